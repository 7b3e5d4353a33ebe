//! The dispatcher's open files: one reader file per sample in flight, kept open a while
//! after its read in case the sample is read again soon, and bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use lobster_uring::{FileId, OpenOptions, Reader};

use crate::dataset::SampleMeta;
use crate::error::Error;

/// Open files the dispatcher keeps at most; least recently opened idle ones close first.
const OPEN_FILES_MAX: usize = 1024;

/// Open files by sample, closed least-recently-opened first when idle.
#[derive(Debug, Default)]
pub(crate) struct OpenFiles {
    /// std's hasher: ahash would save ~40 ns an acquire (benches/cache_maps.rs), small next
    /// to the open and stat each acquire makes, on a fallback path.
    by_sample: HashMap<u32, (FileId, usize)>,
    order: VecDeque<u32>,
}

impl OpenFiles {
    pub(crate) fn acquire(
        &mut self,
        reader: &Reader,
        meta: &SampleMeta,
        direct: bool,
    ) -> Result<FileId, Error> {
        if let Some((file, users)) = self.by_sample.get_mut(&meta.id) {
            *users += 1;
            return Ok(*file);
        }
        while self.by_sample.len() >= OPEN_FILES_MAX {
            let Some(i) = self.order.iter().position(|s| self.by_sample[s].1 == 0) else {
                break;
            };
            let sample = self.order.remove(i).expect("position is in range");
            let (file, _) = self
                .by_sample
                .remove(&sample)
                .expect("order mirrors the map");
            // A close error leaves nothing to undo: the id is gone either way.
            let _ = reader.close(file);
        }
        let file = reader
            .open(&meta.path, OpenOptions { direct })
            .map_err(|e| Error::Read {
                sample: meta.id,
                path: meta.path.to_path_buf(),
                offset: meta.offset,
                cause: Arc::new(e),
            })?;
        // A file that changed since the dataset was opened is reported as such, not read as
        // a short or partial sample. (A range is read exactly: a file that ends inside it
        // fails the read.)
        let size = std::fs::metadata(&meta.path).map(|m| m.len());
        if let (true, Ok(actual_bytes)) = (meta.whole_file, size) {
            if actual_bytes != meta.size_bytes {
                let _ = reader.close(file);
                return Err(Error::SizeChanged {
                    sample: meta.id,
                    path: meta.path.to_path_buf(),
                    expected_bytes: meta.size_bytes,
                    actual_bytes,
                });
            }
        }
        self.by_sample.insert(meta.id, (file, 1));
        self.order.push_back(meta.id);
        Ok(file)
    }

    pub(crate) fn release(&mut self, sample: u32) {
        if let Some((_, users)) = self.by_sample.get_mut(&sample) {
            *users -= 1;
        }
    }
}
