//! What `lobster run` reports: the configuration, each strategy's figures, the printed table
//! and the JSON file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use lobster_io::{AllocationRecord, Assign, Backend, FormChoice, IoOrder, LinkPrices, RunMetrics};
use serde::Serialize;

use super::args::{OnErrorArg, RanksAs, ScheduleArg};
use super::decode::{Decoder, TransformArg};
use super::strategy::Strategy;

/// The run's settings as resolved (defaults filled in), the JSON's `config`.
#[derive(Debug, Serialize)]
pub(crate) struct RunConfig {
    pub data: PathBuf,
    pub samples: usize,
    pub dataset_bytes: u64,
    pub nodes: usize,
    pub node: usize,
    pub ranks_per_node: usize,
    pub batch_size: usize,
    pub epochs: u32,
    pub seed: u64,
    pub cache_bytes: u64,
    pub io_depth: usize,
    pub decode_threads: usize,
    /// Workers per rank of the read-then-decode strategies.
    pub workers_per_rank: usize,
    pub prefetch_iterations: usize,
    pub schedule: ScheduleArg,
    pub hysteresis: f64,
    pub decoder: Decoder,
    pub transform: TransformArg,
    pub image_size: u32,
    pub decode_us_per_kb: f64,
    pub compute_ms: f64,
    pub storage_mbps: f64,
    pub storage_latency_us: u64,
    pub net_mbps: f64,
    pub net_latency_us: u64,
    pub backend: Backend,
    pub io_order: IoOrder,
    /// Which rank of a step gets which sample, as asked (each strategy's `assign` says what
    /// ran).
    pub assign: Assign,
    /// Whether the cluster plan priced remote hits, and with which bandwidths (the emulated
    /// ones, where both tiers are emulated and prices are on).
    pub link_prices: Option<LinkPrices>,
    pub cache_forms: Option<FormChoice>,
    pub decoded_max_side: Option<u32>,
    pub direct: bool,
    pub ranks_as: RanksAs,
    pub on_error: OnErrorArg,
    pub max_failures: Option<String>,
    pub inject_faults: Option<String>,
    /// One process per node over MPI, and whether misses are fetched from peers' caches.
    pub mpi: bool,
    /// Every node in this process (`--cluster`).
    pub in_process_nodes: bool,
    pub remote_hits: bool,
}

/// The I/O backend the loader runs, as the report names it.
pub(crate) fn backend_name<T>(loader: &lobster_io::Loader<T>) -> String {
    loader
        .backend()
        .map_or("read-then-decode workers".to_string(), |b| {
            format!("{:?}", b.active).to_lowercase()
        })
}

/// What one strategy's run measured besides the loader's metrics.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    pub backend: String,
    /// The node's peak memory, as `memory` says it was measured.
    pub peak_rss_bytes: u64,
    pub memory: &'static str,
    pub prefetch_window_bytes: u64,
    pub cache_capacity_bytes: u64,
    /// CPU seconds (user + system) of the whole process while the strategy ran, from
    /// building its loader to dropping it.
    pub cpu_seconds: f64,
    /// The CRC of every batch delivered (see [`super::RankTotals`]), by rank threads or rank
    /// processes alike.
    pub batches_crc32: Option<u32>,
    /// Where the run started and how long its start took (ranks as threads, one node).
    pub start: Option<StartFigures>,
    /// Each step's batches as one CRC, for the run's first steps (ranks as threads).
    pub step_crc32: Vec<StepDigest>,
}

/// Where a strategy's run started and what its start cost: the figures that compare a resume
/// with a fresh start. Times are from the start of the loader's build.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StartFigures {
    /// The state file the run resumed from; None for a fresh start.
    pub resumed_from: Option<PathBuf>,
    /// The epoch and iteration of the run's first batch.
    pub epoch: u32,
    pub iteration: u32,
    /// Batches each rank is given by this loader (fewer when resumed).
    pub steps: u64,
    /// Batches each rank took before the run stopped (--stop-after-iterations), else None.
    pub stopped_after_iterations: Option<u64>,
    /// Building the loader (a resume's replanning included).
    pub build_s: f64,
    /// Until every local rank had its first batch: when the first training step can begin
    /// (None when the run had no batch: resumed at its end).
    pub first_batch_s: Option<f64>,
    /// Steps of the run's first epoch (a resumed one: what was left of its epoch).
    pub first_epoch_steps: u64,
    /// Samples the node's ranks were delivered in it.
    pub first_epoch_samples: u64,
    /// Until its last step ended, and its samples over that time (None when the run stopped
    /// before).
    pub first_epoch_s: Option<f64>,
    pub first_epoch_samples_per_second: Option<f64>,
}

