//! Datasets: an ImageFolder directory, indexed as torchvision indexes it, with every
//! sample's size recorded.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use table::{range_id, Key};

use crate::error::Error;

mod folder;
#[cfg(any(test, fuzzing))]
pub(crate) mod fuzz;
#[cfg(feature = "s3")]
pub(crate) mod objects;
mod probe;
mod shards;
mod source;
mod table;
mod table_file;
mod tar_index;

pub use folder::FolderOptions;

/// The most classes a dataset may have (labels `0..CLASSES_MAX`): ImageNet-22k has 21,841,
/// and a label read from a shard names every class below it.
pub const CLASSES_MAX: u32 = 1 << 20;
#[cfg(feature = "s3")]
pub(crate) use source::Objects;
pub(crate) use source::Source;
pub use table::{Dataset, Probe, SampleMeta, SampleRecord, IMAGE_EXTENSIONS};
use table::{Kept, LinesFrom};
pub(crate) use table_file::read_at_most;
impl Dataset {
    /// Opens what `spec` names: WebDataset shards (a brace pattern, a `.tar` file, a list
    /// file, or a directory holding `.tar` files and no sub-directory) or an ImageFolder
    /// directory.
    ///
    /// # Errors
    /// As [`Dataset::open_shards`] or [`Dataset::open_image_folder`].
    pub fn open(spec: &str) -> Result<Self, Error> {
        if spec.starts_with("s3://") || shards::lists_objects(spec) {
            return Self::open_objects(spec, table_file::default_dir().as_deref(), true);
        }
        match Self::names_shards(spec)? {
            true => Self::open_shards(spec),
            false => Self::open_image_folder(spec),
        }
    }

    /// Opens WebDataset tar shards, read in place: `spec` is a brace pattern
    /// (`shards/train-{000000..000127}.tar`), a directory of `.tar` files, one `.tar` file,
    /// or a list file. Members are grouped into samples by key as webdataset groups them;
    /// a sample's bytes are its image member, its label the integer in its `.cls` member
    /// (or the `"cls"`, else `"label"`, field of its `.json` member), and class `i` is
    /// named `"i"`. Only headers and labels are read to index a shard, and each shard's
    /// index is kept in the directory folders' tables use (see
    /// [`Dataset::open_shards_indexed`]).
    ///
    /// # Errors
    /// Naming the shard and the member or key: a truncated or corrupt archive, a key split
    /// across two shards, a member that appears twice, a sample without an image or a
    /// label.
    pub fn open_shards(spec: &str) -> Result<Self, Error> {
        Self::open_shards_indexed(spec, table_file::default_dir().as_deref())
    }

    /// Opens shards as [`Dataset::open_shards`] does, keeping each shard's index in
    /// `index_dir` (`None`: read every shard's headers and labels each time). An index is
    /// reused while its shard is the same file, unchanged: its size, device, inode and
    /// status change time (not its modification time, which tar and `rsync -a` set).
    ///
    /// # Errors
    /// As [`Dataset::open_shards`]. An index that cannot be read or written is not an
    /// error: the shard is read instead, and a warning logged.
    pub fn open_shards_indexed(spec: &str, index_dir: Option<&Path>) -> Result<Self, Error> {
        Self::shards_from(spec, index_dir, true)
    }

    /// Reads every shard `spec` names and keeps its index in `index_dir` (the default
    /// directory when `None`), replacing any, as `lobster index` does.
    ///
    /// # Errors
    /// As [`Dataset::open_shards`], and no index directory.
    pub fn index_shards(spec: &str, index_dir: Option<&Path>) -> Result<Self, Error> {
        let dir = index_dir
            .map(Path::to_path_buf)
            .or_else(table_file::default_dir)
            .ok_or_else(|| {
                Error::dataset(Path::new(spec), "no directory to keep indexes in: no $HOME")
            })?;
        if spec.starts_with("s3://") || shards::lists_objects(spec) {
            return Self::open_objects(spec, Some(&dir), false);
        }
        Self::shards_from(spec, Some(&dir), false)
    }

