//! A delaying proxy on loopback: per-request latency and per-node bandwidth between clients and
//! one upstream server (an S3 server in the benches), where the kernel has no netem.
//!
//! Each emulated node gets a listening port on 127.0.0.1; all of that node's clients use it.
//! Every connection is forwarded to the upstream address, and:
//! - each HTTP request waits `latency` before it is forwarded. A request starts with the first
//!   client bytes on a connection, or with client bytes after the server sent response bytes:
//!   HTTP/1.1 clients do not pipeline, and a body arriving in several chunks is delayed once
//!   (the server answers only once it is complete). `Expect: 100-continue` costs one more
//!   `latency`, since the `100` is response bytes;
//! - with `delay_accept` (off by default), a new connection also waits `latency` before it is
//!   connected upstream and read, standing for the TCP handshake; the kernel has completed the
//!   handshake already, so the client sees this as a first request slower by `latency`;
//! - server→client bytes go through one pacer per node, shared by all its connections, in
//!   chunks of at most [`CHUNK_BYTES`]: each chunk books the next `bytes / rate` of the node's
//!   link and is written when its booking ends. Chunks are booked in arrival order, so
//!   concurrent connections share the rate fairly, and idle time is not saved up as a burst;
//! - per node it counts connections, requests, bytes up and bytes down.
//!
//! The proxy runs a tokio runtime on a thread of its own; the handle is synchronous, and
//! dropping it closes every listener and connection and joins the thread.
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::TcpListener;
//! use std::time::{Duration, Instant};
//! use lobster_testkit::proxy::{DelayProxy, ProxyConfig};
//!
//! // An upstream that answers one request with "ok" and closes.
//! let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
//! let config = ProxyConfig {
//!     upstream: upstream.local_addr().unwrap(),
//!     nodes: 1,
//!     latency: Duration::from_millis(30),
//!     node_bytes_per_s: None,
//!     delay_accept: false,
//! };
//! let server = std::thread::spawn(move || {
//!     let (mut s, _) = upstream.accept().unwrap();
//!     let mut request = [0u8; 4];
//!     s.read_exact(&mut request).unwrap();
//!     s.write_all(b"ok").unwrap();
//! });
//! let proxy = DelayProxy::start(config).unwrap();
//! assert!(proxy.endpoint(0).starts_with("http://127.0.0.1:"));
//! let started = Instant::now();
//! let mut client = std::net::TcpStream::connect(proxy.addr(0)).unwrap();
//! client.write_all(b"GET ").unwrap();
//! let mut answer = Vec::new();
//! client.read_to_end(&mut answer).unwrap();
//! assert_eq!(answer, b"ok");
//! assert!(started.elapsed() >= Duration::from_millis(30));
//! server.join().unwrap();
//! let counts = proxy.take_counts(0);
//! assert_eq!((counts.requests, counts.up_bytes, counts.down_bytes), (1, 4, 2));
//! ```

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::time::Instant;

/// The most bytes copied at once in either direction, and the pacer's unit of sharing.
pub const CHUNK_BYTES: usize = 64 << 10;

/// Connections open at once per node; more wait in the listener's backlog. Bounds the
/// proxy's tasks and buffers (two chunks per connection).
pub const MAX_CONNECTIONS_PER_NODE: usize = 1024;

/// The most nodes (listening ports) one proxy serves.
pub const MAX_NODES: usize = 1024;

/// What [`DelayProxy::start`] sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The server every connection is forwarded to.
    pub upstream: SocketAddr,
    /// Emulated nodes: one listening port each, `1..=MAX_NODES`.
    pub nodes: usize,
    /// Added before each request is forwarded (zero: none).
    pub latency: Duration,
    /// Each node's server→client bandwidth; `None` or `Some(0)`: unlimited.
    pub node_bytes_per_s: Option<u64>,
    /// Also wait `latency` on each new connection, before connecting upstream (the TCP
    /// handshake's round trip). Off by default in `lobster-bench s3-proxy`.
    pub delay_accept: bool,
}

