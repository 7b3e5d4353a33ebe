//! `lobster-bench s3-proxy` through the built binary: it prints one endpoint per node,
//! forwards with the latency, writes the counts while it runs and at SIGTERM, and exits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";

/// A server answering every connection's request with `ANSWER`, then closing it.
fn upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut read = BufReader::new(stream.try_clone().unwrap());
            let mut line = Vec::new();
            while read.read_until(b'\n', &mut line).unwrap_or(0) > 0 && line != b"\r\n" {
                line.clear();
            }
            let _ = (&stream).write_all(ANSWER);
        }
    });
    addr
}

fn read_json(path: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

#[test]
fn s3_proxy_forwards_counts_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("counts.json");
    let upstream = upstream();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .args([
            "s3-proxy",
            "--upstream",
            &upstream.to_string(),
            "--nodes",
            "2",
        ])
        .args([
            "--latency-ms",
            "30",
            "--node-mbps",
            "8",
            "--counts-every-ms",
            "50",
        ])
        .arg("--counts-json")
        .arg(&json)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut endpoints = Vec::new();
    for node in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let endpoint = line
            .trim()
            .strip_prefix(&format!("node {node} http://"))
            .unwrap_or_else(|| panic!("{line:?}"))
            .to_string();
        endpoints.push(endpoint);
    }

    let request = b"GET /bucket/key HTTP/1.1\r\nHost: test\r\n\r\n";
    let started = Instant::now();
    let mut client = TcpStream::connect(&endpoints[1]).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    client.write_all(request).unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, ANSWER);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(30), "{took:?}");

    // The periodic file shows the request while the proxy runs.
    let waited = Instant::now();
    loop {
        let seen = read_json(&json).is_some_and(|c| c["nodes"][1]["requests"] == 1);
        if seen {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "no counts written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let waited = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if waited.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("s3-proxy did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("node 1 connections 1 requests 1"), "{rest}");

    let counts = read_json(&json).unwrap();
    assert_eq!(counts["last"], true, "{counts}");
    assert_eq!(counts["latency_ms"], 30);
    assert_eq!(counts["node_bytes_per_s"], 1_000_000);
    assert_eq!(counts["delay_accept"], false);
    let node = |n: usize, k: &str| counts["nodes"][n][k].as_u64().unwrap();
    assert_eq!(node(1, "connections"), 1);
    assert_eq!(node(1, "requests"), 1);
    assert_eq!(node(1, "up_bytes"), request.len() as u64);
    assert_eq!(node(1, "down_bytes"), ANSWER.len() as u64);
    for k in ["connections", "requests", "up_bytes", "down_bytes"] {
        assert_eq!(node(0, k), 0, "node 0 {k}");
    }
    assert_eq!(
        counts["nodes"][1]["endpoint"],
        format!("http://{}", endpoints[1])
    );
}
