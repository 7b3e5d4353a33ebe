//! Nodes in one process: each fetch is answered from the peer's served cache, at once on the
//! caller's thread, or later on the thread that lands a read the peer's plan has in flight.
//! For tests and single-process simulations of a cluster; a peer can be made silent, so
//! that its fetches time out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::transport::{Answer, Done, Served, Transport, TransportStats};

/// One node of an in-process job.
pub struct InProcessNode {
    node: usize,
    all: Arc<[Shared]>,
}

#[derive(Default)]
struct Shared {
    served: RwLock<Option<Arc<dyn Served>>>,
    silent: AtomicBool,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    fetches: AtomicU64,
    answered_bytes: AtomicU64,
    answered_miss: AtomicU64,
    timed_out: AtomicU64,
    served_bytes: AtomicU64,
    served_miss: AtomicU64,
}

impl std::fmt::Debug for InProcessNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessNode")
            .field("node", &self.node)
            .field("nodes", &self.all.len())
            .finish()
    }
}

/// Makes the nodes of an in-process job.
#[derive(Debug)]
pub struct InProcessNodes;

impl InProcessNodes {
    /// `nodes` nodes that reach each other.
    pub fn connect(nodes: usize) -> Vec<Arc<InProcessNode>> {
        let all: Arc<[Shared]> = (0..nodes).map(|_| Shared::default()).collect();
        (0..nodes)
            .map(|node| {
                Arc::new(InProcessNode {
                    node,
                    all: all.clone(),
                })
            })
            .collect()
    }
}

impl InProcessNode {
    /// From now on this node answers no fetch: its peers' fetches time out (a fault; feature
    /// `lab`).
    #[cfg(any(test, feature = "lab"))]
    pub fn silence(&self) {
        self.all[self.node].silent.store(true, Ordering::SeqCst);
    }
}

impl Transport for InProcessNode {
    fn node(&self) -> usize {
        self.node
    }

    fn nodes(&self) -> usize {
        self.all.len()
    }

    fn fetch(&self, peer: usize, sample: u32, done: Done) {
        let ours = &self.all[self.node].counters;
        ours.fetches.fetch_add(1, Ordering::Relaxed);
        let Some(theirs) = self.all.get(peer) else {
            done(Answer::Failed(format!(
                "node {peer} is not in this job of {} nodes",
                self.all.len()
            )));
            return;
        };
        if theirs.silent.load(Ordering::SeqCst) {
            ours.timed_out.fetch_add(1, Ordering::Relaxed);
            done(Answer::TimedOut);
            return;
        }
        let served = theirs
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(served) = served else {
            theirs.counters.served_miss.fetch_add(1, Ordering::Relaxed);
            ours.answered_miss.fetch_add(1, Ordering::Relaxed);
            done(Answer::Miss);
            return;
        };
        let all = self.all.clone();
        let me = self.node;
        // Answered at once, or when the peer's read lands (on the thread that lands it).
        served.get_or_wait(
            sample,
            Box::new(move |found| {
                let (ours, theirs) = (&all[me].counters, &all[peer].counters);
                match found {
                    Some(bytes) => {
                        theirs.served_bytes.fetch_add(1, Ordering::Relaxed);
                        ours.answered_bytes.fetch_add(1, Ordering::Relaxed);
                        done(Answer::Bytes(bytes));
                    }
                    None => {
                        theirs.served_miss.fetch_add(1, Ordering::Relaxed);
                        ours.answered_miss.fetch_add(1, Ordering::Relaxed);
                        done(Answer::Miss);
                    }
                }
            }),
        );
    }

    fn serve(&self, cache: Arc<dyn Served>) {
        *self.all[self.node]
            .served
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(cache);
    }

    fn unserve(&self) {
        *self.all[self.node]
            .served
            .write()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn stats(&self) -> TransportStats {
        let c = &self.all[self.node].counters;
        let fetches = c.fetches.load(Ordering::Relaxed);
        TransportStats {
            fetches,
            request_batches: fetches,
            answered_bytes: c.answered_bytes.load(Ordering::Relaxed),
            answered_miss: c.answered_miss.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            served_bytes: c.served_bytes.load(Ordering::Relaxed),
            served_miss: c.served_miss.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::*;

    struct Map(HashMap<u32, Bytes>);

    impl Served for Map {
        fn get(&self, sample: u32) -> Option<Bytes> {
            self.0.get(&sample).cloned()
        }
    }

    fn fetch(node: &InProcessNode, peer: usize, sample: u32) -> Answer {
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        node.fetch(
            peer,
            sample,
            Box::new(move |a| *g.lock().unwrap() = Some(a)),
        );
        let answer = got.lock().unwrap().take();
        answer.expect("answered at once")
    }

    #[test]
    fn fetches_hit_what_the_peer_serves_and_miss_otherwise() {
        let nodes = InProcessNodes::connect(2);
        assert_eq!(fetch(&nodes[0], 1, 3), Answer::Miss, "nothing served yet");
        nodes[1].serve(Arc::new(Map(HashMap::from([(
            3,
            Bytes::from_static(b"x"),
        )]))));
        assert_eq!(
            fetch(&nodes[0], 1, 3),
            Answer::Bytes(Bytes::from_static(b"x"))
        );
        assert_eq!(fetch(&nodes[0], 1, 4), Answer::Miss);
        assert!(matches!(fetch(&nodes[0], 5, 3), Answer::Failed(e) if e.contains("node 5")));
        nodes[1].silence();
        assert_eq!(fetch(&nodes[0], 1, 3), Answer::TimedOut);
        nodes[1].unserve();
        let ours = nodes[0].stats();
        assert_eq!(
            (ours.fetches, ours.answered_bytes, ours.answered_miss),
            (5, 1, 2)
        );
        assert_eq!(ours.timed_out, 1);
        let theirs = nodes[1].stats();
        assert_eq!((theirs.served_bytes, theirs.served_miss), (1, 2));
    }
}