/// One training step's batches: the CRC-32 of the ranks' batch CRCs in rank order.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub(crate) struct StepDigest {
    pub epoch: u32,
    pub iteration: u32,
    pub crc32: u32,
}

/// One strategy's figures, an entry of the JSON's `results`.
#[derive(Debug, Serialize)]
pub(crate) struct StrategyResult {
    pub strategy: Strategy,
    /// The loader's own figures, at the top level of the result as they are named there.
    #[serde(flatten)]
    pub metrics: RunMetrics,
    pub speedup_vs_pytorch: Option<f64>,
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
    /// How `peak_rss_bytes` was measured: one process's peak RSS (ranks as threads), or
    /// the peak of the host's and ranks' summed PSS (ranks as processes).
    pub memory: &'static str,
    pub cache_capacity_bytes: u64,
    pub prefetch_window_bytes: u64,
    pub backend: String,
    /// What the ranks were delivered, as one CRC-32 (ranks as threads): runs that deliver
    /// the same batches have the same.
    pub batches_crc32: Option<u32>,
    /// Median predicted imbalance of the equal split and of lobster-sched's allocation over
    /// the run's windows (allocating strategies only): the model's view of per-rank shares,
    /// which the reads follow under `--io-order shares` only.
    pub predicted_imbalance_equal_split_p50: Option<f64>,
    pub predicted_imbalance_allocated_p50: Option<f64>,
    /// Where the run started and what its start cost (ranks as threads, one node).
    pub start: Option<StartFigures>,
    /// Each step's batches as one CRC, the run's first `STEP_DIGESTS_MAX` steps (ranks as
    /// threads): a resumed run's are the uninterrupted run's from the state on.
    pub step_crc32: Vec<StepDigest>,
}

impl StrategyResult {
    pub(crate) fn new(strategy: Strategy, metrics: RunMetrics, measured: Measured) -> Self {
        let predicted = |f: fn(&AllocationRecord) -> f64| median(metrics.allocations.iter().map(f));
        StrategyResult {
            strategy,
            speedup_vs_pytorch: None,
            cpu_seconds: measured.cpu_seconds,
            peak_rss_bytes: measured.peak_rss_bytes,
            memory: measured.memory,
            cache_capacity_bytes: measured.cache_capacity_bytes,
            prefetch_window_bytes: measured.prefetch_window_bytes,
            backend: measured.backend,
            batches_crc32: measured.batches_crc32,
            predicted_imbalance_equal_split_p50: predicted(|a| a.predicted_imbalance_equal),
            predicted_imbalance_allocated_p50: predicted(|a| a.predicted_imbalance),
            start: measured.start,
            step_crc32: measured.step_crc32,
            metrics,
        }
    }
}

/// Sets every result's speedup over pytorch's samples/s, when pytorch ran.
pub(crate) fn set_speedups(results: &mut [StrategyResult]) {
    let baseline = results
        .iter()
        .find(|r| r.strategy == Strategy::Pytorch)
        .map(|r| r.metrics.samples_per_second);
    for r in results {
        r.speedup_vs_pytorch = baseline.map(|b| r.metrics.samples_per_second / b);
    }
}

