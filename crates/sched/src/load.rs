use crate::SchedError;

/// Where a sample's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// A hit in the node-local cache: served from memory, in planner order, without io_depth.
    Cache,
    /// A read from local or shared storage, through the rank's io_depth.
    Storage,
    /// A read from another node's cache; reserved for the remote tier, through io_depth.
    Remote,
}

impl Tier {
    /// Every tier, in index order.
    pub const ALL: [Tier; 3] = [Tier::Cache, Tier::Storage, Tier::Remote];

    /// Whether reads of this tier are requests in flight, bounded by the rank's io_depth.
    pub fn uses_io_depth(self) -> bool {
        !matches!(self, Tier::Cache)
    }

    /// Lower-case name, as used in error parameters.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Cache => "cache",
            Tier::Storage => "storage",
            Tier::Remote => "remote",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Tier::Cache => 0,
            Tier::Storage => 1,
            Tier::Remote => 2,
        }
    }
}

/// A count of samples and their total bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Volume {
    /// Number of samples (one read request each for a read tier).
    pub samples: u64,
    /// Total bytes of those samples.
    pub bytes: u64,
}

impl Volume {
    /// Adds one sample of `bytes` (saturating).
    pub fn add(&mut self, bytes: u64) {
        self.samples = self.samples.saturating_add(1);
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

/// What one rank will load in the coming window of iterations.
///
/// The planner knows this exactly: which of the rank's samples hit the cache, which are read
/// from storage, and how many bytes each has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RankLoad {
    /// Per tier, indexed like [`Tier::ALL`].
    pub reads: [Volume; 3],
    /// Samples and bytes to decode.
    pub decode: Volume,
}

impl RankLoad {
    /// The read volume of `tier`.
    pub fn tier(&self, tier: Tier) -> Volume {
        self.reads[tier.index()]
    }

    /// Mutable read volume of `tier`.
    pub fn tier_mut(&mut self, tier: Tier) -> &mut Volume {
        &mut self.reads[tier.index()]
    }

    /// Records one sample of `bytes` read from `tier`.
    pub fn add_read(&mut self, tier: Tier, bytes: u64) {
        self.tier_mut(tier).add(bytes);
    }

    /// Records one sample of `bytes` to decode.
    pub fn add_decode(&mut self, bytes: u64) {
        self.decode.add(bytes);
    }

    /// Checks that no volume has bytes without samples.
    pub(crate) fn validate(&self, rank: usize) -> Result<(), SchedError> {
        for tier in Tier::ALL {
            let v = self.tier(tier);
            if v.samples == 0 && v.bytes > 0 {
                return Err(SchedError::InconsistentLoad {
                    rank,
                    parameter: tier.name(),
                    bytes: v.bytes,
                });
            }
        }
        if self.decode.samples == 0 && self.decode.bytes > 0 {
            return Err(SchedError::InconsistentLoad {
                rank,
                parameter: "decode",
                bytes: self.decode.bytes,
            });
        }
        Ok(())
    }
}
