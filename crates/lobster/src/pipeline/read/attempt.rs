//! One read attempt's fate, the same for the dispatcher's reads and the decode workers'
//! (the baselines' blocking reads, reads after a page-cache try): the emulated tier's answer
//! time, injected faults, a retry after a backoff, or the error that names the sample. Every
//! storage read meets [`ReadFates`], so every strategy meets the same tier and the same faults.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::dataset::SampleMeta;
use crate::emulate::{Device, StorageEmulation};
use crate::error::Cause;
use crate::faults::{self, AttemptFaults, FaultInjection, READ_ATTEMPTS};
use crate::pipeline::landing::Loaded;

/// Counts of the fault paths, touched only when something fails or faults are injected.
#[derive(Debug, Default)]
pub(crate) struct FaultCounters {
    /// Read attempts the fault injector changed.
    pub(crate) injected: AtomicU64,
    /// Read attempts retried after a transient failure.
    pub(crate) retries: AtomicU64,
    /// Reads that succeeded after at least one retry.
    pub(crate) recovered: AtomicU64,
}

/// By the epoch of their access: storage read attempts, those served by another attempt's
/// request (an object store's coalesced GET), the reads that delivered bytes, and their
/// bytes; counters for every epoch of the run, made up front.
#[derive(Debug, Default)]
pub(crate) struct DeliveredByEpoch(Box<[[AtomicU64; 4]]>);

impl DeliveredByEpoch {
    fn new(epochs: u32) -> Self {
        DeliveredByEpoch((0..epochs).map(|_| Default::default()).collect())
    }

