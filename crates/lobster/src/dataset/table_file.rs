//! The files lobster-io keeps beside a dataset to open it again without scanning it (a
//! folder's table, a shard's index): lines of tab-separated fields, escaped so a field
//! holds any bytes, ended by a check line so that a file cut short or damaged is not read.
//! Also the one bounded read of a whole file from outside ([`read_at_most`]).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The most a kept file may hold: a folder's table of 2^26 samples (ImageNet-22k has 14
/// million) at 64 bytes a line.
pub(super) const KEPT_MAX_BYTES: u64 = 4 << 30;

/// A source changed this close to when its file was written may change again within the
/// same timestamp: such a file is not trusted.
pub(super) const RACY_NS: i128 = 2_000_000_000;

/// What a kept file records of a directory or a shard to see that it changed: its device
/// and inode (another directory or file put in its place, even within one clock tick) and
/// its status change time. Unlike the modification time, which tar, `rsync -a` and
/// reproducible archives set, no call from user space can set the change time: any change
/// of the entry (its contents, its times, its mode) sets it to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) ctime_ns: i128,
}

impl Stamp {
    pub(super) fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }

    /// Whether a file written at `written_ns` may trust this stamp: as git does for its
    /// index, a change within [`RACY_NS`] of the writing may be followed by another in the
    /// same timestamp, which would not show.
    pub(super) fn settled_at(self, written_ns: i128) -> bool {
        self.ctime_ns <= written_ns.saturating_sub(RACY_NS)
    }

    /// Its three fields, tab-separated: `<dev> <inode> <change time, ns>`.
    pub(super) fn write(self, out: &mut Vec<u8>) {
        let _ = write!(out, "{}\t{}\t{}", self.dev, self.ino, self.ctime_ns);
    }

    /// The stamp [`Stamp::write`] wrote, from the next three of `fields`.
    pub(super) fn parse<'a>(fields: &mut impl Iterator<Item = &'a [u8]>) -> Option<Stamp> {
        fn number<T: std::str::FromStr>(field: Option<&[u8]>) -> Option<T> {
            let field = field?;
            // At most 39 digits and a sign: a longer field cannot parse.
            (field.len() <= 40).then_some(())?;
            std::str::from_utf8(field).ok()?.parse().ok()
        }
        Some(Stamp {
            dev: number(fields.next())?,
            ino: number(fields.next())?,
            ctime_ns: number(fields.next())?,
        })
    }
}

/// `path` read whole, at most `max_bytes` of it whatever it is (a device, a FIFO, a /proc
/// file, a file growing while read): a regular file larger is refused before it is read,
/// anything else read through a limit of one byte past the bound, and refused when that
/// byte is there. The error says which bound; the caller names the file.
///
/// # Errors
/// The file cannot be opened or read, or holds more than `max_bytes` (`FileTooLarge`).
pub(crate) fn read_at_most(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let file = fs::File::open(path)?;
    let meta = file.metadata()?;
    let too_long = || {
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("more than {max_bytes} bytes, the most it may hold"),
        )
    };
    if meta.is_file() && meta.len() > max_bytes {
        return Err(too_long());
    }
    let mut bytes = Vec::new();
    if meta.is_file() {
        bytes.reserve_exact(usize::try_from(meta.len()).unwrap_or(0));
    }
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_long());
    }
    Ok(bytes)
}

/// A kept file read whole, at most `max_bytes`: one lobster-io wrote is a regular file, so
/// anything else at its path (a FIFO, a device) is refused unread.
pub(super) fn read_kept(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file: lobster-io keeps none other",
        ));
    }
    read_at_most(path, max_bytes)
}

/// `$XDG_CACHE_HOME/lobster-io/tables`, else `~/.cache/lobster-io/tables`.
pub(super) fn default_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
    cache.map(|c| c.join("lobster-io").join("tables"))
}

#[cfg(test)]
thread_local! {
    /// How far ahead of the real clock this thread's kept files say they were written: a
    /// unit test's folder, made just now, is then old enough to be kept.
    pub(super) static WRITTEN_AHEAD_NS: std::cell::Cell<i128> = const { std::cell::Cell::new(0) };
}

/// A FIFO at `at` whose writer (returned) writes `chunks` of `chunk` and stops at the
/// first refused write: a reader without a bound still ends.
#[cfg(test)]
pub(super) fn fifo(
    at: &std::path::Path,
    chunk: &'static [u8],
    chunks: usize,
) -> std::thread::JoinHandle<()> {
    let made = std::process::Command::new("mkfifo")
        .arg(at)
        .status()
        .unwrap();
    assert!(made.success());
    let at = at.to_path_buf();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::File::options().write(true).open(&at).unwrap();
        for _ in 0..chunks {
            if f.write_all(chunk).is_err() {
                break;
            }
        }
    })
}

