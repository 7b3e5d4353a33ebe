//! A bucket of an S3-compatible store, read from plain threads.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::read::{Counters, Listing, ObjectInfo, RangeRead, StoreStats};
use crate::runtime::{self, Job, ReadReply, Reply, StoreThread};
use crate::session::StoreSession;
use crate::url::display;

/// One bucket, its store thread and its client. Clones share them; the thread stops and is
/// joined when the last clone and the last of its sessions are dropped.
#[derive(Clone)]
pub struct Store {
    thread: Arc<StoreThread>,
    bucket: Arc<str>,
    endpoint: Option<Arc<str>>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .finish()
    }
}

impl Store {
    /// Starts the store thread, then checks the bucket with one LIST of at most one key: a
    /// missing bucket is [`StoreError::NoSuchBucket`] (a HEAD cannot tell it from a missing
    /// key), refused credentials [`StoreError::AccessDenied`], both naming the bucket.
    pub fn open(config: &StoreConfig, bucket: &str) -> Result<Store, StoreError> {
        crate::url::StoreUrl::new(bucket, "")?;
        let counters = Arc::new(Counters::default());
        let thread = runtime::start(config, bucket, counters.clone())?;
        let store = Store {
            thread: Arc::new(thread),
            bucket: Arc::from(bucket),
            endpoint: config.endpoint().map(Arc::from),
            counters,
        };
        store.probe()?;
        Ok(store)
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The endpoint, if one was set.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Every object under `prefix` (all pages), sorted by key in UTF-8 byte order.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        Ok(self.list_job(prefix, false)?.1)
    }

    /// One level under `prefix` with delimiter `/`: the common prefixes (each ending in `/`)
    /// and the objects, both sorted. Pass a prefix ending in `/` to list a folder.
    pub fn list_dir(&self, prefix: &str) -> Result<(Vec<String>, Vec<ObjectInfo>), StoreError> {
        self.list_job(prefix, true)
    }

    /// Size and ETag of one object.
    pub fn head(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.thread.send(Job::Head(
            key.to_string(),
            Reply::new(tx, Err(StoreError::Stopped)),
        ))?;
        rx.recv().unwrap_or(Err(StoreError::Stopped))
    }

    /// One ranged GET, waited for.
    pub fn get(&self, read: &RangeRead) -> Result<Bytes, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reply = ReadReply::Once(Reply::new(tx, Err(StoreError::Stopped)));
        self.thread.send(Job::Read(read.clone(), reply))?;
        rx.recv().unwrap_or(Err(StoreError::Stopped))
    }

    /// A queue of reads driven by its owner: see [`StoreSession`].
    pub fn session(&self) -> StoreSession {
        StoreSession::new(self.thread.clone())
    }

    /// Cumulative request counts.
    pub fn stats(&self) -> StoreStats {
        self.counters.snapshot()
    }

    fn list_job(&self, prefix: &str, delimiter: bool) -> Result<Listing, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reply = Reply::new(tx, Err(StoreError::Stopped));
        self.thread.send(Job::List {
            prefix: prefix.to_string(),
            delimiter,
            reply,
        })?;
        rx.recv().unwrap_or(Err(StoreError::Stopped))
    }

    /// The check at open: one page of one key.
    fn probe(&self) -> Result<(), StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reply = Reply::new(tx, Err(StoreError::Stopped));
        self.thread.send(Job::Probe(reply))?;
        match rx.recv().unwrap_or(Err(StoreError::Stopped)) {
            Ok(()) => Ok(()),
            Err(StoreError::NotFound { .. }) => Err(StoreError::NoSuchBucket {
                url: display(&self.bucket, ""),
                cause: crate::error::message("the server has no such bucket"),
            }),
            Err(StoreError::AccessDenied { cause, .. }) => Err(StoreError::AccessDenied {
                url: display(&self.bucket, ""),
                cause,
            }),
            Err(e) => Err(e),
        }
    }
}
