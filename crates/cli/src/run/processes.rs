//! `--ranks-as processes`: the node's ranks as processes, as torchrun runs them. This process
//! hosts the loader (lobster-node) and runs this program again once per local rank with
//! `--rank-process R`; each rank attaches, trains (consume, compute, a step barrier with the
//! others) and exits. The node's memory is the peak of the processes' summed PSS.

use std::ffi::OsString;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use lobster_image::Collator;
use lobster_io::{Dataset, Loader, LoaderConfig, RunMetrics};
use lobster_node::{fingerprint, HostOptions, NodeEnv, NodeError, NodeHost, NodeRank};

use super::args::RunArgs;
use super::decode::{Decoded, Decoder, TransformArg};
use super::strategy::Strategy;
use super::train::{digest_parts, RankRun, RankTotals, STEP_DIGESTS_MAX};
use crate::process;

/// How long a rank waits for the host, and the host for the ranks.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

/// What the processes run measured besides the loader's metrics.
pub(crate) struct NodeMeasured {
    /// The peak over the run of the host's and the ranks' summed PSS.
    pub peak_pss_bytes: u64,
    /// CPU seconds of the rank processes.
    pub ranks_cpu_seconds: f64,
    /// What each rank was delivered, as a rank thread digests it, in rank order.
    pub runs: Vec<RankRun>,
}

/// The line a rank process ends its standard output with: its batches' digests.
const DIGESTS_LINE: &str = "lobster-rank-digests ";

/// A rank process's batches as [`RankRun`] digests them, sent to the host when it ends.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct RankDigests {
    delivered: u64,
    skipped: u64,
    crc32: u32,
    /// (epoch, iteration, CRC-32) of its first [`STEP_DIGESTS_MAX`] batches.
    steps: Vec<(u32, u32, u32)>,
}

impl RankDigests {
    /// The digests in `said` (a rank process's standard output); an error when missing.
    fn parse(said: &str) -> Result<RankRun> {
        let line = said
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(DIGESTS_LINE))
            .context("it ended without its batches' digests")?;
        let d: RankDigests = serde_json::from_str(line).context("its batches' digests")?;
        Ok(RankRun {
            totals: RankTotals {
                delivered: d.delivered,
                skipped: d.skipped,
                crc32: d.crc32,
            },
            steps: d.steps,
            ..RankRun::default()
        })
    }
}

/// Where this run's rank `local_rank` stands, in the job `job`.
fn node_env(args: &RunArgs, job: &str, local_rank: usize) -> Result<NodeEnv> {
    let rpn = args.ranks_per_node;
    Ok(NodeEnv::new(
        args.node * rpn + local_rank,
        args.nodes * rpn,
        local_rank,
        rpn,
        args.node,
        args.nodes,
        job,
    )?)
}

/// Bytes of one decoded sample as the host places it.
pub(super) fn sample_bytes(args: &RunArgs) -> u64 {
    match (args.decoder(), args.transform) {
        (Decoder::Jpeg, t) if t != TransformArg::None => {
            u64::from(args.image_size) * u64::from(args.image_size) * 3
        }
        _ => 8,
    }
}

/// This program's arguments for rank process `local_rank` of `strategy`: the run's own,
/// without the options only the host acts on.
fn rank_argv(args: &RunArgs, strategy: Strategy, job: &str, local_rank: usize) -> Vec<OsString> {
    // `--policy` is `--strategy`'s old name; the host alone resumes its loader.
    const HOST_ONLY: [&str; 6] = [
        "--json",
        "--ranks-as",
        "--strategy",
        "--policy",
        "--data",
        "--resume",
    ];
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in std::env::args_os().skip(1) {
        if skip_value {
            skip_value = false;
            continue;
        }
        let s = a.to_string_lossy();
        if HOST_ONLY.contains(&s.as_ref()) {
            skip_value = true;
            continue;
        }
        // Given again below.
        if s == "--quiet" {
            continue;
        }
        if HOST_ONLY.iter().any(|f| s.starts_with(&format!("{f}="))) {
            continue;
        }
        out.push(a);
    }
    let data = args.data.clone().expect("the host resolves --data first");
    out.extend::<[OsString; 9]>([
        "--strategy".into(),
        strategy.name().into(),
        "--data".into(),
        data.into_os_string(),
        "--rank-process".into(),
        local_rank.to_string().into(),
        "--node-job".into(),
        job.into(),
        "--quiet".into(),
    ]);
    out
}

