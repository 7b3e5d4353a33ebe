//! An emulated interconnect, beside the loader's emulated storage tier: every answer a node
//! receives from a peer is charged a latency and the node's share of the fabric's bandwidth,
//! so that one machine (nodes in one process, or MPI ranks on one host) shows what a job's
//! remote hits cost on a real cluster.
//!
//! The model is the receiving node's link: fetches overlap their latency, then their bytes
//! arrive one after another at `rate_mbps`; an answer issued at `t` with `b` bytes is handed
//! over at `max(t + latency, link_free) + b / rate`. The serving node's outbound link is not
//! modelled (each node's fetches are spread over its peers); misses cost the latency only.

use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::NetError;
use crate::transport::{Answer, Done, Served, Transport, TransportStats};

/// The emulated link of one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// The node's share of the fabric, megabytes (10^6 bytes) per second.
    pub rate_mbps: f64,
    /// One request's round trip, microseconds.
    pub latency_us: u64,
}

impl Default for LinkParams {
    /// A 100 Gb/s fabric's share per node (12,500 MB/s) and a 20 us round trip.
    fn default() -> Self {
        LinkParams {
            rate_mbps: 12_500.0,
            latency_us: 20,
        }
    }
}

impl LinkParams {
    /// The parameters, checked: a positive finite rate of at most 10^7 MB/s, a latency of
    /// at most 10 s.
    ///
    /// # Errors
    /// [`NetError::Link`] naming the parameter.
    pub fn new(rate_mbps: f64, latency_us: u64) -> Result<Self, NetError> {
        if !(rate_mbps.is_finite() && rate_mbps > 0.0 && rate_mbps <= 1e7) {
            return Err(NetError::Link {
                parameter: "rate_mbps",
                value: rate_mbps.to_string(),
                expected: "above 0 and at most 10,000,000 MB/s",
            });
        }
        if latency_us > 10_000_000 {
            return Err(NetError::Link {
                parameter: "latency_us",
                value: latency_us.to_string(),
                expected: "at most 10,000,000 us",
            });
        }
        Ok(LinkParams {
            rate_mbps,
            latency_us,
        })
    }

    /// When an answer of `bytes` to a fetch issued at `issued` arrives, with the link free
    /// from `link_free`; the link is busy until then.
    fn arrival(&self, issued: Instant, bytes: u64, link_free: &mut Instant) -> Instant {
        let ready = issued + Duration::from_micros(self.latency_us);
        let transfer = Duration::from_secs_f64(bytes as f64 / (self.rate_mbps * 1e6));
        let start = ready.max(*link_free);
        *link_free = start + transfer;
        *link_free
    }
}

/// An answer held until its arrival time.
struct Pending {
    at: Instant,
    seq: u64,
    done: Done,
    answer: Answer,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    // The earliest first out of the max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Pending>,
    seq: u64,
    stopping: bool,
}

