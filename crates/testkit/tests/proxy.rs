//! The delaying proxy over real loopback sockets, in front of a tiny HTTP/1.1 keep-alive
//! server. Times are checked only from below: a request through a proxy of latency L cannot be
//! answered in less than L, and n bytes paced at r bytes/s cannot arrive in less than n / r.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_testkit::process::guarded;
use lobster_testkit::proxy::{DelayProxy, ProxyConfig, ProxyCounts};

const MIB: usize = 1 << 20;

/// Bytes the test server received and sent, over all its connections.
#[derive(Debug, Default)]
struct ServerBytes {
    received: AtomicU64,
    sent: AtomicU64,
}

/// A keep-alive HTTP/1.1 server: `METHOD /<n> HTTP/1.1` with an optional `Content-Length`
/// body is answered with `n` body bytes. It runs until the test process ends.
fn http_server() -> (SocketAddr, Arc<ServerBytes>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = Arc::new(ServerBytes::default());
    let server_bytes = bytes.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let bytes = server_bytes.clone();
            std::thread::spawn(move || {
                let _ = serve(stream, &bytes);
            });
        }
    });
    (addr, bytes)
}

fn serve(stream: TcpStream, bytes: &ServerBytes) -> io::Result<()> {
    let mut write = stream.try_clone()?;
    let mut read = BufReader::new(stream);
    loop {
        let Some(head) = read_head(&mut read)? else {
            return Ok(());
        };
        bytes
            .received
            .fetch_add(head.len() as u64, Ordering::SeqCst);
        let head = String::from_utf8(head).unwrap();
        let path = head.split(' ').nth(1).unwrap();
        let answer_bytes: usize = path.trim_start_matches('/').parse().unwrap();
        let mut body = vec![0u8; content_length(&head)];
        read.read_exact(&mut body)?;
        bytes
            .received
            .fetch_add(body.len() as u64, Ordering::SeqCst);
        let mut answer =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {answer_bytes}\r\n\r\n").into_bytes();
        answer.extend((0..answer_bytes).map(|i| i as u8));
        // Counted before it is written, so the client that holds the answer finds it counted.
        bytes.sent.fetch_add(answer.len() as u64, Ordering::SeqCst);
        write.write_all(&answer)?;
    }
}

/// A request's or response's head, through the blank line; `None` at the end of the stream.
fn read_head(read: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let start = head.len();
        if read.read_until(b'\n', &mut head)? == 0 {
            assert!(head.is_empty(), "stream ended inside a head");
            return Ok(None);
        }
        if &head[start..] == b"\r\n" {
            return Ok(Some(head));
        }
    }
}

fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A keep-alive client on one connection, counting what it sent and received.
struct Client {
    write: TcpStream,
    read: BufReader<TcpStream>,
    sent_bytes: u64,
    received_bytes: u64,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let write = TcpStream::connect(addr).unwrap();
        // Long enough for any test here; a hang fails instead of blocking the run.
        write
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let read = BufReader::new(write.try_clone().unwrap());
        Client {
            write,
            read,
            sent_bytes: 0,
            received_bytes: 0,
        }
    }

    /// Asks for `answer_bytes` bytes, sending `body` in `pieces` writes `gap` apart; returns
    /// the answer's body and how long the whole exchange took.
    fn request(
        &mut self,
        answer_bytes: usize,
        body: &[u8],
        pieces: usize,
        gap: Duration,
    ) -> (Vec<u8>, Duration) {
        let started = Instant::now();
        let mut request = if body.is_empty() {
            format!("GET /{answer_bytes} HTTP/1.1\r\nHost: test\r\n\r\n")
        } else {
            format!(
                "POST /{answer_bytes} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
        }
        .into_bytes();
        request.extend_from_slice(body);
        let piece_bytes = request.len().div_ceil(pieces);
        for (i, piece) in request.chunks(piece_bytes).enumerate() {
            if i > 0 {
                std::thread::sleep(gap);
            }
            self.write.write_all(piece).unwrap();
        }
        self.sent_bytes += request.len() as u64;
        let head = read_head(&mut self.read).unwrap().expect("an answer");
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut answer = vec![0u8; content_length(&head)];
        self.read.read_exact(&mut answer).unwrap();
        self.received_bytes += (head.len() + answer.len()) as u64;
        (answer, started.elapsed())
    }

    fn get(&mut self, answer_bytes: usize) -> (Vec<u8>, Duration) {
        self.request(answer_bytes, &[], 1, Duration::ZERO)
    }
}

