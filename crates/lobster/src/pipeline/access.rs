//! One access of the node stream as it walks the stages: the one shape it has from the
//! planner's decision to its rank's batch. It says where the access stands in the stream,
//! what the cache decided for it, and who reads its bytes; with its bytes it is [`Ready`].

use std::sync::Arc;

use bytes::Bytes;
use lobster_cache::Form;
use lobster_uring::Arena;

use crate::pipeline::landing::{Found, Landing, Loaded, Origin};

/// The landing an access's bytes appear in, which its planned hits wait on.
pub(crate) type AccessLanding = Landing<Access>;

/// One access on its way to a rank's batch.
#[derive(Debug)]
pub(crate) struct Access {
    /// Position in the node stream (from 1): lower goes first in every queue.
    pub(crate) seq: u64,
    pub(crate) epoch: u32,
    pub(crate) iteration: u32,
    pub(crate) rank: usize,
    /// Position in its batch.
    pub(crate) pos: usize,
    pub(crate) sample: u32,
    pub(crate) cached: Cached,
    pub(crate) read: Read,
    /// The landing where the sample's bytes appear. `None` while the access waits in that
    /// landing's list: a waiting access holding its landing would make a reference cycle, leaked
    /// when the loader stops before the landing is filled.
    pub(crate) landing: Option<Arc<AccessLanding>>,
}

/// What the cache decided for an access: the form it finds the sample in (a hit), and the
/// form the access stores the sample in (`None` for a miss not kept, and for a hit that
/// stays as it was or goes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cached {
    pub(crate) found: Option<Form>,
    pub(crate) kept: Option<Form>,
    /// A miss the disk cache keeps: its bytes are written there once they land.
    pub(crate) to_disk: bool,
}

impl Cached {
    pub(crate) fn hit(self) -> bool {
        self.found.is_some()
    }

    /// A miss whose encoded bytes the cache keeps: the landing stores a right-sized copy, not a
    /// pool buffer.
    pub(crate) fn admitted(self) -> bool {
        self.found.is_none() && self.kept == Some(Form::Encoded)
    }

    /// Bytes that outlive the access's decode (the memory cache keeps them, or the disk
    /// thread writes them): the landing holds its own copy, not a pool block, so that the
    /// reader's pool never waits on the cache or the disk.
    pub(crate) fn keeps_bytes(self) -> bool {
        self.admitted() || (self.found.is_none() && self.to_disk)
    }

    /// The cache keeps the sample decoded after this access, and its image is still to
    /// make: the decode puts it in the landing.
    pub(crate) fn keep_decoded(self) -> bool {
        self.kept == Some(Form::Decoded) && self.found != Some(Form::Decoded)
    }

    /// A hit the plan expects to find decoded.
    pub(crate) fn hit_decoded(self) -> bool {
        self.found == Some(Form::Decoded)
    }
}

/// Who reads an access's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// No one: a hit, whose bytes come from the read that admitted the sample.
    Cached,
    /// The dispatcher, from storage.
    Storage(StorageRead),
    /// The peer node that holds the sample; storage if it does not answer with it.
    Peer(usize),
    /// The decode worker, blocking (read-then-decode), fetching from the peer first if one
    /// is planned to hold the sample.
    Blocking { peer: Option<usize> },
    /// The decode worker if the page cache holds the sample, else the dispatcher.
    IfResident,
    /// A hit on the disk cache: the disk thread reads it there (checked), or has it read
    /// from storage if it cannot (then `Blocking`).
    Disk,
    /// A hit on a sample the cache left in the page cache: the worker reads it there, or
    /// from storage if the page cache has let it go (the miss it then is).
    PageCacheHit,
}

/// A storage read's place in the dispatcher's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StorageRead {
    /// Iterations since the first epoch's first: the read's deadline.
    pub(crate) step: u64,
    /// Parts per million of its batch's storage bytes read once this read is done.
    pub(crate) finish_ppm: u32,
    /// The sample's size: of reads that end their batches together, the largest goes first.
    pub(crate) bytes: u64,
}

impl Access {
    /// Waits on `landing` until it is filled, or is ready now if it is.
    pub(crate) fn wait_on(self, landing: &Arc<AccessLanding>) -> Option<Ready> {
        let (access, found) = landing.wait(self)?;
        Some(access.released(landing, found))
    }

    /// This access, released from `landing` with what it found there.
    fn released(mut self, landing: &Arc<AccessLanding>, found: Found) -> Ready {
        let bytes = match found {
            Found::Bytes(bytes) => bytes,
            // A worker reads it from the page cache; it keeps its landing only to put the
            // sample's decoded image there.
            Found::InPageCache => {
                self.read = Read::PageCacheHit;
                self.landing = self.cached.keep_decoded().then(|| landing.clone());
                return Ready {
                    access: self,
                    bytes: Ok(Bytes::new()),
                };
            }
            Found::Decoded => Ok(Bytes::new()),
        };
        self.landing = Some(landing.clone());
        Ready {
            access: self,
            bytes,
        }
    }

    /// The storage read of an access the dispatcher holds.
    pub(crate) fn storage(&self) -> &StorageRead {
        match &self.read {
            Read::Storage(read) => read,
            other => unreachable!("only storage reads reach the dispatcher, not {other:?}"),
        }
    }

    pub(crate) fn storage_mut(&mut self) -> &mut StorageRead {
        match &mut self.read {
            Read::Storage(read) => read,
            other => unreachable!("only storage reads reach the dispatcher, not {other:?}"),
        }
    }
}

/// An access whose bytes are known, waiting for a decode thread.
#[derive(Debug)]
pub(crate) struct Ready {
    pub(crate) access: Access,
    pub(crate) bytes: Loaded,
}

/// Fills `landing` with a read's bytes and adds the accesses that waited on it to `released`;
/// returns the bytes as the landing keeps them (see [`Landing::fill`]).
pub(crate) fn fill(
    landing: &Arc<AccessLanding>,
    loaded: Loaded,
    admitted: bool,
    (origin, arena): (Origin, Option<&Arena>),
    released: &mut Vec<Ready>,
) -> Loaded {
    let (waiters, found, kept) = landing.fill(loaded, admitted, origin, arena);
    released.extend(
        waiters
            .into_iter()
            .map(|a| a.released(landing, found.clone())),
    );
    kept
}

/// Fills the landing of `access`, which holds it and read its bytes (the dispatcher, a peer's
/// answer): the access joins the ones released, with the bytes as kept.
pub(crate) fn fill_for(
    access: Access,
    loaded: Loaded,
    (origin, arena): (Origin, Option<&Arena>),
    released: &mut Vec<Ready>,
) {
    let landing = access
        .landing
        .as_ref()
        .expect("the reading access holds its landing");
    let bytes = fill(
        landing,
        loaded,
        access.cached.keeps_bytes(),
        (origin, arena),
        released,
    );
    released.push(Ready { access, bytes });
}