/// The link's clock and the answers on their way, handed over by the link's own thread.
struct Link {
    params: LinkParams,
    link_free: Mutex<Instant>,
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl Link {
    fn deliver(self: &Arc<Self>, issued: Instant, answer: Answer, done: Done) {
        let bytes = match &answer {
            Answer::Bytes(b) => b.len() as u64,
            _ => 0,
        };
        let at = {
            let mut free = self.link_free.lock().unwrap_or_else(|p| p.into_inner());
            self.params.arrival(issued, bytes, &mut free)
        };
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.stopping {
            drop(q);
            done(answer);
            return;
        }
        q.seq += 1;
        let seq = q.seq;
        // Bounded by the fetches in flight, which the caller bounds (its prefetch window).
        q.heap.push(Pending {
            at,
            seq,
            done,
            answer,
        });
        drop(q);
        self.cv.notify_one();
    }

    /// The link's thread: hands each answer over at its time; on stop, the rest at once.
    fn run(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            match q.heap.peek() {
                Some(p) if p.at <= now || q.stopping => {
                    let p = q.heap.pop().expect("peeked");
                    drop(q);
                    (p.done)(p.answer);
                    q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                }
                Some(p) => {
                    let wait = p.at - now;
                    q = self
                        .cv
                        .wait_timeout(q, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                None if q.stopping => return,
                None => q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// A transport whose answers come over an emulated link ([`LinkParams`]).
pub struct EmulatedLink {
    inner: Arc<dyn Transport>,
    link: Arc<Link>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for EmulatedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedLink")
            .field("node", &self.inner.node())
            .field("params", &self.link.params)
            .finish()
    }
}

impl EmulatedLink {
    /// `inner` with its answers charged `params`' latency and bandwidth.
    ///
    /// # Errors
    /// [`NetError::Link`] if the link's thread cannot be started.
    pub fn wrap(inner: Arc<dyn Transport>, params: LinkParams) -> Result<Self, NetError> {
        let link = Arc::new(Link {
            params,
            link_free: Mutex::new(Instant::now()),
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let l = link.clone();
        let thread = std::thread::Builder::new()
            .name(format!("lobster-link-{}", inner.node()))
            .spawn(move || l.run())
            .map_err(|e| NetError::Link {
                parameter: "thread",
                value: e.to_string(),
                expected: "a thread for the emulated link",
            })?;
        Ok(EmulatedLink {
            inner,
            link,
            thread: Some(thread),
        })
    }

    /// The link's parameters.
    pub fn params(&self) -> LinkParams {
        self.link.params
    }
}

impl Transport for EmulatedLink {
    fn node(&self) -> usize {
        self.inner.node()
    }

    fn nodes(&self) -> usize {
        self.inner.nodes()
    }

    fn fetch(&self, peer: usize, sample: u32, done: Done) {
        let issued = Instant::now();
        let link = self.link.clone();
        self.inner.fetch(
            peer,
            sample,
            Box::new(move |answer| link.deliver(issued, answer, done)),
        );
    }

    fn serve(&self, cache: Arc<dyn Served>) {
        self.inner.serve(cache);
    }

    fn unserve(&self) {
        self.inner.unserve();
    }

    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
}

impl Drop for EmulatedLink {
    fn drop(&mut self) {
        self.link
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stopping = true;
        self.link.cv.notify_all();
        if let Some(t) = self.thread.take() {
            // An answer's callback may drop the last handle on the link's own thread (a
            // loader stopped mid-run): that thread ends by itself once the callback returns.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InProcessNodes;
    use bytes::Bytes;

    struct Holds(Vec<u8>);

    impl Served for Holds {
        fn get(&self, _sample: u32) -> Option<Bytes> {
            Some(Bytes::from(self.0.clone()))
        }
    }

    #[test]
    fn latency_overlaps_and_bytes_arrive_one_after_another() {
        let p = LinkParams::new(1.0, 1000).unwrap();
        let t = Instant::now();
        let mut free = t;
        // 1000 bytes at 1 MB/s: 1 ms after the 1 ms latency.
        assert_eq!(p.arrival(t, 1000, &mut free), t + Duration::from_millis(2));
        // Issued together: its latency overlapped, its bytes after the first's.
        assert_eq!(p.arrival(t, 1000, &mut free), t + Duration::from_millis(3));
        // Issued once the link is idle again: latency and transfer only.
        let later = t + Duration::from_millis(10);
        assert_eq!(
            p.arrival(later, 0, &mut free),
            later + Duration::from_millis(1)
        );
    }

    #[test]
    fn nonsense_parameters_are_refused_naming_them() {
        for (rate, latency, name) in [
            (0.0, 0, "rate_mbps"),
            (f64::NAN, 0, "rate_mbps"),
            (-1.0, 0, "rate_mbps"),
            (1.0, 10_000_001, "latency_us"),
        ] {
            match LinkParams::new(rate, latency) {
                Err(e @ NetError::Link { parameter, .. }) if parameter == name => {
                    assert!(e.to_string().contains(name), "{e}");
                }
                other => panic!("{rate} {latency}: {other:?}"),
            }
        }
    }

    /// The last handle on the link dropped by an answer's callback, on the link's thread,
    /// ends the link without it joining itself.
    #[test]
    fn an_answer_that_drops_the_last_handle_ends_the_link() {
        let nodes = InProcessNodes::connect(2);
        nodes[1].serve(Arc::new(Holds(vec![7; 100])));
        let link = Arc::new(
            EmulatedLink::wrap(
                nodes[0].clone() as Arc<dyn Transport>,
                LinkParams::new(10.0, 1000).unwrap(),
            )
            .unwrap(),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let held = std::sync::Mutex::new(Some(link.clone()));
        let owner = Arc::new(held);
        let in_callback = owner.clone();
        link.fetch(
            1,
            3,
            Box::new(move |_| {
                // By now the test dropped its handle: this one is the last.
                std::thread::sleep(Duration::from_millis(20));
                drop(in_callback.lock().unwrap().take());
                tx.send(std::thread::current().name().map(str::to_owned))
                    .unwrap();
            }),
        );
        drop(link);
        let on = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the callback finished: dropping the link there did not panic");
        assert_eq!(
            on.as_deref(),
            Some("lobster-link-0"),
            "dropped on the link's thread"
        );
        drop(owner);
    }

    #[test]
    fn answers_are_held_for_the_link_and_all_arrive() {
        let nodes = InProcessNodes::connect(2);
        nodes[1].serve(Arc::new(Holds(vec![7; 50_000])));
        // 50 KB at 10 MB/s: 5 ms each, one after another.
        let link = EmulatedLink::wrap(
            nodes[0].clone() as Arc<dyn Transport>,
            LinkParams::new(10.0, 100).unwrap(),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        for sample in 0..4u32 {
            let tx = tx.clone();
            link.fetch(
                1,
                sample,
                Box::new(move |a| {
                    let _ = tx.send((sample, a, Instant::now()));
                }),
            );
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        }
        got.sort_by_key(|g| g.2);
        for (i, (_, answer, at)) in got.iter().enumerate() {
            assert!(matches!(answer, Answer::Bytes(b) if b.len() == 50_000));
            // The link's clock, not the machine's speed, says when: never earlier.
            assert!(
                *at >= started + Duration::from_millis(5 * (i as u64 + 1)),
                "answer {i} came too early"
            );
        }
    }

    #[test]
    fn dropping_the_link_hands_over_what_is_on_its_way() {
        let nodes = InProcessNodes::connect(2);
        nodes[1].serve(Arc::new(Holds(vec![1; 10])));
        let link = EmulatedLink::wrap(
            nodes[0].clone() as Arc<dyn Transport>,
            LinkParams::new(1.0, 5_000_000).unwrap(),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        link.fetch(1, 3, Box::new(move |a| drop(tx.send(a))));
        // The inner transport answers on its own thread; wait until the answer is queued.
        let deadline = Instant::now() + Duration::from_secs(10);
        while link.link.queue.lock().unwrap().heap.is_empty() {
            assert!(Instant::now() < deadline, "the inner answer never came");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(link);
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(1)),
            Ok(Answer::Bytes(_))
        ));
    }
}