/// Hosts `loader` for the node's ranks, runs a process per rank, and waits for them all.
pub(crate) fn host_and_ranks(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    strategy: Strategy,
    config: &LoaderConfig,
    loader: Loader<Decoded>,
) -> Result<(RunMetrics, NodeMeasured)> {
    let job = format!("run-{}-{}", std::process::id(), strategy.name());
    let env = node_env(args, &job, 0)?;
    let options = HostOptions {
        slots_per_rank: args.prefetch_iterations + 2,
        slot_bytes: args.batch_size as u64 * sample_bytes(args),
        attach_timeout: ATTACH_TIMEOUT,
    };
    let host = NodeHost::start(
        &env,
        loader,
        fingerprint(dataset, config, args.seed),
        options,
    )
    .with_context(|| format!("starting the {strategy} host"))?;
    let cpu_before = process::children_cpu_seconds();
    let exe = std::env::current_exe().context("finding this program to run the ranks")?;
    type Said = std::thread::JoinHandle<String>;
    let mut ranks: Vec<(Child, Said, Said)> = Vec::new();
    let read_all = |mut from: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            // Bounded: a rank says a line of digests and at most an error.
            let _ = (&mut from).take(64 << 20).read_to_string(&mut s);
            s
        })
    };
    for r in 0..args.ranks_per_node {
        let mut child = Command::new(&exe)
            .args(rank_argv(args, strategy, &job, r))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting rank process {r}"))?;
        let out = read_all(Box::new(child.stdout.take().expect("piped")));
        let err = read_all(Box::new(child.stderr.take().expect("piped")));
        ranks.push((child, out, err));
    }
    let mut children: Vec<&mut Child> = ranks.iter_mut().map(|(c, _, _)| c).collect();
    let (codes, peak_pss_bytes) = wait_for_ranks(&mut children, &host)?;
    let (outs, said): (Vec<String>, Vec<String>) = ranks
        .into_iter()
        .map(|(_, out, err)| {
            (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            )
        })
        .unzip();
    let hosted = host.wait();
    let ranks_cpu_seconds = process::children_cpu_seconds() - cpu_before;
    // A rank's own failure names its cause; the others only say a rank stopped.
    let failed: Vec<(usize, &String)> = codes
        .iter()
        .zip(&said)
        .enumerate()
        .filter(|(_, (c, _))| !c.is_some_and(|c| c.success()))
        .map(|(r, (_, s))| (r, s))
        .collect();
    if let Some((r, s)) = failed
        .iter()
        .find(|(_, s)| !s.contains(ANOTHER_RANK))
        .or(failed.first())
    {
        bail!("{strategy}: rank process {r}: {}", s.trim());
    }
    let metrics = hosted.map_err(|e| anyhow!("{strategy}: the host: {e}"))?;
    let runs = outs
        .iter()
        .enumerate()
        .map(|(r, out)| {
            RankDigests::parse(out).with_context(|| format!("{strategy}: rank process {r}"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((
        metrics,
        NodeMeasured {
            peak_pss_bytes,
            ranks_cpu_seconds,
            runs,
        },
    ))
}

/// Waits for every rank process to exit, sampling the node's memory (the peak sum of PSS,
/// this process's and the ranks') meanwhile: their exit statuses and that peak. A rank that
/// fails (even before attaching) stops the job now, not at the attach timeout.
fn wait_for_ranks(
    children: &mut [&mut Child],
    host: &NodeHost,
) -> Result<(Vec<Option<std::process::ExitStatus>>, u64)> {
    let mut peak_pss_bytes = 0;
    let mut codes: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        let mut pss = process::pss_bytes("self");
        for (i, child) in children.iter_mut().enumerate() {
            if codes[i].is_none() {
                pss += process::pss_bytes(&child.id().to_string());
                codes[i] = child.try_wait().context("waiting for a rank process")?;
                if let Some(code) = codes[i].filter(|c| !c.success()) {
                    host.stop(format!("rank process {i} exited with {code}"));
                }
            }
        }
        peak_pss_bytes = peak_pss_bytes.max(pss);
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((codes, peak_pss_bytes))
}

/// What a rank says when it stops because another rank failed.
const ANOTHER_RANK: &str = "another rank failed";

/// A rank process: attach to the host, then train as a rank thread of `--ranks-as threads`
/// does: per batch consume it, compute, and meet the other ranks.
pub(crate) fn rank_process(args: &RunArgs, local_rank: usize, job: &str) -> Result<()> {
    let [strategy] = args.strategy.0[..] else {
        bail!("a rank process runs one strategy");
    };
    let data = args.data.as_ref().context("a rank process needs --data")?;
    // The sample table is the host's: a rank opens it only to say which configuration it
    // attaches with, and holds nothing of it while it trains (a million samples' table in
    // every rank process would be the per-rank memory one engine per node avoids).
    let attaching = {
        let dataset = Dataset::open(&data.to_string_lossy())
            .with_context(|| format!("opening the dataset {}", data.display()))?;
        let cache_bytes = args.cache_capacity_bytes(&dataset);
        let config = args.strategy_config(cache_bytes, strategy)?;
        fingerprint(&dataset, &config, args.seed)
    };
    let env = node_env(args, job, local_rank)?;
    let mut rank = NodeRank::attach(&env, attaching, ATTACH_TIMEOUT)?;
    let compute = Duration::from_secs_f64(args.compute_ms / 1e3);
    let side = args.image_size;
    let images = sample_bytes(args) > 8;
    let mut collator: Option<Collator> = None;
    let mut step = 0u64;
    let mut digests = RankDigests::default();
    let mut crc = crc32fast::Hasher::new();
    while let Some(batch) = rank.next() {
        let failure = match batch {
            Ok(b) => {
                // Digested as a rank thread digests its batch, so both modes' CRCs compare.
                let mut one = crc32fast::Hasher::new();
                let samples = b.samples.iter().enumerate();
                digest_parts(
                    &mut one,
                    samples.map(|(i, p)| (p.id, p.label, b.bytes(i))),
                    &b.skipped,
                );
                crc.combine(&one);
                digests.delivered += b.samples.len() as u64;
                digests.skipped += b.skipped.len() as u64;
                if digests.steps.len() < STEP_DIGESTS_MAX {
                    digests.steps.push((b.epoch, b.iteration, one.finalize()));
                }
                if images {
                    let c =
                        collator.get_or_insert_with(|| Collator::new(args.batch_size, side, side));
                    c.clear();
                    for (i, p) in b.samples.iter().enumerate() {
                        c.push(b.bytes(i), p.label)
                            .context("collating a transformed image")?;
                    }
                    std::hint::black_box(c.images());
                } else {
                    for i in 0..b.samples.len() {
                        std::hint::black_box(b.bytes(i));
                    }
                }
                drop(b);
                if !compute.is_zero() {
                    std::thread::sleep(compute);
                }
                None
            }
            // A failed batch: the step is met, then every rank stops, as with threads.
            Err(NodeError::Batch { reason, .. }) => Some(reason),
            Err(e) => return Err(e.into()),
        };
        let stop = rank.step(step, failure.is_some())?;
        if let Some(reason) = failure {
            bail!("{strategy}: rank {local_rank}: {reason}");
        }
        if stop {
            bail!("{ANOTHER_RANK} at step {step}");
        }
        step += 1;
    }
    digests.crc32 = crc.finalize();
    println!("{DIGESTS_LINE}{}", serde_json::to_string(&digests)?);
    Ok(())
}
