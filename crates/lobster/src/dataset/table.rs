//! The sample table: what the loader knows of each sample before reading it, and the
//! dataset that holds them. The ways to open one (a folder, shards) build on it.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::source::Source;
use crate::error::Error;

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
    pub(super) key: Key,
}

/// Where a sample's name is kept. A folder's sample is named by its path under the root,
/// which its path already holds: one allocation per sample, not two, when a table of a
/// million samples is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Key {
    /// The path's bytes from this index on.
    InPath(u32),
    Own(Arc<str>),
}

impl SampleMeta {
    /// Where the sample is in its file or object: offset, size, and whether it is the whole
    /// of it.
    #[cfg(feature = "s3")]
    pub(crate) fn range(&self) -> (u64, u64, bool) {
        (self.offset, self.size_bytes, self.whole_file)
    }

    /// Bytes a read of this sample asks for.
    pub(crate) fn read_len(&self) -> usize {
        self.size_bytes as usize + usize::from(self.whole_file)
    }

    /// The sample's bytes, read from its file now through one bounded read: a range reads
    /// exactly its bytes, a whole file at most one byte past its size, whatever the file is
    /// (a symlink to a device is not read on and on).
    ///
    /// # Errors
    /// [`Error::Read`] naming the sample, its file and the OS error;
    /// [`Error::SizeChanged`] for a whole file that is no longer the size it had when the
    /// dataset was opened.
    pub fn read_bytes(&self) -> Result<Vec<u8>, Error> {
        let failed = |e: std::io::Error| self.read_error(std::sync::Arc::new(e));
        let changed = |actual_bytes: u64| Error::SizeChanged {
            sample: self.id,
            path: self.path.to_path_buf(),
            expected_bytes: self.size_bytes,
            actual_bytes,
        };
        if !self.whole_file {
            let mut bytes = vec![0u8; self.size_bytes as usize];
            let file = std::fs::File::open(&self.path).map_err(failed)?;
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut bytes, self.offset)
                .map_err(failed)?;
            return Ok(bytes);
        }
        match super::table_file::read_at_most(&self.path, self.size_bytes) {
            Ok(bytes) if bytes.len() as u64 == self.size_bytes => Ok(bytes),
            Ok(bytes) => Err(changed(bytes.len() as u64)),
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                Err(changed(self.size_bytes + 1))
            }
            Err(e) => Err(failed(e)),
        }
    }

    /// The error of a read of this sample that failed for `cause`.
    pub(crate) fn read_error(&self, cause: crate::error::Cause) -> Error {
        Error::Read {
            sample: self.id,
            path: self.path.to_path_buf(),
            offset: self.offset,
            cause,
        }
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
pub(super) fn range_id(count: usize, len: u64) -> Result<u32, String> {
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
    pub(super) root: PathBuf,
    pub(super) classes: Vec<String>,
    pub(super) samples: Vec<SampleMeta>,
    /// The sample table it was read from, if it was not scanned.
    pub(super) table: Option<PathBuf>,
    /// What each sample's header said when it was last probed, as its table or index
    /// keeps it (empty: none kept).
    pub(super) probes: Vec<Probe>,
    /// The tables and indexes this dataset was read from or wrote, where probes are kept.
    pub(super) kept: Vec<Kept>,
    /// Every sample's probe, once asked for ([`Dataset::image_probes`]).
    pub(super) probed: std::sync::OnceLock<Arc<[Probe]>>,
    /// Where the samples' bytes are read from.
    pub(super) source: Source,
}

/// What a sample's header says of its image, probed once and kept in its dataset's table
/// or shard index so that a second open reads no image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Not probed yet.
    Unprobed,
    /// Neither a JPEG nor a PNG header could be read or parsed.
    NoHeader,
    /// A JPEG.
    Jpeg {
        /// Pixels across.
        width: u32,
        /// Pixels down.
        height: u32,
    },
    /// A PNG.
    Png {
        /// Pixels across.
        width: u32,
        /// Pixels down.
        height: u32,
    },
}

impl Probe {
    /// Width and height, if the header was read.
    pub fn dimensions(self) -> Option<(u32, u32)> {
        match self {
            Probe::Jpeg { width, height } | Probe::Png { width, height } => Some((width, height)),
            Probe::Unprobed | Probe::NoHeader => None,
        }
    }

