//! `lobster-bench soak`: many epochs with faults injected, checking that nothing is lost, memory
//! levels off, and descriptors and threads come back once the loader is dropped.
//!
//! SIGINT and SIGTERM stop the run at the next step and remove a generated dataset; a signal
//! during the generation is acted on once it ends.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lobster_io::{
    BudgetConfig, Dataset, DistributedSampler, EpochOrder, FailureBudget, FaultInjection,
    JobConfig, LoaderBuilder, LoaderConfig, OnError, ReadConfig, SampleMeta, Schedule,
};
use serde::Serialize;

use lobster_cli::process;
use lobster_cli::run::{
    decode, train, Budgets, Decoded, Decoder, RankTotals, Strategies, Strategy,
};

/// Arguments of `lobster-bench soak`.
#[derive(Clone, Debug, clap::Args)]
pub struct SoakArgs {
    /// An ImageFolder dataset; without it one is generated into a temporary directory.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Samples of the generated dataset.
    #[arg(long, default_value_t = 1000)]
    pub samples: u32,
    /// Mean file size of the generated dataset, KiB.
    #[arg(long, default_value_t = 16.0)]
    pub mean_kb: f64,
    /// Epochs (at least 3: memory is compared against its level after epoch 2).
    #[arg(long, default_value_t = 20)]
    pub epochs: u32,
    /// Nodes in the job (this is node 0).
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Ranks per node.
    #[arg(long, default_value_t = 4)]
    pub ranks_per_node: usize,
    /// Samples per batch per rank.
    #[arg(long, visible_alias = "batch", default_value_t = 16)]
    pub batch_size: usize,
    /// The loading strategy (one of those of `lobster run`).
    #[arg(long, alias = "policy", default_value = "lobster")]
    pub strategy: Strategies,
    /// Node cache capacity as a fraction of the dataset's bytes.
    #[arg(long, default_value_t = 0.2)]
    pub cache_frac: f64,
    /// Faults injected into storage reads (see `lobster run --inject-faults`).
    #[arg(
        long,
        default_value = "seed=1,eio=0.005,short=0.05,delay=0.02,corrupt=0.005,delay_us=500"
    )]
    pub inject_faults: FaultInjection,
    /// Samples an epoch may skip: a count N or a percentage P%.
    #[arg(long, default_value = "5%")]
    pub max_failures: FailureBudget,
    /// The decoder (jpeg notices corruption; raw and synthetic do not).
    #[arg(long, value_enum, default_value_t = Decoder::Jpeg)]
    pub decoder: Decoder,
    /// Allowed growth of resident memory's level after epoch 2 (see `--rss-steady-epoch`).
    #[arg(long, default_value_t = 0.10)]
    pub rss_growth_max: f64,
    /// The long-run check: from the end of this epoch (or of the run's middle epoch, in a
    /// run of fewer than twice as many), the cache is full and memory must stay level. A
    /// level is the median of the peaks of 20 consecutive epochs (fewer in a run too short
    /// for two such windows); the check compares the level from this epoch with the highest
    /// level of any later window.
    #[arg(long, default_value_t = 20)]
    pub rss_steady_epoch: u32,
    /// Allowed growth of resident memory's level after `--rss-steady-epoch`.
    #[arg(long, default_value_t = 0.05)]
    pub rss_steady_growth_max: f64,
    /// Allowed height of any one epoch's peak after `--rss-steady-epoch` over the level
    /// then: what one epoch has in flight at its highest moment.
    #[arg(long, default_value_t = 0.20)]
    pub rss_excursion_max: f64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct SoakReport {
    strategy: Strategy,
    epochs: u32,
    samples_planned: u64,
    samples_delivered: u64,
    samples_skipped: u64,
    samples_lost: u64,
    faults_injected: u64,
    read_retries: u64,
    reads_recovered: u64,
    /// Resident memory once the loader is built, then at each epoch's end, and the most
    /// resident during each epoch (its peak): the checks compare peaks.
    rss_bytes_after_build: u64,
    rss_bytes_per_epoch: Vec<u64>,
    rss_peak_bytes_per_epoch: Vec<u64>,
    /// Epochs whose median peak makes one level.
    rss_level_epochs: u32,
    rss_growth_after_epoch2: f64,
    /// The long-run check: the epoch memory is compared from (1-based), the level from it,
    /// the highest level of a later window and the last window's, the growth of the
    /// highest over the first, and the highest single epoch's peak after it over the level.
    rss_steady_epoch: u32,
    rss_level_bytes_at_steady_epoch: u64,
    rss_level_bytes_highest_after_steady_epoch: u64,
    rss_level_bytes_at_end: u64,
    rss_growth_after_steady_epoch: f64,
    rss_steady_growth_max: f64,
    rss_peak_bytes_highest_after_steady_epoch: u64,
    rss_excursion_after_steady_epoch: f64,
    rss_excursion_max: f64,
    /// The node cache's capacity: memory the run may still fill after the build.
    cache_capacity_bytes: u64,
    /// The loader's bound on bytes in flight or awaiting decode: pipelined reads land in a
    /// pool of this many bytes, committed when the loader is built.
    prefetch_window_bytes: u64,
    fds_before: usize,
    fds_after: usize,
    threads_before: usize,
    threads_after: usize,
    elapsed_s: f64,
}

