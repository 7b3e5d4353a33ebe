//! Where a sample's bytes appear: the landing every access to one read waits on.
//!
//! A miss creates a landing; the hits the cache plans on that sample share it. Whoever fills the
//! landing (the dispatcher, a worker, a peer's answer) releases every waiter, each with what it
//! finds there, and the caller hands them to the decode queues in one go. A sample the cache
//! keeps that the page cache already holds settles the landing without bytes: its hits read it
//! there. The landing knows its waiters only as `W` (accesses, in `pipeline/access.rs`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use lobster_net::Reply;
use lobster_uring::Arena;

use crate::error::Error;
use crate::pipeline::sync::{lock, StopSignal};

/// Bytes of one sample, or why they could not be had. Shared by every access that needs them.
pub(crate) type Loaded = Result<Bytes, Error>;

/// The bytes of one read, once they are known, and who waits for them until then.
#[derive(Debug)]
pub(crate) struct Landing<W> {
    state: Mutex<LandingState<W>>,
    /// Notified when the landing is filled, for a thread that waits on it (the disk's).
    filled: Condvar,
}

/// How often a thread waiting on a landing looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Peers' fetches of a sample whose read is in flight: answered when it lands, a miss if it
/// never does.
#[derive(Default)]
struct PeerWaiters(Vec<Reply>);

impl std::fmt::Debug for PeerWaiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} peer fetches", self.0.len())
    }
}

/// What a waiter finds when the landing is filled.
#[derive(Clone, Debug)]
pub(crate) enum Found {
    /// The bytes, or why they could not be had.
    Bytes(Loaded),
    /// A cached sample left in the page cache: the waiter reads it there.
    InPageCache,
    /// The sample's decoded image, in place of its bytes.
    Decoded,
}

#[derive(Debug)]
enum LandingState<W> {
    Pending(Vec<W>, PeerWaiters),
    Ready(Loaded),
    /// A cached sample the page cache held when it was read: the cache keeps no copy, and
    /// each hit reads it from there.
    InPageCache,
    /// A sample the cache keeps decoded: its bytes are gone, its hits transform the image.
    Decoded(Arc<DecodedImage>),
}

/// A sample's decoded image as the cache keeps it: the pixels in the cache's arena (or the
/// heap, as [`cache_copy`] places bytes), and how long the decode that made it took.
#[derive(Debug)]
pub(crate) struct DecodedImage {
    width: u32,
    height: u32,
    pixels: Bytes,
    decode: std::time::Duration,
}

impl DecodedImage {
    pub(crate) fn new(
        image: lobster_image::Image,
        decode: std::time::Duration,
        arena: Option<&Arena>,
    ) -> Self {
        let (width, height) = (image.width(), image.height());
        let pixels = Bytes::from(image.into_pixels());
        // Large images move to the arena's pages, as large encoded samples do.
        let pixels = if pixels.len() < LARGE_FROM_BYTES {
            pixels
        } else {
            cache_copy(&pixels, arena)
        };
        DecodedImage {
            width,
            height,
            pixels,
            decode,
        }
    }

