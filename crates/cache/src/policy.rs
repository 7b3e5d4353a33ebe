//! The contract every cache policy follows.

use std::fmt;

use crate::{CacheError, SampleId};

/// Next use of a sample that is never accessed again.
pub const NEVER: u64 = u64::MAX;

/// What a policy did with one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The sample was cached when accessed.
    pub hit: bool,
    /// The access was a miss and the sample is now cached.
    pub admitted: bool,
}

/// A cache replacement policy over a stream of accesses in stream order.
///
/// Contract, which every implementation keeps and the reference checker verifies:
/// - [`access`](Policy::access) is called once per access, in stream order, with strictly
///   increasing `position`s and the position of the sample's next access after this one
///   (`next_use`, [`NEVER`] if none). Policies that do not look ahead ignore `next_use`.
/// - The access is a hit if and only if the sample is cached when the call starts.
/// - Every sample the call removes from the cache is pushed to `evicted`, in the order of
///   removal, and nothing else is pushed; the caller clears `evicted`. A hit may evict the
///   accessed sample itself (reuse policy, no next use).
/// - `admitted` is true only on a miss that left the sample cached.
/// - After every call the bytes of the cached samples, by the size table the policy was built
///   with, never exceed [`capacity_bytes`](Policy::capacity_bytes) (asserted).
/// - Decisions depend only on the calls made, never on time or addresses, so two policies
///   built alike and fed alike decide alike.
pub trait Policy: fmt::Debug + Send {
    /// Records one access of `sample` at `position`; see the trait docs.
    fn access(
        &mut self,
        sample: SampleId,
        position: u64,
        next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> Outcome;

    /// Whether `sample` is cached now.
    fn contains(&self, sample: SampleId) -> bool;

    /// Bytes of the cached samples.
    fn used_bytes(&self) -> u64;

    /// The byte budget.
    fn capacity_bytes(&self) -> u64;

    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// Heap bytes held by the policy's own tables (for the memory budget).
    fn memory_bytes(&self) -> usize;

    /// Hint: these samples are accessed soon. Policies whose tables are too big for the
    /// CPU caches load their entries now, all at once, so the misses overlap instead of
    /// stalling one decision each. Never changes a decision.
    fn warm(&self, _upcoming: &[SampleId]) {}
}

/// The three policies, by name: `reuse`, `lru`, `static`. The parsers also take `lobster`
/// for `reuse` and `nopfs` for `static`, older spellings of the same policies: the policy is
/// named for what it does, NoPFS (whose idea static placement is) names a whole strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PolicyKind {
    /// Belady's rule with "do no harm" admission: the Lobster policy.
    #[cfg_attr(feature = "clap", value(alias = "lobster"))]
    Reuse,
    /// Least recently used.
    Lru,
    /// NoPFS static placement: pin the most accessed samples that fit.
    #[cfg_attr(feature = "clap", value(alias = "nopfs"))]
    Static,
}

impl PolicyKind {
    /// All policies, in the order tables print them.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Reuse, PolicyKind::Static, PolicyKind::Lru];
}

names!(PolicyKind, CacheError, |name: &str| CacheError::UnknownPolicy {
    name: name.to_owned()
}, {
    Reuse => "reuse" | "lobster",
    Lru => "lru",
    Static => "static" | "nopfs",
});