pub fn run(args: &SoakArgs) -> Result<()> {
    check_args(args)?;
    let &[strategy] = args.strategy.0.as_slice() else {
        bail!("--strategy: soak runs one strategy at a time");
    };
    // Before the dataset exists: a signal from here on lets the guard below remove it.
    let signal = Signals::register()?;
    let (data, _generated) = match &args.data {
        Some(d) => (d.clone(), None),
        None => {
            let dir = std::env::temp_dir().join(format!("lobster-soak-{}", std::process::id()));
            println!(
                "generating {} samples into {} ...",
                args.samples,
                dir.display()
            );
            // Made before the generation, so a failed one is removed too.
            let guard = RemoveOnDrop(dir.clone());
            lobster_cli::gen::generate(&dir, args.samples, 4, args.mean_kb, 0)?;
            (dir, Some(guard))
        }
    };
    signal.check()?;
    let dataset = Arc::new(
        Dataset::open_image_folder(&data)
            .with_context(|| format!("opening the dataset {}", data.display()))?,
    );
    let report = soak(args, strategy, &dataset, &signal)?;
    print_report(args, &report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failures = failures(args, &report);
    if !failures.is_empty() {
        bail!("soak failed: {}", failures.join("; "));
    }
    println!("soak passed");
    Ok(())
}

/// Refuses nonsense parameters, naming each.
fn check_args(args: &SoakArgs) -> Result<()> {
    if args.epochs < 3 {
        bail!("--epochs = {}: allowed 3 or more", args.epochs);
    }
    if !(args.cache_frac.is_finite() && (0.0..=1.0).contains(&args.cache_frac)) {
        bail!("--cache-frac = {}: allowed 0 to 1", args.cache_frac);
    }
    if args.rss_steady_epoch == 0 {
        bail!("--rss-steady-epoch = 0: allowed 1 or more");
    }
    for (name, value) in [
        ("--rss-growth-max", args.rss_growth_max),
        ("--rss-steady-growth-max", args.rss_steady_growth_max),
        ("--rss-excursion-max", args.rss_excursion_max),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            bail!("{name} = {value}: allowed 0 or more");
        }
    }
    Ok(())
}

/// The soak's figures, as a reader follows them.
fn print_report(args: &SoakArgs, report: &SoakReport) {
    println!(
        "{} epochs of {}: {} samples planned, {} delivered, {} skipped by --on-error, {} lost",
        report.epochs,
        report.strategy,
        report.samples_planned,
        report.samples_delivered,
        report.samples_skipped,
        report.samples_lost
    );
    println!(
        "faults: {} read attempts faulted, {} retried, {} reads recovered by a retry",
        report.faults_injected, report.read_retries, report.reads_recovered
    );
    let in_mib = |b: u64| b as f64 / f64::from(1 << 20);
    let series = |bytes: &[u64]| {
        let mib: Vec<String> = bytes.iter().map(|b| format!("{:.1}", in_mib(*b))).collect();
        mib.join(" ")
    };
    println!(
        "resident MiB after the build {:.1}, after each epoch: {}",
        in_mib(report.rss_bytes_after_build),
        series(&report.rss_bytes_per_epoch)
    );
    println!(
        "peak resident MiB during each epoch: {}",
        series(&report.rss_peak_bytes_per_epoch)
    );
    println!(
        "resident level (median peak of {} epochs) growth after epoch 2: {:+.1}% (allowed \
         {:.0}%); prefetch window bound {:.1} MiB",
        report.rss_level_epochs,
        100.0 * report.rss_growth_after_epoch2,
        100.0 * args.rss_growth_max,
        in_mib(report.prefetch_window_bytes)
    );
    println!(
        "resident level after epoch {}: {:.1} MiB, highest {:.1} MiB, last {:.1} MiB: growth \
         {:+.1}% (allowed {:.0}%); highest epoch peak {:.1} MiB, {:+.1}% over the level \
         (allowed {:.0}%)",
        report.rss_steady_epoch,
        in_mib(report.rss_level_bytes_at_steady_epoch),
        in_mib(report.rss_level_bytes_highest_after_steady_epoch),
        in_mib(report.rss_level_bytes_at_end),
        100.0 * report.rss_growth_after_steady_epoch,
        100.0 * args.rss_steady_growth_max,
        in_mib(report.rss_peak_bytes_highest_after_steady_epoch),
        100.0 * report.rss_excursion_after_steady_epoch,
        100.0 * args.rss_excursion_max
    );
    println!(
        "open descriptors {} -> {}, threads {} -> {} (before build -> after drop); {:.1} s",
        report.fds_before,
        report.fds_after,
        report.threads_before,
        report.threads_after,
        report.elapsed_s
    );
}

