//! Fetches between real processes, for `mpirun -np N`: every node serves the samples `s`
//! with `s % N == node` (bytes: `s` repeated, `s % 50 + 1` long), then asks every peer for
//! 200 samples, half of them held there, all at once, and checks each answer.
//!
//! `mpi_fetch serve`: every answer must be the bytes or a miss, as held.
//! `mpi_fetch silent`: node 1 takes requests and never answers; fetches to it must time out
//! and all others must be answered.
//! `mpi_fetch stuck`: node 1 hangs for 5 s before a step barrier; every other node's barrier
//! must fail within its 2 s timeout with an error saying so, not wait for it.
//! Exits 0 only if everything is as expected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use lobster_net::{Answer, Bytes, MpiNodes, NetError, Served, Timeouts, Transport};

struct Held(HashMap<u32, Bytes>);

impl Served for Held {
    fn get(&self, sample: u32) -> Option<Bytes> {
        self.0.get(&sample).cloned()
    }
}

fn bytes_of(s: u32) -> Bytes {
    Bytes::from(vec![s as u8; (s % 50 + 1) as usize])
}

fn main() -> Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode == "stuck" {
        return stuck();
    }
    if mode != "serve" && mode != "silent" {
        bail!("usage: mpi_fetch serve | silent | stuck");
    }
    let nodes = MpiNodes::start()?;
    let (me, n) = (nodes.node(), nodes.nodes());
    let held = (0..2000u32)
        .filter(|&s| s as usize % n == me)
        .map(|s| (s, bytes_of(s)))
        .collect();
    nodes.serve(Arc::new(Held(held)));
    let silent = mode == "silent" && me == 1;
    if silent {
        nodes.silence()?;
    }
    nodes.barrier()?;
    let answers = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut asked = 0;
    for peer in (0..n).filter(|&p| p != me) {
        for k in 0..200u32 {
            // Even k: a sample the peer holds; odd k: one it does not.
            let s = k * n as u32 + peer as u32 + if k % 2 == 1 { 1 } else { 0 };
            let (a, tx) = (answers.clone(), tx.clone());
            nodes.fetch(
                peer,
                s,
                Box::new(move |answer| {
                    a.lock().unwrap().push((peer, s, answer));
                    let _ = tx.send(());
                }),
            );
            asked += 1;
        }
    }
    for _ in 0..asked {
        rx.recv()?;
    }
    let mut wrong = 0;
    for (peer, s, answer) in answers.lock().unwrap().iter() {
        let holds = s % n as u32 == *peer as u32;
        let ok = match answer {
            _ if mode == "silent" && *peer == 1 => *answer == Answer::TimedOut,
            Answer::Bytes(b) => holds && *b == bytes_of(*s),
            Answer::Miss => !holds,
            _ => false,
        };
        if !ok {
            wrong += 1;
            eprintln!("node {me}: sample {s} from node {peer}: {answer:?}");
        }
    }
    // Nodes wait for each other before leaving, so a silent node still takes requests.
    nodes.barrier()?;
    let stats = nodes.stats();
    if wrong > 0 {
        bail!("node {me}: {wrong} of {asked} answers wrong ({stats:?})");
    }
    if stats.request_batches >= stats.fetches {
        bail!("node {me}: fetches were not batched ({stats:?})");
    }
    println!("node {me}: {asked} fetches answered as held ({stats:?})");
    Ok(())
}

fn stuck() -> Result<()> {
    let nodes = MpiNodes::start_with(Timeouts {
        fetch: Duration::from_secs(1),
        collective: Duration::from_secs(2),
    })?;
    let me = nodes.node();
    nodes.barrier()?;
    if me == 1 {
        // Hangs past the others' timeout, then arrives (so the job can end cleanly).
        std::thread::sleep(Duration::from_secs(5));
        nodes.barrier()?;
        println!("node 1: arrived late");
        return Ok(());
    }
    let started = Instant::now();
    match nodes.barrier() {
        Err(e @ NetError::Timeout { .. }) if started.elapsed() < Duration::from_secs(4) => {
            println!("node {me}: {e}");
            Ok(())
        }
        other => bail!(
            "node {me}: expected a timeout within 2 s, got {other:?} after {:?}",
            started.elapsed()
        ),
    }
}
