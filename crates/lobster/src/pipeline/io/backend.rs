//! Where the dispatcher's reads go: its own session of the reader (local files, by path, in
//! one ring) or, for a dataset in an object store, the store's queue of ranged GETs. Either
//! way a read is queued without blocking and its completion reaped by the dispatcher, so the
//! io_depth budget, the deadline order and the retries above are the same for both.

use std::time::Duration;

use bytes::Bytes;
use lobster_uring::{PathRead, ReadError, Reader, Session};

use crate::error::Error;
use crate::pipeline::context::Context;
use crate::pipeline::landing::Origin;
use crate::pipeline::read::attempt::ReadFailure;

/// The reads in flight and where they complete.
pub(super) enum Backend {
    Ring {
        session: Session,
        completed: Vec<lobster_uring::Completion>,
    },
    #[cfg(feature = "s3")]
    Store {
        session: lobster_store::StoreSession,
        objects: std::sync::Arc<crate::dataset::Objects>,
        completed: Vec<lobster_store::StoreCompletion>,
    },
}

/// A read's outcome.
pub(super) struct Done {
    pub(super) tag: u64,
    pub(super) result: Result<Bytes, ReadFailure>,
    /// Served by another read's request (a coalesced GET): no request of its own.
    pub(super) shared: bool,
}

impl Done {
    fn new<E: Into<ReadFailure>>(tag: u64, result: Result<Bytes, E>, shared: bool) -> Done {
        Done {
            tag,
            result: result.map_err(Into::into),
            shared,
        }
    }
}

/// What became of a read handed to the backend.
pub(super) enum Queued {
    Yes,
    /// No pool memory for it while other reads hold some: try again when memory is back.
    WouldBlock,
    /// Refused for good.
    Refused(ReadFailure),
}

impl Backend {
    /// The backend for `ctx`'s dataset.
    pub(super) fn new<T>(ctx: &Context<T>, reader: &Reader) -> Result<Backend, Error> {
        #[cfg(feature = "s3")]
        if let crate::dataset::Source::Objects(objects) = ctx.dataset.source() {
            return Ok(Backend::Store {
                session: objects.store.session(),
                objects: std::sync::Arc::clone(objects),
                completed: Vec::new(),
            });
        }
        let _ = ctx;
        let session = reader
            .session()
            .map_err(|e| Error::engine("reader session", e))?;
        Ok(Backend::Ring {
            session,
            completed: Vec::new(),
        })
    }

    /// Where its bytes live: the reader's pool (returned to it, so the cache keeps a copy)
    /// or memory of their own.
    pub(super) fn origin(&self) -> Origin {
        match self {
            Backend::Ring { .. } => Origin::Pool,
            #[cfg(feature = "s3")]
            Backend::Store { .. } => Origin::Own,
        }
    }

    /// Queues the read of sample `sample` for `class` (its rank), tagged `tag`, without a
    /// system call or a wait: a loop's reads reach the kernel (or the store) together when
    /// the dispatcher next waits.
    pub(super) fn queue<T>(
        &mut self,
        ctx: &Context<T>,
        sample: u32,
        class: usize,
        tag: u64,
    ) -> Queued {
        let meta = ctx.meta(sample);
        match self {
            Backend::Ring { session, .. } => {
                // A whole file asks one byte more than the sample: a file that grew since the
                // dataset was opened shows as too long, without a stat.
                let queued = session.queue_path(PathRead {
                    path: meta.path.clone(),
                    dir: ctx.dirs.as_ref().and_then(|d| d.dir(meta)).cloned(),
                    direct: ctx.config.reads.direct,
                    offset: meta.offset,
                    len: meta.read_len(),
                    to_eof: meta.whole_file,
                    class,
                    tag,
                });
                match queued {
                    Ok(()) => Queued::Yes,
                    Err(ReadError::WouldBlock { .. }) => Queued::WouldBlock,
                    Err(e) => Queued::Refused(e.into()),
                }
            }
            #[cfg(feature = "s3")]
            Backend::Store {
                session, objects, ..
            } => match session.queue(objects.read(&meta.path, meta.range(), tag)) {
                Ok(()) => Queued::Yes,
                Err(e) => Queued::Refused(e.into()),
            },
        }
    }

    /// Waits until `min` reads complete or `timeout` passes, and appends what completed.
    pub(super) fn wait_timeout(
        &mut self,
        min: usize,
        timeout: Duration,
        out: &mut Vec<Done>,
    ) -> Result<(), Error> {
        match self {
            Backend::Ring { session, completed } => {
                session
                    .wait_timeout(min, timeout, completed)
                    .map_err(|e| Error::engine("reader session", e))?;
                out.extend(
                    completed
                        .drain(..)
                        .map(|c| Done::new(c.tag, c.result, false)),
                );
            }
            #[cfg(feature = "s3")]
            Backend::Store {
                session, completed, ..
            } => {
                session
                    .wait_timeout(min, timeout, completed)
                    .map_err(|e| Error::engine("object store session", e))?;
                out.extend(
                    completed
                        .drain(..)
                        .map(|c| Done::new(c.tag, c.result, c.shared)),
                );
            }
        }
        Ok(())
    }
}