/// What failed the soak, if anything: a lost sample, memory past its bounds, a descriptor or a
/// thread left behind.
fn failures(args: &SoakArgs, report: &SoakReport) -> Vec<String> {
    let mut failures = Vec::new();
    if report.samples_lost != 0 {
        failures.push(format!("{} samples lost", report.samples_lost));
    }
    if report.rss_growth_after_epoch2 > args.rss_growth_max {
        failures.push(format!(
            "resident memory's level grew {:.1}% after epoch 2",
            100.0 * report.rss_growth_after_epoch2
        ));
    }
    if report.rss_growth_after_steady_epoch > args.rss_steady_growth_max {
        failures.push(format!(
            "resident memory's level grew {:.1}% after epoch {}",
            100.0 * report.rss_growth_after_steady_epoch,
            report.rss_steady_epoch
        ));
    }
    if report.rss_excursion_after_steady_epoch > args.rss_excursion_max {
        failures.push(format!(
            "an epoch's peak resident memory rose {:.1}% over the level after epoch {}",
            100.0 * report.rss_excursion_after_steady_epoch,
            report.rss_steady_epoch
        ));
    }
    if report.fds_after != report.fds_before {
        failures.push(format!(
            "open descriptors {} -> {}",
            report.fds_before, report.fds_after
        ));
    }
    if report.threads_after != report.threads_before {
        failures.push(format!(
            "threads {} -> {}",
            report.threads_before, report.threads_after
        ));
    }
    failures
}

fn soak(
    args: &SoakArgs,
    strategy: Strategy,
    dataset: &Arc<Dataset>,
    signal: &Signals,
) -> Result<SoakReport> {
    let world = args.nodes * args.ranks_per_node;
    let per_rank =
        DistributedSampler::new(dataset.len(), world, false, EpochOrder::Shuffle { seed: 0 })?
            .per_rank();
    let config = soak_config(args, strategy, dataset);
    let cache_capacity_bytes = config.cache.capacity_bytes;
    let decoder = args.decoder;
    let fds_before = process::open_fds();
    let threads_before = process::threads();
    let started = Instant::now();
    let mut loader = LoaderBuilder::new(dataset.clone())
        .config(config)
        .decode_in_epoch(move |bytes: &[u8], meta: &SampleMeta, epoch| {
            decode(
                decoder,
                1.0,
                lobster_image::Transform::None,
                lobster_image::PIXELS_MAX_DEFAULT,
                (0, epoch),
                bytes,
                meta,
            )
        })
        .build()
        .context("starting the loader")?;
    let rss_bytes_after_build = process::status_bytes("VmRSS");
    let iterations = loader.iterations_per_epoch();
    let prefetch_window_bytes = loader.prefetch_window_bytes();
    let handles = loader.ranks().context("rank handles already taken")?;
    let (totals, rss) = train_sampling_rss(handles, iterations, strategy, signal)?;
    let metrics = loader.metrics();
    drop(loader);
    let elapsed_s = started.elapsed().as_secs_f64();
    let (rss_bytes_per_epoch, rss_peak_bytes_per_epoch): (Vec<u64>, Vec<u64>) =
        rss.into_iter().unzip();
    // The checks compare levels of the epochs' peaks: one instant moves by what is in flight
    // then (reads in the pool, images being decoded), one epoch's peak by where its highest
    // moment lands (a few MiB either way in a level run), and one epoch against the highest
    // of hundreds finds growth in a level run.
    let peaks = &rss_peak_bytes_per_epoch;
    let early = Levels::of(&peaks[1..]);
    let rss_steady_epoch = steady_epoch(args.rss_steady_epoch, args.epochs);
    let steady = Levels::of(&peaks[rss_steady_epoch as usize - 1..]);
    let samples_planned = (per_rank * args.ranks_per_node) as u64 * u64::from(args.epochs);
    let (delivered, skipped) = totals.iter().fold((0, 0), |(d, s), t: &RankTotals| {
        (d + t.delivered, s + t.skipped)
    });
    if (delivered, skipped) != (metrics.samples, metrics.skipped) {
        bail!(
            "the ranks counted {delivered} delivered and {skipped} skipped, the metrics {} and {}",
            metrics.samples,
            metrics.skipped
        );
    }
    Ok(SoakReport {
        strategy,
        epochs: args.epochs,
        samples_planned,
        samples_delivered: delivered,
        samples_skipped: skipped,
        samples_lost: samples_planned.saturating_sub(delivered + skipped),
        faults_injected: metrics.faults_injected,
        read_retries: metrics.read_retries,
        reads_recovered: metrics.reads_recovered,
        rss_level_epochs: steady.epochs as u32,
        rss_growth_after_epoch2: early.growth(),
        rss_bytes_after_build,
        rss_steady_epoch,
        rss_level_bytes_at_steady_epoch: steady.first,
        rss_level_bytes_highest_after_steady_epoch: steady.highest,
        rss_level_bytes_at_end: steady.last,
        rss_growth_after_steady_epoch: steady.growth(),
        rss_steady_growth_max: args.rss_steady_growth_max,
        rss_peak_bytes_highest_after_steady_epoch: steady.highest_peak,
        rss_excursion_after_steady_epoch: steady.excursion(),
        rss_excursion_max: args.rss_excursion_max,
        rss_bytes_per_epoch,
        rss_peak_bytes_per_epoch,
        cache_capacity_bytes,
        prefetch_window_bytes,
        fds_before,
        fds_after: process::open_fds(),
        threads_before,
        threads_after: process::threads(),
        elapsed_s,
    })
}

