//! A caller-driven queue of reads: the shape of the io_uring session, for an object store.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::StoreError;
use crate::read::{RangeRead, StoreCompletion};
use crate::runtime::{Job, ReadReply, Reply, StoreThread};

/// Reads queued and not yet sent before [`StoreSession::queue`] sends them itself.
const PENDING_MAX: usize = 1024;

/// Reads queued by one thread, completed in any order. Every queued read completes exactly
/// once, with [`StoreError::Stopped`] if the store thread stopped first.
///
/// Queued reads wait in the session until [`StoreSession::flush`] (or
/// [`StoreSession::wait_timeout`], which flushes first) sends them together, so that reads of
/// one object near each other share one GET: see [`StoreConfig::with_coalescing`]. A read in a
/// shared GET still completes on its own, with exactly its bytes (its own copy, so that
/// what a cache keeps of it is only its bytes, not the shared body) or an error naming its own
/// byte range; it fails with the GET (its deadline, its retries) and, when the body comes back
/// short, only if the body stops before the read's end.
///
/// The session never bounds what is in flight: its owner does (its io_depth), and the
/// completion queue holds at most that many. What waits unsent is bounded too: past
/// 1024 reads, [`StoreSession::queue`] sends them.
///
/// [`StoreConfig::with_coalescing`]: crate::StoreConfig::with_coalescing
pub struct StoreSession {
    thread: Arc<StoreThread>,
    done_tx: Sender<StoreCompletion>,
    done_rx: Receiver<StoreCompletion>,
    /// Queued, not yet sent, each with its place in the queue.
    pending: Vec<(usize, RangeRead)>,
    /// Queued and not yet handed out, the pending ones included.
    in_flight: usize,
}

impl std::fmt::Debug for StoreSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSession")
            .field("in_flight", &self.in_flight)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl StoreSession {
    pub(crate) fn new(thread: Arc<StoreThread>) -> StoreSession {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        StoreSession {
            thread,
            done_tx,
            done_rx,
            pending: Vec::new(),
            in_flight: 0,
        }
    }

    /// Queues a read; never blocks. It is sent with the others at the next
    /// [`StoreSession::flush`] or [`StoreSession::wait_timeout`]. An error means it was not
    /// queued and will not complete.
    pub fn queue(&mut self, read: RangeRead) -> Result<(), StoreError> {
        if self.thread.is_stopped() {
            return Err(StoreError::Stopped);
        }
        self.pending.push((self.pending.len(), read));
        self.in_flight += 1;
        if self.pending.len() >= PENDING_MAX {
            self.flush();
        }
        Ok(())
    }

    /// Sends the reads queued since the last send, adjacent ones of one object merged into one
    /// GET (see [`StoreConfig::with_coalescing`](crate::StoreConfig::with_coalescing)). If the
    /// store thread has stopped, they complete with [`StoreError::Stopped`].
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut reads = std::mem::take(&mut self.pending);
        let coalescing = self.thread.coalescing;
        let gets = gets_in_queue_order(&mut reads, coalescing.gap_bytes, coalescing.span_bytes);
        let mut reads: Vec<Option<RangeRead>> = reads.into_iter().map(|(_, r)| Some(r)).collect();
        for (members, span) in gets {
            // The plan's groups cover the sorted reads, each once.
            let members: Vec<_> = members
                .filter_map(|i| reads[i].take())
                .map(|read| {
                    let reply = self.reply(read.tag);
                    (read, reply)
                })
                .collect();
            let job = match <[_; 1]>::try_from(members) {
                Ok([(read, reply)]) => Job::Read(read, ReadReply::Session(reply)),
                Err(members) => Job::Coalesced { span, members },
            };
            self.thread.send_or_stop(job);
        }
        debug_assert!(reads.iter().all(Option::is_none));
    }

    /// Where the read tagged `tag` completes; [`StoreError::Stopped`] if it is dropped
    /// unanswered.
    fn reply(&self, tag: u64) -> Reply<StoreCompletion> {
        let fallback = StoreCompletion {
            tag,
            result: Err(StoreError::Stopped),
            shared: false,
        };
        Reply::new(self.done_tx.clone(), fallback)
    }

    /// Reads queued and not yet handed out by [`StoreSession::wait_timeout`].
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Sends what is queued ([`StoreSession::flush`]), then waits until `min` completions are
    /// out (at most those in flight) or `timeout` has passed, then appends to `out` all that
    /// are ready; returns how many it appended.
    pub fn wait_timeout(
        &mut self,
        min: usize,
        timeout: Duration,
        out: &mut Vec<StoreCompletion>,
    ) -> Result<usize, StoreError> {
        self.flush();
        let min = min.min(self.in_flight);
        let until = Instant::now() + timeout;
        let mut got = 0;
        while got < min {
            match self.done_rx.recv_deadline(until) {
                Ok(c) => {
                    out.push(c);
                    got += 1;
                }
                Err(RecvTimeoutError::Timeout) => break,
                // The session holds a sender itself: never disconnected.
                Err(RecvTimeoutError::Disconnected) => return Err(StoreError::Stopped),
            }
        }
        while got < self.in_flight {
            match self.done_rx.try_recv() {
                Ok(c) => {
                    out.push(c);
                    got += 1;
                }
                Err(_) => break,
            }
        }
        self.in_flight -= got;
        Ok(got)
    }
}

