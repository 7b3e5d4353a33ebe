//! The regular files of a tar archive and where their bytes lie, read from the headers alone
//! (the data between them is skipped, not read): ustar and GNU headers, pax extended headers
//! (long paths, large sizes) and GNU long names.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::Error;

const BLOCK: u64 = 512;
/// Extension headers larger than this are refused rather than read into memory.
const EXTENSION_MAX_BYTES: u64 = 1 << 20;

/// One regular file of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    /// Its path in the archive.
    pub(crate) name: String,
    /// Where its bytes start in the archive.
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// What an archive is read from: a file, or bytes in memory (the fuzz checker's).
pub(crate) trait ReadAt {
    /// The archive's length in bytes.
    fn len_bytes(&self) -> std::io::Result<u64>;
    /// Fills `buf` from byte `offset`, or fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn len_bytes(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn len_bytes(&self) -> std::io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len() as u64)
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self[offset as usize..end as usize]);
        Ok(())
    }
}

/// What the extension headers before a member say of it.
#[derive(Default)]
struct Pending {
    name: Option<String>,
    size: Option<u64>,
}

/// Every regular file of the tar archive `file` (opened from `path`), handed to `visit` in
/// archive order as soon as its header is read, so that a small member can be read while the
/// bytes after its header are at hand (an object store's reader fetches a span from the
/// header on). Directories, links and other entries are not members.
///
/// # Errors
/// The archive cannot be read, a header is corrupt (bad checksum or number), or a member's
/// bytes run past the end of the file (a truncated archive); the error names the archive,
/// the offset and the member. And `visit`'s.
pub(crate) fn walk(
    file: &(impl ReadAt + ?Sized),
    path: &Path,
    mut visit: impl FnMut(Member) -> Result<(), Error>,
) -> Result<(), Error> {
    let len = file.len_bytes().map_err(|e| Error::dataset(path, e))?;
    let bad = |at: u64, what: String| Error::dataset(path, format!("at offset {at}: {what}"));
    let mut pending = Pending::default();
    let mut at = 0u64;
    let mut header = [0u8; BLOCK as usize];
    loop {
        if at.checked_add(BLOCK).is_none_or(|end| end > len) {
            if at == len && pending.name.is_none() && pending.size.is_none() {
                // No end-of-archive blocks: tolerated, as tar tools do.
                return Ok(());
            }
            return Err(bad(
                at,
                "truncated: the archive ends inside a header".into(),
            ));
        }
        file.read_exact_at(&mut header, at)
            .map_err(|e| Error::dataset(path, e))?;
        if header.iter().all(|&b| b == 0) {
            return Ok(());
        }
        check_sum(&header).map_err(|what| bad(at, what.into()))?;
        let name = header_name(&header);
        let size = number(&header[124..136])
            .ok_or_else(|| bad(at, format!("{name}: an unreadable size")))?;
        let data = at + BLOCK;
        let kind = header[156];
        let size = match kind {
            b'0' | b'\0' | b'7' => pending.size.take().unwrap_or(size),
            _ => size,
        };
        // Checked: a size near 2^64 must not wrap around to an offset inside the file.
        if data.checked_add(size).is_none_or(|end| end > len) {
            let name = pending.name.as_deref().unwrap_or(&name);
            return Err(bad(
                at,
                format!(
                    "truncated: member {name} needs {size} bytes from offset {data}, the archive \
                     has {}",
                    len - data.min(len)
                ),
            ));
        }
        match kind {
            b'0' | b'\0' | b'7' => visit(Member {
                name: pending.name.take().unwrap_or(name),
                offset: data,
                size,
            })?,
            b'x' | b'L' => {
                if size > EXTENSION_MAX_BYTES {
                    return Err(bad(at, format!("an extension header of {size} bytes")));
                }
                let mut body = vec![0u8; size as usize];
                file.read_exact_at(&mut body, data)
                    .map_err(|e| Error::dataset(path, e))?;
                if kind == b'L' {
                    pending.name = Some(text(&body));
                } else {
                    pax(&body, &mut pending).map_err(|what| bad(at, what))?;
                }
            }
            // Directories, links, devices, global pax headers: not members, and they end
            // what an extension header said.
            _ => pending = Pending::default(),
        }
        // The member's end is within the file (checked above), so its padded end cannot
        // overflow; and it is past this header, so indexing always moves forward.
        let next = data + size.next_multiple_of(BLOCK);
        debug_assert!(next > at, "indexing moves forward");
        at = next;
    }
}

/// Whether a header's stored checksum is the sum of its bytes (the checksum field counted
/// as spaces), else what is wrong.
fn check_sum(header: &[u8; BLOCK as usize]) -> Result<(), &'static str> {
    let stored = octal(&header[148..156]).ok_or("a header with an unreadable checksum")?;
    let computed: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    if stored != computed {
        return Err("a corrupt header (checksum mismatch)");
    }
    Ok(())
}

