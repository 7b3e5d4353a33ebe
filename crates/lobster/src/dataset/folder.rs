//! ImageFolder directories: indexed as torchvision's `ImageFolder` indexes them, and the
//! index (the sample table) kept on disk so that a second open neither lists nor stats the
//! files again.
//!
//! A table stays valid while no directory of the folder changes: adding, removing or
//! renaming a file changes its directory's status change time, which the table records for
//! every directory it walked with its device and inode (one stat each on reopen, not one
//! per file). The modification time is not enough: tar, `rsync -a` and reproducible
//! archives set it, so a folder replaced by another extracted the same way would keep it;
//! the change time cannot be set, and a directory put in another's place has another
//! inode. A file whose size changed in place is caught when it is read. As git does for
//! its index, a directory changed less than [`RACY_NS`](super::table_file::RACY_NS) before the table was written is
//! not trusted (a change in the same clock tick would not show), so such a folder is
//! scanned again.

use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::source::Source;
use super::table::{
    held_probes, Dataset, Kept, Key, LinesFrom, Probe, SampleMeta, IMAGE_EXTENSIONS,
};
use super::table_file::{
    default_dir, escape, fnv, now_ns, parse_sealed, prune, read_kept, seal, split, unescape,
    unescape_into, write_atomically, Sealed, Stamp, KEPT_MAX_BYTES,
};
use crate::error::Error;

/// Tables kept in a table directory; the least recently written go first.
const TABLES_MAX: usize = 64;
/// Version 2 added each sample's image probe, version 3 a check in four lanes
/// ([`super::table_file::check_of`]), version 4 each directory's device, inode and change
/// time in place of its modification time; a table of an older version is scanned over
/// and made again.
pub(super) const MAGIC: &[u8] = b"lobster-folder-table 4";

/// Which files of a folder are samples, and where its table is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FolderOptions {
    /// File name endings (matched case-insensitively) that make a file a sample.
    pub extensions: Vec<String>,
    /// Where sample tables are kept (`None`: scan every time). The default is
    /// `$XDG_CACHE_HOME/lobster-io/tables` (else `~/.cache/lobster-io/tables`), at most
    /// 64 tables.
    pub table_dir: Option<PathBuf>,
}

impl Default for FolderOptions {
    fn default() -> Self {
        FolderOptions {
            extensions: IMAGE_EXTENSIONS.iter().map(|e| e.to_string()).collect(),
            table_dir: default_dir(),
        }
    }
}

impl FolderOptions {
    pub(super) fn is_sample(&self, name: &std::ffi::OsStr) -> bool {
        let name = name.as_bytes();
        self.extensions.iter().any(|e| {
            let e = e.as_bytes();
            name.len() >= e.len() && name[name.len() - e.len()..].eq_ignore_ascii_case(e)
        })
    }
}

/// A directory the scan walked, relative to the root, and its stamp.
struct Walked {
    rel: PathBuf,
    stamp: Stamp,
}

/// Opens `root`: from its table if one is valid, else by scanning (and then keeping the
/// table, unless the folder changed too recently to trust).
pub(super) fn open(root: &Path, options: &FolderOptions) -> Result<Dataset, Error> {
    let table = options
        .table_dir
        .as_ref()
        .map(|d| table_path(d, root, options));
    if let Some(path) = &table {
        match load(path, root, options, PARALLEL_FROM_BYTES) {
            Ok(Some(ds)) => return Ok(ds),
            Ok(None) => {}
            // A table that cannot be read is scanned over, not trusted.
            Err(e) => log::warn!("lobster-io: ignoring a sample table: {e}"),
        }
    }
    let (mut ds, walked) = scan(root, options)?;
    if let Some(path) = &table {
        match store(path, &ds, &walked, options) {
            Ok(kept) => ds.kept.extend(kept),
            Err(e) => log::warn!(
                "lobster-io: could not keep the sample table {}: {e}",
                path.display()
            ),
        }
    }
    Ok(ds)
}

/// Scans `root` and keeps its table, replacing any; returns where the table was kept.
pub(super) fn index(
    root: &Path,
    options: &FolderOptions,
) -> Result<(Dataset, Option<PathBuf>), Error> {
    let (mut ds, walked) = scan(root, options)?;
    let Some(path) = options
        .table_dir
        .as_ref()
        .map(|d| table_path(d, root, options))
    else {
        return Ok((ds, None));
    };
    let _ = fs::remove_file(&path);
    let kept = store(&path, &ds, &walked, options).map_err(|e| Error::dataset(&path, e))?;
    ds.kept.extend(kept);
    let kept = path.exists().then_some(path);
    Ok((ds, kept))
}