pub(crate) fn print_header(config: &RunConfig) {
    println!(
        "dataset {} ({} samples, {:.1} MiB); node {} of {} with {} ranks; batch {}; {} epochs; \
         cache {:.1} MiB",
        config.data.display(),
        config.samples,
        mib(config.dataset_bytes),
        config.node,
        config.nodes,
        config.ranks_per_node,
        config.batch_size,
        config.epochs,
        mib(config.cache_bytes)
    );
    println!(
        "pipelined: {} reads in flight and {} decode threads per node; read-then-decode: {} \
         workers per rank",
        config.io_depth, config.decode_threads, config.workers_per_rank
    );
    if let Some(f) = &config.inject_faults {
        println!("injecting faults into storage reads: {f}");
    }
    if config.storage_mbps > 0.0 {
        println!(
            "emulated shared storage: {} MB/s, {} us per request; compute {} ms per iteration",
            config.storage_mbps, config.storage_latency_us, config.compute_ms
        );
    }
    // Only where peers answer: a node of a job run alone has no interconnect to emulate.
    let peers = (config.mpi && config.remote_hits) || config.in_process_nodes;
    if peers && config.net_mbps > 0.0 {
        println!(
            "emulated interconnect: {} MB/s per node, {} us per fetch",
            config.net_mbps, config.net_latency_us
        );
        if config.link_prices.is_some() {
            println!(
                "the cluster plan prices remote hits with these bandwidths (--link-prices off: \
                 peers serve all they hold)"
            );
        }
    }
}

pub(crate) fn print_table(results: &[StrategyResult]) {
    println!(
        "\n{:<20} {:>12} {:>11} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "strategy",
        "epoch s",
        "samples/s",
        "stall %",
        "job st %",
        "imb p50",
        "imb p95",
        "hit ratio",
        "speedup"
    );
    for r in results {
        let mean_epoch = r.metrics.epoch_seconds.iter().sum::<f64>()
            / r.metrics.epoch_seconds.len().max(1) as f64;
        println!(
            "{:<20} {:>12.2} {:>11.0} {:>8.1} {:>8.1} {:>9.3} {:>9.3} {:>9.3} {:>9}",
            r.strategy.name(),
            mean_epoch,
            r.metrics.samples_per_second,
            r.metrics.stall_fraction * 100.0,
            r.metrics.job_stall_fraction * 100.0,
            r.metrics.imbalance_p50,
            r.metrics.imbalance_p95,
            r.metrics.hit_ratio,
            r.speedup_vs_pytorch
                .map_or("-".to_string(), |s| format!("{s:.2}x")),
        );
    }
}

/// Where each strategy's run started and what its start cost, when measured.
pub(crate) fn print_start(results: &[StrategyResult]) {
    let measured: Vec<(&StrategyResult, &StartFigures)> = results
        .iter()
        .filter_map(|r| r.start.as_ref().map(|s| (r, s)))
        .collect();
    if measured.is_empty() {
        return;
    }
    println!(
        "\n{:<20} {:>16} {:>9} {:>12} {:>12} {:>16}",
        "strategy", "start", "build s", "1st batch s", "1st epoch s", "1st epoch smp/s"
    );
    for (r, s) in &measured {
        let from = match &s.resumed_from {
            Some(_) => format!("resume e{} i{}", s.epoch, s.iteration),
            None => format!("fresh e{} i{}", s.epoch, s.iteration),
        };
        let opt =
            |x: Option<f64>, digits: usize| x.map_or("-".to_string(), |x| format!("{x:.digits$}"));
        println!(
            "{:<20} {from:>16} {:>9.3} {:>12} {:>12} {:>16}",
            r.strategy.name(),
            s.build_s,
            opt(s.first_batch_s, 3),
            opt(s.first_epoch_s, 2),
            opt(s.first_epoch_samples_per_second, 0),
        );
    }
    if let Some((_, s)) = measured.first() {
        if let Some(path) = &s.resumed_from {
            println!("resumed from {}", path.display());
        }
        if let Some(k) = s.stopped_after_iterations {
            println!("stopped after {k} iterations per rank");
        }
    }
}

/// The decoded tier of each strategy that had one: hits by form, decode time saved, bytes
/// by form.
pub(crate) fn print_forms(results: &[StrategyResult]) {
    const MIB: f64 = (1 << 20) as f64;
    for r in results.iter().filter(|r| r.metrics.form_costs.is_some()) {
        let m = &r.metrics;
        println!(
            "{}: cache forms {}: hits {} encoded, {} decoded ({} served decoded, {} decoded \
             again); decode time saved {:.2} s; peak {:.1} MiB encoded, {:.1} MiB decoded",
            r.strategy.name(),
            m.cache_forms,
            m.hits_encoded,
            m.hits_decoded,
            m.decoded_hits_served,
            m.decoded_again,
            m.decode_saved_seconds,
            m.peak_cached_encoded_bytes as f64 / MIB,
            m.peak_cached_decoded_bytes as f64 / MIB,
        );
    }
}