/// Sorts `reads` (each with its place in the queue, carried along) and groups them into GETs:
/// each group is an index range of the sorted reads and the byte span one GET fetches for
/// them. Reads of one key and one `If-Match`, neither
/// whole objects nor empty, sorted by offset, join the group before them while each starts at
/// most `gap_bytes` past the group's end so far and the group spans at most `span_bytes`. Every
/// other read is a group of its own; `span_bytes` 0 leaves every read alone, in queue order.
pub(crate) fn plan_gets(
    reads: &mut [(usize, RangeRead)],
    gap_bytes: u64,
    span_bytes: u64,
) -> Vec<(Range<usize>, Range<u64>)> {
    if span_bytes == 0 {
        return (0..reads.len())
            .map(|i| (i..i + 1, reads[i].1.range()))
            .collect();
    }
    let alone = |r: &RangeRead| r.whole_object || r.len == 0;
    // The reads that go alone last among an object's, so that they split no run of ranges.
    reads.sort_by(|(_, a), (_, b)| {
        (&*a.key, &a.if_match, alone(a), a.offset, a.len).cmp(&(
            &*b.key,
            &b.if_match,
            alone(b),
            b.offset,
            b.len,
        ))
    });
    let mut gets = Vec::new();
    let mut i = 0;
    while i < reads.len() {
        let first = &reads[i].1;
        let mut span = first.range();
        let mut j = i + 1;
        if !alone(first) {
            while let Some((_, next)) = reads.get(j) {
                let end = span.end.max(next.range().end);
                if alone(next)
                    || next.key != first.key
                    || next.if_match != first.if_match
                    || next.offset > span.end.saturating_add(gap_bytes)
                    || end - span.start > span_bytes
                {
                    break;
                }
                span.end = end;
                j += 1;
            }
        }
        gets.push((i..j, span));
        i = j;
    }
    gets
}

/// [`plan_gets`], the GETs in the order of their earliest read: grouping sorts by object, and
/// the GETs still go out in the order the caller queued the reads (its deadline order).
fn gets_in_queue_order(
    reads: &mut [(usize, RangeRead)],
    gap_bytes: u64,
    span_bytes: u64,
) -> Vec<(Range<usize>, Range<u64>)> {
    let mut gets = plan_gets(reads, gap_bytes, span_bytes);
    gets.sort_by_key(|(members, _)| reads[members.clone()].iter().map(|(at, _)| *at).min());
    gets
}

#[cfg(test)]
mod tests {
    use super::{gets_in_queue_order, plan_gets};
    use crate::read::RangeRead;

    fn read(key: &str, offset: u64, len: u64, tag: u64) -> RangeRead {
        RangeRead::new(key, offset, len, tag)
    }

    /// The plan as (tags of each group in order, span).
    fn plan(reads: Vec<RangeRead>, gap: u64, span: u64) -> Vec<(Vec<u64>, (u64, u64))> {
        let mut reads: Vec<(usize, RangeRead)> = reads.into_iter().enumerate().collect();
        let gets = plan_gets(&mut reads, gap, span);
        // The groups cover every read once, in order.
        let mut next = 0;
        for (members, _) in &gets {
            assert_eq!(members.start, next);
            assert!(members.end > members.start);
            next = members.end;
        }
        assert_eq!(next, reads.len());
        gets.into_iter()
            .map(|(members, s)| {
                for (_, r) in &reads[members.clone()] {
                    assert!(
                        s.start <= r.offset && r.range().end <= s.end,
                        "{r:?} in {s:?}"
                    );
                }
                (
                    reads[members].iter().map(|(_, r)| r.tag).collect(),
                    (s.start, s.end),
                )
            })
            .collect()
    }

