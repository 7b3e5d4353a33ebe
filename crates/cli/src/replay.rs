//! `lobster replay`: replay an access trace through a cache policy and count hits.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::{Context, Result};
use lobster_io::cache::{trace, PolicyKind};

/// Arguments of `lobster replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Trace file: one access a line, `SAMPLE_ID SIZE_BYTES`; `#` starts a comment.
    #[arg(long)]
    pub trace: PathBuf,
    /// Cache capacity in bytes.
    #[arg(long)]
    pub capacity_bytes: u64,
    /// Cache policy: reuse, lru or static.
    #[arg(long)]
    pub policy: PolicyKind,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ReplayArgs) -> Result<()> {
    let file = File::open(&args.trace)
        .with_context(|| format!("opening trace {}", args.trace.display()))?;
    let parsed = trace::parse(BufReader::new(file))
        .with_context(|| format!("parsing trace {}", args.trace.display()))?;
    let stats = trace::replay(&parsed, args.capacity_bytes, args.policy)?;
    if args.json {
        let out = serde_json::json!({
            "policy": args.policy.as_str(),
            "capacity_bytes": args.capacity_bytes,
            "accesses": stats.accesses,
            "hits": stats.hits,
            "misses": stats.misses,
            "hit_bytes": stats.hit_bytes,
            "miss_bytes": stats.miss_bytes,
        });
        println!("{out}");
    } else {
        println!("policy          {}", args.policy);
        println!("capacity_bytes  {}", args.capacity_bytes);
        println!(
            "samples         {} ({} bytes)",
            parsed.num_samples(),
            parsed.dataset_bytes()
        );
        println!("accesses        {}", stats.accesses);
        println!(
            "hits            {} ({:.2}%)",
            stats.hits,
            100.0 * stats.hit_ratio()
        );
        println!("misses          {}", stats.misses);
        println!("hit_bytes       {}", stats.hit_bytes);
        println!("miss_bytes      {}", stats.miss_bytes);
    }
    Ok(())
}
