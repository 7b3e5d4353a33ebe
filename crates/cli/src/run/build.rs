//! One node's loader for a strategy, as `lobster run` configures it.

use std::sync::Arc;

use anyhow::{Context, Result};
use lobster_io::net::Transport;
use lobster_io::{Dataset, Loader, LoaderBuilder, LoaderConfig, LoaderState, SampleMeta};

use super::args::{RanksAs, RunArgs};
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
    let mut config = args.loader_config()?;
    config.job.node = node;
    strategy.apply(&args.budgets(cache_bytes)?, &mut config);
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
    if args.ranks_as == RanksAs::Processes {
        // A rank's slot holds batch_size samples of this: a larger one is a bad sample.
        builder = builder.decoded_sample_bytes_max(processes::sample_bytes(args));
    }
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
