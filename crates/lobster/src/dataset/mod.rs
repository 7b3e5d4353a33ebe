//! Datasets: an ImageFolder directory, indexed as torchvision indexes it, with every
//! sample's size recorded.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Error;

mod folder;
mod shards;
mod table_file;
mod tar_index;

pub use folder::FolderOptions;

/// What the loader knows of one sample before reading it: a byte range of a file, with its
/// label and its name in the source. The reader, the cache and the planner see only this.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    /// Stable id: the sample's index in the dataset's order.
    pub id: u32,
    /// The class index: classes sorted by name.
    pub label: u32,
    /// The file holding the sample.
    pub path: Arc<Path>,
    /// Where the sample's bytes start in the file (0 for a whole file).
    pub offset: u64,
    /// The sample's size when the dataset was opened.
    pub size_bytes: u64,
    /// The sample is the whole file: a read asks one byte more, so that a file that grew
    /// since the dataset was opened shows. A range (a member of a shard) is read exactly,
    /// and a file that ends inside it is an error.
    pub whole_file: bool,
    key: Key,
}

/// Where a sample's name is kept. A folder's sample is named by its path under the root,
/// which its path already holds: one allocation per sample, not two, when a table of a
/// million samples is read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    /// The path's bytes from this index on.
    InPath(u32),
    Own(Arc<str>),
}

impl SampleMeta {
    /// Bytes a read of this sample asks for.
    pub(crate) fn read_len(&self) -> usize {
        self.size_bytes as usize + usize::from(self.whole_file)
    }

    /// The sample's name in its source: its path under the root for a folder (lossily
    /// UTF-8), its key for a shard's member or a caller's record.
    pub fn key(&self) -> std::borrow::Cow<'_, str> {
        match &self.key {
            Key::InPath(at) => {
                String::from_utf8_lossy(&self.path.as_os_str().as_bytes()[*at as usize..])
            }
            Key::Own(key) => std::borrow::Cow::Borrowed(key),
        }
    }
}

/// The id of the sample after `count` others, if a range of `len` bytes can be one.
fn range_id(count: usize, len: u64) -> Result<u32, String> {
    if len > u64::from(u32::MAX) {
        return Err(format!(
            "{len} bytes: samples of 4 GiB or more are not supported"
        ));
    }
    u32::try_from(count).map_err(|_| "more than 2^32 samples".into())
}

/// torchvision's `IMG_EXTENSIONS`: the files an ImageFolder takes as samples, matched
/// case-insensitively at the end of the file name.
pub const IMAGE_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];

/// A dataset: a table of samples, each a byte range of a file ([`SampleMeta`]). Built from
/// a caller's table ([`Dataset::from_records`]) or opened from an ImageFolder directory:
/// `root/<class>/.../<file>`, indexed as torchvision's `ImageFolder` indexes it, so that
/// sample ids (and with them PyTorch's sampler order) agree.
///
/// - Classes are the directories directly under `root` (symlinks to directories count),
///   sorted by name; a class's index is its label. Files directly under `root` are not
///   samples.
/// - Each class directory is walked recursively, following symlinks; directories in the
///   order of their paths, files in each sorted by name.
/// - A sample is a file whose name ends in one of [`IMAGE_EXTENSIONS`] (any case); other
///   files (`readme.txt`, `.DS_Store`) are not samples.
/// - A class without a sample is an error naming every such class, as torchvision's.
///
/// Where torchvision would go on silently or fail later, opening stops with an error naming
/// the path: a directory that cannot be listed, a sample whose size cannot be read (a
/// broken symlink), or a symlink loop. Files are not opened: whether a sample is readable is
/// found when it is read.
#[derive(Clone, Debug)]
pub struct Dataset {
    root: PathBuf,
    classes: Vec<String>,
    samples: Vec<SampleMeta>,
    /// The sample table it was read from, if it was not scanned.
    table: Option<PathBuf>,
}