    pub(crate) fn view(&self) -> lobster_image::ImageRef<'_> {
        lobster_image::ImageRef::new(self.width, self.height, &self.pixels)
            .expect("a decoded image keeps its shape")
    }

    pub(crate) fn decode_ns(&self) -> u64 {
        u64::try_from(self.decode.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Where a read's bytes live, which decides what the cache keeps of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A block of the reader's pool, which must go back to it: the cache keeps a copy.
    Pool,
    /// Memory of their own (a blocking read, a read into the arena or the heap): the cache
    /// keeps them as they are.
    Own,
    /// The page cache, which holds the sample: the cache keeps no copy, and its hits read it
    /// back from there.
    PageCache,
}

/// Samples at or above this size are large: the cache keeps them in its arena, and reads
/// of them not kept go to pool blocks. Smaller ones live on the heap, whose size classes
/// reuse freed memory without a page fault or a shared lock.
pub(crate) const LARGE_FROM_BYTES: usize = 64 << 10;

/// A cached sample's own copy, so pool buffers only hold samples in flight (the pool stays
/// small however large the cache). Large samples go to the cache's arena (whole pages, reused
/// after evictions, no mapping per sample) so that evicted ones do not fragment the heap over
/// a long run; small ones, which the allocator keeps in size classes, to the heap. Without an
/// arena, or when it is full, large samples get pages of their own, or the heap when the
/// system refuses another mapping (vm.max_map_count).
fn cache_copy(b: &Bytes, arena: Option<&Arena>) -> Bytes {
    if b.len() < LARGE_FROM_BYTES {
        return Bytes::copy_from_slice(b);
    }
    arena
        .and_then(|a| a.copy(b))
        .or_else(|| lobster_uring::copy_to_pages(b).ok())
        .unwrap_or_else(|| Bytes::copy_from_slice(b))
}

impl<W> Landing<W> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Landing {
            state: Mutex::new(LandingState::Pending(Vec::new(), PeerWaiters::default())),
            filled: Condvar::new(),
        })
    }

    /// Answers a peer's fetch with the bytes, once read (a miss if the read failed, or if the
    /// cache keeps no bytes of the sample).
    pub(crate) fn serve(&self, reply: Reply) {
        let mut state = lock(&self.state);
        if let LandingState::Pending(_, peers) = &mut *state {
            peers.0.push(reply);
            return;
        }
        let found = match &*state {
            LandingState::Ready(Ok(b)) => Some(b.clone()),
            _ => None,
        };
        drop(state);
        reply(found);
    }

    /// Blocks until the landing is filled or the loader stops: the bytes it keeps, or
    /// `None` if its read failed, it keeps no bytes, or the loader stopped.
    pub(crate) fn wait_bytes(&self, stop: &StopSignal) -> Option<Bytes> {
        let mut state = lock(&self.state);
        loop {
            match &*state {
                LandingState::Pending(..) => {}
                LandingState::Ready(Ok(b)) => return Some(b.clone()),
                _ => return None,
            }
            if stop.is_set() {
                return None;
            }
            state = self
                .filled
                .wait_timeout(state, STOP_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Parks `waiter` until the landing is filled, or gives it back with what it finds if it is.
    pub(crate) fn wait(&self, waiter: W) -> Option<(W, Found)> {
        let mut state = lock(&self.state);
        let found = match &mut *state {
            LandingState::Pending(waiters, _) => {
                waiters.push(waiter);
                return None;
            }
            LandingState::Ready(loaded) => Found::Bytes(loaded.clone()),
            LandingState::InPageCache => Found::InPageCache,
            LandingState::Decoded(_) => Found::Decoded,
        };
        Some((waiter, found))
    }

    /// Puts the sample's decoded image in place of its bytes; `false` if the landing holds no
    /// good bytes to replace (its read or decode failed, or an image is there already).
    pub(crate) fn keep_decoded(&self, image: DecodedImage) -> bool {
        let mut state = lock(&self.state);
        match &*state {
            LandingState::Ready(Ok(_)) | LandingState::InPageCache => {
                *state = LandingState::Decoded(Arc::new(image));
                true
            }
            LandingState::Pending(..) | LandingState::Ready(Err(_)) | LandingState::Decoded(_) => {
                false
            }
        }
    }

    /// The decoded image, if the cache keeps the sample decoded and it has been made.
    pub(crate) fn decoded(&self) -> Option<Arc<DecodedImage>> {
        match &*lock(&self.state) {
            LandingState::Decoded(image) => Some(image.clone()),
            _ => None,
        }
    }

    /// Fills the landing: the waiters, what they find, and the bytes as the landing keeps them. A
    /// sample the cache keeps (`admitted`) whose bytes hold a pool block is copied out of the
    /// pool first; one the page cache holds is not kept at all, and its hits are sent to read
    /// it there.
    pub(crate) fn fill(
        &self,
        loaded: Loaded,
        admitted: bool,
        origin: Origin,
        arena: Option<&Arena>,
    ) -> (Vec<W>, Found, Loaded) {
        if admitted && origin == Origin::PageCache && loaded.is_ok() {
            let (waiters, peers) = self.settle(LandingState::InPageCache);
            answer(peers, None);
            return (waiters, Found::InPageCache, loaded);
        }
        let loaded = match loaded {
            Ok(b) if admitted && origin == Origin::Pool => Ok(cache_copy(&b, arena)),
            other => other,
        };
        let (waiters, peers) = self.settle(LandingState::Ready(loaded.clone()));
        answer(peers, loaded.as_ref().ok());
        (waiters, Found::Bytes(loaded.clone()), loaded)
    }

    /// Moves a pending landing to `settled`, returning the accesses and the peers' fetches
    /// that waited on it.
    fn settle(&self, settled: LandingState<W>) -> (Vec<W>, PeerWaiters) {
        let mut state = lock(&self.state);
        let before = std::mem::replace(&mut *state, settled);
        drop(state);
        self.filled.notify_all();
        match before {
            LandingState::Pending(waiters, peers) => (waiters, peers),
            LandingState::Ready(_) | LandingState::InPageCache | LandingState::Decoded(_) => {
                unreachable!("a landing is filled once")
            }
        }
    }

    /// The bytes, once read and if the read succeeded (what a peer's fetch is served).
    pub(crate) fn bytes(&self) -> Option<Bytes> {
        match &*lock(&self.state) {
            LandingState::Ready(Ok(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// The bytes a storage read admitted to the cache failed to decode (corrupt on the way,
    /// or bad on disk): later hits read storage instead, and the cached copy is freed.
    pub(crate) fn spoil(&self, error: Error) {
        let mut state = lock(&self.state);
        if let LandingState::Ready(loaded @ Ok(_)) = &mut *state {
            *loaded = Err(error);
        }
    }
}

impl<W> Drop for Landing<W> {
    fn drop(&mut self) {
        // A landing dropped unfilled (the loader stopped) still answers its peers.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let LandingState::Pending(_, peers) = state {
            answer(std::mem::take(peers), None);
        }
    }
}

/// Answers the peers' fetches that waited on a landing, outside its lock.
fn answer(peers: PeerWaiters, bytes: Option<&Bytes>) {
    for reply in peers.0 {
        reply(bytes.cloned());
    }
}