/// Walks `root` as torchvision does; see [`Dataset`].
fn scan(root: &Path, options: &FolderOptions) -> Result<(Dataset, Vec<Walked>), Error> {
    let root_meta = fs::metadata(root).map_err(|e| Error::dataset(root, e))?;
    let mut walked = vec![Walked {
        rel: PathBuf::new(),
        stamp: Stamp::of(&root_meta),
    }];
    let entries = fs::read_dir(root).map_err(|e| Error::dataset(root, e))?;
    let mut class_dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::dataset(root, e))?;
        let path = entry.path();
        // As os.scandir's is_dir: follows a symlink, and a broken one is no directory.
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            let name = entry.file_name().into_string().map_err(|name| {
                Error::dataset(&path, format!("class name {name:?} is not valid UTF-8"))
            })?;
            class_dirs.push((name, path));
        }
    }
    class_dirs.sort();
    if class_dirs.is_empty() {
        return Err(Error::dataset(
            root,
            "no class directories (expected root/<class>/<file>)",
        ));
    }
    let mut samples = Vec::new();
    let mut classes = Vec::with_capacity(class_dirs.len());
    let mut empty = Vec::new();
    for (label, (name, dir)) in class_dirs.into_iter().enumerate() {
        let files = walk_class(root, &dir, options, &mut walked)?;
        if files.is_empty() {
            empty.push(name.clone());
        }
        for path in files {
            let size_bytes = fs::metadata(&path)
                .map_err(|e| Error::dataset(&path, e))?
                .len();
            // The path under the root is a tail of the path's bytes.
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let key_at = path.as_os_str().len() - rel.as_os_str().len();
            let id = samples.len();
            push_sample(&mut samples, id, &path, key_at, label as u32, size_bytes)
                .map_err(|e| Error::dataset(root, e))?;
        }
        classes.push(name);
    }
    every_class_has_a_file(root, &empty, options)?;
    Ok((
        Dataset::of_samples(root.to_path_buf(), classes, samples),
        walked,
    ))
}

/// Refuses a folder with classes (`empty`) that hold no sample, naming them all with the
/// extensions taken, as torchvision does.
pub(super) fn every_class_has_a_file(
    root: &Path,
    empty: &[String],
    options: &FolderOptions,
) -> Result<(), Error> {
    if empty.is_empty() {
        return Ok(());
    }
    Err(Error::dataset(
        root,
        format!(
            "no valid file for the classes {}; supported extensions are: {}",
            empty.join(", "),
            options.extensions.join(", ")
        ),
    ))
}

/// Appends a folder's sample `id`: a whole file, named by its path from byte `key_at` on (its
/// path under the root); scanned or read from a table.
pub(super) fn push_sample(
    samples: &mut Vec<SampleMeta>,
    id: usize,
    path: &Path,
    key_at: usize,
    label: u32,
    size_bytes: u64,
) -> Result<(), &'static str> {
    let id = u32::try_from(id).map_err(|_| "more than 2^32 samples")?;
    let key_at = u32::try_from(key_at).map_err(|_| "a root path of 4 GiB")?;
    samples.push(SampleMeta {
        id,
        label,
        path: Arc::from(path),
        offset: 0,
        size_bytes,
        whole_file: true,
        key: Key::InPath(key_at),
    });
    Ok(())
}

