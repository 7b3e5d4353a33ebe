//! `lobster replay`: replay an access trace through a cache policy and count hits.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::PathBuf;

use anyhow::{Context, Result};
use lobster_cache::{trace, PolicyKind};

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

/// The longest trace line read: an access is two 32-bit numbers, and a comment may follow.
const TRACE_LINE_MAX_BYTES: usize = 4096;

/// A trace's bytes, refused at the first line past [`TRACE_LINE_MAX_BYTES`]: a file
/// without line ends (a device, a binary file) is not read into one line without end. The
/// trace as a whole is streamed, held as 4 bytes an access up to the parser's bound.
struct BoundedLines<R> {
    inner: R,
    line_bytes: usize,
}

impl<R: Read> Read for BoundedLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            self.line_bytes = if b == b'\n' { 0 } else { self.line_bytes + 1 };
            if self.line_bytes > TRACE_LINE_MAX_BYTES {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::FileTooLarge,
                    format!("a line of more than {TRACE_LINE_MAX_BYTES} bytes"),
                ));
            }
        }
        Ok(n)
    }
}

pub fn run(args: &ReplayArgs) -> Result<()> {
    let file = File::open(&args.trace)
        .with_context(|| format!("opening trace {}", args.trace.display()))?;
    let lines = BoundedLines {
        inner: file,
        line_bytes: 0,
    };
    let parsed = trace::parse(BufReader::new(lines))
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