/// A header's member name, with its path prefix where the header is POSIX ustar (GNU's
/// header uses those bytes for other things).
fn header_name(header: &[u8; BLOCK as usize]) -> String {
    let name = text(&header[0..100]);
    let prefix = if &header[257..263] == b"ustar\0" {
        text(&header[345..500])
    } else {
        String::new()
    };
    match prefix.is_empty() {
        true => name,
        false => format!("{prefix}/{name}"),
    }
}

/// A NUL-terminated field as text.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// An octal field (spaces and NULs around it allowed).
fn octal(field: &[u8]) -> Option<u64> {
    let digits: &[u8] = {
        let s = field
            .iter()
            .position(|&b| b != b' ' && b != 0)
            .unwrap_or(field.len());
        let rest = &field[s..];
        let e = rest
            .iter()
            .position(|&b| b == b' ' || b == 0)
            .unwrap_or(rest.len());
        &rest[..e]
    };
    if digits.is_empty() {
        return Some(0);
    }
    digits.iter().try_fold(0u64, |n, &d| match d {
        b'0'..=b'7' => n.checked_mul(8)?.checked_add(u64::from(d - b'0')),
        _ => None,
    })
}

/// A numeric field: octal, or GNU's base-256 (high bit of the first byte set) for large
/// values.
fn number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut n = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            n = n.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(n);
    }
    octal(field)
}

/// The records of a pax extended header ("<len> <key>=<value>\n"): the path and size it
/// sets for the next member.
fn pax(body: &[u8], pending: &mut Pending) -> Result<(), String> {
    let mut rest = body;
    while !rest.is_empty() && rest[0] != 0 {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a pax record without a length")?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l > space + 1 && l <= rest.len())
            .ok_or("a pax record with a bad length")?;
        let record = &rest[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a pax record without '='")?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pending.name = Some(String::from_utf8_lossy(value).into_owned()),
            b"size" => {
                pending.size = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or("a pax size that is not a number")?,
                )
            }
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(())
}

/// [`walk`]'s members, collected.
#[cfg(any(test, fuzzing))]
pub(crate) fn members(file: &(impl ReadAt + ?Sized), path: &Path) -> Result<Vec<Member>, Error> {
    let mut members = Vec::new();
    walk(file, path, |m| {
        members.push(m);
        Ok(())
    })?;
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_and_base_256_numbers() {
        assert_eq!(octal(b"0000644\0"), Some(0o644));
        assert_eq!(octal(b"  17 \0"), Some(15));
        assert_eq!(octal(b"\0\0\0"), Some(0));
        assert_eq!(octal(b"0009"), None);
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[7] = 1;
        assert_eq!(number(&big), Some(1 << 32));
    }

    /// A ustar header for `name` whose size field holds `size` in base-256 (any u64).
    fn header(name: &str, size: u64) -> [u8; BLOCK as usize] {
        let mut h = [0u8; BLOCK as usize];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].fill(b' ');
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    #[test]
    fn a_member_size_near_2_pow_64_is_refused_not_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostile.tar");
        for size in [u64::MAX, u64::MAX - 511, u64::MAX - (1 << 20)] {
            let mut bytes = header("a.jpg", size).to_vec();
            bytes.extend_from_slice(&[0u8; 2 * BLOCK as usize]);
            std::fs::write(&path, &bytes).unwrap();
            let file = File::open(&path).unwrap();
            let e = members(&file, &path).unwrap_err().to_string();
            assert!(
                e.contains("hostile.tar") && e.contains("truncated") && e.contains("a.jpg"),
                "{e}"
            );
        }
        // A sane member after the same header shape is indexed.
        let mut bytes = header("b.jpg", 3).to_vec();
        bytes.extend_from_slice(&[7u8; BLOCK as usize]);
        bytes.extend_from_slice(&[0u8; 2 * BLOCK as usize]);
        std::fs::write(&path, &bytes).unwrap();
        let m = members(&File::open(&path).unwrap(), &path).unwrap();
        assert_eq!((m.len(), m[0].offset, m[0].size), (1, BLOCK, 3));
    }

    #[test]
    fn pax_records_set_the_path_and_size() {
        let mut p = Pending::default();
        let body = b"29 path=a/very/long/name.jpg\n12 size=999\n18 mtime=1.000000\n";
        pax(body, &mut p).unwrap();
        assert_eq!(p.name.as_deref(), Some("a/very/long/name.jpg"));
        assert_eq!(p.size, Some(999));
        assert!(pax(b"99 path=x\n", &mut Pending::default()).is_err());
    }
}