    #[test]
    fn adjacent_reads_of_one_object_are_sorted_and_merged() {
        let reads = vec![
            read("a", 200, 100, 2),
            read("a", 0, 100, 0),
            read("a", 100, 100, 1),
        ];
        assert_eq!(plan(reads, 0, 1 << 20), [(vec![0, 1, 2], (0, 300))]);
    }

    #[test]
    fn a_gap_past_the_limit_splits_and_one_within_is_bridged() {
        let reads = vec![
            read("a", 0, 10, 0),
            read("a", 20, 10, 1),
            read("a", 41, 10, 2),
        ];
        assert_eq!(
            plan(reads, 10, 1 << 20),
            [(vec![0, 1], (0, 30)), (vec![2], (41, 51))]
        );
    }

    #[test]
    fn the_span_limit_holds_and_a_larger_read_goes_alone() {
        let reads: Vec<RangeRead> = (0..5).map(|i| read("a", i * 10, 10, i)).collect();
        assert_eq!(
            plan(reads, 0, 25),
            [
                (vec![0, 1], (0, 20)),
                (vec![2, 3], (20, 40)),
                (vec![4], (40, 50))
            ]
        );
        let reads = vec![read("a", 0, 100, 0), read("a", 100, 1, 1)];
        assert_eq!(
            plan(reads, 0, 50),
            [(vec![0], (0, 100)), (vec![1], (100, 101))]
        );
    }

    #[test]
    fn overlapping_reads_merge_into_their_union() {
        let reads = vec![
            read("a", 0, 100, 0),
            read("a", 50, 10, 1),
            read("a", 90, 30, 2),
        ];
        assert_eq!(plan(reads, 0, 1 << 20), [(vec![0, 1, 2], (0, 120))]);
        // The union is what counts against the span, not the sum.
        let reads = vec![read("a", 0, 100, 0), read("a", 0, 100, 1)];
        assert_eq!(plan(reads, 0, 100), [(vec![0, 1], (0, 100))]);
    }

    #[test]
    fn different_objects_etags_whole_objects_and_empty_reads_never_merge() {
        let whole = RangeRead {
            whole_object: true,
            ..read("a", 0, 10, 3)
        };
        let tagged = RangeRead {
            if_match: Some("\"e\"".into()),
            ..read("a", 10, 10, 4)
        };
        let reads = vec![
            read("b", 10, 10, 1),
            read("a", 0, 10, 0),
            whole,
            tagged,
            read("a", 10, 0, 5),
            read("b", 0, 10, 2),
        ];
        assert_eq!(
            plan(reads, 1 << 20, 1 << 20),
            [
                (vec![0], (0, 10)),
                (vec![3], (0, 10)),
                (vec![5], (10, 10)),
                (vec![4], (10, 20)),
                (vec![2, 1], (0, 20)),
            ]
        );
    }

    #[test]
    fn gets_go_out_in_the_order_their_first_read_was_queued() {
        // Queued: b's read first (the nearest deadline), then two of a, then c.
        let mut reads: Vec<(usize, RangeRead)> = [
            read("b", 0, 10, 0),
            read("a", 10, 10, 1),
            read("c", 0, 10, 2),
            read("a", 0, 10, 3),
        ]
        .into_iter()
        .enumerate()
        .collect();
        let gets = gets_in_queue_order(&mut reads, 0, 1 << 20);
        let tags: Vec<Vec<u64>> = gets
            .into_iter()
            .map(|(members, _)| reads[members].iter().map(|(_, r)| r.tag).collect())
            .collect();
        assert_eq!(tags, [vec![0], vec![3, 1], vec![2]]);
    }

    #[test]
    fn span_zero_turns_merging_off_and_keeps_the_queue_order() {
        let reads = vec![read("a", 10, 10, 0), read("a", 0, 10, 1)];
        assert_eq!(
            plan(reads, 1 << 20, 0),
            [(vec![0], (10, 20)), (vec![1], (0, 10))]
        );
    }
}