    /// Opens what `spec` (`s3://bucket/key...`) names in an S3-compatible bucket, as
    /// [`Dataset::open`] opens a local path: shards (a brace pattern, a `.tar` object, or
    /// a prefix holding `.tar` objects) or an ImageFolder-shaped prefix; or `spec` is a
    /// local list file of shards in one bucket, an `s3://` URL a line. The endpoint,
    /// region and credentials come from the environment and the `~/.aws` files as the AWS
    /// tools take them. Each shard's index is kept in `index_dir`, reused when `reuse` while
    /// the object has the same size and ETag.
    ///
    /// # Errors
    /// As [`Dataset::open_shards`] and [`Dataset::open_image_folder`], naming the object;
    /// and a URL, endpoint or credentials the store refuses, a missing bucket or object.
    /// Without the `s3` feature, an error saying so.
    pub fn open_objects(spec: &str, index_dir: Option<&Path>, reuse: bool) -> Result<Self, Error> {
        #[cfg(feature = "s3")]
        return objects::open(spec, None, index_dir, reuse);
        #[cfg(not(feature = "s3"))]
        {
            let _ = (index_dir, reuse);
            Err(Error::dataset(
                Path::new(spec),
                "object stores need lobster-io's `s3` feature, which this build lacks",
            ))
        }
    }

    /// [`Dataset::open_objects`] on the store `config` names (its endpoint, region,
    /// credentials and deadlines), not the environment's.
    ///
    /// # Errors
    /// As [`Dataset::open_objects`].
    #[cfg(feature = "s3")]
    pub fn open_objects_with(
        spec: &str,
        config: &lobster_store::StoreConfig,
        index_dir: Option<&Path>,
        reuse: bool,
    ) -> Result<Self, Error> {
        objects::open(spec, Some(config), index_dir, reuse)
    }

    /// Whether [`Dataset::open`] takes `spec` for shards (else for a folder).
    ///
    /// # Errors
    /// A directory that cannot be listed.
    pub fn names_shards(spec: &str) -> Result<bool, Error> {
        let path = Path::new(spec);
        Ok(spec.contains('{')
            || path.is_file()
            || (path.is_dir() && {
                let entries = fs::read_dir(path).map_err(|e| Error::dataset(path, e))?;
                let (mut tars, mut dirs) = (false, false);
                for entry in entries {
                    let p = entry.map_err(|e| Error::dataset(path, e))?.path();
                    dirs |= p.is_dir();
                    tars |= p.extension().is_some_and(|e| e == "tar");
                }
                tars && !dirs
            }))
    }

    /// Opens shards; a label of [`CLASSES_MAX`] or more is refused, since every class up to
    /// the largest label gets a name.
    fn shards_from(spec: &str, index_dir: Option<&Path>, reuse: bool) -> Result<Self, Error> {
        let paths = shards::shard_paths(spec)?;
        let indexed = shards::indexed(&paths, index_dir, reuse)?;
        Self::from_shards(PathBuf::from(spec), &paths, indexed)
    }

    /// The dataset of `paths`' samples, as `indexed` found them.
    fn from_shards(
        root: PathBuf,
        paths: &[PathBuf],
        indexed: Vec<shards::ShardSamples>,
    ) -> Result<Self, Error> {
        // Keys are unique already (within a shard by grouping, across shards checked).
        let total = indexed.iter().map(|s| s.samples.len()).sum();
        let mut samples = Vec::with_capacity(total);
        let mut probes = Vec::with_capacity(total);
        let mut kept = Vec::new();
        for (shard, found) in paths.iter().zip(indexed) {
            let path: Arc<Path> = Arc::from(shard.as_path());
            if let Some((at, check)) = found.kept {
                kept.push(Kept {
                    path: at,
                    check,
                    samples: samples.len()..samples.len() + found.samples.len(),
                    lines_from: LinesFrom::Skip(2),
                });
            }
            for x in found.samples {
                let id = range_id(samples.len(), x.size)
                    .map_err(|what| Error::dataset(shard, format!("sample {:?}: {what}", x.key)))?;
                if x.label >= CLASSES_MAX {
                    return Err(Error::dataset(
                        shard,
                        format!(
                            "sample {:?}: label {} is past the largest supported, {}",
                            x.key,
                            x.label,
                            CLASSES_MAX - 1
                        ),
                    ));
                }
                probes.push(x.probe);
                samples.push(SampleMeta {
                    id,
                    label: x.label,
                    path: Arc::clone(&path),
                    offset: x.offset,
                    size_bytes: x.size,
                    whole_file: false,
                    key: Key::Own(x.key),
                });
            }
        }
        let classes = samples.iter().map(|s| s.label + 1).max().unwrap_or(0);
        let (probes, probed) = table::held_probes(probes);
        Ok(Self {
            root,
            classes: (0..classes).map(|c| c.to_string()).collect(),
            samples,
            table: None,
            probes,
            kept,
            probed,
            source: Source::Files,
        })
    }