    fn attempted(&self, epoch: u32) {
        if let Some([attempts, ..]) = self.0.get(epoch as usize) {
            attempts.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn shared(&self, epoch: u32) {
        if let Some([_, shared, ..]) = self.0.get(epoch as usize) {
            shared.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn add(&self, epoch: u32, bytes: u64) {
        if let Some([_, _, reads, total]) = self.0.get(epoch as usize) {
            reads.fetch_add(1, Ordering::Relaxed);
            total.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// (attempts, shared, reads, bytes) per epoch.
    pub(crate) fn counts(&self) -> [Vec<u64>; 4] {
        std::array::from_fn(|i| {
            self.0
                .iter()
                .map(|c| c[i].load(Ordering::Relaxed))
                .collect()
        })
    }
}

/// A read attempt that failed before any fault was injected.
#[derive(Debug)]
pub(crate) struct ReadFailure {
    /// The failure may go away on retry.
    pub(crate) transient: bool,
    pub(crate) cause: Cause,
}

impl From<std::io::Error> for ReadFailure {
    fn from(e: std::io::Error) -> Self {
        ReadFailure {
            transient: faults::transient(&e),
            cause: std::sync::Arc::new(e),
        }
    }
}

impl From<lobster_uring::ReadError> for ReadFailure {
    fn from(e: lobster_uring::ReadError) -> Self {
        // The reader already retried EAGAIN/EINTR; what remains transient is an OS error
        // that may clear.
        let transient = match &e {
            lobster_uring::ReadError::Read { source, .. } => faults::transient(source),
            _ => false,
        };
        ReadFailure {
            transient,
            cause: std::sync::Arc::new(e),
        }
    }
}

#[cfg(feature = "s3")]
impl From<lobster_store::StoreError> for ReadFailure {
    fn from(e: lobster_store::StoreError) -> Self {
        // The store retried what it could within its deadline.
        ReadFailure {
            transient: e.is_transient(),
            cause: std::sync::Arc::new(e),
        }
    }
}

/// What becomes of one attempt.
#[derive(Debug)]
pub(crate) enum Fate {
    /// The sample's bytes or its error, due at `at`: the emulated tier answers (success or
    /// failure) when it has served the request, an injected delay on top. `None`: now (no
    /// emulated tier and no delay, so no clock read).
    Deliver { at: Option<Instant>, loaded: Loaded },
    /// A transient failure with attempts left: try again at `at`.
    Retry { at: Instant },
}

/// One attempt of the read of `meta` for an access in `epoch`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt<'a> {
    pub(crate) meta: &'a SampleMeta,
    pub(crate) epoch: u32,
    /// 0 for the first attempt.
    pub(crate) number: u32,
    /// When the emulated tier answers it, reserved when it was issued.
    pub(crate) due: Option<Instant>,
}

/// What decides every storage read attempt's fate, whoever makes it: the emulated tier and the
/// injected faults (each if configured, feature `lab`), and the counts of what failed.
#[derive(Debug, Default)]
pub(crate) struct ReadFates {
    device: Option<Device>,
    faults: Option<FaultInjection>,
    pub(crate) counters: FaultCounters,
    pub(crate) delivered: DeliveredByEpoch,
}

impl ReadFates {
    pub(crate) fn new(
        emulation: Option<StorageEmulation>,
        faults: Option<FaultInjection>,
        epochs: u32,
    ) -> Self {
        ReadFates {
            device: emulation.map(Device::new),
            faults,
            counters: FaultCounters::default(),
            delivered: DeliveredByEpoch::new(epochs),
        }
    }

    /// Reserves the emulated tier (if any) for a read of `bytes` issued at `issued`: when it
    /// is due. Reserved at issue, so the tier serves requests in the order they were issued.
    pub(crate) fn reserve(&self, issued: Instant, bytes: u64) -> Option<Instant> {
        self.device.as_ref().map(|d| d.finish_time(issued, bytes))
    }

    /// Counts an attempt of `epoch` that made no request of its own: it rode another's.
    pub(crate) fn shared_request(&self, epoch: u32) {
        self.delivered.shared(epoch);
    }

    /// Decides `attempt`'s fate from what the read returned.
    pub(crate) fn fate(&self, attempt: Attempt<'_>, read: Result<Bytes, ReadFailure>) -> Fate {
        let epoch = attempt.epoch;
        self.delivered.attempted(epoch);
        let fate = fate(attempt, self.faults.as_ref(), &self.counters, read);
        if let Fate::Deliver {
            loaded: Ok(bytes), ..
        } = &fate
        {
            self.delivered.add(epoch, bytes.len() as u64);
        }
        fate
    }
}

fn fate(
    attempt: Attempt<'_>,
    injection: Option<&FaultInjection>,
    counters: &FaultCounters,
    read: Result<Bytes, ReadFailure>,
) -> Fate {
    let Attempt {
        meta,
        epoch,
        number,
        due,
    } = attempt;
    let result = read.and_then(|bytes| match injection {
        None => Ok((bytes, Duration::ZERO)),
        Some(f) => {
            if f.decide(meta.id, epoch, number) != AttemptFaults::default() {
                counters.injected.fetch_add(1, Ordering::Relaxed);
            }
            f.apply(meta.id, epoch, number, bytes)
                .map_err(|e| ReadFailure {
                    transient: e.transient,
                    cause: std::sync::Arc::new(e.cause),
                })
        }
    });
    let answered = || {
        let now = Instant::now();
        due.map_or(now, |due| due.max(now))
    };
    // When an attempt that succeeded or failed for good is answered.
    let deliver_at =
        |delay: Duration| (due.is_some() || !delay.is_zero()).then(|| answered() + delay);
    match result {
        Ok((bytes, delay)) => {
            if number > 0 {
                counters.recovered.fetch_add(1, Ordering::Relaxed);
            }
            Fate::Deliver {
                at: deliver_at(delay),
                loaded: Ok(bytes),
            }
        }
        Err(e) if e.transient && number + 1 < READ_ATTEMPTS => {
            counters.retries.fetch_add(1, Ordering::Relaxed);
            Fate::Retry {
                at: answered() + faults::backoff(number + 1),
            }
        }
        Err(e) => Fate::Deliver {
            at: deliver_at(Duration::ZERO),
            loaded: Err(meta.read_error(e.cause)),
        },
    }
}
