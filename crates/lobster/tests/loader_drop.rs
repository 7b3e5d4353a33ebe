//! Dropping the loader returns without waiting for the work still planned and leaves no thread
//! and no file descriptor behind: while reads are in flight, while a rank is blocked on a
//! batch, and while faults are being retried; on both I/O backends and with read-then-decode
//! workers.
//!
//! One test in its own binary: it counts the process's threads and descriptors, which tests
//! running beside it would change.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_io::Backend;
use lobster_io::{
    Dataset, Error, Execution, FailureBudget, FaultInjection, Loader, LoaderBuilder, OnError,
    StorageEmulation,
};
use lobster_testkit::data::{content, make_dataset};
use lobster_testkit::process::{fds, guarded, threads, Watchdog};

const SAMPLES: u32 = 200;
const RANKS: usize = 2;
const BATCH: usize = 4;
const EPOCHS: u32 = 50;

#[derive(Clone, Copy, Debug)]
enum Situation {
    /// Reads on slow emulated storage, the prefetch window full of them.
    ReadsInFlight,
    /// No read completes for minutes; a rank thread waits in `next()`.
    RankBlocked,
    /// Nearly every attempt is short (retried after a backoff) or delayed by 10 s, and the
    /// attempts that succeed take minutes.
    FaultsRetried,
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    execution: Execution,
    backend: Backend,
}

const SETUPS: [Setup; 3] = [
    Setup {
        execution: Execution::Pipelined,
        backend: Backend::Uring,
    },
    Setup {
        execution: Execution::Pipelined,
        backend: Backend::Pread,
    },
    Setup {
        execution: Execution::ReadThenDecode,
        backend: Backend::Pread,
    },
];

/// 10 B/s: one sample takes 10 to 310 s, so a drop that waited for a read would hang.
const SLOWEST: StorageEmulation = StorageEmulation {
    bandwidth_bytes_per_s: 10.0,
    latency_us: 1_000,
};

fn build(ds: &Arc<Dataset>, setup: Setup, situation: Situation) -> Loader<Vec<u8>> {
    let builder = LoaderBuilder::new(ds.clone())
        .world(1, RANKS, 0)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .execution(setup.execution)
        .backend(setup.backend)
        .decode_threads(4)
        .io_depth(4)
        .decode(|bytes: &[u8], meta| {
            if bytes == content(meta.id).as_slice() {
                Ok(bytes.to_vec())
            } else {
                Err(format!("content of sample {} does not match", meta.id))
            }
        });
    let builder = match situation {
        // 200 samples of 1.6 kB on average at 100 kB/s: over two minutes for the 50 epochs.
        Situation::ReadsInFlight => builder.storage_emulation(Some(StorageEmulation {
            bandwidth_bytes_per_s: 1e5,
            latency_us: 5_000,
        })),
        Situation::RankBlocked => builder.storage_emulation(Some(SLOWEST)),
        Situation::FaultsRetried => builder
            .storage_emulation(Some(SLOWEST))
            .on_error(OnError::Skip {
                max_failures: FailureBudget::Fraction(1.0),
            })
            .inject_faults(Some(FaultInjection {
                seed: 1,
                short: 0.8,
                delay: 0.2,
                delay_us: 10_000_000,
                ..FaultInjection::default()
            })),
    };
    builder.build().unwrap()
}

/// The kernel's view of a thread: its state letter (R, S, D, ...).
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The state follows the parenthesised name, which may itself hold spaces.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until thread `tid` sleeps in the kernel (a rank parked on its condition variable).
fn wait_until_parked(tid: i32, what: &str) {
    let dog = Watchdog::arm(format!("{what}: waiting for the rank thread to block"));
    // Twice in a row, so a thread merely passing through a contended lock is not taken.
    let mut parked_seen = 0;
    while parked_seen < 2 {
        parked_seen = if thread_state(tid) == Some('S') {
            parked_seen + 1
        } else {
            0
        };
        std::thread::sleep(Duration::from_millis(20));
    }
    dog.disarm();
}