/// The samples under class directory `dir` in torchvision's order: `sorted(os.walk(dir,
/// followlinks=True))`, directories by path, files within each by name. Every directory
/// walked is added to `walked`.
fn walk_class(
    root: &Path,
    dir: &Path,
    options: &FolderOptions,
    walked: &mut Vec<Walked>,
) -> Result<Vec<PathBuf>, Error> {
    // Directories found, each with the (device, inode) chain from the class directory down
    // to it, so a symlink back to one of its ancestors is caught.
    let mut stack = vec![(dir.to_path_buf(), Vec::<(u64, u64)>::new())];
    let mut listed: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    while let Some((path, mut ancestors)) = stack.pop() {
        let meta = fs::metadata(&path).map_err(|e| Error::dataset(&path, e))?;
        let id = (meta.dev(), meta.ino());
        if ancestors.contains(&id) {
            return Err(Error::dataset(
                &path,
                "a symlink loop: this directory contains itself",
            ));
        }
        ancestors.push(id);
        walked.push(Walked {
            rel: path.strip_prefix(root).unwrap_or(&path).to_path_buf(),
            stamp: Stamp::of(&meta),
        });
        let mut files = Vec::new();
        for entry in fs::read_dir(&path).map_err(|e| Error::dataset(&path, e))? {
            let entry = entry.map_err(|e| Error::dataset(&path, e))?;
            let child = entry.path();
            // As os.walk: a symlink to a directory is a directory; anything else (a broken
            // symlink too) is a file.
            if fs::metadata(&child).is_ok_and(|m| m.is_dir()) {
                stack.push((child, ancestors.clone()));
            } else if options.is_sample(&entry.file_name()) {
                files.push(child);
            }
        }
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        listed.push((path, files));
    }
    // Python compares the walk's paths as strings: byte order of their UTF-8.
    listed.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    Ok(listed.into_iter().flat_map(|(_, files)| files).collect())
}

/// Where `root`'s table lives: named by a hash of the root and the extensions.
fn table_path(dir: &Path, root: &Path, options: &FolderOptions) -> PathBuf {
    let mut parts = vec![root.as_os_str().as_bytes()];
    parts.extend(options.extensions.iter().map(|e| e.as_bytes()));
    dir.join(format!("folder-{:016x}.table", fnv(&parts)))
}

/// Writes the table of `ds` (atomically: a temporary file renamed), unless a directory
/// changed too recently to be trusted; then keeps at most [`TABLES_MAX`] tables. Returns
/// the table as kept, if it was.
fn store(
    path: &Path,
    ds: &Dataset,
    walked: &[Walked],
    options: &FolderOptions,
) -> std::io::Result<Option<Kept>> {
    let written = now_ns();
    if walked.iter().any(|w| !w.stamp.settled_at(written)) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(64 * ds.samples.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(b"\nroot\t");
    escape(ds.root.as_os_str().as_bytes(), &mut out);
    out.extend_from_slice(b"\next");
    for e in &options.extensions {
        out.push(b'\t');
        escape(e.as_bytes(), &mut out);
    }
    out.extend_from_slice(format!("\nwritten\t{written}\n").as_bytes());
    for w in walked {
        out.extend_from_slice(b"dir\t");
        w.stamp.write(&mut out);
        out.push(b'\t');
        escape(w.rel.as_os_str().as_bytes(), &mut out);
        out.push(b'\n');
    }
    for c in &ds.classes {
        out.extend_from_slice(b"class\t");
        escape(c.as_bytes(), &mut out);
        out.push(b'\n');
    }
    for (i, s) in ds.samples.iter().enumerate() {
        out.extend_from_slice(format!("s\t{}\t{}\t", s.label, s.size_bytes).as_bytes());
        ds.probes
            .get(i)
            .copied()
            .unwrap_or(Probe::Unprobed)
            .write(&mut out);
        out.push(b'\t');
        let rel = s.path.strip_prefix(&ds.root).unwrap_or(&s.path);
        escape(rel.as_os_str().as_bytes(), &mut out);
        out.push(b'\n');
    }
    let check = seal(&mut out);
    write_atomically(path, &out)?;
    prune(path, TABLES_MAX);
    Ok(Some(Kept {
        path: path.to_path_buf(),
        check,
        samples: 0..ds.samples.len(),
        lines_from: LinesFrom::FirstSample,
    }))
}

/// The dataset `path` holds for `root`, if the table exists and every directory it walked
/// is unchanged and was not changed too close to the table's writing. Sample lines past
/// `parallel_from_bytes` are read in two halves at once.
///
/// # Errors
/// A table that cannot be read or is malformed, naming it.
fn load(
    path: &Path,
    root: &Path,
    options: &FolderOptions,
    parallel_from_bytes: usize,
) -> Result<Option<Dataset>, Error> {
    let bytes = match read_kept(path, KEPT_MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::dataset(path, format!("sample table: {e}"))),
    };
    from_file(bytes, path, root, options, parallel_from_bytes)
}

/// [`load`] on the bytes of the table at `path`.
pub(super) fn from_file(
    bytes: Vec<u8>,
    path: &Path,
    root: &Path,
    options: &FolderOptions,
    parallel_from_bytes: usize,
) -> Result<Option<Dataset>, Error> {
    from_bytes(bytes, path, root, options, parallel_from_bytes)
        .map_err(|e| Error::dataset(path, format!("sample table: {e}")))
}