/// One sample of a table a caller builds from its own format's index: a byte range of a
/// file, its label and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleRecord {
    /// The file holding the sample.
    pub path: PathBuf,
    /// Where its bytes start.
    pub offset: u64,
    /// How many bytes it has.
    pub len: u64,
    /// Its class index into the dataset's classes.
    pub label: u32,
    /// Its name, unique in the table.
    pub key: String,
}

impl Dataset {
    /// A dataset from a table the caller built (for loaders that embed this one with their
    /// own format): ids in the order given, `classes` naming the labels, `root` what the
    /// dataset is reported as. Nothing is opened: a range its file does not hold fails
    /// when it is read, naming the sample.
    ///
    /// # Errors
    /// An empty table, a label without a class, a duplicate key, a sample of 4 GiB or more,
    /// or more than 2^32 samples, naming the record.
    pub fn from_records(
        root: impl Into<PathBuf>,
        classes: Vec<String>,
        records: impl IntoIterator<Item = SampleRecord>,
    ) -> Result<Self, Error> {
        let root = root.into();
        let mut keys = std::collections::HashSet::new();
        let mut samples = Vec::new();
        for r in records {
            let named =
                |what: String| Error::dataset(&r.path, format!("record {:?}: {what}", r.key));
            if r.label as usize >= classes.len() {
                return Err(named(format!(
                    "label {} but {} classes",
                    r.label,
                    classes.len()
                )));
            }
            if !keys.insert(r.key.clone()) {
                return Err(named("a duplicate key".into()));
            }
            let id = range_id(samples.len(), r.len).map_err(named)?;
            // A shard's members share one path.
            let path = match samples.last() {
                Some(SampleMeta { path, .. }) if **path == *r.path => Arc::clone(path),
                _ => Arc::from(r.path),
            };
            samples.push(SampleMeta {
                id,
                label: r.label,
                path,
                offset: r.offset,
                size_bytes: r.len,
                whole_file: false,
                key: Key::Own(Arc::from(r.key)),
            });
        }
        if samples.is_empty() {
            return Err(Error::dataset(&root, "an empty table: no samples"));
        }
        Ok(Self {
            root,
            classes,
            samples,
            table: None,
        })
    }

    /// Opens what `spec` names: WebDataset shards (a brace pattern, a `.tar` file, a list
    /// file, or a directory holding `.tar` files and no sub-directory) or an ImageFolder
    /// directory.
    ///
    /// # Errors
    /// As [`Dataset::open_shards`] or [`Dataset::open_image_folder`].
    pub fn open(spec: &str) -> Result<Self, Error> {
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
    /// reused while its shard keeps its size and modification time.
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
        Self::shards_from(spec, Some(&dir), false)
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

    fn shards_from(spec: &str, index_dir: Option<&Path>, reuse: bool) -> Result<Self, Error> {
        let paths = shards::shard_paths(spec)?;
        let indexed = shards::indexed(&paths, index_dir, reuse)?;
        // Keys are unique already (within a shard by grouping, across shards checked).
        let mut samples = Vec::with_capacity(indexed.iter().map(Vec::len).sum());
        for (shard, list) in paths.iter().zip(indexed) {
            let path: Arc<Path> = Arc::from(shard.as_path());
            for x in list {
                let id = range_id(samples.len(), x.size)
                    .map_err(|what| Error::dataset(shard, format!("sample {:?}: {what}", x.key)))?;
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
        Ok(Self {
            root: PathBuf::from(spec),
            classes: (0..classes).map(|c| c.to_string()).collect(),
            samples,
            table: None,
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

    /// The sample table on disk this dataset was read from; `None` when its source was
    /// scanned (or it was built from records).
    pub fn table(&self) -> Option<&Path> {
        self.table.as_deref()
    }

    /// The directory the dataset was opened from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Class names; a sample's label indexes this.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every sample, indexed by id.
    pub fn samples(&self) -> &[SampleMeta] {
        &self.samples
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the dataset has no samples (never true for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The largest sample's size (0 for an empty dataset).
    pub fn max_sample_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size_bytes).max().unwrap_or(0)
    }

    /// The sum of all sample sizes.
    pub fn total_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size_bytes).sum()
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