/// Resident bytes at an epoch's end, and the peak during it.
type EpochRss = (u64, u64);

/// Trains on `handles` to the end, stopping every rank at the same step on a signal: the
/// ranks' totals, and resident memory (now, and the peak since the last) at each epoch's end
/// (`iterations` steps).
fn train_sampling_rss(
    handles: Vec<lobster_io::RankHandle<Decoded>>,
    iterations: usize,
    strategy: Strategy,
    signal: &Signals,
) -> Result<(Vec<RankTotals>, Vec<EpochRss>)> {
    let rss = Mutex::new(Vec::new());
    // Each epoch's peak from here on, not the build's.
    process::reset_peak_rss();
    let totals = train(
        handles,
        Duration::ZERO,
        strategy.name(),
        |step| {
            if (step + 1) % iterations == 0 {
                let (now, peak) = process::rss_and_peak_bytes();
                process::reset_peak_rss();
                rss.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((now, peak));
            }
        },
        // Polled once a step: a signal stops every rank at the same step.
        Some(&|| signal.check()),
        |_, _: &mut ()| {},
    )?;
    let rss = rss.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok((totals, rss))
}

/// The loader's configuration: the strategy's, with the soak's world, faults and error rule.
fn soak_config(args: &SoakArgs, strategy: Strategy, dataset: &Dataset) -> LoaderConfig {
    let cache_bytes = (dataset.total_bytes() as f64 * args.cache_frac).max(1.0) as u64;
    let mut config = LoaderConfig {
        job: JobConfig {
            nodes: args.nodes,
            node: 0,
            ranks_per_node: args.ranks_per_node,
            batch_size: args.batch_size,
            epochs: args.epochs,
            drop_last: false,
            ..JobConfig::default()
        },
        budgets: BudgetConfig {
            io_depth: 4 * args.ranks_per_node,
            ..BudgetConfig::default()
        },
        reads: ReadConfig {
            inject_faults: Some(args.inject_faults),
            ..ReadConfig::default()
        },
        on_error: OnError::Skip {
            max_failures: args.max_failures,
        },
        ..LoaderConfig::default()
    };
    let budgets = Budgets {
        pipelined_schedule: Schedule::Allocate { hysteresis: 0.05 },
        decode_threads: 2 * args.ranks_per_node,
        workers_per_rank: 2,
        cache_bytes,
        pipeline_threads: lobster_io::PipelineThreads::default(),
    };
    strategy.apply(&budgets, &mut config);
    config
}

/// Epochs whose median peak makes one level of resident memory.
const LEVEL_EPOCHS: usize = 20;

