//! `lobster-bench s3-proxy`: the delaying proxy of lobster-testkit as a process, so that every
//! loader compared in a benchmark (lobster, and the Python peers) reads one S3 server on
//! loopback with the same latency per request and bandwidth per node, counted the same way.
//!
//! It prints `node I http://127.0.0.1:P` per node, then runs until SIGINT or SIGTERM. With
//! `--counts-json` it writes every node's counts since the start (never reset: a benchmark
//! takes the difference of two snapshots for an epoch) every `--counts-every-ms` and at exit,
//! each time to a temporary file renamed over the last, so a reader never sees half a file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lobster_testkit::proxy::{DelayProxy, ProxyConfig, ProxyCounts};
use serde::Serialize;

/// Arguments of `lobster-bench s3-proxy`.
#[derive(Clone, Debug, clap::Args)]
pub struct S3ProxyArgs {
    /// The server to forward to, HOST:PORT.
    #[arg(long)]
    pub upstream: String,
    /// Emulated nodes: one listening port on 127.0.0.1 each.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Latency added to every HTTP request before it is forwarded, ms.
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    /// Each node's server-to-client bandwidth in megabits per second (1 Mbps = 125,000
    /// bytes/s), shared by all of the node's connections; 0: unlimited.
    #[arg(long, default_value_t = 0.0)]
    pub node_mbps: f64,
    /// Also add the latency once to every new connection (the TCP handshake).
    #[arg(long)]
    pub delay_accept: bool,
    /// Write every node's counts (connections, requests, bytes up and down) here, as JSON.
    #[arg(long)]
    pub counts_json: Option<PathBuf>,
    /// How often to write `--counts-json`, ms; 0: only at exit.
    #[arg(long, default_value_t = 1000, requires = "counts_json")]
    pub counts_every_ms: u64,
}

/// The `--counts-json` file.
#[derive(Debug, Serialize)]
struct CountsFile {
    upstream: SocketAddr,
    latency_ms: u64,
    /// `null`: unlimited.
    node_bytes_per_s: Option<u64>,
    delay_accept: bool,
    /// Since the proxy started.
    elapsed_ms: u64,
    /// True in the file written at exit.
    last: bool,
    nodes: Vec<NodeCounts>,
}

#[derive(Debug, Serialize)]
struct NodeCounts {
    node: usize,
    endpoint: String,
    connections: u64,
    requests: u64,
    up_bytes: u64,
    down_bytes: u64,
}

/// Runs the proxy until SIGINT or SIGTERM.
pub fn run(args: &S3ProxyArgs) -> Result<()> {
    let upstream = resolve(&args.upstream)?;
    let node_bytes_per_s = bytes_per_s(args.node_mbps)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .with_context(|| format!("handling signal {signal}"))?;
    }
    let config = ProxyConfig {
        upstream,
        nodes: args.nodes,
        latency: Duration::from_millis(args.latency_ms),
        node_bytes_per_s,
        delay_accept: args.delay_accept,
    };
    let proxy = DelayProxy::start(config).context("starting the proxy")?;
    let started = Instant::now();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for node in 0..args.nodes {
            writeln!(out, "node {node} {}", proxy.endpoint(node))?;
        }
        // Whoever started the proxy reads the endpoints from a pipe: it must have them now.
        out.flush()?;
    }
    let every = Duration::from_millis(args.counts_every_ms);
    let mut next_write = started + every;
    // Polled: a signal handler may only set the flag.
    let poll = Duration::from_millis(20);
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(poll);
        if let Some(path) = &args.counts_json {
            if !every.is_zero() && Instant::now() >= next_write {
                write_counts(path, &proxy, &config, started, false)?;
                next_write += every;
                // Behind (a stalled machine): the next write is a period from now, not a burst.
                next_write = next_write.max(Instant::now());
            }
        }
    }
    if let Some(path) = &args.counts_json {
        write_counts(path, &proxy, &config, started, true)?;
    }
    for node in 0..args.nodes {
        let c = proxy.counts(node);
        println!(
            "node {node} connections {} requests {} up_bytes {} down_bytes {}",
            c.connections, c.requests, c.up_bytes, c.down_bytes
        );
    }
    Ok(())
}

fn resolve(upstream: &str) -> Result<SocketAddr> {
    let mut addrs = upstream
        .to_socket_addrs()
        .with_context(|| format!("--upstream {upstream}: not a HOST:PORT that resolves"))?;
    match addrs.next() {
        Some(addr) => Ok(addr),
        None => bail!("--upstream {upstream}: resolves to no address"),
    }
}

/// Megabits per second as bytes per second; `None` for 0 (unlimited).
fn bytes_per_s(mbps: f64) -> Result<Option<u64>> {
    if !mbps.is_finite() || mbps < 0.0 {
        bail!("--node-mbps {mbps}: must be a finite number >= 0");
    }
    let rate = (mbps * 125_000.0).round();
    if mbps > 0.0 && rate < 1.0 {
        bail!("--node-mbps {mbps}: below one byte per second");
    }
    // In range: finite, >= 1 and far below u64::MAX for any bandwidth one can type.
    Ok((rate >= 1.0).then_some(rate as u64))
}

fn write_counts(
    path: &Path,
    proxy: &DelayProxy,
    config: &ProxyConfig,
    started: Instant,
    last: bool,
) -> Result<()> {
    let file = CountsFile {
        upstream: config.upstream,
        latency_ms: u64::try_from(config.latency.as_millis()).unwrap_or(u64::MAX),
        node_bytes_per_s: config.node_bytes_per_s,
        delay_accept: config.delay_accept,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        last,
        nodes: (0..config.nodes)
            .map(|node| {
                let ProxyCounts {
                    connections,
                    requests,
                    up_bytes,
                    down_bytes,
                } = proxy.counts(node);
                NodeCounts {
                    node,
                    endpoint: proxy.endpoint(node),
                    connections,
                    requests,
                    up_bytes,
                    down_bytes,
                }
            })
            .collect(),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, serde_json::to_string_pretty(&file)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bytes_per_s;

    #[test]
    fn megabits_per_second_become_bytes_per_second() {
        assert_eq!(bytes_per_s(0.0).unwrap(), None);
        assert_eq!(bytes_per_s(100.0).unwrap(), Some(12_500_000));
        assert_eq!(bytes_per_s(0.5).unwrap(), Some(62_500));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e-9] {
            assert!(bytes_per_s(bad).is_err(), "{bad}");
        }
    }
}
