//! `lobster run`: simulated synchronous training on this node, Lobster against its baselines
//! on the same data in the same process.

mod args;
mod build;
mod cluster;
mod dataset;
mod decode;
mod nodes;
mod processes;
mod report;
mod state;
mod strategy;
mod train;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lobster_io::{Dataset, LoaderState, OnError, RunMetrics};

use args::RanksAs;
pub use args::RunArgs;
pub use dataset::default_dataset;
pub use decode::{decode, Decoded, Decoder, TransformArg};
pub use strategy::{Budgets, Strategies, Strategy};
use train::batches_crc32;
pub use train::{train, RankTotals};

use crate::process;
use report::{Measured, RunConfig, StartFigures, StepDigest, StrategyResult};
use train::{train_steps, RankRun, TrainSteps};

pub fn run(args: &RunArgs) -> Result<()> {
    args.validate()?;
    if let (Some(r), Some(job)) = (args.rank_process, &args.node_job) {
        return processes::rank_process(args, r, job);
    }
    // Files written at the end are checked now, not after the whole run.
    for (option, path) in [("--json", &args.json), ("--save-state", &args.save_state)] {
        if let Some(path) = path {
            writable(option, path)?;
        }
    }
    // Read before anything is built: a state that cannot be used never becomes a fresh start.
    let resume = args
        .resume
        .as_ref()
        .map(|path| state::read(path).map(|s| (path.clone(), s)))
        .transpose()?;
    let cluster = cluster::Cluster::start(args.mpi, args.nodes, !args.no_remote)?;
    let node = cluster.as_ref().map_or(args.node, cluster::Cluster::node);
    // Node 0 alone speaks for an MPI job.
    let lead = node == 0 || cluster.is_none();
    let data = resolve_data(args, lead, cluster.as_ref())?;
    // Rank processes are given the dataset as resolved here, and the decoder chosen for it:
    // the built-in set keeps its synthetic decoder once it is named like a user's --data.
    let args = &RunArgs {
        decoder: Some(args.decoder()),
        data: Some(data.clone()),
        node,
        quiet: args.quiet || !lead,
        ..args.clone()
    };
    let dataset = Arc::new(
        Dataset::open(&data.to_string_lossy())
            .with_context(|| format!("opening the dataset {}", data.display()))?,
    );
    let cache_bytes = args.cache_capacity_bytes(&dataset);
    build::check_strategies(args, &dataset, cache_bytes)?;
    let config = run_config(args, &dataset, cache_bytes, cluster.as_ref())?;
    if let Some(c) = &cluster {
        // Nodes plan each other's caches from where they start: a resume must be the same.
        let mut fields = report::plan_fields(&config)?;
        let point = resume.as_ref().and_then(|(_, s)| s.resume_point());
        fields.push(("resume".into(), point.unwrap_or_else(|| "none".into())));
        c.agree(fields)?;
    }
    if lead {
        report::print_header(&config);
    }
    if args.cluster {
        return run_nodes(args, &dataset, cache_bytes, &config, resume.as_ref());
    }
    let mut results = Vec::with_capacity(args.strategy.0.len());
    // The state every strategy stopped at: the same batches taken, the same state.
    let mut saved: Option<(Strategy, LoaderState)> = None;
    for &strategy in &args.strategy.0 {
        let (metrics, measured, stopped) = run_strategy(
            args,
            &dataset,
            cache_bytes,
            strategy,
            cluster.as_ref(),
            resume.as_ref(),
        )?;
        results.push(StrategyResult::new(strategy, metrics, measured));
        if let (Some(path), Some(state)) = (&args.save_state, stopped) {
            keep_state(path, (strategy, state), &mut saved, lead)?;
        }
    }
    report::set_speedups(&mut results);
    let per_node = match &cluster {
        Some(c) => Some(
            c.gather(serde_json::to_vec(&results)?)?
                .iter()
                .map(|b| serde_json::from_slice::<serde_json::Value>(b))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    if !lead {
        return Ok(());
    }
    report_run(
        args,
        &config,
        &results,
        per_node.as_deref(),
        saved.as_ref().map(|(_, s)| s),
    )
}

/// Writes the first strategy's stopped state to `path` (node 0 speaks for the job: every
/// node is at the same step); every later strategy must have stopped at the same state.
fn keep_state(
    path: &std::path::Path,
    (strategy, state): (Strategy, LoaderState),
    saved: &mut Option<(Strategy, LoaderState)>,
    lead: bool,
) -> Result<()> {
    match saved {
        None => {
            if lead {
                state::write(path, &state)?;
            }
            *saved = Some((strategy, state));
        }
        Some((first, s)) if *s != state => anyhow::bail!(
            "{strategy} stopped at another state than {first} (written to {}): {:?} \
             against {:?}",
            path.display(),
            state.ranks,
            s.ranks
        ),
        Some(_) => {}
    }
    Ok(())
}

/// Node 0's report: the tables, where the state went, and the JSON.
fn report_run(
    args: &RunArgs,
    config: &RunConfig,
    results: &[StrategyResult],
    per_node: Option<&[serde_json::Value]>,
    saved: Option<&LoaderState>,
) -> Result<()> {
    report::print_table(results);
    report::print_start(results);
    report::print_forms(results);
    report::print_skipped(results);
    if let Some(nodes) = per_node {
        report::print_nodes(nodes);
        report::print_cluster(nodes, config);
    }
    if let (Some(path), Some(state)) = (&args.save_state, saved) {
        let at = state.ranks.first().map(|r| (r.epoch, r.iteration));
        let (epoch, iteration) = at.unwrap_or_default();
        println!(
            "wrote the loader state to {} (next batch: epoch {epoch}, iteration {iteration})",
            path.display()
        );
    }
    if let Some(path) = &args.json {
        report::write_json(path, config, results, per_node)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// What the report says of the run: its parameters as resolved.
fn run_config(
    args: &RunArgs,
    dataset: &Dataset,
    cache_bytes: u64,
    cluster: Option<&cluster::Cluster>,
) -> Result<RunConfig> {
    Ok(RunConfig {
        data: args.data.clone().expect("resolved by run"),
        samples: dataset.len(),
        dataset_bytes: dataset.total_bytes(),
        nodes: args.nodes,
        node: args.node,
        ranks_per_node: args.ranks_per_node,
        batch_size: args.batch_size,
        epochs: args.epochs,
        seed: args.seed,
        cache_bytes,
        io_depth: args.io_depth,
        decode_threads: args.decode_threads,
        workers_per_rank: args.workers_per_rank()?,
        prefetch_iterations: args.prefetch_iterations,
        schedule: args.schedule,
        hysteresis: args.hysteresis,
        decoder: args.decoder(),
        transform: args.transform,
        image_size: args.image_size,
        decode_us_per_kb: args.decode_us_per_kb,
        compute_ms: args.compute_ms,
        storage_mbps: args.storage_mbps,
        storage_latency_us: args.storage_latency_us,
        net_mbps: args.net_mbps,
        net_latency_us: args.net_latency_us,
        backend: args.backend,
        io_order: args.io_order,
        assign: args.assign,
        link_prices: args.link_prices(),
        cache_forms: args.cache_forms,
        decoded_max_side: args.decoded_max_side,
        direct: args.direct,
        ranks_as: args.ranks_as,
        on_error: args.on_error,
        max_failures: match args.on_error_rule()? {
            OnError::Skip { max_failures } => Some(max_failures.to_string()),
            _ => None,
        },
        inject_faults: args.inject_faults.map(|f| {
            format!(
                "seed={},eio={},short={},delay={},corrupt={},delay_us={}",
                f.seed, f.eio, f.short, f.delay, f.corrupt, f.delay_us
            )
        }),
        mpi: cluster.is_some(),
        in_process_nodes: args.cluster,
        remote_hits: args.cluster || cluster.is_some_and(|c| c.peers().is_some()),
    })
}

/// The dataset: `--data`, or the built-in set, which node 0 generates while the others wait
/// for it, then reuse it.
fn resolve_data(
    args: &RunArgs,
    lead: bool,
    cluster: Option<&cluster::Cluster>,
) -> Result<std::path::PathBuf> {
    if let Some(d) = &args.data {
        return Ok(d.clone());
    }
    let made = lead.then(|| dataset::default_dataset(args.samples, args.quiet));
    if let Some(c) = cluster {
        c.barrier()?;
    }
    match made {
        Some(made) => made,
        None => dataset::default_dataset(args.samples, true),
    }
}

/// Refuses `path` unless a file can be written there: its folder exists and takes a new
/// file, and it is not itself a folder. Probed with a file made and removed beside it.
fn writable(option: &str, path: &std::path::Path) -> Result<()> {
    if path.is_dir() {
        anyhow::bail!("{option} {}: a directory, not a file", path.display());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let probe = dir.join(format!(".lobster-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .with_context(|| format!("{option} {}: cannot write there", path.display()))
}

/// `--cluster`: every strategy on every node of the job in this process; node 0's results
/// head the report, every node's follow, as an MPI job reports them.
fn run_nodes(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    cache_bytes: u64,
    config: &RunConfig,
    resume: Option<&(PathBuf, LoaderState)>,
) -> Result<()> {
    let mut per_node: Vec<Vec<StrategyResult>> = (0..args.nodes).map(|_| Vec::new()).collect();
    for &strategy in &args.strategy.0 {
        let results = nodes::run_strategy(args, dataset, cache_bytes, strategy, resume)?;
        for (node, (metrics, measured)) in results.into_iter().enumerate() {
            per_node[node].push(StrategyResult::new(strategy, metrics, measured));
        }
    }
    for results in &mut per_node {
        report::set_speedups(results);
    }
    let values = per_node
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let results = per_node.swap_remove(0);
    report::print_table(&results);
    report::print_skipped(&results);
    report::print_nodes(&values);
    report::print_cluster(&values, config);
    if let Some(path) = &args.json {
        report::write_json(path, config, &results, Some(&values))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs one strategy with its own loader, resumed from `resume` if given, to its end or to
/// --stop-after-iterations; returns the loader's state when it stopped early.
fn run_strategy(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    cache_bytes: u64,
    strategy: Strategy,
    cluster: Option<&cluster::Cluster>,
    resume: Option<&(PathBuf, LoaderState)>,
) -> Result<(RunMetrics, Measured, Option<LoaderState>)> {
    process::reset_peak_rss();
    let cpu_before = process::cpu_seconds();
    let peers = cluster.and_then(cluster::Cluster::peers);
    let started = Instant::now();
    let (loader, loader_config) = build::loader(
        args,
        dataset,
        cache_bytes,
        strategy,
        args.node,
        peers,
        resume.map(|(_, s)| s.clone()),
    )
    .with_context(|| {
        resume.map_or("starting".into(), |(p, _)| {
            format!("resuming from {}", p.display())
        })
    })?;
    let build_s = started.elapsed().as_secs_f64();
    let cache_capacity_bytes = loader_config.cache.capacity_bytes;
    // What the loader is, before it runs.
    let loader_figures = Measured {
        backend: report::backend_name(&loader),
        prefetch_window_bytes: loader.prefetch_window_bytes(),
        cache_capacity_bytes,
        ..Measured::default()
    };
    if args.ranks_as == RanksAs::Processes {
        let (metrics, node) =
            processes::host_and_ranks(args, dataset, strategy, &loader_config, loader)?;
        let measured = Measured {
            peak_rss_bytes: node.peak_pss_bytes,
            memory: "peak sum of PSS, host and rank processes",
            cpu_seconds: process::cpu_seconds() - cpu_before + node.ranks_cpu_seconds,
            batches_crc32: Some(batches_crc32(
                &node.runs.iter().map(|r| r.totals).collect::<Vec<_>>(),
            )),
            start: None,
            step_crc32: step_digests(&node.runs),
            ..loader_figures
        };
        return Ok((metrics, measured, None));
    }
    let (metrics, runs, stopped, start) =
        train_threads(args, loader, strategy, cluster, (started, build_s), resume)?;
    let totals: Vec<RankTotals> = runs.iter().map(|r| r.totals).collect();
    let measured = Measured {
        peak_rss_bytes: process::status_bytes("VmHWM"),
        memory: "peak RSS of this process",
        cpu_seconds: process::cpu_seconds() - cpu_before,
        batches_crc32: Some(batches_crc32(&totals)),
        start: Some(start),
        step_crc32: step_digests(&runs),
        ..loader_figures
    };
    Ok((metrics, measured, stopped))
}

/// Trains on the loader's rank handles, ranks as threads of this process: the metrics, each
/// rank's run, the state where it stopped (with `--stop-after-iterations`) and what the
/// start cost (`started`: when the build began, and how long it took).
fn train_threads(
    args: &RunArgs,
    mut loader: lobster_io::Loader<decode::Decoded>,
    strategy: Strategy,
    cluster: Option<&cluster::Cluster>,
    (started, build_s): (Instant, f64),
    resume: Option<&(PathBuf, LoaderState)>,
) -> Result<(RunMetrics, Vec<RankRun>, Option<LoaderState>, StartFigures)> {
    let positions = loader.positions();
    let steps = loader.steps();
    // A resumed run's first epoch is what is left of the interrupted one.
    let first_epoch_steps = positions
        .head
        .map_or(positions.iterations, |h| h.0)
        .min(steps);
    let at = positions.after(0, 0);
    let stop_after = args.stop_after_iterations;
    let bar = report::progress_bar(
        args.quiet,
        strategy,
        stop_after.map_or(steps, |k| k.min(steps)),
    );
    let handles = loader.ranks().context("rank handles already taken")?;
    let compute = Duration::from_secs_f64(args.compute_ms / 1e3);
    let job_barrier = cluster.map(|c| move || c.barrier());
    if let Some(c) = cluster {
        // Every node's loader is built (its peers' plans replayed) before any trains.
        c.barrier()?;
    }
    let runs = train_steps(
        handles,
        compute,
        strategy.name(),
        TrainSteps {
            stop_after,
            first_epoch: first_epoch_steps,
        },
        |_| bar.inc(1),
        job_barrier
            .as_ref()
            .map(|b| b as &(dyn Fn() -> Result<()> + Sync)),
        decode::collate,
    )?;
    bar.finish_and_clear();
    let metrics = loader.metrics();
    let stopped = stop_after.map(|_| loader.state());
    // Dropping joins the loader's threads, so their CPU time is counted.
    drop(loader);
    let (first_batch_s, first_epoch_s) = (
        slowest_since(&runs, started, |r| r.first_batch),
        slowest_since(&runs, started, |r| r.first_epoch_end),
    );
    let first_epoch_samples = runs.iter().map(|r| r.first_epoch_delivered).sum::<u64>();
    let start = StartFigures {
        resumed_from: resume.map(|(p, _)| p.clone()),
        epoch: at.epoch,
        iteration: at.iteration,
        steps,
        // Only a run that stopped before its end.
        stopped_after_iterations: stop_after.filter(|&k| k < steps),
        build_s,
        first_batch_s,
        first_epoch_steps,
        first_epoch_samples,
        first_epoch_s,
        first_epoch_samples_per_second: first_epoch_s
            .filter(|&t| t > 0.0)
            .map(|t| first_epoch_samples as f64 / t),
    };
    Ok((metrics, runs, stopped, start))
}

/// When the slowest rank reached what `at` says it reached, in seconds from `started`; `None`
/// if a rank never did.
fn slowest_since(
    runs: &[RankRun],
    started: Instant,
    at: impl Fn(&RankRun) -> Option<Instant>,
) -> Option<f64> {
    runs.iter()
        .map(|r| at(r).map(|t| t.duration_since(started).as_secs_f64()))
        .collect::<Option<Vec<f64>>>()
        .and_then(|t| t.into_iter().reduce(f64::max))
}

/// Each step's batches as one digest: the ranks' batch CRCs in rank order.
fn step_digests(runs: &[RankRun]) -> Vec<StepDigest> {
    let kept = runs.iter().map(|r| r.steps.len()).min().unwrap_or(0);
    (0..kept)
        .map(|i| {
            let mut crc = crc32fast::Hasher::new();
            for r in runs {
                crc.update(&r.steps[i].2.to_le_bytes());
            }
            let (epoch, iteration, _) = runs[0].steps[i];
            StepDigest {
                epoch,
                iteration,
                crc32: crc.finalize(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::args::tests::parse;
    use super::*;

    fn small_run(dir: &Path, extra: &[&str]) -> (RunArgs, PathBuf) {
        let data = dir.join("data");
        if !data.exists() {
            crate::gen::generate(&data, 48, 3, 4.0, 1).unwrap();
        }
        let json = dir.join("run.json");
        let data_s = data.to_str().unwrap();
        let json_s = json.to_str().unwrap();
        let mut args = vec![
            "--quiet",
            "--data",
            data_s,
            "--json",
            json_s,
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--batch",
            "4",
            "--epochs",
            "3",
            "--compute-ms",
            "0",
            "--storage-mbps",
            "0",
            // No --decoder: with --data it decodes JPEG.
            "--decode-threads",
            "2",
            "--io-depth",
            "4",
        ];
        args.extend_from_slice(extra);
        (parse(&args).unwrap(), json)
    }

    #[test]
    fn skip_reports_the_same_injected_faults_on_both_executions() {
        let dir = tempfile::tempdir().unwrap();
        // nopfs and lobster-alloc-only share the static cache: same reads, same faults, one
        // through read-then-decode workers, the other through the pipelined reader.
        let (args, json) = small_run(
            dir.path(),
            &[
                "--strategy",
                "nopfs,lobster-alloc-only",
                "--on-error",
                "skip",
                "--max-failures",
                "100%",
                "--inject-faults",
                "seed=4,eio=0.1,short=0.3,corrupt=0.1",
            ],
        );
        let cpu_before = process::cpu_seconds();
        run(&args).unwrap();
        let cpu_s = process::cpu_seconds() - cpu_before;
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        // Each strategy's CPU time is its own share of the whole run's: decoding JPEGs costs
        // ticks, and the shares cannot add up to more than the run used.
        let cpu: Vec<f64> = report["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["cpu_seconds"].as_f64().unwrap())
            .collect();
        assert!(cpu.iter().all(|&c| c > 0.0), "{cpu:?}");
        assert!(
            cpu.iter().sum::<f64>() <= cpu_s + 1e-9,
            "{cpu:?} of {cpu_s}"
        );
        let sets: Vec<BTreeSet<(u64, u64, u64)>> = report["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let list = r["skipped_samples"].as_array().unwrap();
                assert_eq!(r["skipped"].as_u64().unwrap() as usize, list.len());
                list.iter()
                    .map(|s| {
                        assert!(!s["cause"].as_str().unwrap().is_empty());
                        let n = |k: &str| s[k].as_u64().unwrap();
                        (n("epoch"), n("rank"), n("sample"))
                    })
                    .collect()
            })
            .collect();
        assert_eq!(sets.len(), 2);
        assert!(!sets[0].is_empty());
        assert_eq!(sets[0], sets[1]);
    }

    #[test]
    fn every_strategy_delivers_the_same_batches() {
        let dir = tempfile::tempdir().unwrap();
        let all = "pytorch,nopfs,lobster-cache-only,lobster-alloc-only,lobster";
        let crcs = |extra: &[&str]| -> Vec<serde_json::Value> {
            let mut with = vec!["--strategy", all];
            with.extend_from_slice(extra);
            let (args, json) = small_run(dir.path(), &with);
            run(&args).unwrap();
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
            report["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["batches_crc32"].clone())
                .collect()
        };
        let raw = crcs(&["--decoder", "raw"]);
        assert_eq!(raw.len(), 5);
        assert!(raw.iter().all(|c| c.is_u64() && *c == raw[0]), "{raw:?}");
        // The synthetic decoder's value is its bytes' digest, whatever time it spins.
        let synthetic = crcs(&["--decoder", "synthetic", "--decode-us-per-kb", "1"]);
        assert!(
            synthetic.iter().all(|c| *c == synthetic[0]),
            "{synthetic:?}"
        );
        assert_ne!(raw[0], synthetic[0]);
        // Another seed delivers other batches.
        let seed = crcs(&["--decoder", "raw", "--seed", "9"]);
        assert_ne!(raw[0], seed[0]);
    }

    #[test]
    fn fail_stops_the_run_naming_the_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (args, _) = small_run(
            dir.path(),
            &[
                "--strategy",
                "lobster,pytorch",
                "--inject-faults",
                "seed=4,eio=0.2",
            ],
        );
        let e = format!("{:#}", run(&args).unwrap_err());
        assert!(e.contains("lobster: rank"), "{e}");
        assert!(
            e.contains("reading sample") && e.contains("injected EIO"),
            "{e}"
        );
    }

    #[test]
    fn images_are_transformed_and_collated_for_either_transform() {
        let dir = tempfile::tempdir().unwrap();
        for transform in ["train", "eval"] {
            let (args, json) = small_run(
                dir.path(),
                &[
                    "--strategy",
                    "lobster,pytorch",
                    "--transform",
                    transform,
                    "--image-size",
                    "32",
                ],
            );
            run(&args).unwrap();
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
            assert_eq!(report["config"]["transform"], transform);
            let results = report["results"].as_array().unwrap();
            for r in results {
                assert_eq!(r["samples"], 48 * 3, "{transform}");
            }
            // The cache (decoded images kept by lobster) changes no pixel of any batch.
            assert!(results[0]["batches_crc32"].is_u64(), "{transform}");
            assert_eq!(
                results[0]["batches_crc32"], results[1]["batches_crc32"],
                "{transform}"
            );
        }
        let e = parse(&["--transform", "train", "--decoder", "raw"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("--decoder jpeg"), "{e}");
    }

    #[test]
    fn a_truncated_jpeg_in_a_users_folder_fails_by_default_naming_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let (args, _) = small_run(dir.path(), &["--strategy", "lobster"]);
        let data = dir.path().join("data");
        let first = |dir: &Path| {
            std::fs::read_dir(dir)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path()
        };
        let victim = first(&first(&data));
        let bytes = std::fs::read(&victim).unwrap();
        std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();
        let name = victim.file_name().unwrap().to_str().unwrap();
        // The generated set is reopened with the file's new size: only the decoder sees it.
        let e = format!("{:#}", run(&args).unwrap_err());
        assert!(e.contains(name) && e.contains("decod"), "{e}");
    }
}