fn config(upstream: SocketAddr, nodes: usize, latency_ms: u64) -> ProxyConfig {
    ProxyConfig {
        upstream,
        nodes,
        latency: Duration::from_millis(latency_ms),
        node_bytes_per_s: None,
        delay_accept: false,
    }
}

/// The stream was closed by the other side: end of stream or a reset, not a timeout.
fn assert_closed(stream: &mut TcpStream, what: &str) {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("{what}: {n} bytes instead of a closed connection"),
        Err(e) => assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
            ),
            "{what}: {e} instead of a closed connection"
        ),
    }
}

#[test]
fn every_request_on_a_keep_alive_connection_waits_the_latency_and_is_counted() {
    let (upstream, server) = http_server();
    let proxy = DelayProxy::start(config(upstream, 1, 50)).unwrap();
    let mut client = Client::connect(proxy.addr(0));
    let sizes = [0, 10, 1000, 100_000, 7];
    for &size in &sizes {
        let (answer, took) = client.get(size);
        assert_eq!(answer, (0..size).map(|i| i as u8).collect::<Vec<_>>());
        assert!(
            took >= Duration::from_millis(50),
            "a request of {size} bytes through a 50 ms proxy answered in {took:?}"
        );
    }
    let counts = proxy.counts(0);
    assert_eq!(
        counts,
        ProxyCounts {
            connections: 1,
            requests: sizes.len() as u64,
            up_bytes: client.sent_bytes,
            down_bytes: client.received_bytes,
        }
    );
    assert_eq!(counts.up_bytes, server.received.load(Ordering::SeqCst));
    assert_eq!(counts.down_bytes, server.sent.load(Ordering::SeqCst));
}

#[test]
fn a_body_in_several_writes_is_one_request_delayed_once() {
    let (upstream, server) = http_server();
    let proxy = DelayProxy::start(config(upstream, 1, 50)).unwrap();
    let mut client = Client::connect(proxy.addr(0));
    let body: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
    // Pieces further apart than the latency: each reaches the proxy on its own, after the
    // one before was forwarded.
    let (answer, took) = client.request(100, &body, 3, Duration::from_millis(80));
    assert_eq!(answer.len(), 100);
    assert!(took >= Duration::from_millis(50), "{took:?}");
    assert_eq!(proxy.counts(0).requests, 1, "one request in three writes");
    // The next request on the connection is a request again.
    let (_, took) = client.get(10);
    assert!(took >= Duration::from_millis(50), "{took:?}");
    let counts = proxy.counts(0);
    assert_eq!(counts.requests, 2);
    assert_eq!(counts.up_bytes, client.sent_bytes);
    assert_eq!(counts.up_bytes, server.received.load(Ordering::SeqCst));
    assert_eq!(counts.down_bytes, client.received_bytes);
}

#[test]
fn delay_accept_adds_the_latency_to_a_new_connection() {
    let (upstream, _server) = http_server();
    let proxy = DelayProxy::start(ProxyConfig {
        delay_accept: true,
        ..config(upstream, 1, 40)
    })
    .unwrap();
    let started = Instant::now();
    let mut client = Client::connect(proxy.addr(0));
    client.get(10);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(80), "{took:?}");
    // On the open connection, only the request's latency.
    let (_, took) = client.get(10);
    assert!(took >= Duration::from_millis(40), "{took:?}");
    assert_eq!(proxy.counts(0).requests, 2);
}