/// [`load`] on the table's bytes, read from `path`.
fn from_bytes(
    bytes: Vec<u8>,
    path: &Path,
    root: &Path,
    options: &FolderOptions,
    parallel_from_bytes: usize,
) -> Result<Option<Dataset>, String> {
    let Sealed {
        bytes,
        lines_at: at,
        check,
    } = parse_sealed(bytes, MAGIC)?;
    let body = &bytes[at..];
    let bad = |what: &str| Err(format!("malformed: {what}"));
    let mut lines = split(body, b'\n');
    let mut root_line = split(lines.next().unwrap_or_default(), b'\t');
    if root_line.next() != Some(b"root")
        || root_line.next().and_then(unescape).as_deref() != Some(root.as_os_str().as_bytes())
    {
        // Another root with the same hash: scan.
        return Ok(None);
    }
    let ext = lines.next().unwrap_or_default();
    let ext: Vec<Vec<u8>> = split(ext, b'\t')
        .skip(1)
        .map(|e| unescape(e).unwrap_or_default())
        .collect();
    if ext
        .iter()
        .map(|e| e.as_slice())
        .ne(options.extensions.iter().map(|e| e.as_bytes()))
    {
        return Ok(None);
    }
    let number =
        |field: Option<&[u8]>| -> Option<i128> { std::str::from_utf8(field?).ok()?.parse().ok() };
    let mut written_line = split(lines.next().unwrap_or_default(), b'\t');
    let Some(written) = written_line.nth(1).and_then(|f| number(Some(f))) else {
        return bad("no time of writing");
    };
    // The sample lines come last; the lines before them name directories and classes.
    let samples_at = memchr::memmem::find(body, b"\ns\t").map_or(body.len(), |i| i + 1);
    let mut classes = Vec::new();
    // After the root, extension and writing lines: the first directory is the root's.
    for line in split(&body[..samples_at], b'\n').skip(3) {
        let mut fields = split(line, b'\t');
        match fields.next() {
            Some(b"dir") => {
                let (Some(stored), Some(rel)) =
                    (Stamp::parse(&mut fields), fields.next().and_then(unescape))
                else {
                    return bad("a dir line");
                };
                let dir = root.join(std::ffi::OsString::from_vec(rel));
                match fs::metadata(&dir) {
                    Ok(m) if Stamp::of(&m) == stored && stored.settled_at(written) => {}
                    _ => return Ok(None),
                }
            }
            Some(b"class") => {
                let Some(name) = fields.next().and_then(unescape) else {
                    return bad("a class line");
                };
                classes.push(String::from_utf8(name).map_err(|_| "a class name not UTF-8")?);
            }
            Some(b"") if line.is_empty() => {}
            _ => return bad("an unknown line"),
        }
    }
    let (samples, probes) = read_samples_in_halves(
        &body[samples_at..],
        root,
        classes.len(),
        parallel_from_bytes,
    )?;
    if samples.is_empty() {
        return bad("no samples");
    }
    let (probes, probed) = held_probes(probes);
    let kept = Kept {
        path: path.to_path_buf(),
        check,
        samples: 0..samples.len(),
        lines_from: LinesFrom::FirstSample,
    };
    Ok(Some(Dataset {
        root: root.to_path_buf(),
        classes,
        samples,
        table: Some(path.to_path_buf()),
        probes,
        kept: vec![kept],
        probed,
        source: Source::Files,
    }))
}

/// The samples (and their probes) of a table's sample `lines`. A large table is read in two
/// halves at once: most of a reopen is building each sample's path, and page faults on the
/// memory that holds them.
fn read_samples_in_halves(
    lines: &[u8],
    root: &Path,
    classes_len: usize,
    parallel_from_bytes: usize,
) -> Result<(Vec<SampleMeta>, Vec<Probe>), String> {
    let mut cut = lines.len();
    if lines.len() >= parallel_from_bytes {
        cut = memchr::memchr(b'\n', &lines[lines.len() / 2..])
            .map_or(lines.len(), |i| lines.len() / 2 + i + 1);
    }
    let (first, second) = lines.split_at(cut);
    let first_lines = memchr::memchr_iter(b'\n', first).count();
    let second_lines = memchr::memchr_iter(b'\n', second).count();
    let mut samples = Vec::with_capacity(first_lines + second_lines);
    let mut probes = Vec::with_capacity(first_lines + second_lines);
    let rest = std::thread::scope(|scope| {
        let rest = (!second.is_empty()).then(|| {
            scope.spawn(move || {
                let mut rest = (
                    Vec::with_capacity(second_lines),
                    Vec::with_capacity(second_lines),
                );
                read_samples(
                    second,
                    root,
                    classes_len,
                    first_lines,
                    &mut rest.0,
                    &mut rest.1,
                )
                .map(|()| rest)
            })
        });
        let read = read_samples(first, root, classes_len, 0, &mut samples, &mut probes);
        let rest = rest.map(|h| h.join().expect("reading a table's samples panicked"));
        read.and(rest.transpose())
    })?;
    if let Some((rest, rest_probes)) = rest {
        samples.extend(rest);
        probes.extend(rest_probes);
    }
    Ok((samples, probes))
}

