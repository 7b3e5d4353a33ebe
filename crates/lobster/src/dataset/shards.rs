//! WebDataset tar shards read in place: members grouped into samples by key, each sample a
//! byte range (its image member) of its shard.
//!
//! A member's key is its path up to the first dot of its file name, and the rest is its
//! extension (lower-cased), as webdataset splits them (`a/b.c.jpg`: key `a/b`, extension
//! `c.jpg`); names without such a split are not samples' members. A sample has one image
//! member (an extension of [`crate::IMAGE_EXTENSIONS`]) whose bytes are the sample, and a
//! label: the text of its `.cls` member (a non-negative integer), or, without one, the
//! `"cls"` (else `"label"`) field of its `.json` member, a non-negative integer. Samples
//! are numbered in shard order, then by their first member's place in the shard.
//!
//! **Shard indexes.** Indexing a shard reads every member's header and every label, which
//! on a parallel file system is a read per member. So each shard's index is kept in the
//! index directory (by default the one folders' tables use) as `shard-<hash of its
//! path>.idx`, and reused while the shard is the same file, unchanged: its size, device,
//! inode and status change time. The modification time is not enough: tar, `rsync -a` and
//! reproducible archives set it, so a shard replaced by another of the same size would
//! keep it; the change time cannot be set, and a file renamed into its place has another
//! inode.
//!
//! ```text
//! lobster-shard-index 4
//! shard   <path>  <size bytes>  <device>  <inode>  <change time, ns>  <written, ns>
//! <label> <image member's data offset> <its size> <probe> <key>   (a line per sample)
//! end     <check of the lines above>
//! ```
//!
//! Fields are tab-separated, with tabs, newlines and backslashes in a path or key escaped
//! (`\t`, `\n`, `\\`). A probe is what the image's header says, added once the decoded
//! tier first asks ([`Dataset::image_probes`](crate::Dataset::image_probes)): `?` not yet
//! probed, `-` no JPEG or PNG header, `j<width>x<height>` or `p<width>x<height>`. An index
//! of another version (1 had no probes, 2 a check in one lane, 3 the modification time in
//! place of the device, inode and change time) is read over and made again. DALI's
//! `wds2idx` format was the candidate to reuse, but it holds members' offsets without
//! labels: reopening would still read every `.cls` member. A shard changed within 2 s of
//! indexing is not kept (it may still be being written, or change again within the same
//! timestamp).

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::table::{Probe, IMAGE_EXTENSIONS};
use super::table_file::{
    escape, fnv, now_ns, parse_sealed, prune, read_at_most, read_kept, seal, split, unescape,
    unescape_into, write_atomically, Sealed, Stamp, KEPT_MAX_BYTES,
};
use super::tar_index::{walk, Member, ReadAt};
use crate::error::Error;

/// The longest `.cls` member read.
const LABEL_MAX_BYTES: u64 = 64;
/// The longest `.json` member read for a label.
const JSON_MAX_BYTES: u64 = 64 << 10;
/// Shard indexes kept in one directory, the least recently written removed first.
const INDEXES_MAX: usize = 1 << 16;
/// Version 3: a check in four lanes ([`super::table_file::check_of`]); version 4: the
/// shard's device, inode and change time in place of its modification time. An index of an
/// older version is made again.
pub(super) const MAGIC: &[u8] = b"lobster-shard-index 4";
/// The most a list of shards may hold: a million shards named by 64 bytes each.
const SHARD_LIST_MAX_BYTES: u64 = 64 << 20;

