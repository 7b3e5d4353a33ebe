//! ImageFolder directories: indexed as torchvision's `ImageFolder` indexes them, and the
//! index (the sample table) kept on disk so that a second open neither lists nor stats the
//! files again.
//!
//! A table stays valid while no directory of the folder changes: adding, removing or
//! renaming a file changes its directory's modification time, which the table records for
//! every directory it walked (one stat each on reopen, not one per file). A file whose size
//! changed in place is caught when it is read. As git does for its index, a directory
//! modified less than [`RACY_NS`] before the table was written is not trusted (a change in
//! the same clock tick would not show), so such a folder is scanned again.

use std::fs;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Dataset, SampleMeta, IMAGE_EXTENSIONS};
use crate::error::Error;

/// How close to the table's writing a directory's change makes it untrusted.
const RACY_NS: i128 = 2_000_000_000;
/// Tables kept in a table directory; the least recently written go first.
const TABLES_MAX: usize = 64;
const MAGIC: &[u8] = b"lobster-folder-table 1";

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
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
        FolderOptions {
            extensions: IMAGE_EXTENSIONS.iter().map(|e| e.to_string()).collect(),
            table_dir: cache.map(|c| c.join("lobster-io").join("tables")),
        }
    }
}

impl FolderOptions {
    fn is_sample(&self, name: &std::ffi::OsStr) -> bool {
        let name = name.as_bytes();
        self.extensions.iter().any(|e| {
            let e = e.as_bytes();
            name.len() >= e.len() && name[name.len() - e.len()..].eq_ignore_ascii_case(e)
        })
    }
}

/// A directory the scan walked, relative to the root, and its modification time.
struct Walked {
    rel: PathBuf,
    mtime_ns: i128,
}

fn mtime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Opens `root`: from its table if one is valid, else by scanning (and then keeping the
/// table, unless the folder changed too recently to trust).
pub(super) fn open(root: &Path, options: &FolderOptions) -> Result<Dataset, Error> {
    let table = options
        .table_dir
        .as_ref()
        .map(|d| table_path(d, root, options));
    if let Some(path) = &table {
        match load(path, root, options) {
            Ok(Some(ds)) => return Ok(ds),
            Ok(None) => {}
            // A table that cannot be read is scanned over, not trusted.
            Err(e) => log::warn!(
                "lobster-io: ignoring the sample table {}: {e}",
                path.display()
            ),
        }
    }
    let (ds, walked) = scan(root, options)?;
    if let Some(path) = &table {
        if let Err(e) = store(path, &ds, &walked, options) {
            log::warn!(
                "lobster-io: could not keep the sample table {}: {e}",
                path.display()
            );
        }
    }
    Ok(ds)
}

/// Scans `root` and keeps its table, replacing any; returns where the table was kept.
pub(super) fn index(
    root: &Path,
    options: &FolderOptions,
) -> Result<(Dataset, Option<PathBuf>), Error> {
    let (ds, walked) = scan(root, options)?;
    let Some(path) = options
        .table_dir
        .as_ref()
        .map(|d| table_path(d, root, options))
    else {
        return Ok((ds, None));
    };
    let _ = fs::remove_file(&path);
    store(&path, &ds, &walked, options).map_err(|e| Error::dataset(&path, e))?;
    let kept = path.exists().then_some(path);
    Ok((ds, kept))
}

/// Walks `root` as torchvision does; see [`Dataset`].
fn scan(root: &Path, options: &FolderOptions) -> Result<(Dataset, Vec<Walked>), Error> {
    let root_meta = fs::metadata(root).map_err(|e| Error::dataset(root, e))?;
    let mut walked = vec![Walked {
        rel: PathBuf::new(),
        mtime_ns: mtime_ns(&root_meta),
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
            let key = path.strip_prefix(root).unwrap_or(&path).to_string_lossy();
            push_sample(&mut samples, &path, &key, label as u32, size_bytes)
                .map_err(|e| Error::dataset(root, e))?;
        }
        classes.push(name);
    }
    if !empty.is_empty() {
        return Err(Error::dataset(
            root,
            format!(
                "no valid file for the classes {}; supported extensions are: {}",
                empty.join(", "),
                options.extensions.join(", ")
            ),
        ));
    }
    let ds = Dataset {
        root: root.to_path_buf(),
        classes,
        samples,
        table: None,
    };
    Ok((ds, walked))
}

/// Appends a folder's sample (a whole file; `key` its path under the root), scanned or
/// read from a table.
fn push_sample(
    samples: &mut Vec<SampleMeta>,
    path: &Path,
    key: &str,
    label: u32,
    size_bytes: u64,
) -> Result<(), &'static str> {
    let id = u32::try_from(samples.len()).map_err(|_| "more than 2^32 samples")?;
    samples.push(SampleMeta {
        id,
        label,
        key: Arc::from(key),
        path: Arc::from(path),
        offset: 0,
        size_bytes,
        whole_file: true,
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
            mtime_ns: mtime_ns(&meta),
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

/// FNV-1a over `parts`, eight bytes a step (a table is megabytes): stable across runs and
/// builds.
fn fnv(parts: &[&[u8]]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        let mut words = part.chunks_exact(8);
        for w in &mut words {
            let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
            h = (h ^ w).wrapping_mul(PRIME).rotate_left(29);
        }
        for &b in words.remainder() {
            h = (h ^ u64::from(b)).wrapping_mul(PRIME);
        }
        h = (h ^ part.len() as u64).wrapping_mul(PRIME);
    }
    h
}

/// Where `root`'s table lives: named by a hash of the root and the extensions.
fn table_path(dir: &Path, root: &Path, options: &FolderOptions) -> PathBuf {
    let mut parts = vec![root.as_os_str().as_bytes()];
    parts.extend(options.extensions.iter().map(|e| e.as_bytes()));
    dir.join(format!("folder-{:016x}.table", fnv(&parts)))
}

/// Tabs, newlines and backslashes escaped, so a field is one tab-free run of bytes.
fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(b),
        }
    }
}

