//! Where a dataset's samples are read from: local files, or the objects of an S3-compatible
//! bucket (feature `s3`).

#[cfg(feature = "s3")]
use std::collections::HashMap;
#[cfg(feature = "s3")]
use std::path::Path;
#[cfg(feature = "s3")]
use std::sync::Arc;

/// Where a dataset's samples are read from.
#[derive(Clone, Debug, Default)]
pub(crate) enum Source {
    /// Local files, by path.
    #[default]
    Files,
    /// Objects of an S3-compatible bucket: a sample's path is its object's URL.
    #[cfg(feature = "s3")]
    Objects(Arc<Objects>),
}

/// Each object's key and ETag, by its URL.
#[cfg(feature = "s3")]
pub(crate) type ObjectKeys = HashMap<Arc<Path>, (Arc<str>, Option<Arc<str>>), ahash::RandomState>;

/// What reads of a store dataset need: the store, and each object's key and ETag by the
/// URL its samples share as their path.
#[cfg(feature = "s3")]
#[derive(Debug)]
pub(crate) struct Objects {
    pub(crate) store: lobster_store::Store,
    objects: ObjectKeys,
}

#[cfg(feature = "s3")]
impl Objects {
    /// `objects` maps each object's URL to its key and ETag.
    pub(crate) fn new(store: lobster_store::Store, objects: ObjectKeys) -> Self {
        Objects { store, objects }
    }

    /// The ranged GET of `len` bytes at `offset` of the object at URL `path` (`whole`: the
    /// whole object, which must not have grown), tagged `tag`.
    pub(crate) fn read(
        &self,
        path: &Path,
        (offset, len, whole): (u64, u64, bool),
        tag: u64,
    ) -> lobster_store::RangeRead {
        let (key, etag) = self
            .objects
            .get(path)
            .expect("every sample's object is known");
        lobster_store::RangeRead {
            key: Arc::clone(key),
            offset,
            len,
            whole_object: whole,
            if_match: etag.clone(),
            tag,
        }
    }
}
