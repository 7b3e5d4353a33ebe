//! What the loader does when a sample fails, which failures it retries, and a deterministic
//! fault injector for tests, demos and benches (public with the `lab` feature).

use std::fmt;
use std::io;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Error;

/// How many samples an epoch may lose before the run fails.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FailureBudget {
    /// At most this many skipped accesses per epoch on this node.
    Count(u64),
    /// At most this fraction (0..=1) of the node's accesses in an epoch, rounded up: any
    /// fraction above 0 allows at least one failure however short the epoch (1% of 50
    /// accesses allows 1, not 0).
    Fraction(f64),
}

impl FailureBudget {
    /// The skipped accesses allowed in an epoch of `accesses` accesses.
    pub fn allowed(&self, accesses: u64) -> u64 {
        match *self {
            FailureBudget::Count(n) => n,
            FailureBudget::Fraction(f) => {
                let share = f * accesses as f64;
                // 1% of 300 is 3.0000000000000004 in floats: a share within rounding of a
                // whole number is that number.
                let whole = share.round();
                if (share - whole).abs() <= 1e-9 * whole.max(1.0) {
                    whole as u64
                } else {
                    share.ceil() as u64
                }
            }
        }
    }
}

impl fmt::Display for FailureBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureBudget::Count(n) => write!(f, "{n}"),
            FailureBudget::Fraction(x) => write!(f, "{}%", x * 100.0),
        }
    }
}

impl FromStr for FailureBudget {
    type Err = Error;
    /// `N` (a count) or `P%` (a percentage of the epoch's accesses).
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::invalid("max_failures", s, "a count N or a percentage P% (0-100)");
        match s.trim().strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.trim().parse().map_err(|_| bad())?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(bad());
                }
                Ok(FailureBudget::Fraction(p / 100.0))
            }
            None => s
                .trim()
                .parse()
                .map(FailureBudget::Count)
                .map_err(|_| bad()),
        }
    }
}

/// What a rank's iterator does with a sample that could not be read or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum OnError {
    /// The batch holding the sample is an error naming the sample id, path, offset and cause.
    #[default]
    Fail,
    /// The sample is left out: its batch is delivered short (the other samples in plan order,
    /// the skipped ids in [`Batch::skipped`](crate::Batch::skipped)), every rank still gets
    /// every batch, and the skip is recorded in [`RunMetrics`](crate::RunMetrics). Once an
    /// epoch skips more than `max_failures`, every rank's next batch is
    /// [`Error::TooManyFailures`] and its iterator ends.
    Skip {
        /// Skipped accesses allowed per epoch, node-wide.
        max_failures: FailureBudget,
    },
}

/// Attempts per storage read: one, then retries of transient failures with backoff.
pub const READ_ATTEMPTS: u32 = 4;

/// The wait before retry `attempt` (1-based): 1, 2, 4 ms.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(1 << (attempt - 1).min(10))
}

/// Whether an OS error may go away if the read is tried again (EAGAIN, EINTR, EBUSY, a
/// timeout, EIO until the attempts run out); ENOENT, EACCES and the like never do.
pub(crate) fn transient(e: &io::Error) -> bool {
    // EIO is 5 on Linux, the only platform lobster-io targets.
    const EIO: i32 = 5;
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::ResourceBusy
    ) || e.raw_os_error() == Some(EIO)
}

/// One failed read attempt.
#[derive(Debug)]
pub(crate) struct AttemptError {
    pub(crate) transient: bool,
    pub(crate) cause: io::Error,
}

/// The fault a storage read ends with once its attempts are spent.
#[cfg(feature = "lab")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Every attempt fails with an I/O error (a bad block).
    Eio,
    /// Every attempt returns fewer bytes than the sample has.
    Short,
    /// The read succeeds but bytes are flipped: the decode function sees garbage.
    Corrupt,
}

/// The faults the injector puts into one read attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptFaults {
    /// The attempt fails with EIO (the same for every attempt of that read).
    pub eio: bool,
    /// The attempt returns a short read (drawn again at each attempt).
    pub short: bool,
    /// The attempt takes [`FaultInjection::delay_us`] longer (drawn at each attempt).
    pub delay: bool,
    /// The bytes are corrupted (the same for every attempt of that read).
    pub corrupt: bool,
}

/// Deterministic faults on storage reads, for tests and demos.
///
/// Every fault is a pure function of (`seed`, sample id, epoch of the access that reads it,
/// attempt), never of timing, so the same seed gives the same faults on every run, backend and
/// execution. EIO and corruption are drawn once per read (a bad block stays bad on retry);
/// short reads and delays are drawn again at every attempt, so a short read usually succeeds
/// when retried. Probabilities are per read: `eio + corrupt <= 1` and `short + delay <= 1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultInjection {
    /// Seed of the decisions.
    pub seed: u64,
    /// Probability that a read fails with EIO on every attempt.
    pub eio: f64,
    /// Probability that an attempt returns a short read.
    pub short: f64,
    /// Probability that an attempt is delayed by `delay_us`.
    pub delay: f64,
    /// Probability that a read's bytes are corrupted.
    pub corrupt: f64,
    /// Extra latency of a delayed attempt, microseconds.
    pub delay_us: u64,
}