/// One node's counts since the proxy started or since the last [`DelayProxy::take_counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    /// Connections accepted.
    pub connections: u64,
    /// HTTP requests seen (each delayed once).
    pub requests: u64,
    /// Client→server bytes forwarded (counted as they are handed to the server).
    pub up_bytes: u64,
    /// Server→client bytes forwarded (counted as they are handed to the client).
    pub down_bytes: u64,
}

/// A running proxy; dropping it stops it (listeners and open connections closed) and joins
/// its thread.
#[derive(Debug)]
pub struct DelayProxy {
    addrs: Vec<SocketAddr>,
    nodes: Arc<[Node]>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// One node: its pacer and counters.
#[derive(Debug)]
struct Node {
    pacer: Option<Pacer>,
    connections: AtomicU64,
    requests: AtomicU64,
    up_bytes: AtomicU64,
    down_bytes: AtomicU64,
}

/// A node's link: the time its last booked chunk is through.
#[derive(Debug)]
struct Pacer {
    bytes_per_s: u64,
    booked_until: Mutex<Option<Instant>>,
}

impl Pacer {
    /// Waits until `bytes` may be sent: after every chunk booked before them, and
    /// `bytes / rate` after the later of now and the previous booking's end.
    async fn take(&self, bytes: usize) {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_s as f64);
        let done = {
            // A poisoned lock only means a task panicked while holding an Instant: the value is
            // still a valid booking.
            let mut booked = self.booked_until.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = booked.map_or(now, |b| b.max(now));
            let done = start + cost;
            *booked = Some(done);
            done
        };
        tokio::time::sleep_until(done).await;
    }
}

impl DelayProxy {
    /// Binds one port per node on 127.0.0.1 and starts forwarding to `config.upstream`.
    ///
    /// Fails with `InvalidInput` for `nodes` outside `1..=MAX_NODES`, or with the error of
    /// binding a port, building the runtime or spawning its thread.
    pub fn start(config: ProxyConfig) -> io::Result<DelayProxy> {
        if config.nodes == 0 || config.nodes > MAX_NODES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("proxy nodes = {}: must be in 1..={MAX_NODES}", config.nodes),
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| with_context(e, "building the proxy's runtime"))?;
        let mut listeners = Vec::with_capacity(config.nodes);
        let mut addrs = Vec::with_capacity(config.nodes);
        {
            // Registering the listeners with the runtime's reactor needs its context.
            let _context = runtime.enter();
            for node in 0..config.nodes {
                let bind = |e| with_context(e, &format!("binding node {node}'s port"));
                let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(bind)?;
                listener.set_nonblocking(true).map_err(bind)?;
                addrs.push(listener.local_addr().map_err(bind)?);
                listeners.push(TcpListener::from_std(listener).map_err(bind)?);
            }
        }
        let nodes: Arc<[Node]> = (0..config.nodes)
            .map(|_| Node {
                pacer: config
                    .node_bytes_per_s
                    .filter(|&rate| rate > 0)
                    .map(|bytes_per_s| Pacer {
                        bytes_per_s,
                        booked_until: Mutex::new(None),
                    }),
                connections: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                up_bytes: AtomicU64::new(0),
                down_bytes: AtomicU64::new(0),
            })
            .collect();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread_nodes = nodes.clone();
        let thread = std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    for (index, listener) in listeners.into_iter().enumerate() {
                        tokio::spawn(accept_loop(listener, index, thread_nodes.clone(), config));
                    }
                    // A send or the handle's drop: either way, stop.
                    let _ = stopped.await;
                });
                // Dropping the runtime drops every connection's task, closing its sockets.
                drop(runtime);
            })
            .map_err(|e| with_context(e, "spawning the proxy's thread"))?;
        Ok(DelayProxy {
            addrs,
            nodes,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Node `node`'s listening address, 127.0.0.1:P.
    ///
    /// # Panics
    /// If `node` is not below the configured `nodes`.
    pub fn addr(&self, node: usize) -> SocketAddr {
        self.addrs[self.check(node)]
    }

    /// Node `node`'s endpoint URL, `http://127.0.0.1:P`.
    ///
    /// # Panics
    /// If `node` is not below the configured `nodes`.
    pub fn endpoint(&self, node: usize) -> String {
        format!("http://{}", self.addr(node))
    }

    /// Node `node`'s counts so far.
    ///
    /// # Panics
    /// If `node` is not below the configured `nodes`.
    pub fn counts(&self, node: usize) -> ProxyCounts {
        let n = &self.nodes[self.check(node)];
        ProxyCounts {
            connections: n.connections.load(Ordering::Relaxed),
            requests: n.requests.load(Ordering::Relaxed),
            up_bytes: n.up_bytes.load(Ordering::Relaxed),
            down_bytes: n.down_bytes.load(Ordering::Relaxed),
        }
    }

    /// Node `node`'s counts so far, each counter reset to zero as it is read (no count is
    /// lost between two calls).
    ///
    /// # Panics
    /// If `node` is not below the configured `nodes`.
    pub fn take_counts(&self, node: usize) -> ProxyCounts {
        let n = &self.nodes[self.check(node)];
        ProxyCounts {
            connections: n.connections.swap(0, Ordering::Relaxed),
            requests: n.requests.swap(0, Ordering::Relaxed),
            up_bytes: n.up_bytes.swap(0, Ordering::Relaxed),
            down_bytes: n.down_bytes.swap(0, Ordering::Relaxed),
        }
    }

    /// Number of nodes (listening ports).
    pub fn nodes(&self) -> usize {
        self.addrs.len()
    }

    fn check(&self, node: usize) -> usize {
        assert!(
            node < self.addrs.len(),
            "node {node} of a proxy with {} nodes",
            self.addrs.len()
        );
        node
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() && !std::thread::panicking() {
                panic!("the delay proxy's thread panicked");
            }
        }
    }
}