/// A table with this many bytes of sample lines or more is read in two threads.
pub(super) const PARALLEL_FROM_BYTES: usize = 1 << 20;

/// Appends the samples of a table's sample `lines`, the first of them numbered `first_id`.
/// Each line is found by one `memchr` and its fields by one pass over its bytes: a table
/// has a line per sample, millions, and most of a reopen is spent here.
fn read_samples(
    lines: &[u8],
    root: &Path,
    classes: usize,
    first_id: usize,
    samples: &mut Vec<SampleMeta>,
    probes: &mut Vec<Probe>,
) -> Result<(), String> {
    let bad = |what: &str| Err(format!("malformed: {what}"));
    // The path of each sample is built here, then copied once into its `Arc`.
    let root_bytes = root.as_os_str().as_bytes();
    let mut path_buf: Vec<u8> = Vec::with_capacity(root_bytes.len() + 256);
    path_buf.extend_from_slice(root_bytes);
    if !root_bytes.ends_with(b"/") {
        path_buf.push(b'/');
    }
    let rel_at = path_buf.len();
    let mut rest = lines;
    while !rest.is_empty() {
        let line;
        (line, rest) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        if line.is_empty() {
            continue;
        }
        let Some(fields) = line.strip_prefix(b"s\t") else {
            return match line == b"s" {
                true => bad("a sample line"),
                false => bad("an unknown line among the samples"),
            };
        };
        let Some((label, fields)) = count_field(fields) else {
            return bad("a sample line");
        };
        let Some((size_bytes, fields)) = count_field(fields) else {
            return bad("a sample line");
        };
        let Some(tab) = fields.iter().position(|&b| b == b'\t') else {
            return bad("a sample line");
        };
        let (Some(probe), rel) = (Probe::parse(&fields[..tab]), &fields[tab + 1..]) else {
            return bad("a sample line");
        };
        // Without a branch per byte, so that it vectorizes.
        let (tabs, escapes) = rel.iter().fold((false, false), |(t, e), &b| {
            (t | (b == b'\t'), e | (b == b'\\'))
        });
        if tabs {
            return bad("a sample line with a field too many");
        }
        probes.push(probe);
        let label = u32::try_from(label).map_err(|_| "a label out of range")?;
        if label as usize >= classes {
            return bad("a label without a class");
        }
        path_buf.truncate(rel_at);
        match escapes {
            true => unescape_into(rel, &mut path_buf).ok_or("a sample path")?,
            false => path_buf.extend_from_slice(rel),
        }
        let path = Path::new(std::ffi::OsStr::from_bytes(&path_buf));
        let id = first_id + samples.len();
        push_sample(samples, id, path, rel_at, label, size_bytes)?;
    }
    Ok(())
}