fn unescape(field: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    unescape_into(field, &mut out)?;
    Some(out)
}

/// Appends `field` unescaped to `out`.
fn unescape_into(field: &[u8], out: &mut Vec<u8>) -> Option<()> {
    if !field.contains(&b'\\') {
        out.extend_from_slice(field);
        return Some(());
    }
    let mut it = field.iter();
    while let Some(&b) = it.next() {
        out.push(match b {
            b'\\' => match it.next()? {
                b'\\' => b'\\',
                b't' => b'\t',
                b'n' => b'\n',
                _ => return None,
            },
            _ => b,
        });
    }
    Some(())
}

/// Writes the table of `ds` (atomically: a temporary file renamed), unless a directory
/// changed too recently to be trusted; then keeps at most [`TABLES_MAX`] tables.
fn store(
    path: &Path,
    ds: &Dataset,
    walked: &[Walked],
    options: &FolderOptions,
) -> std::io::Result<()> {
    let written = now_ns();
    if walked.iter().any(|w| w.mtime_ns > written - RACY_NS) {
        return Ok(());
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
        out.extend_from_slice(format!("dir\t{}\t", w.mtime_ns).as_bytes());
        escape(w.rel.as_os_str().as_bytes(), &mut out);
        out.push(b'\n');
    }
    for c in &ds.classes {
        out.extend_from_slice(b"class\t");
        escape(c.as_bytes(), &mut out);
        out.push(b'\n');
    }
    for s in &ds.samples {
        out.extend_from_slice(format!("s\t{}\t{}\t", s.label, s.size_bytes).as_bytes());
        let rel = s.path.strip_prefix(&ds.root).unwrap_or(&s.path);
        escape(rel.as_os_str().as_bytes(), &mut out);
        out.push(b'\n');
    }
    // The last line checks the rest: a table cut short or damaged is not read.
    let check = fnv(&[&out]);
    out.extend_from_slice(format!("end\t{check:016x}\n").as_bytes());
    let dir = path.parent().expect("a table path has a directory");
    fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    prune(dir);
    Ok(())
}

/// Removes the least recently written tables past [`TABLES_MAX`].
fn prune(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut tables: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "table"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if tables.len() > TABLES_MAX {
        tables.sort();
        for (_, p) in &tables[..tables.len() - TABLES_MAX] {
            let _ = fs::remove_file(p);
        }
    }
}

