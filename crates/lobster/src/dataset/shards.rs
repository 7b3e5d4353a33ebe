//! WebDataset tar shards read in place: members grouped into samples by key, each sample a
//! byte range (its image member) of its shard.
//!
//! A member's key is its path up to the first dot of its file name, and the rest is its
//! extension (lower-cased), as webdataset splits them (`a/b.c.jpg`: key `a/b`, extension
//! `c.jpg`); names without such a split are not samples' members. A sample has one image
//! member (an extension of [`crate::IMAGE_EXTENSIONS`]) whose bytes are the sample, and a
//! `.cls` member whose text is its label (a non-negative integer). Samples are numbered in
//! shard order, then by their first member's place in the shard.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::tar_index::{members, Member};
use super::{SampleRecord, IMAGE_EXTENSIONS};
use crate::error::Error;

/// The longest `.cls` member read.
const LABEL_MAX_BYTES: u64 = 64;

/// The shards a specification names: `dir/train-{000000..000127}.tar` (brace ranges, zero
/// padding kept), a directory (its `.tar` files, sorted), one `.tar` file, or a list file
/// (one shard per line, relative to the list's directory).
///
/// # Errors
/// A bad brace range, an unreadable directory or list, or no shard named.
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
            let text = std::fs::read_to_string(path).map_err(|e| Error::dataset(path, e))?;
            let base = path.parent().unwrap_or(Path::new("."));
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
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
fn expand_braces(spec: &str) -> Result<Vec<String>, Error> {
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
    label: Option<Member>,
    /// What the label member holds, read while its shard is open.
    label_value: Option<Result<u32, String>>,
}

/// The samples of `shards`, in order, with the labels read from their `.cls` members.
///
/// # Errors
/// Anything [`members`] refuses, and, naming the shard and the member or key: a key split
/// across two shards, a member that appears twice, two image members, a sample without an
/// image or a label, a label that is not a non-negative integer.
pub(crate) fn records(shards: &[PathBuf]) -> Result<Vec<SampleRecord>, Error> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    // Every shard is indexed before any sample is judged, so a key split across shards is
    // reported as such, not as a sample missing a member.
    let mut indexed = Vec::with_capacity(shards.len());
    for (s, shard) in shards.iter().enumerate() {
        let bad = |what: String| Error::dataset(shard, what);
        let mut order: Vec<String> = Vec::new();
        let mut parts: HashMap<String, Parts> = HashMap::new();
        let file = std::fs::File::open(shard).map_err(|e| Error::dataset(shard, e))?;
        for m in members(&file, shard)? {
            let Some((key, ext)) = key_and_extension(&m.name) else {
                continue;
            };
            let key = key.to_owned();
            if let Some(&other) = seen.get(&key) {
                if other != s {
                    return Err(bad(format!(
                        "key {key:?} is split across two shards: also in {}",
                        shards[other].display()
                    )));
                }
            }
            let p = parts.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                Parts::default()
            });
            seen.insert(key.clone(), s);
            let slot = if ext == "cls" {
                &mut p.label
            } else if IMAGE_EXTENSIONS.iter().any(|e| e[1..] == ext) {
                &mut p.image
            } else {
                continue;
            };
            match slot {
                Some(first) if first.name == m.name => {
                    return Err(bad(format!("member {} appears twice", m.name)))
                }
                Some(first) => {
                    return Err(bad(format!(
                        "sample {key:?} has two members of one kind: {} and {}",
                        first.name, m.name
                    )))
                }
                None => *slot = Some(m),
            }
        }
        // Labels are read while the shard is open: one descriptor at a time however many
        // shards there are.
        for p in parts.values_mut() {
            p.label_value = p.label.as_ref().map(|m| read_label(&file, m));
        }
        indexed.push((order, parts));
    }
    let mut records = Vec::new();
    for (shard, (order, mut parts)) in shards.iter().zip(indexed) {
        let bad = |what: String| Error::dataset(shard, what);
        for key in order {
            let p = parts.remove(&key).expect("every key in order has parts");
            let image = p
                .image
                .ok_or_else(|| bad(format!("sample {key:?} has no image member")))?;
            let (Some(member), Some(value)) = (p.label, p.label_value) else {
                return Err(bad(format!(
                    "sample {key:?} has no .cls member (its label)"
                )));
            };
            let label = value
                .map_err(|what| bad(format!("sample {key:?}: member {}: {what}", member.name)))?;
            records.push(SampleRecord {
                path: shard.clone(),
                offset: image.offset,
                len: image.size,
                label,
                key,
            });
        }
    }
    Ok(records)
}

/// A `.cls` member's label.
fn read_label(file: &std::fs::File, m: &Member) -> Result<u32, String> {
    if m.size > LABEL_MAX_BYTES {
        return Err(format!("{} bytes, not a label", m.size));
    }
    let mut buf = vec![0u8; m.size as usize];
    file.read_exact_at(&mut buf, m.offset)
        .map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
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
