//! `lobster-bench s3-server`: a real S3 server (s3s-fs, as the tests run it) as a process, for
//! benchmarks that compare lobster with other loaders reading one bucket: it serves the
//! buckets under `--root` on 127.0.0.1, uploads local directories into them by PUT first (so
//! the server keeps each object's ETag), prints its endpoint and credentials, and runs until
//! SIGINT or SIGTERM. The credentials are the test server's fixed pair, not a secret.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lobster_testkit::s3::TestS3;

/// Arguments of `lobster-bench s3-server`.
#[derive(Clone, Debug, clap::Args)]
pub struct S3ServerArgs {
    /// The directory the buckets live in (kept when the server stops).
    #[arg(long)]
    pub root: PathBuf,
    /// The port on 127.0.0.1; 0: a free one.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Uploads, before serving: BUCKET/PREFIX=DIR puts every file under DIR as
    /// `PREFIX/<its path under DIR>` in BUCKET (made if missing). Repeatable.
    #[arg(long)]
    pub upload: Vec<String>,
    /// Stop once the uploads are done (to fill a root another run serves).
    #[arg(long)]
    pub upload_only: bool,
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: &S3ServerArgs) -> Result<()> {
    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("--root {}", args.root.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .with_context(|| format!("handling signal {signal}"))?;
    }
    let s3 = TestS3::start_in(&args.root, args.port);
    for spec in &args.upload {
        let (bucket, prefix, dir) = upload_spec(spec)?;
        let n = upload(&s3, bucket, prefix, Path::new(dir))?;
        eprintln!("uploaded {n} objects to s3://{bucket}/{prefix}");
    }
    if args.upload_only {
        return Ok(());
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "endpoint {}", s3.endpoint())?;
        writeln!(out, "access_key {}", s3.access_key())?;
        writeln!(out, "secret_key {}", s3.secret_key())?;
        // Whoever started the server reads these from a pipe: it must have them now.
        out.flush()?;
    }
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("requests {}", s3.requests());
    Ok(())
}

/// `BUCKET/PREFIX=DIR` as its three parts.
fn upload_spec(spec: &str) -> Result<(&str, &str, &str)> {
    let Some((target, dir)) = spec.split_once('=') else {
        bail!("--upload {spec}: expected BUCKET/PREFIX=DIR");
    };
    let (bucket, prefix) = target.split_once('/').unwrap_or((target, ""));
    if bucket.is_empty() || dir.is_empty() {
        bail!("--upload {spec}: expected BUCKET/PREFIX=DIR");
    }
    Ok((bucket, prefix.trim_end_matches('/'), dir))
}

/// Puts every file under `dir` as `prefix/<path under dir>`; returns how many.
fn upload(s3: &TestS3, bucket: &str, prefix: &str, dir: &Path) -> Result<usize> {
    if !s3.root().join(bucket).is_dir() {
        s3.create_bucket(bucket);
    }
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    for path in &files {
        let rel = path.strip_prefix(dir).expect("found under dir");
        let rel = rel
            .to_str()
            .with_context(|| format!("{}: not UTF-8", path.display()))?;
        let key = match prefix {
            "" => rel.to_owned(),
            p => format!("{p}/{rel}"),
        };
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        s3.put(bucket, &key, bytes);
    }
    Ok(files.len())
}
