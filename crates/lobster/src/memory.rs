//! The memory a run's parameters ask for, checked against what this process may have before
//! anything is allocated: a batch of 8192-pixel images or a cache larger than the machine is
//! an error naming the parameters, not an abort mid-run.

use std::fmt;

/// One part of a run's memory: what it is (naming the parameters that size it) and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPart {
    /// What holds the memory and which parameters size it.
    pub what: String,
    /// Its size.
    pub bytes: u64,
}

impl MemoryPart {
    /// A part of `bytes` held by `what`.
    pub fn new(what: impl Into<String>, bytes: u64) -> Self {
        MemoryPart {
            what: what.into(),
            bytes,
        }
    }
}

/// What this process may still allocate: the kernel's estimate of memory available without
/// swapping, and what its address-space limit (`ulimit -v`) leaves, whichever is less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineMemory {
    /// `MemAvailable` of `/proc/meminfo`.
    pub available_bytes: Option<u64>,
    /// `RLIMIT_AS` less the address space already mapped (`VmSize`), where a limit is set.
    pub address_space_left_bytes: Option<u64>,
}

impl MachineMemory {
    /// This process's, read from procfs; a figure procfs does not give is `None`.
    pub fn now() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let available_bytes = read("/proc/meminfo").and_then(|m| kib_field(&m, "MemAvailable:"));
        let limit = read("/proc/self/limits").and_then(|l| address_space_limit(&l));
        let mapped = read("/proc/self/status").and_then(|s| kib_field(&s, "VmSize:"));
        MachineMemory {
            available_bytes,
            address_space_left_bytes: limit.map(|l| l.saturating_sub(mapped.unwrap_or(0))),
        }
    }

    /// The lesser bound and what sets it.
    fn bound(&self) -> Option<(u64, &'static str)> {
        let available = self.available_bytes.map(|b| (b, "MemAvailable"));
        let left = self
            .address_space_left_bytes
            .map(|b| (b, "the address-space limit (ulimit -v)"));
        match (available, left) {
            (Some(a), Some(l)) => Some(if l.0 < a.0 { l } else { a }),
            (a, l) => a.or(l),
        }
    }

    /// Refuses `parts` when together they need more than this process may have.
    pub fn check(&self, parts: &[MemoryPart]) -> Result<(), MemoryShort> {
        let needed_bytes = parts
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.bytes));
        match self.bound() {
            Some((bytes, limit)) if needed_bytes > bytes => Err(MemoryShort {
                needed_bytes,
                available_bytes: bytes,
                limit,
                parts: parts.to_vec(),
            }),
            _ => Ok(()),
        }
    }
}

/// A run refused by [`MachineMemory::check`]: what it needs, by part, and what it may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryShort {
    /// The parts' sum.
    pub needed_bytes: u64,
    /// What this process may have.
    pub available_bytes: u64,
    /// What sets that bound.
    pub limit: &'static str,
    /// What needs the memory, each naming the parameters that size it.
    pub parts: Vec<MemoryPart>,
}

impl fmt::Display for MemoryShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the run needs {} of memory, more than the {} this process may have ({}):",
            Human(self.needed_bytes),
            Human(self.available_bytes),
            self.limit
        )?;
        for (i, p) in self.parts.iter().filter(|p| p.bytes > 0).enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}{} {}", p.what, Human(p.bytes))?;
        }
        Ok(())
    }
}

impl std::error::Error for MemoryShort {}

/// A `Name:  N kB` line's value in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(name))?;
    let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft `Max address space` of `/proc/self/limits`, in bytes (`None`: unlimited).
fn address_space_limit(limits: &str) -> Option<u64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Bytes as a person reads them.
struct Human(u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        match self.0 {
            0..=1023 => write!(f, "{} B", self.0),
            1024..=1_048_575 => write!(f, "{:.1} KiB", b / 1024.0),
            1_048_576..=1_073_741_823 => write!(f, "{:.1} MiB", b / 1_048_576.0),
            _ => write!(f, "{:.1} GiB", b / 1_073_741_824.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_fields_parse() {
        let meminfo = "MemTotal:  32768000 kB\nMemAvailable:   24124920 kB\n";
        assert_eq!(kib_field(meminfo, "MemAvailable:"), Some(24_124_920 * 1024));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         16384000000          unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), Some(16_384_000_000));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(unlimited), None);
    }

    #[test]
    fn the_lesser_bound_refuses_and_names_every_part() {
        let machine = MachineMemory {
            available_bytes: Some(10 << 30),
            address_space_left_bytes: Some(4 << 30),
        };
        let parts = [
            MemoryPart::new("decoded samples in flight (batch_size)", 3 << 30),
            MemoryPart::new("collation buffers", 2 << 30),
        ];
        let err = machine.check(&parts).unwrap_err().to_string();
        assert!(err.contains("ulimit -v"), "{err}");
        assert!(
            err.contains("batch_size") && err.contains("collation"),
            "{err}"
        );
        assert!(machine.check(&parts[..1]).is_ok());
        let unknown = MachineMemory {
            available_bytes: None,
            address_space_left_bytes: None,
        };
        assert!(unknown.check(&parts).is_ok());
    }
}