/// Faults met and what the error policy skipped, per strategy (nothing when none).
pub(crate) fn print_skipped(results: &[StrategyResult]) {
    for r in results
        .iter()
        .filter(|r| r.metrics.skipped + r.metrics.faults_injected + r.metrics.read_retries > 0)
    {
        println!(
            "{}: {} read attempts faulted by injection, {} retried, {} reads recovered by a \
             retry; {} samples skipped (budget per epoch held)",
            r.strategy.name(),
            r.metrics.faults_injected,
            r.metrics.read_retries,
            r.metrics.reads_recovered,
            r.metrics.skipped
        );
        for s in r.metrics.skipped_samples.iter().take(5) {
            println!(
                "  epoch {} rank {} sample {}: {}",
                s.epoch, s.rank, s.sample, s.cause
            );
        }
    }
}

/// Writes `{"config": ..., "results": [...]}` to `path`.
/// Writes the configuration and results; over MPI, `per_node` is every node's results in
/// node order (`results` are node 0's).
pub(crate) fn write_json(
    path: &Path,
    config: &RunConfig,
    results: &[StrategyResult],
    per_node: Option<&[serde_json::Value]>,
) -> Result<()> {
    #[derive(Serialize)]
    struct Report<'a> {
        config: &'a RunConfig,
        results: &'a [StrategyResult],
        #[serde(skip_serializing_if = "Option::is_none")]
        nodes: Option<&'a [serde_json::Value]>,
    }
    let text = serde_json::to_string_pretty(&Report {
        config,
        results,
        nodes: per_node,
    })?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The plan's inputs every node of an MPI job must share: the whole configuration but the
/// node, as (field, value) text.
pub(crate) fn plan_fields(config: &RunConfig) -> Result<Vec<(String, String)>> {
    let serde_json::Value::Object(map) = serde_json::to_value(config)? else {
        anyhow::bail!("the run's configuration is not a JSON object");
    };
    Ok(map
        .into_iter()
        .filter(|(k, _)| k != "node")
        .map(|(k, v)| (k, v.to_string()))
        .collect())
}

/// Every node's figures of an MPI job, a line per node and strategy, and the job's totals
/// (samples summed; samples/s of the job: its samples over the slowest node's time).
pub(crate) fn print_nodes(nodes: &[serde_json::Value]) {
    let num = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    println!();
    println!(
        "{:>4} {:>20} {:>12} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "node", "strategy", "samples/s", "hit", "remote", "planned", "r-misses", "timeouts"
    );
    let strategies = nodes.first().and_then(|n| n.as_array()).map_or(0, Vec::len);
    for p in 0..strategies {
        let (mut samples, mut slowest_s, mut remote, mut planned) = (0.0, 0.0f64, 0.0, 0.0);
        let mut name = String::new();
        for (n, results) in nodes.iter().enumerate() {
            let r = &results[p];
            name = r["strategy"].as_str().unwrap_or("?").to_owned();
            println!(
                "{n:>4} {name:>20} {:>12.0} {:>8.3} {:>10} {:>10} {:>10} {:>10}",
                num(r, "samples_per_second"),
                num(r, "hit_ratio"),
                num(r, "remote_hits"),
                num(r, "planned_remote_hits"),
                num(r, "remote_misses"),
                num(r, "remote_timeouts"),
            );
            samples += num(r, "samples");
            slowest_s = slowest_s.max(num(r, "samples") / num(r, "samples_per_second"));
            remote += num(r, "remote_hits");
            planned += num(r, "planned_remote_hits");
        }
        println!(
            "{:>4} {name:>20} {:>12.0} {:>8} {remote:>10} {planned:>10}",
            "job",
            samples / slowest_s,
            ""
        );
    }
}