fn drop_in(ds: &Arc<Dataset>, setup: Setup, situation: Situation) {
    let what = format!("{situation:?} {setup:?}");
    let threads_before = threads();
    let fds_before = fds();
    let mut loader = build(ds, setup, situation);
    let mut handles = loader.ranks().unwrap();
    let threads_running = threads().len();
    assert!(threads_running > threads_before.len(), "{what}");
    let mut blocked_rank = None;
    match situation {
        Situation::ReadsInFlight => {
            let first = handles[0].next().unwrap().unwrap();
            assert_eq!(first.samples.len(), BATCH, "{what}");
        }
        Situation::RankBlocked => {
            let mut handle = handles.pop().expect("a rank");
            let (tid_tx, tid_rx) = mpsc::channel();
            let rank = std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_tx.send(unsafe { libc::gettid() }).unwrap();
                handle.next()
            });
            wait_until_parked(tid_rx.recv().unwrap(), &what);
            blocked_rank = Some(rank);
        }
        Situation::FaultsRetried => {
            let dog = Watchdog::arm(format!("{what}: waiting for a retry"));
            while loader.metrics().read_retries == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            dog.disarm();
        }
    }
    let fds_running = fds().len();
    let m = loader.metrics();
    let planned = SAMPLES as u64 * u64::from(EPOCHS);
    assert!(
        m.samples + m.skipped < planned,
        "{what}: the run is not over"
    );
    let ((), drop_took) = guarded(format!("{what}: dropping the loader"), || drop(loader));
    let mut join_took = Duration::ZERO;
    if let Some(rank) = blocked_rank {
        let (woken, took) = guarded(format!("{what}: the blocked rank"), || rank.join().unwrap());
        join_took = took;
        assert!(
            matches!(woken, Some(Err(Error::Stopped { .. }))),
            "{what}: the blocked rank is told the loader stopped, got {:?}",
            woken.map(|r| r.map(|b| b.samples.len()))
        );
    }
    // A joined thread's /proc entry goes a moment after its join returns (the kernel
    // finishes the exit after waking the joiner): give it up to a second to go.
    let settled = Instant::now() + Duration::from_secs(1);
    while (threads() != threads_before || fds() != fds_before) && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(5));
    }
    let threads_after = threads();
    let fds_after = fds();
    println!(
        "{what}: drop {:.1} ms (blocked rank woken {:.1} ms later), {} samples delivered \
         and {} retries before it; threads {} -> {} -> {}, fds {} -> {} -> {}",
        drop_took.as_secs_f64() * 1e3,
        join_took.as_secs_f64() * 1e3,
        m.samples,
        m.read_retries,
        threads_before.len(),
        threads_running,
        threads_after.len(),
        fds_before.len(),
        fds_running,
        fds_after.len()
    );
    assert_eq!(threads_after, threads_before, "{what}: every thread joined");
    assert_eq!(fds_after, fds_before, "{what}: every descriptor closed");
    // Handles outliving the loader hand out the batches completed before the drop, then
    // report that it stopped, then end.
    for h in handles {
        let items: Vec<_> = h.collect();
        let (last, done) = items.split_last().expect("at least the stop is reported");
        assert!(done.iter().all(Result::is_ok), "{what}");
        assert!(
            matches!(last, Err(Error::Stopped { .. })),
            "{what}: {:?}",
            last.as_ref().map(|b| b.samples.len())
        );
    }
}

#[test]
fn dropping_the_loader_returns_and_leaves_no_thread_or_descriptor_behind() {
    let dir = tempfile::tempdir().unwrap();
    // One class: a sample's id is its generator index, which `content` checks.
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    for situation in [
        Situation::ReadsInFlight,
        Situation::RankBlocked,
        Situation::FaultsRetried,
    ] {
        for setup in SETUPS {
            drop_in(&ds, setup, situation);
        }
    }
}
