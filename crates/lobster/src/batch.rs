//! What a rank receives: batches of decoded samples in the sampler's order.

/// One decoded sample of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<T> {
    /// The sample's id in the dataset.
    pub id: u32,
    /// Its label.
    pub label: u32,
    /// What the decode function made of its bytes.
    pub value: T,
}

/// One rank's batch for one iteration, in the sampler's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch<T> {
    /// The epoch.
    pub epoch: u32,
    /// The iteration within the epoch.
    pub iteration: u32,
    /// The samples, in the order the sampler gave them to this rank. With
    /// [`OnError::Skip`](crate::OnError::Skip) a batch is delivered short: samples that failed are left out
    /// (the others keep their order) and listed in `skipped`; it is not refilled, so every
    /// rank gets the same number of batches and steps stay in lockstep.
    pub samples: Vec<Sample<T>>,
    /// Ids of the samples left out of this batch by [`OnError::Skip`](crate::OnError::Skip), in plan order.
    pub skipped: Vec<u32>,
}