/// The job's storage reads against the floor, and where its accesses were served, per
/// strategy (every node's results, in node order). Steady state: the epochs after the first.
pub(crate) fn print_cluster(nodes: &[serde_json::Value], config: &RunConfig) {
    let floor = config
        .dataset_bytes
        .saturating_sub(config.nodes as u64 * config.cache_bytes);
    println!();
    println!(
        "storage floor per epoch F - N*C = {:.1} MB (F {:.1} MB, {} nodes x {:.1} MB)",
        floor as f64 / 1e6,
        config.dataset_bytes as f64 / 1e6,
        config.nodes,
        config.cache_bytes as f64 / 1e6
    );
    println!(
        "{:>20} {:>12} {:>14} {:>10} {:>8} {:>8} {:>8} {:>9} {:>12} {:>10} {:>12}",
        "strategy",
        "plan",
        "storage MB/ep",
        "x floor",
        "local",
        "remote",
        "storage",
        "rerouted",
        "net MB",
        "job smp/s",
        "steady smp/s"
    );
    let strategies = nodes.first().and_then(|n| n.as_array()).map_or(0, Vec::len);
    for p in 0..strategies {
        let figures = job_figures(nodes, p);
        let mut plan = nodes[0][p]["peer_plan"]["mode"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        if nodes[0][p]["assign"]["mode"].as_str() == Some("locality") {
            plan.push_str(",loc");
        }
        println!(
            "{:>20} {plan:>12} {:>14.1} {:>10} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>12.1} {:>10.0} {:>12.0}",
            nodes[0][p]["strategy"].as_str().unwrap_or("?"),
            figures.steady_storage_bytes_per_epoch / 1e6,
            if floor > 0 {
                format!(
                    "{:.3}",
                    figures.steady_storage_bytes_per_epoch / floor as f64
                )
            } else {
                "-".into()
            },
            figures.fractions[0],
            figures.fractions[1],
            figures.fractions[2],
            figures.fractions[3],
            figures.remote_bytes / 1e6,
            figures.samples_per_second,
            figures.steady_samples_per_second,
        );
    }
}

/// One strategy's figures for the whole job.
struct JobFigures {
    /// Mean over the epochs after the first of the job's storage bytes per epoch.
    steady_storage_bytes_per_epoch: f64,
    /// Local hits, remote hits, storage reads and, of those, the remote hits the link prices
    /// sent to storage, over accesses.
    fractions: [f64; 4],
    /// Bytes peers sent, all nodes.
    remote_bytes: f64,
    /// The nodes' samples per second, summed: overall, and after the first epoch.
    samples_per_second: f64,
    steady_samples_per_second: f64,
}

fn job_figures(nodes: &[serde_json::Value], p: usize) -> JobFigures {
    let num = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(0.0);
    let (mut steady, mut epochs) = (0.0, 0usize);
    let (mut accesses, mut hits, mut remote, mut remote_bytes) = (0.0, 0.0, 0.0, 0.0);
    let mut rerouted = 0.0;
    let (mut samples_per_second, mut steady_samples_per_second) = (0.0, 0.0);
    for results in nodes {
        let r = &results[p];
        let by_epoch: Vec<f64> = r["storage_bytes_by_epoch"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
            .unwrap_or_default();
        steady += by_epoch.iter().skip(1).sum::<f64>();
        epochs = epochs.max(by_epoch.len().saturating_sub(1));
        accesses += num(r, "accesses");
        hits += num(r, "hits");
        remote += num(r, "remote_hits");
        remote_bytes += num(r, "remote_hit_bytes");
        if let Some(epochs) = r["cluster_plan"]["epochs"].as_array() {
            rerouted += epochs.iter().map(|e| num(e, "rerouted_reads")).sum::<f64>();
        }
        samples_per_second += num(r, "samples_per_second");
        steady_samples_per_second += num(r, "steady_samples_per_second");
    }
    let share = |x: f64| if accesses > 0.0 { x / accesses } else { 0.0 };
    JobFigures {
        steady_storage_bytes_per_epoch: if epochs > 0 {
            steady / epochs as f64
        } else {
            0.0
        },
        fractions: [
            share(hits),
            share(remote),
            share(accesses - hits - remote),
            share(rerouted),
        ],
        remote_bytes,
        samples_per_second,
        steady_samples_per_second,
    }
}

/// The median of the finite values, the upper one of an even count; None when there are none.
fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// A strategy's progress over `total` iterations, or none with `quiet`.
pub(crate) fn progress_bar(quiet: bool, strategy: Strategy, total: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:40}] {pos}/{len} iterations {elapsed}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_prefix(strategy.name());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_skips_what_is_not_finite() {
        assert_eq!(median([3.0, f64::NAN, 1.0, 2.0].into_iter()), Some(2.0));
        assert_eq!(median([f64::INFINITY].into_iter()), None);
    }
}
