//! One node's loader for a strategy, as `lobster run` configures it.

use std::sync::Arc;

use anyhow::{Context, Result};
use lobster_io::net::Transport;
use lobster_io::{Dataset, Loader, LoaderBuilder, LoaderConfig, LoaderState, SampleMeta};

use super::args::RunArgs;
use super::decode::{self, Decoded, Decoder};
use super::processes;
use super::strategy::Strategy;

/// The loader of node `node` for `strategy`, with `peers` if the job has them, resumed from
/// `resume` if given, and the configuration it runs with.
pub(crate) fn loader(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    cache_bytes: u64,
    strategy: Strategy,
    node: usize,
    peers: Option<Arc<dyn Transport>>,
    resume: Option<LoaderState>,
) -> Result<(Loader<Decoded>, LoaderConfig)> {
    let peers = match peers {
        Some(p) if args.net_mbps > 0.0 => {
            let params = lobster_io::net::LinkParams::new(args.net_mbps, args.net_latency_us)
                .context("--net-mbps / --net-latency-us")?;
            let link = lobster_io::net::EmulatedLink::wrap(p, params)
                .context("starting the emulated interconnect")?;
            Some(Arc::new(link) as Arc<dyn Transport>)
        }
        other => other,
    };
    let mut config = args.strategy_config(cache_bytes, strategy)?;
    config.job.node = node;
    let loader_config = config.clone();
    let (decoder, us_per_kb, seed) = (args.decoder(), args.decode_us_per_kb, args.seed);
    let pixels_max = args.image_pixels_max;
    let transform = args.transform.transform(args.image_size);
    let builder = LoaderBuilder::new(dataset.clone())
        .config(config)
        .seed(seed);
    let mut builder = match decoder {
        // Real images decode in two stages, so that the cache may keep the first's image.
        Decoder::Jpeg => builder.decode_in_two_stages(
            move |bytes: &[u8], meta: &SampleMeta| decode::decode_image(bytes, meta, pixels_max),
            move |image, meta, epoch| decode::finish_image(transform, (seed, epoch), image, meta),
        ),
        _ => builder.decode_in_epoch(move |bytes: &[u8], meta: &SampleMeta, epoch| {
            decode::decode(
                decoder,
                us_per_kb,
                transform,
                pixels_max,
                (seed, epoch),
                bytes,
                meta,
            )
        }),
    };
    // A decoded sample is a transformed image or a digest, never more than this (a rank
    // process's slot holds batch_size of them): the loader's memory check counts them.
    let collation = collation(args);
    builder = builder
        .decoded_sample_bytes_max(processes::sample_bytes(args))
        .reserve_memory(collation.what, collation.bytes);
    if let Some(peers) = peers {
        builder = builder.peers(peers);
    }
    if let Some(state) = resume {
        builder = builder.resume_from(state);
    }
    let loader = builder
        .build()
        .with_context(|| format!("starting the {strategy} loader of node {node}"))?;
    Ok((loader, loader_config))
}

/// The ranks' `[B, H, W, 3]` buffers, where the samples are transformed images.
fn collation(args: &RunArgs) -> lobster_io::MemoryPart {
    let bytes = match args.transform {
        super::decode::TransformArg::None => 0,
        _ => (args.ranks_per_node as u64)
            .saturating_mul(args.batch_size as u64)
            .saturating_mul(processes::sample_bytes(args)),
    };
    lobster_io::MemoryPart::new(
        "the ranks' collation buffers (--ranks-per-node x --batch-size x --image-size^2 x 3)",
        bytes,
    )
}

/// Checks every strategy's loader configuration before any runs, so that a bad option is
/// refused up front, naming the option, and not after the strategies before it ran.
pub(crate) fn check_strategies(args: &RunArgs, dataset: &Dataset, cache_bytes: u64) -> Result<()> {
    for &strategy in &args.strategy.0 {
        let mut config = args.strategy_config(cache_bytes, strategy)?;
        if let Err(e) = config.validate(dataset.len()) {
            let option = match &e {
                lobster_io::Error::InvalidParameter { parameter, .. } => {
                    option_of(parameter, config.execution)
                }
                _ => None,
            };
            return Err(match option {
                Some(option) => anyhow::anyhow!("{option}: {e} (strategy {strategy})"),
                None => anyhow::anyhow!("{e} (strategy {strategy})"),
            });
        }
        // As `loader` bounds each decoded sample.
        config.limits.decoded_sample_bytes_max = Some(processes::sample_bytes(args));
        let mut memory = config.memory_parts(dataset);
        memory.push(collation(args));
        lobster_io::MachineMemory::now()
            .check(&memory)
            .with_context(|| format!("strategy {strategy}"))?;
    }
    Ok(())
}

/// The option of `lobster run` that sets a loader parameter.
fn option_of(parameter: &str, execution: lobster_io::Execution) -> Option<&'static str> {
    Some(match parameter {
        // Read-then-decode strategies' threads are their workers.
        "decode_threads" if execution == lobster_io::Execution::ReadThenDecode => {
            "--workers-per-rank (times --ranks-per-node)"
        }
        "decode_threads" => "--decode-threads",
        "io_depth" => "--io-depth",
        "batch_size" => "--batch-size",
        "ranks_per_node" => "--ranks-per-node",
        "nodes" => "--nodes",
        "node" => "--node",
        "world" => "--nodes x --ranks-per-node",
        "epochs" => "--epochs",
        "prefetch_iterations" => "--prefetch-iterations",
        "hysteresis" => "--hysteresis",
        "cache_bytes" => "--cache-bytes / --cache-frac",
        "cache_forms" => "--cache-forms",
        "disk_cache" => "--disk-cache",
        "disk_cache_bytes" => "--disk-cache-bytes",
        "decoded_max_side" => "--decoded-max-side",
        "image_pixels_max" => "--image-pixels-max",
        "max_failures" => "--max-failures",
        "storage bandwidth_bytes_per_s" => "--storage-mbps",
        "storage latency_us" => "--storage-latency-us",
        _ => return None,
    })
}