impl Default for FaultInjection {
    fn default() -> Self {
        Self {
            seed: 0,
            eio: 0.0,
            short: 0.0,
            delay: 0.0,
            corrupt: 0.0,
            delay_us: 2000,
        }
    }
}

/// splitmix64's finaliser: a well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in [0, 1) from the inputs.
fn draw(seed: u64, sample: u32, epoch: u32, salt: u64) -> f64 {
    let h = mix(mix(mix(seed) ^ u64::from(sample)) ^ (u64::from(epoch) << 32 | salt));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Salt of the per-read draw; attempts use their own number.
const PER_READ: u64 = u32::MAX as u64;

impl FaultInjection {
    /// What happens to attempt `attempt` (0-based) of the read of `sample` for an access in
    /// `epoch`.
    pub fn decide(&self, sample: u32, epoch: u32, attempt: u32) -> AttemptFaults {
        let read = draw(self.seed, sample, epoch, PER_READ);
        let this = draw(self.seed, sample, epoch, u64::from(attempt));
        AttemptFaults {
            eio: read < self.eio,
            corrupt: (self.eio..self.eio + self.corrupt).contains(&read),
            short: this < self.short,
            delay: (self.short..self.short + self.delay).contains(&this),
        }
    }

    /// The fault the read of `sample` for an access in `epoch` ends with after all
    /// [`READ_ATTEMPTS`]; `None` if it delivers the right bytes. What a test expects of a read.
    #[cfg(feature = "lab")]
    pub fn outcome(&self, sample: u32, epoch: u32) -> Option<Fault> {
        let first = self.decide(sample, epoch, 0);
        if first.eio {
            return Some(Fault::Eio);
        }
        if (0..READ_ATTEMPTS).all(|a| self.decide(sample, epoch, a).short) {
            return Some(Fault::Short);
        }
        first.corrupt.then_some(Fault::Corrupt)
    }

    /// Applies attempt `attempt`'s decision to the bytes storage returned: the bytes to use
    /// (flipped if corrupt) and the extra delay, or the attempt's failure.
    pub(crate) fn apply(
        &self,
        sample: u32,
        epoch: u32,
        attempt: u32,
        bytes: Bytes,
    ) -> Result<(Bytes, Duration), AttemptError> {
        let d = self.decide(sample, epoch, attempt);
        if d.eio {
            return Err(AttemptError {
                transient: true,
                cause: io::Error::other(format!(
                    "injected EIO (attempt {} of {READ_ATTEMPTS})",
                    attempt + 1
                )),
            });
        }
        if d.short {
            return Err(AttemptError {
                transient: true,
                cause: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "injected short read: {} of {} bytes (attempt {} of {READ_ATTEMPTS})",
                        bytes.len() / 2,
                        bytes.len(),
                        attempt + 1
                    ),
                ),
            });
        }
        let bytes = if d.corrupt { corrupt(&bytes) } else { bytes };
        let delay = if d.delay {
            Duration::from_micros(self.delay_us)
        } else {
            Duration::ZERO
        };
        Ok((bytes, delay))
    }

    /// Checks the probabilities.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        for (name, p) in [
            ("inject eio", self.eio),
            ("inject short", self.short),
            ("inject delay", self.delay),
            ("inject corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::invalid(name, p, "a probability 0..=1"));
            }
        }
        if self.eio + self.corrupt > 1.0 {
            return Err(Error::invalid(
                "inject eio + corrupt",
                self.eio + self.corrupt,
                "at most 1",
            ));
        }
        if self.short + self.delay > 1.0 {
            return Err(Error::invalid(
                "inject short + delay",
                self.short + self.delay,
                "at most 1",
            ));
        }
        if self.delay_us > 10_000_000 {
            return Err(Error::invalid(
                "inject delay_us",
                self.delay_us,
                "0..=10000000",
            ));
        }
        Ok(())
    }
}

impl FromStr for FaultInjection {
    type Err = Error;
    /// `seed=S,eio=P,short=P,delay=P,corrupt=P[,delay_us=U]`; missing keys are 0 (delay_us
    /// 2000).
    fn from_str(s: &str) -> Result<Self, Error> {
        let mut f = FaultInjection::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                Error::invalid("inject-faults", part, "key=value pairs separated by commas")
            })?;
            let (key, value) = (key.trim(), value.trim());
            let prob = |name: &'static str| {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| Error::invalid(name, value, "a probability 0..=1"))
            };
            match key {
                "seed" => {
                    f.seed = value
                        .parse()
                        .map_err(|_| Error::invalid("seed", value, "an unsigned integer"))?;
                }
                "eio" => f.eio = prob("eio")?,
                "short" => f.short = prob("short")?,
                "delay" => f.delay = prob("delay")?,
                "corrupt" => f.corrupt = prob("corrupt")?,
                "delay_us" => {
                    f.delay_us = value
                        .parse()
                        .map_err(|_| Error::invalid("delay_us", value, "microseconds"))?;
                }
                other => {
                    return Err(Error::invalid(
                        "inject-faults key",
                        other,
                        "seed, eio, short, delay, corrupt or delay_us",
                    ))
                }
            }
        }
        f.validate()?;
        Ok(f)
    }
}