/// Resident memory's levels over a run of epochs' peaks: the median of each window of
/// `epochs` consecutive peaks (`LEVEL_EPOCHS`, or half the run where it is shorter).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Levels {
    epochs: usize,
    first: u64,
    highest: u64,
    last: u64,
    highest_peak: u64,
}

impl Levels {
    fn of(peaks: &[u64]) -> Self {
        let epochs = LEVEL_EPOCHS.min(peaks.len() / 2).max(1);
        let levels: Vec<u64> = peaks.windows(epochs).map(median).collect();
        Levels {
            epochs,
            first: levels.first().copied().unwrap_or(0),
            highest: levels.iter().copied().max().unwrap_or(0),
            last: levels.last().copied().unwrap_or(0),
            highest_peak: peaks.iter().copied().max().unwrap_or(0),
        }
    }

    /// The highest level over the first, less one.
    fn growth(&self) -> f64 {
        self.over_first(self.highest)
    }

    /// The highest single peak over the first level, less one.
    fn excursion(&self) -> f64 {
        self.over_first(self.highest_peak)
    }

    fn over_first(&self, bytes: u64) -> f64 {
        if self.first == 0 {
            return 0.0;
        }
        bytes as f64 / self.first as f64 - 1.0
    }
}

/// The median of a window (the lower middle of an even one).
fn median(window: &[u64]) -> u64 {
    let mut sorted = window.to_vec();
    sorted.sort_unstable();
    sorted[(sorted.len() - 1) / 2]
}

/// The epoch (1-based) the long-run check compares from: `wanted`, or the middle of a run
/// shorter than twice that.
fn steady_epoch(wanted: u32, epochs: u32) -> u32 {
    wanted.min(epochs / 2).max(1)
}

/// SIGINT and SIGTERM, recorded for the run to poll instead of ending the process where it
/// stands (which would leave a generated dataset behind). They stay recorded, not acted on,
/// until the process exits: `soak` is the process's last work.
#[derive(Debug)]
struct Signals {
    /// The last signal received, 0 for none.
    received: Arc<AtomicUsize>,
}

impl Signals {
    fn register() -> Result<Self> {
        let received = Arc::new(AtomicUsize::new(0));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let as_usize = usize::try_from(signal).expect("signal numbers are positive");
            signal_hook::flag::register_usize(signal, received.clone(), as_usize)
                .with_context(|| format!("handling signal {signal}"))?;
        }
        Ok(Signals { received })
    }

    /// An error naming the signal, once one came.
    fn check(&self) -> Result<()> {
        match self.received.load(Ordering::SeqCst) {
            0 => Ok(()),
            signal => bail!("stopped by signal {signal} ({})", signal_name(signal)),
        }
    }
}

fn signal_name(signal: usize) -> &'static str {
    match i32::try_from(signal) {
        Ok(signal_hook::consts::SIGINT) => "SIGINT",
        Ok(signal_hook::consts::SIGTERM) => "SIGTERM",
        _ => "unexpected",
    }
}

/// A generated dataset, removed when the soak ends.
#[derive(Debug)]
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_run_with_one_high_epoch_has_no_growth_but_an_excursion() {
        let mut peaks = vec![100u64; 100];
        peaks[50] = 130;
        let levels = Levels::of(&peaks);
        assert_eq!(levels.epochs, LEVEL_EPOCHS);
        assert_eq!((levels.first, levels.highest, levels.last), (100, 100, 100));
        assert_eq!(levels.growth(), 0.0);
        assert!((levels.excursion() - 0.30).abs() < 1e-12);
    }

    #[test]
    fn growth_in_the_middle_counts_though_the_end_is_back_down() {
        let mut peaks = vec![100u64; 100];
        peaks[40..70].fill(110);
        let levels = Levels::of(&peaks);
        assert_eq!((levels.first, levels.highest, levels.last), (100, 110, 100));
        assert!((levels.growth() - 0.10).abs() < 1e-12);
    }

    #[test]
    fn a_slow_creep_counts_in_full() {
        let peaks: Vec<u64> = (0..400).map(|e| 1000 + e).collect();
        let levels = Levels::of(&peaks);
        // Medians of 20: epochs 0..20 give 1009, the last window 1389.
        assert_eq!((levels.first, levels.last), (1009, 1389));
        assert_eq!(levels.highest, levels.last);
    }

    #[test]
    fn a_short_run_compares_single_epochs() {
        let levels = Levels::of(&[100, 100, 101]);
        assert_eq!(levels.epochs, 1);
        assert_eq!((levels.first, levels.highest, levels.last), (100, 101, 101));
        assert!(levels.growth() > 0.0);
        assert_eq!(Levels::of(&[]).growth(), 0.0);
    }
}