fn paced(upstream: SocketAddr, nodes: usize, bytes_per_s: u64) -> DelayProxy {
    DelayProxy::start(ProxyConfig {
        node_bytes_per_s: Some(bytes_per_s),
        ..config(upstream, nodes, 0)
    })
    .unwrap()
}

#[test]
fn a_node_bandwidth_paces_the_answer() {
    let (upstream, _server) = http_server();
    let proxy = paced(upstream, 1, 4 * MIB as u64);
    let mut client = Client::connect(proxy.addr(0));
    let (answer, took) = client.get(2 * MIB);
    assert_eq!(answer.len(), 2 * MIB);
    // 2 MiB at 4 MiB/s: at least 0.5 s (the head's bytes are paced too).
    assert!(
        took >= Duration::from_millis(450),
        "2 MiB at 4 MiB/s in {took:?}"
    );
    assert_eq!(proxy.counts(0).down_bytes, client.received_bytes);
}

#[test]
fn connections_of_one_node_share_its_bandwidth() {
    let (upstream, _server) = http_server();
    let proxy = paced(upstream, 1, 4 * MIB as u64);
    let addr = proxy.addr(0);
    let started = Instant::now();
    let clients: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                let (answer, _) = client.get(MIB);
                assert_eq!(answer.len(), MIB);
                client.received_bytes
            })
        })
        .collect();
    let received: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let took = started.elapsed();
    // 1 MiB each would take 0.25 s with a bucket per connection; 2 MiB through the node's
    // one bucket takes at least 0.5 s.
    assert!(
        took >= Duration::from_millis(450),
        "2 × 1 MiB at 4 MiB/s in {took:?}"
    );
    let counts = proxy.counts(0);
    assert_eq!((counts.connections, counts.requests), (2, 2));
    assert_eq!(counts.down_bytes, received);
}

#[test]
fn two_nodes_are_paced_and_counted_each_on_its_own() {
    let (upstream, server) = http_server();
    let proxy = paced(upstream, 2, 4 * MIB as u64);
    let sizes = [2 * MIB, MIB];
    let addrs = [proxy.addr(0), proxy.addr(1)];
    let clients: Vec<_> = (0..2)
        .map(|node| {
            let (addr, size) = (addrs[node], sizes[node]);
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                let (answer, took) = client.get(size);
                assert_eq!(answer.len(), size);
                (client.sent_bytes, client.received_bytes, took)
            })
        })
        .collect();
    let results: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    // Each node's answer is held to its own node's rate, from below.
    let (_, _, took0) = results[0];
    assert!(
        took0 >= Duration::from_millis(450),
        "2 MiB at 4 MiB/s in {took0:?}"
    );
    let (_, _, took1) = results[1];
    assert!(
        took1 >= Duration::from_millis(200),
        "1 MiB at 4 MiB/s in {took1:?}"
    );
    for (node, &(sent, received, _)) in results.iter().enumerate() {
        let counts = proxy.counts(node);
        assert_eq!(
            counts,
            ProxyCounts {
                connections: 1,
                requests: 1,
                up_bytes: sent,
                down_bytes: received,
            },
            "node {node}"
        );
    }
    let down: u64 = (0..2).map(|n| proxy.counts(n).down_bytes).sum();
    assert_eq!(down, server.sent.load(Ordering::SeqCst));
}

#[test]
fn take_counts_reads_and_resets() {
    let (upstream, _server) = http_server();
    let proxy = DelayProxy::start(config(upstream, 2, 0)).unwrap();
    let mut client = Client::connect(proxy.addr(1));
    client.get(100);
    client.get(200);
    let first = proxy.take_counts(1);
    assert_eq!(
        first,
        ProxyCounts {
            connections: 1,
            requests: 2,
            up_bytes: client.sent_bytes,
            down_bytes: client.received_bytes,
        }
    );
    assert_eq!(proxy.counts(1), ProxyCounts::default());
    assert_eq!(proxy.take_counts(1), ProxyCounts::default());
    assert_eq!(
        proxy.counts(0),
        ProxyCounts::default(),
        "node 0 saw nothing"
    );
    // After the reset, the same connection counts from zero.
    client.get(300);
    let second = proxy.take_counts(1);
    assert_eq!(second.connections, 0);
    assert_eq!(second.requests, 1);
    assert_eq!(second.up_bytes, client.sent_bytes - first.up_bytes);
    assert_eq!(second.down_bytes, client.received_bytes - first.down_bytes);
}

