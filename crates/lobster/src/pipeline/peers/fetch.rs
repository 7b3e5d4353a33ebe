//! Fetching a planned miss from the peer that holds it and settling the answer: the sample's
//! bytes, counted as a remote hit, or, when the peer answers "miss" or not in time, a remote
//! miss that storage serves after all. The planner's fetches, whose answers go on to the
//! decode queues or the dispatcher, are in `plan/remote.rs`.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use lobster_net::Answer;
use lobster_sched::{CostModel, Tier};

use super::Peers;
use crate::pipeline::sync::lock;

/// Fetches `sample` (of `size_bytes`) from `peer` and waits for the answer (a
/// read-then-decode worker): its bytes, or `None` when storage must serve it.
pub(crate) fn blocking(
    peers: &Peers,
    model: &Mutex<CostModel>,
    (sample, size_bytes): (u32, u64),
    peer: usize,
) -> Option<Bytes> {
    peers.counters.planned.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let issued = Instant::now();
    peers.transport.fetch(
        peer,
        sample,
        Box::new(move |answer| {
            let _ = tx.send(answer);
        }),
    );
    let answer = rx
        .recv()
        .unwrap_or_else(|_| Answer::Failed("the transport dropped the fetch".into()));
    settle(peers, model, (sample, size_bytes), peer, issued, answer)
}

/// The answer's bytes if they are the sample's, counted as a remote hit and observed by the
/// cost model; anything else is counted as a remote miss.
pub(crate) fn settle(
    peers: &Peers,
    model: &Mutex<CostModel>,
    (sample, size_bytes): (u32, u64),
    peer: usize,
    issued: Instant,
    answer: Answer,
) -> Option<Bytes> {
    let counters = &peers.counters;
    match answer {
        Answer::Bytes(b) if b.len() as u64 == size_bytes => {
            counters.hits.fetch_add(1, Ordering::Relaxed);
            counters.hit_bytes.fetch_add(size_bytes, Ordering::Relaxed);
            lock(model).observe_read(Tier::Remote, size_bytes, issued.elapsed());
            return Some(b);
        }
        Answer::Bytes(b) => log::warn!(
            "node {peer} sent {} bytes for sample {sample} of {size_bytes}: read from storage",
            b.len()
        ),
        Answer::Miss => {}
        Answer::TimedOut => {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        Answer::Failed(why) => log::warn!("fetching sample {sample} from node {peer}: {why}"),
    }
    counters.misses.fetch_add(1, Ordering::Relaxed);
    None
}
