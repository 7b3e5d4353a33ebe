//! An emulated shared storage tier: every storage read is charged a per-request latency and a
//! share of a bandwidth on top of the real read, so one node can reproduce a contended
//! parallel file system.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The emulated tier's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StorageEmulation {
    /// Bandwidth shared by every read of the node, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Latency of one request, overlapped among requests in flight.
    pub latency_us: u64,
}

/// The device clock: requests overlap their latency, then transfer one after another at the
/// shared bandwidth. A read issued at `t` of `b` bytes finishes at
/// `max(t + latency, link_free) + b / bandwidth`, and the link is busy until then. Callers
/// reserve when they issue the request (every attempt, failed ones too), so the link serves
/// requests in the order they were issued, not in the order the host happened to see the
/// real reads complete.
#[derive(Debug)]
pub(crate) struct Device {
    config: StorageEmulation,
    link_free: Mutex<Instant>,
}

impl Device {
    pub(crate) fn new(config: StorageEmulation) -> Self {
        Self {
            config,
            link_free: Mutex::new(Instant::now()),
        }
    }

    /// When a read of `bytes` issued at `issued` completes on the emulated tier.
    pub(crate) fn finish_time(&self, issued: Instant, bytes: u64) -> Instant {
        let ready = issued + Duration::from_micros(self.config.latency_us);
        let transfer = Duration::from_secs_f64(bytes as f64 / self.config.bandwidth_bytes_per_s);
        let mut link_free = self.link_free.lock().unwrap_or_else(|p| p.into_inner());
        let start = ready.max(*link_free);
        *link_free = start + transfer;
        *link_free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_overlaps_and_transfers_serialise() {
        let device = Device::new(StorageEmulation {
            bandwidth_bytes_per_s: 1e6,
            latency_us: 1000,
        });
        let t0 = Instant::now() + Duration::from_secs(1);
        // Two 1000-byte reads issued together: both wait 1 ms, then transfer 1 ms each.
        let a = device.finish_time(t0, 1000);
        let b = device.finish_time(t0, 1000);
        assert_eq!(a - t0, Duration::from_millis(2));
        assert_eq!(b - t0, Duration::from_millis(3));
        // A read issued after the link is idle again only pays its own latency and transfer.
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(
            device.finish_time(t1, 500) - t1,
            Duration::from_micros(1500)
        );
    }
}
