//! `lobster run --cluster`: every node of the job in this process, as an MPI job runs them:
//! each node its own loader (and emulated storage link), its ranks as threads, the nodes in
//! lock-step (a barrier across them after every step, standing in for DDP's all-reduce), and
//! peers' caches reached through the in-process transport.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::{Context, Result};
use lobster_io::net::{InProcessNodes, Transport};
use lobster_io::{Dataset, RunMetrics};

use super::args::RunArgs;
use super::build;
use super::decode;
use super::report::{self, Measured};
use super::strategy::Strategy;
use super::train::{batches_crc32, train, RankTotals};
use crate::process;

/// Runs `strategy` on every node; each node's metrics and what was measured, in node order.
pub(crate) fn run_strategy(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    cache_bytes: u64,
    strategy: Strategy,
    resume: Option<&(std::path::PathBuf, lobster_io::LoaderState)>,
) -> Result<Vec<(RunMetrics, Measured)>> {
    process::reset_peak_rss();
    let cpu_before = process::cpu_seconds();
    let transports = InProcessNodes::connect(args.nodes);
    let mut loaders = Vec::with_capacity(args.nodes);
    for (node, t) in transports.iter().enumerate() {
        let peers = t.clone() as Arc<dyn Transport>;
        loaders.push(
            build::loader(
                args,
                dataset,
                cache_bytes,
                strategy,
                node,
                Some(peers),
                resume.map(|(_, s)| s.clone()),
            )
            .with_context(|| match resume {
                Some((path, _)) => format!("node {node}: resuming from {}", path.display()),
                None => format!("node {node}: starting"),
            })?,
        );
    }
    let steps = loaders[0].0.steps();
    let bar = report::progress_bar(args.quiet, strategy, steps);
    let bar = &bar;
    let compute = Duration::from_secs_f64(args.compute_ms / 1e3);
    let job = Barrier::new(args.nodes);
    let job_barrier = || -> Result<()> {
        job.wait();
        Ok(())
    };
    let handles = loaders
        .iter_mut()
        .map(|(l, _)| l.ranks().context("rank handles already taken"))
        .collect::<Result<Vec<_>>>()?;
    let totals = train_nodes(handles, compute, strategy, bar, &job_barrier)?;
    bar.finish_and_clear();
    let mut out = Vec::with_capacity(args.nodes);
    let mut measured = Vec::with_capacity(args.nodes);
    for ((loader, config), totals) in loaders.iter().zip(&totals) {
        measured.push((
            report::backend_name(loader),
            loader.prefetch_window_bytes(),
            config.cache.capacity_bytes,
            batches_crc32(totals),
        ));
        out.push(loader.metrics());
    }
    // Dropping joins the loaders' threads, so their CPU time is counted.
    drop(loaders);
    let cpu_seconds = process::cpu_seconds() - cpu_before;
    let peak_rss_bytes = process::status_bytes("VmHWM");
    Ok(out
        .into_iter()
        .zip(measured)
        .map(|(metrics, (backend, window, capacity, crc))| {
            let m = Measured {
                backend,
                peak_rss_bytes,
                memory: "peak RSS of this process, every node's loader in it",
                prefetch_window_bytes: window,
                cache_capacity_bytes: capacity,
                cpu_seconds,
                batches_crc32: Some(crc),
                start: None,
                step_crc32: Vec::new(),
            };
            (metrics, m)
        })
        .collect())
}

/// Trains every node's ranks at once, a thread per node: each node's rank totals, in node
/// order.
fn train_nodes(
    handles: Vec<Vec<lobster_io::RankHandle<decode::Decoded>>>,
    compute: Duration,
    strategy: Strategy,
    bar: &indicatif::ProgressBar,
    job_barrier: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Vec<Vec<RankTotals>>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(node, ranks)| {
                s.spawn(move || {
                    train(
                        ranks,
                        compute,
                        strategy.name(),
                        |_| {
                            if node == 0 {
                                bar.inc(1);
                            }
                        },
                        Some(job_barrier as &(dyn Fn() -> Result<()> + Sync)),
                        decode::collate,
                    )
                    .with_context(|| format!("node {node}"))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a node's training thread panicked"))
            .collect::<Result<Vec<_>>>()
    })
}