/// The entries of the list of shards at `path`: its lines, trimmed, but blank ones and
/// `#` comments.
///
/// # Errors
/// A list that cannot be read, past [`SHARD_LIST_MAX_BYTES`], or not UTF-8.
pub(super) fn list_entries(path: &Path) -> Result<Vec<String>, Error> {
    let bytes = read_at_most(path, SHARD_LIST_MAX_BYTES)
        .map_err(|e| Error::dataset(path, format!("list of shards: {e}")))?;
    let text =
        String::from_utf8(bytes).map_err(|_| Error::dataset(path, "list of shards: not UTF-8"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

/// Whether `spec` is a list of shards whose first entry is an object in a bucket.
pub(super) fn lists_objects(spec: &str) -> bool {
    let path = Path::new(spec);
    path.is_file()
        && path.extension().is_none_or(|e| e != "tar")
        && list_entries(path).is_ok_and(|l| l.first().is_some_and(|e| e.starts_with("s3://")))
}

/// The shards a specification names: `dir/train-{000000..000127}.tar` (brace ranges, zero
/// padding kept), a directory (its `.tar` files, sorted), one `.tar` file, or a list file
/// (one shard per line, relative to the list's directory) of at most
/// [`SHARD_LIST_MAX_BYTES`].
///
/// # Errors
/// A bad brace range, an unreadable directory or list, a list past its bound or not UTF-8,
/// or no shard named.
pub(crate) fn shard_paths(spec: &str) -> Result<Vec<PathBuf>, Error> {
    let paths = if spec.contains('{') {
        expand_braces(spec)?
            .into_iter()
            .map(PathBuf::from)
            .collect()
    } else {
        let path = Path::new(spec);
        if path.is_dir() {
            let mut tars = Vec::new();
            for entry in std::fs::read_dir(path).map_err(|e| Error::dataset(path, e))? {
                let p = entry.map_err(|e| Error::dataset(path, e))?.path();
                if p.extension().is_some_and(|e| e == "tar") {
                    tars.push(p);
                }
            }
            tars.sort();
            tars
        } else if path.extension().is_some_and(|e| e == "tar") {
            vec![path.to_path_buf()]
        } else {
            let base = path.parent().unwrap_or(Path::new("."));
            list_entries(path)?
                .into_iter()
                .map(|l| base.join(l))
                .collect()
        }
    };
    if paths.is_empty() {
        return Err(Error::dataset(Path::new(spec), "no shards"));
    }
    Ok(paths)
}

/// Expands every `{a..b}` of `spec` (decimal, zero-padded to the width of `a`).
pub(super) fn expand_braces(spec: &str) -> Result<Vec<String>, Error> {
    let bad = |what: &str| Error::dataset(Path::new(spec), format!("shard pattern: {what}"));
    let Some(open) = spec.find('{') else {
        return Ok(vec![spec.to_owned()]);
    };
    let close = open
        + spec[open..]
            .find('}')
            .ok_or_else(|| bad("a '{' without '}'"))?;
    let (lo, hi) = spec[open + 1..close]
        .split_once("..")
        .ok_or_else(|| bad("expected {first..last}"))?;
    let (a, b): (u64, u64) = match (lo.parse(), hi.parse()) {
        (Ok(a), Ok(b)) if a <= b => (a, b),
        _ => return Err(bad("expected {first..last} with first <= last, in decimal")),
    };
    if b - a >= 1 << 20 {
        return Err(bad("more than 2^20 shards in one range"));
    }
    let width = lo.len();
    let rest = expand_braces(&spec[close + 1..])?;
    let mut out = Vec::new();
    for n in a..=b {
        for r in &rest {
            out.push(format!("{}{n:0width$}{r}", &spec[..open]));
        }
    }
    Ok(out)
}

/// webdataset's split of a member name into key and extension.
fn key_and_extension(name: &str) -> Option<(&str, String)> {
    let base_at = name.rfind('/').map_or(0, |i| i + 1);
    let dot = base_at + name[base_at..].find('.')?;
    if dot == base_at {
        return None;
    }
    Some((&name[..dot], name[dot + 1..].to_lowercase()))
}

/// One sample's members while a shard is read.
#[derive(Default)]
struct Parts {
    image: Option<Member>,
    cls: Option<Member>,
    json: Option<Member>,
    /// What the `.cls` and `.json` members hold, read as their headers were (while the
    /// shard is open); a `.cls` member's label wins, as webdataset takes it.
    cls_label: Option<Result<u32, String>>,
    json_label: Option<Result<u32, String>>,
}

/// A shard's samples before they are judged: keys in order, with their members.
pub(super) struct Grouped {
    order: Vec<String>,
    parts: HashMap<String, Parts>,
}

/// One sample as a shard's index holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Indexed {
    pub(super) key: Arc<str>,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) label: u32,
    pub(super) probe: Probe,
}

/// A shard's samples, and its index as kept (its path and check), if it is.
pub(super) struct ShardSamples {
    pub(super) samples: Vec<Indexed>,
    pub(super) kept: Option<(PathBuf, u64)>,
}

/// A shard as found: from its index, or read and not yet judged, with what its index is
/// kept against (a file's stamp before it was read, an object's size and ETag).
pub(super) enum Shard<S> {
    Indexed(ShardSamples),
    Read(Grouped, S),
}

/// The samples of `shards`, in order, each shard from its index in `index_dir` when that
/// is still valid and `reuse`, else by reading its headers and labels (then its index is
/// kept).
///
/// # Errors
/// Anything [`members`] refuses, and, naming the shard and the member or key: a key split
/// across two shards, a member that appears twice, two image members, a sample without an
/// image or a label, a label that is not a non-negative integer, a shard without samples.
pub(super) fn indexed(
    shards: &[PathBuf],
    index_dir: Option<&Path>,
    reuse: bool,
) -> Result<Vec<ShardSamples>, Error> {
    let mut found = Vec::with_capacity(shards.len());
    for shard in shards {
        let meta = fs::metadata(shard).map_err(|e| Error::dataset(shard, e))?;
        let index = index_dir.filter(|_| reuse).map(|d| index_path(d, shard));
        let kept = match &index {
            Some(at) => load_index(at, shard, &meta).unwrap_or_else(|e| {
                log::warn!("lobster-io: ignoring a shard index: {e}");
                None
            }),
            None => None,
        };
        found.push(match kept {
            Some(samples) => Shard::Indexed(samples),
            None => {
                let file = fs::File::open(shard).map_err(|e| Error::dataset(shard, e))?;
                Shard::Read(group(&file, shard)?, Stamp::of(&meta))
            }
        });
    }
    keys_in_one_shard(shards, &found)?;
    let keep = index_dir.map(|dir| {
        (
            |shard: &Path| index_path(dir, shard),
            |at: &Path, shard: &Path, samples: &[Indexed], read_at: Stamp| {
                store_index(at, shard, samples, read_at)
            },
        )
    });
    judge_all(shards, found, keep)
}

/// Judges the shards found read and keeps their indexes where `keep` says (where a
/// shard's index goes, and how it is kept: its check, or `None` if it may not be); the
/// shards' samples in order.
pub(super) fn judge_all<S>(
    shards: &[PathBuf],
    found: Vec<Shard<S>>,
    keep: Option<(
        impl Fn(&Path) -> PathBuf,
        impl Fn(&Path, &Path, &[Indexed], S) -> std::io::Result<Option<u64>>,
    )>,
) -> Result<Vec<ShardSamples>, Error> {
    let mut all = Vec::with_capacity(shards.len());
    let mut wrote = None;
    for (shard, found) in shards.iter().zip(found) {
        let samples = match found {
            Shard::Indexed(samples) => samples,
            Shard::Read(grouped, read_at) => {
                let samples = judge(shard, grouped)?;
                let mut kept = None;
                if let Some((index_path, store_index)) = &keep {
                    let at = index_path(shard);
                    match store_index(&at, shard, &samples, read_at) {
                        Ok(Some(check)) => {
                            kept = Some((at.clone(), check));
                            wrote = Some(at);
                        }
                        Ok(None) => {}
                        Err(e) => log::warn!(
                            "lobster-io: could not keep the shard index {}: {e}",
                            at.display()
                        ),
                    }
                }
                ShardSamples { samples, kept }
            }
        };
        all.push(samples);
    }
    if let Some(at) = wrote {
        prune(&at, INDEXES_MAX);
    }
    Ok(all)
}

/// Refuses a key found in two shards. Every shard is grouped before any sample is judged,
/// so a key split across shards is reported as such, not as a sample missing a member.
pub(super) fn keys_in_one_shard<S>(shards: &[PathBuf], found: &[Shard<S>]) -> Result<(), Error> {
    let total = found
        .iter()
        .map(|f| match f {
            Shard::Indexed(s) => s.samples.len(),
            Shard::Read(g, _) => g.order.len(),
        })
        .sum();
    let mut seen: HashMap<&str, usize, ahash::RandomState> =
        HashMap::with_capacity_and_hasher(total, ahash::RandomState::new());
    for (s, shard) in found.iter().enumerate() {
        let keys: Box<dyn Iterator<Item = &str>> = match shard {
            Shard::Indexed(s) => Box::new(s.samples.iter().map(|x| &*x.key)),
            Shard::Read(g, _) => Box::new(g.order.iter().map(String::as_str)),
        };
        for key in keys {
            if let Some(other) = seen.insert(key, s) {
                return Err(Error::dataset(
                    &shards[s],
                    format!(
                        "key {key:?} is split across two shards: also in {}",
                        shards[other].display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A shard's members grouped into samples by key, with the labels read; `file` is the
/// shard at `shard`.
pub(super) fn group(file: &(impl ReadAt + ?Sized), shard: &Path) -> Result<Grouped, Error> {
    let bad = |what: String| Error::dataset(shard, what);
    let mut order: Vec<String> = Vec::new();
    let mut parts: HashMap<String, Parts> = HashMap::new();
    // Labels are read as their headers are: while the shard is open (one descriptor at a
    // time however many shards there are), and in archive order, so that an object store's
    // reader finds each in the span it fetched for the header before it.
    walk(file, shard, |m| {
        let Some((key, ext)) = key_and_extension(&m.name) else {
            return Ok(());
        };
        let p = match parts.get_mut(key) {
            Some(p) => p,
            None => {
                order.push(key.to_owned());
                parts.entry(key.to_owned()).or_default()
            }
        };
        let (slot, label) = if ext == "cls" {
            (&mut p.cls, Some((&mut p.cls_label, read_cls(file, &m))))
        } else if ext == "json" {
            (
                &mut p.json,
                Some((&mut p.json_label, read_json_label(file, &m))),
            )
        } else if IMAGE_EXTENSIONS.iter().any(|e| e[1..] == ext) {
            (&mut p.image, None)
        } else {
            return Ok(());
        };
        match slot {
            Some(first) if first.name == m.name => {
                Err(bad(format!("member {} appears twice", m.name)))
            }
            Some(first) => Err(bad(format!(
                "sample {key:?} has two members of one kind: {} and {}",
                first.name, m.name
            ))),
            None => {
                *slot = Some(m);
                if let Some((to, l)) = label {
                    *to = Some(l);
                }
                Ok(())
            }
        }
    })?;
    Ok(Grouped { order, parts })
}

/// A shard's samples, each with an image and a label.
pub(super) fn judge(shard: &Path, grouped: Grouped) -> Result<Vec<Indexed>, Error> {
    let bad = |what: String| Error::dataset(shard, what);
    let Grouped { order, mut parts } = grouped;
    if order.is_empty() {
        return Err(bad(
            "holds no samples (no member named <key>.<extension>)".into()
        ));
    }
    let mut samples = Vec::with_capacity(order.len());
    for key in order {
        let p = parts.remove(&key).expect("every key in order has parts");
        let image = p
            .image
            .ok_or_else(|| bad(format!("sample {key:?} has no image member")))?;
        let Some(label) = p.cls_label.or(p.json_label) else {
            return Err(bad(format!(
                "sample {key:?} has no label: no .cls member, and no .json member"
            )));
        };
        let member = p.cls.or(p.json).expect("a label comes from a member");
        let label =
            label.map_err(|what| bad(format!("sample {key:?}: member {}: {what}", member.name)))?;
        samples.push(Indexed {
            key: Arc::from(key),
            offset: image.offset,
            size: image.size,
            label,
            probe: Probe::Unprobed,
        });
    }
    Ok(samples)
}

/// A member's bytes, refused past `max` bytes.
fn read_member(file: &(impl ReadAt + ?Sized), m: &Member, max: u64) -> Result<Vec<u8>, String> {
    if m.size > max {
        return Err(format!("{} bytes, more than a label's {max}", m.size));
    }
    let mut buf = vec![0u8; m.size as usize];
    file.read_exact_at(&mut buf, m.offset)
        .map_err(|e| e.to_string())?;
    Ok(buf)
}

/// A `.cls` member's label.
fn read_cls(file: &(impl ReadAt + ?Sized), m: &Member) -> Result<u32, String> {
    let buf = read_member(file, m, LABEL_MAX_BYTES)?;
    std::str::from_utf8(&buf)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "{:?} is not a non-negative integer",
                String::from_utf8_lossy(&buf)
            )
        })
}

/// A `.json` member's label: its object's `"cls"` field, else its `"label"` field.
fn read_json_label(file: &(impl ReadAt + ?Sized), m: &Member) -> Result<u32, String> {
    let buf = read_member(file, m, JSON_MAX_BYTES)?;
    let value: serde_json::Value =
        serde_json::from_slice(&buf).map_err(|e| format!("not JSON: {e}"))?;
    let field = ["cls", "label"]
        .into_iter()
        .find_map(|f| value.get(f).map(|v| (f, v)));
    let Some((name, v)) = field else {
        return Err("no \"cls\" or \"label\" field".into());
    };
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("its {name:?} field, {v}, is not a non-negative integer"))
}

/// Where `shard`'s index lives: named by a hash of its absolute path.
fn index_path(dir: &Path, shard: &Path) -> PathBuf {
    let absolute = std::path::absolute(shard).unwrap_or_else(|_| shard.to_path_buf());
    dir.join(format!(
        "shard-{:016x}.idx",
        fnv(&[absolute.as_os_str().as_bytes()])
    ))
}

/// Keeps `samples` as `shard`'s index at `at`, unless the shard changed since it was read
/// (its stamp then was `read_at`) or too recently to be trusted (then `Ok(None)`); returns
/// its check.
fn store_index(
    at: &Path,
    shard: &Path,
    samples: &[Indexed],
    read_at: Stamp,
) -> std::io::Result<Option<u64>> {
    let written = now_ns();
    let meta = fs::metadata(shard)?;
    let stamp = Stamp::of(&meta);
    if stamp != read_at || !stamp.settled_at(written) {
        return Ok(None);
    }
    let absolute = std::path::absolute(shard)?;
    let mut out = Vec::with_capacity(64 + 48 * samples.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(b"\nshard\t");
    escape(absolute.as_os_str().as_bytes(), &mut out);
    out.extend_from_slice(format!("\t{}\t", meta.len()).as_bytes());
    stamp.write(&mut out);
    out.extend_from_slice(format!("\t{written}\n").as_bytes());
    write_samples(samples, &mut out);
    let check = seal(&mut out);
    write_atomically(at, &out)?;
    Ok(Some(check))
}

/// `shard`'s samples from its index at `at`, if the index exists and was written for the
/// shard as it is now (its path, size, device, inode and change time), not too soon after
/// the shard changed.
///
/// # Errors
/// An index that cannot be read or is malformed, naming it.
fn load_index(at: &Path, shard: &Path, meta: &fs::Metadata) -> Result<Option<ShardSamples>, Error> {
    let named = |e: String| Error::dataset(at, format!("shard index: {e}"));
    let bytes = match read_kept(at, KEPT_MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(named(e.to_string())),
    };
    let absolute = std::path::absolute(shard).map_err(|e| named(e.to_string()))?;
    let now = ShardNow {
        absolute: absolute.as_os_str().as_bytes(),
        len: meta.len(),
        stamp: Stamp::of(meta),
    };
    index_from_file(bytes, at, &now)
}

/// [`load_index`] on the bytes of the index at `at`.
pub(super) fn index_from_file(
    bytes: Vec<u8>,
    at: &Path,
    now: &ShardNow<'_>,
) -> Result<Option<ShardSamples>, Error> {
    let found = index_from_bytes(bytes, now)
        .map_err(|e| Error::dataset(at, format!("shard index: {e}")))?;
    Ok(found.map(|(samples, check)| ShardSamples {
        samples,
        kept: Some((at.to_path_buf(), check)),
    }))
}

/// A shard as it is now, which its index must have been written for.
pub(super) struct ShardNow<'a> {
    pub(super) absolute: &'a [u8],
    pub(super) len: u64,
    pub(super) stamp: Stamp,
}

/// [`load_index`] on the index's bytes: its samples and its check.
fn index_from_bytes(
    bytes: Vec<u8>,
    shard: &ShardNow<'_>,
) -> Result<Option<(Vec<Indexed>, u64)>, String> {
    let Sealed {
        bytes,
        lines_at: at,
        check,
    } = parse_sealed(bytes, MAGIC)?;
    let body = &bytes[at..];
    let bad = |what: &str| Err(format!("malformed: {what}"));
    let mut lines = split(body, b'\n');
    let mut head = split(lines.next().unwrap_or_default(), b'\t');
    if head.next() != Some(b"shard")
        || head.next().and_then(unescape).as_deref() != Some(shard.absolute)
    {
        // Another shard with the same hash.
        return Ok(None);
    }
    let size = number(head.next());
    let (Some(size), Some(stamp), Some(written)) =
        (size, Stamp::parse(&mut head), number(head.next()))
    else {
        return bad("the shard line");
    };
    if size != i128::from(shard.len) || stamp != shard.stamp || !stamp.settled_at(written) {
        return Ok(None);
    }
    Ok(Some((parse_samples(lines, shard.len)?, check)))
}

/// An index's number field.
pub(super) fn number(f: Option<&[u8]>) -> Option<i128> {
    let f = f?;
    // At most 39 digits and a sign: an i128 parse of a longer field cannot succeed.
    (f.len() <= 40).then_some(())?;
    std::str::from_utf8(f).ok()?.parse().ok()
}

/// An index's sample lines, one per sample: label, the image member's data offset, its
/// size, its probe and its key.
pub(super) fn write_samples(samples: &[Indexed], out: &mut Vec<u8>) {
    for x in samples {
        out.extend_from_slice(format!("{}\t{}\t{}\t", x.label, x.offset, x.size).as_bytes());
        x.probe.write(out);
        out.push(b'\t');
        escape(x.key.as_bytes(), out);
        out.push(b'\n');
    }
}

/// The samples of an index's sample lines ([`write_samples`]), each within the shard's
/// `shard_len` bytes.
pub(super) fn parse_samples<'a>(
    lines: impl Iterator<Item = &'a [u8]>,
    shard_len: u64,
) -> Result<Vec<Indexed>, String> {
    let bad = |what: &str| Err(format!("malformed: {what}"));
    let mut samples = Vec::new();
    let mut key = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let mut f = split(line, b'\t');
        let (Some(label), Some(offset), Some(size), Some(probe)) = (
            number(f.next()),
            number(f.next()),
            number(f.next()),
            f.next().and_then(Probe::parse),
        ) else {
            return bad("a sample line");
        };
        key.clear();
        if f.next().and_then(|k| unescape_into(k, &mut key)).is_none() {
            return bad("a sample's key");
        }
        if f.next().is_some() {
            return bad("a sample line with a field too many");
        }
        let (Ok(label), Ok(offset), Ok(size), Ok(key)) = (
            u32::try_from(label),
            u64::try_from(offset),
            u64::try_from(size),
            std::str::from_utf8(&key),
        ) else {
            return bad("a sample line's field out of range");
        };
        if offset.checked_add(size).is_none_or(|end| end > shard_len) {
            return bad("a sample past the shard's end");
        }
        samples.push(Indexed {
            key: Arc::from(key),
            offset,
            size,
            label,
            probe,
        });
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::super::table_file::fifo;
    use super::*;

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        let split = |n| key_and_extension(n).map(|(k, e)| (k.to_owned(), e));
        assert_eq!(split("a/b.c.JPG"), Some(("a/b".into(), "c.jpg".into())));
        assert_eq!(
            split("x.y/000001.cls"),
            Some(("x.y/000001".into(), "cls".into()))
        );
        assert_eq!(split("noext"), None);
        assert_eq!(split("dir/.hidden"), None);
    }

    /// A list of shards is the user's file, and may be a pipe: read up to its bound, and
    /// refused past it naming the list and the bound.
    #[test]
    fn a_shard_list_past_its_bound_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("shards.list");
        // 65 MiB of lines of 1 KiB, past the bound (64 MiB).
        let mut line = vec![b'x'; 1023];
        line.push(b'\n');
        let chunk: &'static [u8] = line.repeat(64).leak();
        let writer = fifo(&list, chunk, 65 * 16);
        let e = shard_paths(list.to_str().unwrap())
            .map(|paths| paths.len())
            .unwrap_err()
            .to_string();
        writer.join().unwrap();
        assert!(
            e.contains("shards.list") && e.contains(&(64u64 << 20).to_string()),
            "{e}"
        );
    }

    /// A kept index is a file lobster-io wrote: anything else at its path (a FIFO, a
    /// device) is refused without being read, naming it.
    #[test]
    fn an_index_that_is_not_a_regular_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.tar");
        fs::write(&shard, [0u8; 1024]).unwrap();
        let at = index_path(dir.path(), &shard);
        let writer = fifo(&at, &[0u8; 1 << 16], 64);
        let meta = fs::metadata(&shard).unwrap();
        let e = load_index(&at, &shard, &meta)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        // Refused unopened: the writer waits for a reader that never comes.
        drop(writer);
        assert!(
            e.contains(&*at.to_string_lossy()) && e.contains("not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn brace_ranges_expand_with_their_padding() {
        assert_eq!(
            expand_braces("s-{08..10}.tar").unwrap(),
            ["s-08.tar", "s-09.tar", "s-10.tar"]
        );
        assert_eq!(
            expand_braces("{0..1}/p{1..2}").unwrap(),
            ["0/p1", "0/p2", "1/p1", "1/p2"]
        );
        assert!(expand_braces("s-{3..1}.tar").is_err());
        assert!(expand_braces("s-{a..b}.tar").is_err());
        assert!(expand_braces("s-{1..2.tar").is_err());
    }
}