    /// The field a table or index keeps: `?` unprobed, `-` no header, `j<w>x<h>`, `p<w>x<h>`.
    pub(super) fn write(self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = match self {
            Probe::Unprobed => write!(out, "?"),
            Probe::NoHeader => write!(out, "-"),
            Probe::Jpeg { width, height } => write!(out, "j{width}x{height}"),
            Probe::Png { width, height } => write!(out, "p{width}x{height}"),
        };
    }

    /// The probe [`Probe::write`] wrote, if `field` is one. One pass over the bytes: a
    /// table holds a probe per sample, millions.
    pub(super) fn parse(field: &[u8]) -> Option<Probe> {
        let (&kind, rest) = field.split_first()?;
        if rest.is_empty() {
            return match kind {
                b'?' => Some(Probe::Unprobed),
                b'-' => Some(Probe::NoHeader),
                _ => None,
            };
        }
        let mut sides = [0u64; 2];
        let mut digits = [0usize; 2];
        let mut at = 0;
        for &b in rest {
            match b {
                b'0'..=b'9' if digits[at] < 10 => {
                    sides[at] = sides[at] * 10 + u64::from(b - b'0');
                    digits[at] += 1;
                }
                b'x' if at == 0 => at = 1,
                _ => return None,
            }
        }
        let side = |i: usize| {
            u32::try_from(sides[i])
                .ok()
                .filter(|&n| n > 0 && digits[i] > 0)
        };
        let (width, height) = (side(0)?, side(1)?);
        match kind {
            b'j' => Some(Probe::Jpeg { width, height }),
            b'p' => Some(Probe::Png { width, height }),
            _ => None,
        }
    }
}

/// Probes as a dataset holds them when read from its table or indexes: every sample's
/// already as asked for, else those known (none: an empty list), to probe the rest.
pub(super) fn held_probes(probes: Vec<Probe>) -> (Vec<Probe>, std::sync::OnceLock<Arc<[Probe]>>) {
    let probed = std::sync::OnceLock::new();
    let unprobed = probes.iter().filter(|p| **p == Probe::Unprobed).count();
    if unprobed == probes.len() {
        return (Vec::new(), probed);
    }
    if unprobed == 0 {
        let _ = probed.set(probes.into());
        return (Vec::new(), probed);
    }
    (probes, probed)
}

/// A table or shard index on disk holding samples `samples` of a dataset, as written or
/// read (its check line's value), so that probes can be added to it later unless it was
/// replaced since.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    pub(super) path: PathBuf,
    pub(super) check: u64,
    pub(super) samples: std::ops::Range<usize>,
    /// Where its sample lines start: after the first line holding this, or after `skip`
    /// lines.
    pub(super) lines_from: LinesFrom,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum LinesFrom {
    /// The first line starting `s\t` (a folder's table).
    FirstSample,
    /// After this many lines (a shard's index: its shard line).
    Skip(usize),
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
        Ok(Self::of_samples(root, classes, samples))
    }

    /// A dataset of local `samples` read from no table, with nothing probed yet.
    pub(super) fn of_samples(
        root: PathBuf,
        classes: Vec<String>,
        samples: Vec<SampleMeta>,
    ) -> Self {
        Self {
            root,
            classes,
            samples,
            table: None,
            probes: Vec::new(),
            kept: Vec::new(),
            probed: Default::default(),
            source: Source::Files,
        }
    }

    /// `sample`'s bytes (a sample of this dataset), read now from where the dataset
    /// lives: [`SampleMeta::read_bytes`] for a local file, one ranged GET for an object.
    ///
    /// # Errors
    /// As [`SampleMeta::read_bytes`], naming the sample and its file or object.
    pub fn sample_bytes(&self, sample: &SampleMeta) -> Result<Vec<u8>, Error> {
        match &self.source {
            Source::Files => sample.read_bytes(),
            #[cfg(feature = "s3")]
            Source::Objects(objects) => {
                let read = objects.read(&sample.path, sample.range(), 0);
                objects
                    .store
                    .get(&read)
                    .map(|b| b.to_vec())
                    .map_err(|e| sample.read_error(Arc::new(e)))
            }
        }
    }

    /// Where the samples are read from.
    pub(crate) fn source(&self) -> &Source {
        &self.source
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