#[test]
fn drop_with_connections_open_returns_and_closes_them() {
    let (upstream, _server) = http_server();
    let proxy = DelayProxy::start(ProxyConfig {
        latency: Duration::from_secs(60),
        node_bytes_per_s: Some(1024),
        ..config(upstream, 2, 0)
    })
    .unwrap();
    // One connection idle, one with a request waiting out its 60 s latency.
    let idle = TcpStream::connect(proxy.addr(0)).unwrap();
    let mut waiting = TcpStream::connect(proxy.addr(1)).unwrap();
    waiting.write_all(b"GET /1000000 HTTP/1.1\r\n\r\n").unwrap();
    // Both accepted before the drop (the accept loop counts them).
    let waited = Instant::now();
    while proxy.counts(0).connections + proxy.counts(1).connections < 2 {
        assert!(waited.elapsed() < Duration::from_secs(20), "never accepted");
        std::thread::sleep(Duration::from_millis(5));
    }
    let ((), _) = guarded("dropping the proxy with connections open".into(), || {
        drop(proxy)
    });
    for (mut stream, what) in [(idle, "idle"), (waiting, "waiting")] {
        assert_closed(&mut stream, what);
    }
}

#[test]
fn drop_during_a_paced_answer_returns() {
    let (upstream, _server) = http_server();
    // 1 MiB at 64 KiB/s: about 16 s, far longer than the test waits.
    let proxy = paced(upstream, 1, 64 << 10);
    let mut stream = TcpStream::connect(proxy.addr(0)).unwrap();
    stream.write_all(b"GET /1048576 HTTP/1.1\r\n\r\n").unwrap();
    // The first paced bytes have come: the answer is under way.
    let mut first = [0u8; 1];
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.read_exact(&mut first).unwrap();
    let ((), _) = guarded("dropping the proxy during a paced answer".into(), || {
        drop(proxy)
    });
    // What was forwarded may still be read; then the stream ends.
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.len() < 1 << 20, "the whole answer after the drop"),
        Err(e) => assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
            ),
            "{e}"
        ),
    }
}

#[test]
fn an_upstream_refusing_connections_closes_the_client() {
    // A port that was bound and is now closed refuses connections.
    let upstream = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let proxy = DelayProxy::start(config(upstream, 1, 10)).unwrap();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(proxy.addr(0)).unwrap();
        // The write may already find the connection closed.
        let _ = stream.write_all(b"GET /1 HTTP/1.1\r\n\r\n");
        assert_closed(&mut stream, "a client of a refusing upstream");
    }
    let counts = proxy.counts(0);
    assert_eq!(counts.connections, 3);
    assert_eq!(
        (counts.requests, counts.up_bytes, counts.down_bytes),
        (0, 0, 0)
    );
}

#[test]
fn nodes_out_of_range_are_refused() {
    let upstream: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for nodes in [0, lobster_testkit::proxy::MAX_NODES + 1] {
        let e = DelayProxy::start(config(upstream, nodes, 0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&format!("nodes = {nodes}")), "{e}");
    }
    let proxy = DelayProxy::start(config(upstream, 3, 0)).unwrap();
    assert_eq!(proxy.nodes(), 3);
    let ports: std::collections::BTreeSet<_> = (0..3).map(|n| proxy.addr(n).port()).collect();
    assert_eq!(ports.len(), 3, "one port per node");
    for n in 0..3 {
        assert!(proxy.addr(n).ip().is_loopback());
        assert_eq!(proxy.endpoint(n), format!("http://{}", proxy.addr(n)));
    }
}