/// A label or a size (plain decimal digits, at most 19) ended by a tab, and what follows
/// the tab.
fn count_field(field: &[u8]) -> Option<(u64, &[u8])> {
    let mut n = 0u64;
    for (i, &b) in field.iter().enumerate().take(20) {
        match b {
            b'0'..=b'9' if i < 19 => n = n * 10 + u64::from(b - b'0'),
            b'\t' if i > 0 => return Some((n, &field[i + 1..])),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::table_file::fifo;
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    /// Sets every directory under `root` (and itself) an hour back, as a folder made long
    /// before it is opened; its directories' change times cannot be set back, so the tables
    /// this thread keeps say they were written an hour ahead instead.
    fn age(root: &Path) {
        super::super::table_file::WRITTEN_AHEAD_NS.set(3600 * 1_000_000_000);
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                }
            }
            fs::File::open(&d).unwrap().set_modified(hour_ago).unwrap();
        }
    }

    fn table(ds: &Dataset) -> Vec<(u32, u32, u64, String, PathBuf)> {
        ds.samples()
            .iter()
            .map(|s| {
                (
                    s.id,
                    s.label,
                    s.size_bytes,
                    s.key().to_string(),
                    s.path.to_path_buf(),
                )
            })
            .collect()
    }

    fn options(tables: &Path) -> FolderOptions {
        FolderOptions {
            table_dir: Some(tables.to_path_buf()),
            ..FolderOptions::default()
        }
    }

    #[test]
    fn a_second_open_reads_the_table_until_a_directory_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("b/x\tab\tname.jpg"), b"12");
        write(&root.join("a/sub/1.png"), b"1");
        write(&root.join("a/0.jpg"), b"123");
        write(&root.join("a/notes.txt"), b"no");
        age(&root);
        let o = options(&tables);
        let scanned = open(&root, &o).unwrap();
        assert!(scanned.table().is_none());
        let cached = open(&root, &o).unwrap();
        assert!(cached.table().is_some_and(|t| t.starts_with(&tables)));
        assert_eq!(table(&cached), table(&scanned));
        assert_eq!(cached.classes(), scanned.classes());
        // A file added to a nested directory changes that directory: scanned again.
        write(&root.join("a/sub/2.png"), b"22");
        let rescanned = open(&root, &o).unwrap();
        assert!(rescanned.table().is_none());
        assert_eq!(rescanned.len(), scanned.len() + 1);
        // Another list of extensions is another table.
        let txt = FolderOptions {
            extensions: vec![".txt".into(), ".jpg".into()],
            ..o.clone()
        };
        age(&root);
        open(&root, &txt).unwrap();
        let with_txt = open(&root, &txt).unwrap();
        assert!(with_txt.table().is_some());
        assert!(with_txt
            .samples()
            .iter()
            .any(|s| s.key().ends_with("notes.txt")));
        assert!(!open(&root, &o)
            .unwrap()
            .samples()
            .iter()
            .any(|s| s.key().ends_with("notes.txt")));
    }

    /// A class directory added changes only the root's modification time: the root's
    /// directory line (the first) must be checked too.
    #[test]
    fn a_class_added_to_the_root_is_seen_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("a/0.jpg"), b"1");
        age(&root);
        let o = options(&tables);
        open(&root, &o).unwrap();
        assert!(open(&root, &o).unwrap().table().is_some());
        write(&root.join("b/0.jpg"), b"2");
        fs::File::open(&root)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(600))
            .unwrap();
        fs::File::open(root.join("b"))
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(600))
            .unwrap();
        let ds = open(&root, &o).unwrap();
        assert_eq!(ds.classes(), ["a", "b"]);
        assert_eq!(ds.len(), 2);
    }

    /// Sets `path`'s modification time to 2024-01-01, as tar --mtime, rsync -a or a
    /// reproducible archive does.
    fn stamp_2024(path: &Path) {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_704_067_200);
        let f = fs::File::options()
            .read(true)
            .write(path.is_file())
            .open(path)
            .unwrap();
        f.set_modified(t).unwrap();
    }

    /// A folder (its directories and files stamped 2024-01-01) holding `files`.
    fn stamped_folder(root: &Path, files: &[&str]) {
        for f in files {
            write(&root.join(f), f.as_bytes());
            stamp_2024(&root.join(f));
        }
        for f in files {
            stamp_2024(root.join(f).parent().unwrap());
        }
        stamp_2024(root);
    }

    /// A directory replaced by another with the same modification times (as two extracted
    /// tarballs made with `tar --mtime`) is another directory: its table is not trusted.
    #[test]
    fn a_folder_replaced_by_one_with_the_same_mtimes_is_scanned_again() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        stamped_folder(&root, &["a/0.jpg", "a/1.jpg", "b/2.jpg"]);
        // The directories' status changes must be older than the racy window for the table
        // to be kept: a real wait, as a folder extracted before a job starts.
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let o = options(&tables);
        open(&root, &o).unwrap();
        let kept = open(&root, &o).unwrap();
        assert!(kept.table().is_some(), "the table is kept and read");
        let keys = |ds: &Dataset| -> Vec<String> {
            ds.samples().iter().map(|s| s.key().into_owned()).collect()
        };
        assert_eq!(keys(&kept), ["a/0.jpg", "a/1.jpg", "b/2.jpg"]);
        fs::remove_dir_all(&root).unwrap();
        stamped_folder(&root, &["a/0.jpg", "b/2.jpg", "b/3.jpg"]);
        let ds = open(&root, &o).unwrap();
        assert_eq!(keys(&ds), ["a/0.jpg", "b/2.jpg", "b/3.jpg"]);
        // A file removed and added within one directory, its time set back: the same.
        std::thread::sleep(std::time::Duration::from_millis(2100));
        open(&root, &o).unwrap();
        assert!(open(&root, &o).unwrap().table().is_some());
        fs::remove_file(root.join("b/3.jpg")).unwrap();
        write(&root.join("b/4.jpg"), b"4");
        stamp_2024(&root.join("b"));
        assert_eq!(
            keys(&open(&root, &o).unwrap()),
            ["a/0.jpg", "b/2.jpg", "b/4.jpg"]
        );
    }

    /// A kept table is a file lobster-io wrote: anything else at its path (a FIFO, a
    /// device) is refused without being read, naming it, and the folder is scanned.
    #[test]
    fn a_table_that_is_not_a_regular_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("a/0.jpg"), b"1");
        let o = options(&tables);
        let at = table_path(&tables, &root, &o);
        fs::create_dir_all(&tables).unwrap();
        // A bounded writer, so that a reader without a bound still ends.
        let writer = fifo(&at, &[0u8; 1 << 16], 64);
        let e = load(&at, &root, &o, PARALLEL_FROM_BYTES)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        // Refused unopened: the writer waits for a reader that never comes.
        drop(writer);
        assert!(
            e.contains(&*at.to_string_lossy()) && e.contains("not a regular file"),
            "{e}"
        );
        let symlink = dir.path().join("zero.table");
        std::os::unix::fs::symlink("/dev/zero", &symlink).unwrap();
        let e = load(&symlink, &root, &o, PARALLEL_FROM_BYTES)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("zero.table") && e.contains("not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn a_table_read_in_two_halves_is_the_table_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        for (class, n) in [("a", 7), ("b", 1), ("c", 4)] {
            for i in 0..n {
                write(
                    &root.join(format!("{class}/{i:03}.jpg")),
                    &vec![b'x'; i + 1],
                );
            }
        }
        age(&root);
        let o = options(&tables);
        let scanned = open(&root, &o).unwrap();
        let at = table_path(&tables, &root, &o);
        let whole = load(&at, &root, &o, usize::MAX).unwrap().unwrap();
        assert_eq!(table(&whole), table(&scanned));
        for from in [1, 40, 200] {
            let halves = load(&at, &root, &o, from).unwrap().unwrap();
            assert_eq!(table(&halves), table(&scanned), "split from {from} bytes");
            assert_eq!(halves.classes(), scanned.classes());
        }
    }

    #[test]
    fn a_folder_changed_just_now_is_not_trusted_to_a_table() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("a/0.jpg"), b"1");
        let o = options(&tables);
        assert!(open(&root, &o).unwrap().table().is_none());
        assert!(open(&root, &o).unwrap().table().is_none());
        assert!(!tables.exists(), "no table kept for a racy folder");
    }

    #[test]
    fn a_damaged_table_is_scanned_over() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("a/0.jpg"), b"1");
        age(&root);
        let o = options(&tables);
        open(&root, &o).unwrap();
        let path = table_path(&tables, &root, &o);
        let text = fs::read(&path).unwrap();
        fs::write(&path, &text[..text.len() - 3]).unwrap();
        let ds = open(&root, &o).unwrap();
        assert!(ds.table().is_none());
        assert_eq!(ds.len(), 1);
    }

    #[test]
    fn a_time_of_writing_near_the_smallest_i128_is_not_trusted_and_does_not_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
        write(&root.join("a/0.jpg"), b"1");
        age(&root);
        let o = options(&tables);
        open(&root, &o).unwrap();
        let path = table_path(&tables, &root, &o);
        let text = String::from_utf8(fs::read(&path).unwrap()).unwrap();
        let body = &text[..text.rfind("end\t").unwrap()];
        let written = body.lines().find(|l| l.starts_with("written\t")).unwrap();
        let mut out = body
            .replace(written, &format!("written\t{}", i128::MIN))
            .into_bytes();
        seal(&mut out);
        fs::write(&path, &out).unwrap();
        // `written - 2 s` overflowed (a panic in a debug build) before it saturated.
        let ds = open(&root, &o).unwrap();
        assert!(ds.table().is_none(), "scanned, not trusted");
        assert_eq!(ds.len(), 1);
    }

    /// Sample lines as the one-pass parser reads them: each field's bounds, the probe,
    /// escapes in the path, and every malformed form refused naming the table.
    #[test]
    fn sample_lines_are_read_field_by_field_and_malformed_ones_refused() {
        let root = Path::new("/nonexistent/lobster-lines");
        let o = FolderOptions {
            extensions: vec![".jpg".into()],
            table_dir: None,
        };
        let read = |lines: &str| {
            let mut out = MAGIC.to_vec();
            out.extend_from_slice(
                format!(
                    "\nroot\t{}\next\t.jpg\nwritten\t9000000000000\nclass\ta\nclass\tb\n{lines}",
                    root.display()
                )
                .as_bytes(),
            );
            seal(&mut out);
            from_file(out, Path::new("t.table"), root, &o, usize::MAX)
        };
        let ds = read("s\t1\t9999999999999999999\tj3x4\ta\\tb.jpg\ns\t0\t0\t?\t\n")
            .unwrap()
            .unwrap();
        let s = ds.samples();
        assert_eq!(
            (s[0].label, s[0].size_bytes),
            (1, 9_999_999_999_999_999_999)
        );
        assert_eq!(
            s[0].path.as_os_str().as_bytes(),
            b"/nonexistent/lobster-lines/a\tb.jpg"
        );
        assert_eq!(s[0].key(), "a\tb.jpg");
        assert_eq!(
            (s[1].label, s[1].size_bytes, s[1].key().as_ref()),
            (0, 0, "")
        );
        assert_eq!(
            ds.probes,
            [
                Probe::Jpeg {
                    width: 3,
                    height: 4
                },
                Probe::Unprobed
            ]
        );
        for bad in [
            "s\n",
            "s\t\n",
            "x\t0\t1\t?\ta.jpg\n",
            "s\t\t1\t?\ta.jpg\n",
            "s\t0\t\t?\ta.jpg\n",
            "s\t0\t10000000000000000000\t?\ta.jpg\n",
            "s\t0\t99999999999999999999\t?\ta.jpg\n",
            "s\t0\t1x\t?\ta.jpg\n",
            "s\t2\t1\t?\ta.jpg\n",
            "s\t4294967296\t1\t?\ta.jpg\n",
            "s\t0\t1\t?\n",
            "s\t0\t1\n",
            "s\t0\t1\tq1x1\ta.jpg\n",
            "s\t0\t1\tj0x1\ta.jpg\n",
            "s\t0\t1\t?\ta.jpg\textra\n",
            "s\t0\t1\t?\ta\\q.jpg\n",
        ] {
            let e = read(bad).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("t.table"), "{bad:?}: {e}");
        }
    }

    /// Every byte of a sealed file counts in its check, whichever lane or the rest holds it,
    /// and so do its length and its lanes' order.
    #[test]
    fn a_check_sees_any_byte_changed_and_the_length() {
        let bytes: Vec<u8> = (0..100u8).collect();
        let check = super::super::table_file::check_of(&bytes);
        for at in 0..bytes.len() {
            let mut changed = bytes.clone();
            changed[at] ^= 1;
            assert_ne!(
                super::super::table_file::check_of(&changed),
                check,
                "byte {at}"
            );
        }
        assert_ne!(super::super::table_file::check_of(&bytes[..99]), check);
        let mut swapped = bytes.clone();
        swapped[..16].rotate_left(8);
        assert_ne!(super::super::table_file::check_of(&swapped), check);
        let mut sealed = bytes.clone();
        sealed.push(b'\n');
        seal(&mut sealed);
        assert!(super::super::table_file::unseal(&sealed).is_some());
        sealed[5] ^= 1;
        assert!(super::super::table_file::unseal(&sealed).is_none());
    }

    #[test]
    fn escaped_fields_come_back_whole() {
        let mut out = Vec::new();
        escape(b"a\tb\\c\nd", &mut out);
        assert_eq!(unescape(&out).unwrap(), b"a\tb\\c\nd");
        escape(b"\t\n\\", &mut out);
        assert!(!out.contains(&b'\t') && !out.contains(&b'\n'));
        assert_eq!(unescape(b"bad\\x"), None);
    }
}