/// The time a kept file is written at.
pub(super) fn now_ns() -> i128 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    #[cfg(test)]
    let now = now + WRITTEN_AHEAD_NS.get();
    now
}

/// FNV-1a over `parts`, eight bytes a step (a table is megabytes): stable across runs and
/// builds.
pub(super) fn fnv(parts: &[&[u8]]) -> u64 {
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

/// The check of a kept file's bytes: [`fnv`]'s step in four lanes, 32 bytes a step, folded
/// with the rest. The lanes' multiplies do not wait on each other, so a reopen checks its
/// table (megabytes) in a quarter of one chain's time.
pub(super) fn check_of(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut lanes: [u64; 4] = [
        0xcbf2_9ce4_8422_2325,
        0x9e37_79b9_7f4a_7c15,
        0x2545_f491_4f6c_dd1d,
        0x8422_2325_cbf2_9ce4,
    ];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
            *lane = (*lane ^ w).wrapping_mul(PRIME).rotate_left(29);
        }
    }
    let lanes = lanes.map(u64::to_le_bytes);
    fnv(&[
        &lanes.concat(),
        blocks.remainder(),
        &(bytes.len() as u64).to_le_bytes(),
    ])
}

/// Appends the check line of everything in `out`; returns the check.
pub(super) fn seal(out: &mut Vec<u8>) -> u64 {
    let check = check_of(out);
    out.extend_from_slice(format!("end\t{check:016x}\n").as_bytes());
    check
}

/// What [`seal`] sealed and its check, if its check line matches.
pub(super) fn unseal(bytes: &[u8]) -> Option<(&[u8], u64)> {
    let body_len = bytes[..bytes.len().saturating_sub(1)]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let (body, end) = bytes.split_at(body_len);
    let check = check_of(body);
    (end == format!("end\t{check:016x}\n").as_bytes()).then_some((body, check))
}

/// A kept file read whole: its lines after the first, `magic`, where they start, and its
/// check.
pub(super) struct Sealed {
    pub(super) bytes: Vec<u8>,
    pub(super) lines_at: usize,
    pub(super) check: u64,
}

/// A kept file's bytes when its check line matches and its first line is `magic` (else an
/// error saying what is wrong). A file of another version is refused, so that it is made
/// again rather than misread.
pub(super) fn parse_sealed(mut bytes: Vec<u8>, magic: &[u8]) -> Result<Sealed, String> {
    let Some((body_len, check)) = unseal(&bytes).map(|(b, c)| (b.len(), c)) else {
        return Err("malformed: cut short or damaged (its check does not match)".into());
    };
    bytes.truncate(body_len);
    match bytes.strip_prefix(magic) {
        Some([b'\n', ..]) => Ok(Sealed {
            bytes,
            lines_at: magic.len() + 1,
            check,
        }),
        _ => Err("malformed: not of this version".into()),
    }
}

/// The file at `path` without its check line, and its check, whatever its first line.
pub(super) fn read_sealed_any(path: &Path, max_bytes: u64) -> Result<(Vec<u8>, u64), String> {
    let mut bytes = read_kept(path, max_bytes).map_err(|e| e.to_string())?;
    let (body_len, check) = unseal(&bytes)
        .map(|(b, c)| (b.len(), c))
        .ok_or("malformed: cut short or damaged (its check does not match)")?;
    bytes.truncate(body_len);
    Ok((bytes, check))
}

/// Writes `bytes` to `path` whole or not at all: a temporary file, synced, then renamed.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("a kept file's path has a directory");
    fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// Removes the least recently written files of `kept`'s kind (its extension) in its
/// directory past the `max` newest.
pub(super) fn prune(kept: &Path, max: usize) {
    let (Some(dir), Some(kind)) = (kept.parent(), kept.extension()) else {
        return;
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension() == Some(kind))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() > max {
        files.sort();
        for (_, p) in &files[..files.len() - max] {
            let _ = fs::remove_file(p);
        }
    }
}

/// `bytes` split at each `sep` as `slice::split` splits, but found by `memchr`: a table
/// has millions of fields.
pub(super) fn split(bytes: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let r = rest?;
        match memchr::memchr(sep, r) {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Tabs, newlines and backslashes escaped, so a field is one tab-free run of bytes.
pub(super) fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(b),
        }
    }
}

pub(super) fn unescape(field: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    unescape_into(field, &mut out)?;
    Some(out)
}

/// Appends `field` unescaped to `out`.
pub(super) fn unescape_into(field: &[u8], out: &mut Vec<u8>) -> Option<()> {
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