/// The dataset `path` holds for `root`, if the table exists and every directory it walked
/// is unchanged and was not changed too close to the table's writing.
fn load(path: &Path, root: &Path, options: &FolderOptions) -> Result<Option<Dataset>, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let bad = |what: &str| Err(format!("malformed: {what}"));
    let body_len = bytes[..bytes.len().saturating_sub(1)]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let (body, end) = bytes.split_at(body_len);
    if end != format!("end\t{:016x}\n", fnv(&[body])).as_bytes() {
        return bad("cut short or damaged (its check does not match)");
    }
    let mut lines = body.split(|&b| b == b'\n');
    if lines.next() != Some(MAGIC) {
        return bad("not a table of this version");
    }
    let mut root_line = lines.next().unwrap_or_default().split(|&b| b == b'\t');
    if root_line.next() != Some(b"root")
        || root_line.next().and_then(unescape).as_deref() != Some(root.as_os_str().as_bytes())
    {
        // Another root with the same hash: scan.
        return Ok(None);
    }
    let ext: Vec<Vec<u8>> = lines
        .next()
        .unwrap_or_default()
        .split(|&b| b == b'\t')
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
    // A sample line's label and size: plain decimal digits.
    let count = |field: Option<&[u8]>| -> Option<u64> {
        let field = field?;
        if field.is_empty() || field.len() > 19 || !field.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(field.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
    };
    let mut written_line = lines.next().unwrap_or_default().split(|&b| b == b'\t');
    let Some(written) = written_line.nth(1).and_then(|f| number(Some(f))) else {
        return bad("no time of writing");
    };
    let mut classes = Vec::new();
    // About one sample per 40 bytes of table.
    let mut samples = Vec::with_capacity(body.len() / 40);
    // The path of each sample is built here, then copied once into its `Arc`.
    let root_bytes = root.as_os_str().as_bytes();
    let mut path_buf: Vec<u8> = Vec::with_capacity(root_bytes.len() + 256);
    for line in lines.filter(|l| !l.is_empty()) {
        let mut fields = line.split(|&b| b == b'\t');
        match fields.next() {
            Some(b"dir") => {
                let (Some(stored), Some(rel)) =
                    (number(fields.next()), fields.next().and_then(unescape))
                else {
                    return bad("a dir line");
                };
                let dir = root.join(std::ffi::OsString::from_vec(rel));
                match fs::metadata(&dir) {
                    Ok(m) if mtime_ns(&m) == stored && stored <= written - RACY_NS => {}
                    _ => return Ok(None),
                }
            }
            Some(b"class") => {
                let Some(name) = fields.next().and_then(unescape) else {
                    return bad("a class line");
                };
                classes.push(String::from_utf8(name).map_err(|_| "a class name not UTF-8")?);
            }
            Some(b"s") => {
                let (Some(label), Some(size), Some(rel)) =
                    (count(fields.next()), count(fields.next()), fields.next())
                else {
                    return bad("a sample line");
                };
                let label = u32::try_from(label).map_err(|_| "a label out of range")?;
                let size_bytes = size;
                if label as usize >= classes.len() {
                    return bad("a label without a class");
                }
                path_buf.clear();
                path_buf.extend_from_slice(root_bytes);
                if !root_bytes.ends_with(b"/") {
                    path_buf.push(b'/');
                }
                let rel_at = path_buf.len();
                unescape_into(rel, &mut path_buf).ok_or("a sample path")?;
                let key = String::from_utf8_lossy(&path_buf[rel_at..]);
                let path = Path::new(std::ffi::OsStr::from_bytes(&path_buf));
                push_sample(&mut samples, path, &key, label, size_bytes)?;
            }
            _ => return bad("an unknown line"),
        }
    }
    if samples.is_empty() {
        return bad("no samples");
    }
    Ok(Some(Dataset {
        root: root.to_path_buf(),
        classes,
        samples,
        table: Some(path.to_path_buf()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    /// Sets every directory under `root` (and itself) an hour back, as a folder made long
    /// before it is opened.
    fn age(root: &Path) {
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
                    s.key.to_string(),
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
            .any(|s| s.key.ends_with("notes.txt")));
        assert!(!open(&root, &o)
            .unwrap()
            .samples()
            .iter()
            .any(|s| s.key.ends_with("notes.txt")));
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
    fn escaped_fields_come_back_whole() {
        let mut out = Vec::new();
        escape(b"a\tb\\c\nd", &mut out);
        assert_eq!(unescape(&out).unwrap(), b"a\tb\\c\nd");
        escape(b"\t\n\\", &mut out);
        assert!(!out.contains(&b'\t') && !out.contains(&b'\n'));
        assert_eq!(unescape(b"bad\\x"), None);
    }
}