    /// Opens an ImageFolder directory (see [`Dataset`]) and records every sample's size.
    pub fn open_image_folder(root: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_folder(root, &FolderOptions::default())
    }

    /// Opens a folder laid out as an ImageFolder whose samples are the files `options`
    /// names (torchvision's `DatasetFolder` with `extensions`), from its cached table when
    /// the folder has not changed since (see [`FolderOptions::table_dir`]).
    pub fn open_folder(root: impl AsRef<Path>, options: &FolderOptions) -> Result<Self, Error> {
        folder::open(root.as_ref(), options)
    }

    /// Scans an ImageFolder and keeps its sample table (see [`FolderOptions::table_dir`]),
    /// replacing any; also returns where the table was kept: `None` without a table
    /// directory, or when a directory of the folder changed in the last 2 s (too recently
    /// for a table to be trusted).
    ///
    /// # Errors
    /// As [`Dataset::open_folder`], and a table that cannot be written.
    pub fn index_folder(
        root: impl AsRef<Path>,
        options: &FolderOptions,
    ) -> Result<(Self, Option<PathBuf>), Error> {
        folder::index(root.as_ref(), options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn ids_follow_sorted_classes_then_sorted_files() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("b/2.jpg"), b"xx");
        write(&dir.path().join("b/1.jpg"), b"x");
        write(&dir.path().join("a/9.jpg"), b"xxx");
        write(&dir.path().join("README"), b"not a sample");
        let ds = Dataset::open_image_folder(dir.path()).unwrap();
        assert_eq!(ds.classes(), ["a", "b"]);
        let got: Vec<_> = ds
            .samples()
            .iter()
            .map(|s| {
                (
                    s.id,
                    s.label,
                    s.path.file_name().unwrap().to_str().unwrap().to_owned(),
                    s.size_bytes,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, "9.jpg".into(), 3),
                (1, 1, "1.jpg".into(), 1),
                (2, 1, "2.jpg".into(), 2)
            ]
        );
        assert_eq!(ds.total_bytes(), 6);
    }

    #[test]
    fn classes_without_a_sample_are_named_together_with_the_extensions() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/1.jpg"), b"x");
        write(&dir.path().join("strays/readme.txt"), b"x");
        fs::create_dir_all(dir.path().join("empty")).unwrap();
        let err = Dataset::open_image_folder(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no valid file for the classes empty, strays") && err.contains(".webp"),
            "{err}"
        );
    }

    #[test]
    fn class_directories_are_walked_and_only_image_files_are_samples() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/sub/1.JPG"), b"x");
        write(&dir.path().join("a/readme.txt"), b"x");
        write(&dir.path().join("a/0.png"), b"xy");
        let ds = Dataset::open_image_folder(dir.path()).unwrap();
        let names: Vec<_> = ds.samples().iter().map(|s| s.path.to_path_buf()).collect();
        assert_eq!(
            names,
            [dir.path().join("a/0.png"), dir.path().join("a/sub/1.JPG")]
        );
        // Other extensions, when asked for.
        let bins = FolderOptions {
            extensions: vec![".txt".into()],
            ..FolderOptions::default()
        };
        let ds = Dataset::open_folder(dir.path(), &bins).unwrap();
        assert_eq!(ds.samples()[0].path.file_name().unwrap(), "readme.txt");
    }

    #[test]
    fn a_symlink_loop_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("a/1.jpg"), b"x");
        std::os::unix::fs::symlink("..", dir.path().join("a/up")).unwrap();
        let err = Dataset::open_image_folder(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("symlink loop") && err.contains("up"), "{err}");
    }

    #[test]
    fn a_missing_root_is_named() {
        let err = Dataset::open_image_folder("/nonexistent/lobster-root")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/lobster-root"), "{err}");
    }
}
