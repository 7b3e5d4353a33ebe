//! The decode queues: one min-heap per rank on the stream position, and which rank each
//! decode worker serves first.

use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::pipeline::access::Ready;
use crate::pipeline::layout::Layout;
use crate::pipeline::sync::{lock, StopSignal};

// Queues are min-heaps on the stream position, so the oldest iteration is served first.
impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.access.seq == other.access.seq
    }
}

impl Eq for Ready {}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.access.seq.cmp(&self.access.seq)
    }
}

#[derive(Debug)]
struct Queues {
    by_rank: Vec<BinaryHeap<Ready>>,
    /// Worker index to the rank it serves first.
    assignment: Vec<usize>,
    /// Workers waiting on the condition variable: a push wakes someone only if one sleeps.
    sleepers: usize,
}

/// Tasks a worker takes at once, at most.
pub(crate) const GROUP_MAX: usize = 4;

/// How workers pick from the queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeRule {
    /// A worker takes its rank's oldest task if that is of the oldest iteration waiting, and
    /// otherwise that iteration's task at the earliest batch position of any rank.
    OldestIteration,
    /// A worker belongs to its rank, as in PyTorch's DataLoader; an unassigned worker takes
    /// the oldest task of any rank.
    OwnRank,
}

#[derive(Debug)]
pub(crate) struct DecodeQueues {
    state: Mutex<Queues>,
    cv: Condvar,
    rule: TakeRule,
}

impl DecodeQueues {
    /// `threads`: decode threads per rank, the workers assigned in rank order.
    pub(crate) fn new(ranks: usize, threads: &[u32], rule: TakeRule) -> Self {
        DecodeQueues {
            rule,
            state: Mutex::new(Queues {
                by_rank: (0..ranks).map(|_| BinaryHeap::new()).collect(),
                assignment: spread(threads),
                sleepers: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Queues every task of `ready` under one lock, waking workers only if some sleep.
    pub(crate) fn push(&self, ready: impl IntoIterator<Item = Ready>) {
        let mut state = lock(&self.state);
        let mut pushed = 0;
        for r in ready {
            state.by_rank[r.access.rank].push(r);
            pushed += 1;
        }
        let wake = pushed.min(state.sleepers);
        drop(state);
        if wake > 0 {
            // Workers prefer different ranks: wake all, each sees whether a task suits it.
            self.cv.notify_all();
        }
    }

    /// Reassigns the workers: `threads` per rank, in rank order.
    pub(crate) fn set_assignment(&self, threads: &[u32]) {
        lock(&self.state).assignment = spread(threads);
    }

    /// Takes the next tasks for worker `w` into `out` (empty on entry), waiting while there
    /// are none; `false` once the loader stops or `finished` says no task will come. While
    /// the queue holds more than `workers` tasks per worker the worker takes up to
    /// [`GROUP_MAX`] of one rank's tasks of the same iteration under one lock; with fewer, one,
    /// so a shallow queue is spread over every worker.
    pub(crate) fn take(
        &self,
        w: usize,
        layout: &Layout,
        stop: &StopSignal,
        finished: impl Fn() -> bool,
        out: &mut Vec<Ready>,
    ) -> bool {
        debug_assert!(out.is_empty());
        let step = |t: &Ready| layout.step(t.access.epoch, t.access.iteration as usize);
        let mut state = lock(&self.state);
        loop {
            if stop.is_set() {
                return false;
            }
            let own = state.assignment.get(w).copied();
            let workers = state.assignment.len().max(1);
            let queues = &mut state.by_rank;
            let chosen = match self.rule {
                TakeRule::OldestIteration => {
                    let oldest = (0..queues.len())
                        .filter_map(|r| queues[r].peek().map(|t| ((step(t), t.access.pos), r)))
                        .min();
                    oldest.map(|((oldest_step, _), oldest_rank)| {
                        own.filter(|&r| queues[r].peek().is_some_and(|t| step(t) <= oldest_step))
                            .unwrap_or(oldest_rank)
                    })
                }
                TakeRule::OwnRank => match own {
                    Some(r) => Some(r).filter(|&r| !queues[r].is_empty()),
                    None => (0..queues.len())
                        .filter_map(|r| queues[r].peek().map(|t| (t.access.seq, r)))
                        .min()
                        .map(|(_, r)| r),
                },
            };
            if let Some(r) = chosen {
                let first = queues[r].pop().expect("the chosen queue has a task");
                let first_step = step(&first);
                out.push(first);
                let queued: usize = queues.iter().map(BinaryHeap::len).sum();
                let group = if queued > workers * GROUP_MAX {
                    GROUP_MAX
                } else {
                    1
                };
                while out.len() < group && queues[r].peek().is_some_and(|t| step(t) == first_step) {
                    out.push(queues[r].pop().expect("peeked"));
                }
                return true;
            }
            if finished() {
                return false;
            }
            state.sleepers += 1;
            // The timeout bounds the wait on `finished`, which changes without this lock.
            state = self
                .cv
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.sleepers -= 1;
        }
    }

    /// Wakes every waiting worker (stop, or no more tasks).
    pub(crate) fn wake(&self) {
        drop(lock(&self.state));
        self.cv.notify_all();
    }
}

/// Per-rank thread counts to a worker-to-rank assignment.
fn spread(threads: &[u32]) -> Vec<usize> {
    threads
        .iter()
        .enumerate()
        .flat_map(|(r, &t)| std::iter::repeat_n(r, t as usize))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_go_to_ranks_in_rank_order_by_their_counts() {
        assert_eq!(spread(&[2, 0, 1]), vec![0, 0, 2]);
        assert!(spread(&[0, 0]).is_empty());
    }
}