/// The bytes with every byte of the first 64 and the middle one inverted, so any content
/// check sees the change (a zero-length sample has nothing to corrupt).
fn corrupt(bytes: &[u8]) -> Bytes {
    let mut v = bytes.to_vec();
    let mid = v.len() / 2;
    for b in v.iter_mut().take(64) {
        *b = !*b;
    }
    if mid >= 64 {
        v[mid] = !v[mid];
    }
    Bytes::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_match_their_probabilities_and_seeds_differ() {
        let f = FaultInjection {
            seed: 3,
            eio: 0.1,
            short: 0.2,
            delay: 0.3,
            corrupt: 0.05,
            ..FaultInjection::default()
        };
        let n = 20_000u32;
        let mut counts = [0u32; 4];
        for s in 0..n {
            let d = f.decide(s, 1, 0);
            counts[0] += u32::from(d.eio);
            counts[1] += u32::from(d.short);
            counts[2] += u32::from(d.delay);
            counts[3] += u32::from(d.corrupt);
            assert!(!(d.eio && d.corrupt || d.short && d.delay));
            // A bad block stays bad on retry.
            assert_eq!(f.decide(s, 1, 2).eio, d.eio);
        }
        for (c, p) in counts.iter().zip([0.1, 0.2, 0.3, 0.05]) {
            let rate = f64::from(*c) / f64::from(n);
            assert!((rate - p).abs() < 0.015, "rate {rate} vs {p}");
        }
        let other = FaultInjection { seed: 4, ..f };
        let differ = (0..1000).filter(|&s| f.outcome(s, 0) != other.outcome(s, 0));
        assert!(differ.count() > 50);
    }

    #[test]
    fn outcome_agrees_with_the_attempts() {
        let f = FaultInjection {
            seed: 9,
            eio: 0.1,
            short: 0.6,
            corrupt: 0.1,
            ..FaultInjection::default()
        };
        let bytes = Bytes::from(vec![7u8; 300]);
        for s in 0..2000 {
            let mut last = None;
            for a in 0..READ_ATTEMPTS {
                match f.apply(s, 2, a, bytes.clone()) {
                    Ok((b, _)) => {
                        last = Some(b);
                        break;
                    }
                    Err(e) => assert!(e.transient),
                }
            }
            let expected = match &last {
                None if f.decide(s, 2, 0).eio => Some(Fault::Eio),
                None => Some(Fault::Short),
                Some(b) if *b != bytes => Some(Fault::Corrupt),
                Some(_) => None,
            };
            assert_eq!(f.outcome(s, 2), expected, "sample {s}");
        }
    }

    #[test]
    fn parse_names_the_bad_key_or_value() {
        let f: FaultInjection = "seed=5,eio=0.01,short=0.1,delay=0.2,corrupt=0.02"
            .parse()
            .unwrap();
        assert_eq!((f.seed, f.eio, f.corrupt), (5, 0.01, 0.02));
        for (text, named) in [
            ("seed=5,eio=2", "eio"),
            ("seed=x", "seed"),
            ("bogus=1", "bogus"),
            ("eio", "eio"),
            ("short=0.7,delay=0.5", "short + delay"),
        ] {
            let e = text.parse::<FaultInjection>().unwrap_err().to_string();
            assert!(e.contains(named), "{text}: {e}");
        }
        assert_eq!(
            "5".parse::<FailureBudget>().unwrap(),
            FailureBudget::Count(5)
        );
        assert_eq!(
            "2.5%".parse::<FailureBudget>().unwrap(),
            FailureBudget::Fraction(0.025)
        );
        assert!("150%".parse::<FailureBudget>().is_err());
        assert!("-1".parse::<FailureBudget>().is_err());
        // Rounded up, so a short epoch still tolerates a failure; exact shares stay exact.
        assert_eq!(FailureBudget::Fraction(0.1).allowed(95), 10);
        assert_eq!(FailureBudget::Fraction(0.01).allowed(50), 1);
        assert_eq!(FailureBudget::Fraction(0.01).allowed(99), 1);
        assert_eq!(FailureBudget::Fraction(0.01).allowed(300), 3);
        assert_eq!(FailureBudget::Fraction(0.07).allowed(100), 7);
        assert_eq!(FailureBudget::Fraction(0.0).allowed(1000), 0);
    }

    #[test]
    fn transient_errors_are_told_from_permanent_ones() {
        assert!(transient(&io::Error::from_raw_os_error(5)));
        assert!(transient(&io::Error::from(io::ErrorKind::Interrupted)));
        assert!(transient(&io::Error::from(io::ErrorKind::WouldBlock)));
        assert!(!transient(&io::Error::from(io::ErrorKind::NotFound)));
        assert!(!transient(&io::Error::from(
            io::ErrorKind::PermissionDenied
        )));
    }
}
