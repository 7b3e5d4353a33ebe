//! The dataset's directories, held open while the loader runs, so that the pipeline opens a
//! sample's file by its name in its directory: one lookup for the kernel instead of one per
//! component of its path, which for a small sample in the page cache is a good part of its
//! read. The read-then-decode baselines open by path, as PyTorch's workers do.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use lobster_uring::FileRef;
use std::collections::HashMap;

use crate::dataset::SampleMeta;

/// Directories held at most, and the share of the descriptor limit they may take (one in
/// this many): the rest belongs to the program that embeds the loader.
const DIRS_MAX: usize = 4096;
const DESCRIPTOR_LIMIT_SHARE: u64 = 8;

/// Marks a sample whose directory is not held: opened by its path.
const NOT_HELD: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct SampleDirs {
    held: Vec<Arc<OwnedFd>>,
    /// Per sample, its directory's index in `held`, or [`NOT_HELD`].
    of_sample: Vec<u32>,
}

impl SampleDirs {
    /// Holds the directories of `samples` while the bound allows. A directory that cannot
    /// be opened is not held: its samples open by path, and an error, if any, names the file.
    pub(crate) fn new(samples: &[SampleMeta]) -> Self {
        let limit = lobster_uring::open_files_limit()
            .map_or(DIRS_MAX, |n| (n / DESCRIPTOR_LIMIT_SHARE) as usize)
            .min(DIRS_MAX);
        let mut held = Vec::new();
        // Touched only where the directory changes from the last sample's: std's hasher.
        let mut index: HashMap<&[u8], u32> = HashMap::new();
        let mut last: Option<(&[u8], u32)> = None;
        let of_sample = samples
            .iter()
            .map(|meta| {
                let Some(dir) = meta.path.parent() else {
                    return NOT_HELD;
                };
                let key = dir.as_os_str().as_bytes();
                // A folder's samples come directory by directory: most need no lookup.
                if let Some((last_key, i)) = last {
                    if last_key == key {
                        return i;
                    }
                }
                let i = *index.entry(key).or_insert_with(|| {
                    if held.len() >= limit {
                        return NOT_HELD;
                    }
                    match lobster_uring::open_dir(dir) {
                        Ok(fd) => {
                            held.push(Arc::new(fd));
                            (held.len() - 1) as u32
                        }
                        Err(_) => NOT_HELD,
                    }
                });
                last = Some((key, i));
                i
            })
            .collect();
        SampleDirs { held, of_sample }
    }

    /// How the pipeline opens `meta`'s file.
    pub(crate) fn file<'a>(&'a self, meta: &'a SampleMeta) -> FileRef<'a> {
        match self.dir(meta) {
            Some(dir) => FileRef::in_dir(dir.as_fd(), &meta.path),
            None => FileRef::from(&*meta.path),
        }
    }

    /// `meta`'s directory, if held.
    pub(crate) fn dir(&self, meta: &SampleMeta) -> Option<&Arc<OwnedFd>> {
        let i = *self.of_sample.get(meta.id as usize)?;
        self.held.get(i as usize)
    }

    /// Directories held.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Dataset;

    #[test]
    fn every_sample_of_a_folder_opens_in_its_held_class_directory() {
        let dir = tempfile::tempdir().unwrap();
        for (class, files) in [("a", 3), ("b", 2)] {
            std::fs::create_dir(dir.path().join(class)).unwrap();
            for f in 0..files {
                std::fs::write(dir.path().join(class).join(format!("{f}.jpg")), [f]).unwrap();
            }
        }
        let ds = Dataset::open_image_folder(dir.path()).unwrap();
        let dirs = SampleDirs::new(ds.samples());
        assert_eq!(dirs.held(), 2);
        for meta in ds.samples() {
            let file = dirs.file(meta);
            assert!(
                file.dir.is_some(),
                "{} is opened by path",
                meta.path.display()
            );
            let bytes = lobster_uring::read_resident(file, 0, 2).unwrap();
            let lobster_uring::Resident::Read { bytes, .. } = bytes else {
                panic!("a file just written is resident");
            };
            assert_eq!(bytes[..], std::fs::read(&meta.path).unwrap()[..]);
        }
    }
}
