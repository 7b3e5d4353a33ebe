//! `lobster order`: one rank's sample indices for an epoch, to compare with another sampler.

use anyhow::Result;
use lobster_io::{DistributedSampler, EpochOrder};

/// Arguments of `lobster order`.
#[derive(Debug, clap::Args)]
pub struct OrderArgs {
    /// Number of samples in the dataset.
    #[arg(long)]
    pub samples: usize,
    /// Sampler seed (PyTorch's DistributedSampler seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Epoch (the permutation is seeded with seed + epoch).
    #[arg(long, default_value_t = 0)]
    pub epoch: u32,
    /// Number of ranks in the world.
    #[arg(long)]
    pub world: usize,
    /// The rank whose indices to print.
    #[arg(long)]
    pub rank: usize,
    /// Drop the tail instead of padding with the head.
    #[arg(long)]
    pub drop_last: bool,
}

pub fn run(args: &OrderArgs) -> Result<()> {
    let sampler = DistributedSampler::new(
        args.samples,
        args.world,
        args.drop_last,
        EpochOrder::Shuffle { seed: args.seed },
    )?;
    if args.rank >= args.world {
        anyhow::bail!("--rank = {}: allowed 0..{}", args.rank, args.world);
    }
    println!(
        "{}",
        serde_json::to_string(&sampler.rank_indices(args.epoch, args.rank))?
    );
    Ok(())
}