fn with_context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

async fn accept_loop(listener: TcpListener, index: usize, nodes: Arc<[Node]>, config: ProxyConfig) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_NODE));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return; // never closed
        };
        match listener.accept().await {
            Ok((client, _)) => {
                nodes[index].connections.fetch_add(1, Ordering::Relaxed);
                let nodes = nodes.clone();
                tokio::spawn(async move {
                    // An error (upstream refused, a reset) ends this connection only; dropping
                    // the sockets closes both sides.
                    let _ = forward(client, &nodes[index], &config).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of descriptors or an aborted handshake: pause rather than spin.
                eprintln!("delay proxy: node {index} accepting: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn forward(mut client: TcpStream, node: &Node, config: &ProxyConfig) -> io::Result<()> {
    if config.delay_accept && !config.latency.is_zero() {
        tokio::time::sleep(config.latency).await;
    }
    let mut server = TcpStream::connect(config.upstream).await?;
    // Chunks are written whole as they come: Nagle would only add delay that is not asked for.
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    // True: the next client bytes start a request.
    let answered = AtomicBool::new(true);
    let up = async {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            if answered.swap(false, Ordering::SeqCst) {
                node.requests.fetch_add(1, Ordering::Relaxed);
                if !config.latency.is_zero() {
                    tokio::time::sleep(config.latency).await;
                }
            }
            // Counted before the write, so that a peer holding the bytes finds them counted.
            node.up_bytes.fetch_add(n as u64, Ordering::Relaxed);
            server_write.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return client_write.shutdown().await;
            }
            // Set on reading, before the client can have the bytes, so its next request is
            // seen as one.
            answered.store(true, Ordering::SeqCst);
            if let Some(pacer) = &node.pacer {
                pacer.take(n).await;
            }
            node.down_bytes.fetch_add(n as u64, Ordering::Relaxed);
            client_write.write_all(&buf[..n]).await?;
        }
    };
    tokio::try_join!(up, down).map(|_| ())
}
