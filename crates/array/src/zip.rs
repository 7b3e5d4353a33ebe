//! The parts of a zip archive an `.npz` needs: the end records (zip64 too), the central
//! directory, and each stored member's local header, data and CRC. Where a member's data
//! starts is decided by its own local header (its name and extra field lengths), where it ends
//! by the central directory's size: numpy's `savez` writes zip64 local headers whose 32-bit
//! sizes are 0xFFFFFFFF, with the sizes in their extra field, and central entries without one.

use std::ops::Range;

use crate::error::ArrayError;

/// The bound on an archive's members: the most a zip without zip64 counts (its count field
/// is 16 bits), so only a zip64 count can pass it. Every member costs its 46-byte directory
/// entry too, so the members parsed never outnumber the input's bytes / 46.
pub const MEMBERS_MAX: u64 = 65_535;

/// The bound on a member's name: far longer than any key a program gives `np.savez`
/// (the format allows 65535).
pub const MEMBER_NAME_BYTES_MAX: usize = 1024;

/// An end-of-central-directory record's comment is at most this long (its length field is 16
/// bits), so the record is searched for in the input's last 22 + 65535 bytes only.
const COMMENT_BYTES_MAX: usize = 65_535;

const END_SIGNATURE: u32 = 0x0605_4b50;
const END_BYTES: usize = 22;
const LOCATOR_SIGNATURE: u32 = 0x0706_4b50;
const LOCATOR_BYTES: usize = 20;
const END64_SIGNATURE: u32 = 0x0606_4b50;
const END64_BYTES: usize = 56;
const CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const CENTRAL_BYTES: usize = 46;
const LOCAL_SIGNATURE: u32 = 0x0403_4b50;
const LOCAL_BYTES: usize = 30;
const ZIP64_EXTRA_ID: u16 = 0x0001;
const FLAG_ENCRYPTED: u16 = 1;
const METHOD_STORED: u16 = 0;

/// A member as the central directory gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    /// Where its central directory entry starts.
    pub(crate) offset: u64,
    flags: u16,
    method: u16,
    crc: u32,
    compressed_bytes: u64,
    size_bytes: u64,
    local_offset: u64,
}

/// The central directory: its entries in archive order, and where it starts (the members'
/// bytes lie before).
#[derive(Debug)]
pub(crate) struct Directory {
    pub(crate) entries: Vec<Entry>,
    pub(crate) start: usize,
}

/// Where a stored member lies: `span` from its local header to its data's end, and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) span: Range<usize>,
    pub(crate) data: Range<usize>,
}

/// The `N` bytes of a fixed-size record at `at`, if the input holds them.
fn record<const N: usize>(bytes: &[u8], at: usize) -> Option<&[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

// Readers of fields at offsets fixed by the format, inside records of fixed size.
fn u16_at<const N: usize>(r: &[u8; N], off: usize) -> u16 {
    u16::from_le_bytes([r[off], r[off + 1]])
}

fn u32_at<const N: usize>(r: &[u8; N], off: usize) -> u32 {
    u32::from_le_bytes([r[off], r[off + 1], r[off + 2], r[off + 3]])
}

fn u64_at<const N: usize>(r: &[u8; N], off: usize) -> u64 {
    u64::from(u32_at(r, off)) | u64::from(u32_at(r, off + 4)) << 32
}

fn zip_error(offset: usize, reason: impl Into<String>) -> ArrayError {
    ArrayError::Zip {
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Reads the end records and the central directory.
pub(crate) fn directory(bytes: &[u8]) -> Result<Directory, ArrayError> {
    let (end_at, end) = end_record(bytes)?;
    // The directory must end before the end records do.
    let mut records_start = end_at;
    let locator_at = end_at.checked_sub(LOCATOR_BYTES);
    let locator = locator_at.and_then(|at| record::<LOCATOR_BYTES>(bytes, at));
    let (count, size, offset) = match (locator_at, locator) {
        (Some(locator_at), Some(locator)) if u32_at(locator, 0) == LOCATOR_SIGNATURE => {
            if u32_at(locator, 4) != 0 || u32_at(locator, 16) > 1 {
                return Err(zip_error(locator_at, "an archive of several disks"));
            }
            let before_locator = bytes.get(..locator_at).unwrap_or_default();
            let end64 = usize::try_from(u64_at(locator, 8))
                .ok()
                .and_then(|at| Some((at, record::<END64_BYTES>(before_locator, at)?)));
            let Some((end64_at, end64)) = end64 else {
                return Err(zip_error(
                    locator_at,
                    "the zip64 end record is not before its locator",
                ));
            };
            if u32_at(end64, 0) != END64_SIGNATURE {
                return Err(zip_error(end64_at, "no zip64 end record signature"));
            }
            let record_bytes = u64_at(end64, 4);
            let record_end = (end64_at as u64).checked_add(12).and_then(|e| {
                e.checked_add(record_bytes)
                    .filter(|&e| record_bytes >= 44 && e <= locator_at as u64)
            });
            if record_end.is_none() {
                return Err(zip_error(end64_at, "a zip64 end record of a wrong size"));
            }
            if u32_at(end64, 16) != 0
                || u32_at(end64, 20) != 0
                || u64_at(end64, 24) != u64_at(end64, 32)
            {
                return Err(zip_error(end64_at, "an archive of several disks"));
            }
            records_start = end64_at;
            (u64_at(end64, 32), u64_at(end64, 40), u64_at(end64, 48))
        }
        _ => {
            if u16_at(end, 4) != 0 || u16_at(end, 6) != 0 || u16_at(end, 8) != u16_at(end, 10) {
                return Err(zip_error(end_at, "an archive of several disks"));
            }
            (
                u64::from(u16_at(end, 10)),
                u64::from(u32_at(end, 12)),
                u64::from(u32_at(end, 16)),
            )
        }
    };
    if count > MEMBERS_MAX {
        return Err(ArrayError::TooManyMembers {
            members: count,
            members_max: MEMBERS_MAX,
        });
    }
    let range = usize::try_from(offset)
        .ok()
        .and_then(|start| Some(start..start.checked_add(usize::try_from(size).ok()?)?))
        .filter(|r| r.end <= records_start)
        .ok_or_else(|| {
            let reason = format!(
                "a central directory of {size} bytes at {offset} runs past the end records at \
                 {records_start}"
            );
            zip_error(end_at, reason)
        })?;
    // Each entry is at least its fixed part: a count the size cannot hold is refused before
    // anything of its size is reserved.
    if count.saturating_mul(CENTRAL_BYTES as u64) > size {
        let reason = format!("{count} entries cannot fit a central directory of {size} bytes");
        return Err(zip_error(end_at, reason));
    }
    // Entries are read from the directory's bytes alone.
    let central = &bytes[..range.end];
    let mut entries = Vec::with_capacity(count as usize);
    let mut at = range.start;
    for _ in 0..count {
        let (entry, next) = central_entry(central, at)?;
        entries.push(entry);
        at = next;
    }
    if at != range.end {
        let reason = format!(
            "the central directory holds more than its {count} entries ({} bytes left)",
            range.end - at
        );
        return Err(zip_error(at, reason));
    }
    Ok(Directory {
        entries,
        start: range.start,
    })
}

/// Where the end-of-central-directory record starts: the last signature whose comment
/// length reaches exactly the end of the input (a comment may hold the signature itself).
fn end_record(bytes: &[u8]) -> Result<(usize, &[u8; END_BYTES]), ArrayError> {
    let not_zip = || ArrayError::NoEndRecord {
        file_bytes: bytes.len() as u64,
    };
    let last = bytes.len().checked_sub(END_BYTES).ok_or_else(not_zip)?;
    let lowest = last.saturating_sub(COMMENT_BYTES_MAX);
    (lowest..=last)
        .rev()
        .find_map(|at| {
            let end = record::<END_BYTES>(bytes, at)?;
            let found =
                u32_at(end, 0) == END_SIGNATURE && usize::from(u16_at(end, 20)) == last - at;
            found.then_some((at, end))
        })
        .ok_or_else(not_zip)
}

/// The entry at `at` in `central` (the input up to the directory's end), and where the next
/// one starts.
fn central_entry(central: &[u8], at: usize) -> Result<(Entry, usize), ArrayError> {
    let r = record::<CENTRAL_BYTES>(central, at)
        .ok_or_else(|| zip_error(at, "a central directory entry runs past the directory"))?;
    if u32_at(r, 0) != CENTRAL_SIGNATURE {
        return Err(zip_error(at, "no central directory entry signature"));
    }
    let name_bytes = usize::from(u16_at(r, 28));
    if name_bytes > MEMBER_NAME_BYTES_MAX {
        return Err(ArrayError::NameTooLong {
            offset: at as u64,
            name_bytes: name_bytes as u64,
            name_bytes_max: MEMBER_NAME_BYTES_MAX as u64,
        });
    }
    // At most 46 + 3 * 65535 past `at`, an index into the input: no overflow.
    let name_at = at + CENTRAL_BYTES;
    let extra_at = name_at + name_bytes;
    let comment_at = extra_at + usize::from(u16_at(r, 30));
    let next = comment_at + usize::from(u16_at(r, 32));
    let (Some(name), Some(extra)) = (
        central.get(name_at..extra_at),
        central.get(extra_at..comment_at),
    ) else {
        return Err(zip_error(
            at,
            "a central directory entry runs past the directory",
        ));
    };
    if next > central.len() {
        return Err(zip_error(
            at,
            "a central directory entry runs past the directory",
        ));
    }
    // Names are UTF-8 with flag bit 11, CP437 without; numpy's keys are ASCII either way.
    let name = std::str::from_utf8(name)
        .map_err(|_| zip_error(at, "a member name that is not UTF-8"))?
        .to_string();
    let bad = |reason: &str| ArrayError::BadMember {
        name: name.clone(),
        offset: at as u64,
        reason: reason.to_string(),
    };
    // The zip64 extra field holds, in this order, the fields whose 32-bit value is all ones.
    let mut zip64 = zip64_extra(extra).map_err(&bad)?;
    let mut wide = |value: u32, what: &str| -> Result<u64, ArrayError> {
        if value != u32::MAX {
            return Ok(u64::from(value));
        }
        let field = zip64.and_then(|z| z.first_chunk::<8>());
        let Some(field) = field else {
            return Err(bad(&format!("no zip64 extra field for its {what}")));
        };
        zip64 = zip64.and_then(|z| z.get(8..));
        Ok(u64::from_le_bytes(*field))
    };
    let size_bytes = wide(u32_at(r, 24), "size")?;
    let compressed_bytes = wide(u32_at(r, 20), "compressed size")?;
    let local_offset = wide(u32_at(r, 42), "local header offset")?;
    let disk = match u16_at(r, 34) {
        u16::MAX => zip64
            .and_then(|z| z.first_chunk::<4>())
            .map(|d| u32::from_le_bytes(*d))
            .ok_or_else(|| bad("no zip64 extra field for its disk"))?,
        disk => u32::from(disk),
    };
    if disk != 0 {
        return Err(bad("a member on another disk"));
    }
    let entry = Entry {
        name,
        offset: at as u64,
        flags: u16_at(r, 8),
        method: u16_at(r, 10),
        crc: u32_at(r, 16),
        compressed_bytes,
        size_bytes,
        local_offset,
    };
    Ok((entry, next))
}

/// The body of the zip64 extra field (id 1) among the extra fields, if there is one.
fn zip64_extra(extra: &[u8]) -> Result<Option<&[u8]>, &'static str> {
    let mut rest = extra;
    // As Python's zipfile: fewer than 4 bytes left are padding.
    while let Some((head, after)) = rest.split_first_chunk::<4>() {
        let id = u16::from_le_bytes([head[0], head[1]]);
        let body_bytes = usize::from(u16::from_le_bytes([head[2], head[3]]));
        let Some((body, after)) = after.split_at_checked(body_bytes) else {
            return Err("an extra field runs past the extra fields");
        };
        if id == ZIP64_EXTRA_ID {
            return Ok(Some(body));
        }
        rest = after;
    }
    Ok(None)
}

/// Where a member's bytes lie, checked: stored (not compressed or encrypted), with a local
/// header of the same name and method, its data before the central directory (at
/// `members_end`) and of the CRC-32 the directory gives.
pub(crate) fn stored(
    bytes: &[u8],
    entry: &Entry,
    members_end: usize,
) -> Result<Stored, ArrayError> {
    let name = &entry.name;
    if entry.flags & FLAG_ENCRYPTED != 0 {
        return Err(ArrayError::Encrypted { name: name.clone() });
    }
    if entry.method != METHOD_STORED {
        return Err(ArrayError::Compressed {
            name: name.clone(),
            method: entry.method,
        });
    }
    let bad = |offset: u64, reason: String| ArrayError::BadMember {
        name: name.clone(),
        offset,
        reason,
    };
    if entry.compressed_bytes != entry.size_bytes {
        let reason = format!(
            "stored, yet of {} bytes compressed and {} not",
            entry.compressed_bytes, entry.size_bytes
        );
        return Err(bad(entry.offset, reason));
    }
    let members = bytes.get(..members_end).unwrap_or_default();
    let local = usize::try_from(entry.local_offset)
        .ok()
        .and_then(|at| Some((at, record::<LOCAL_BYTES>(members, at)?)));
    let Some((at, r)) = local else {
        let reason = format!(
            "its local header at {} is not before the central directory at {members_end}",
            entry.local_offset
        );
        return Err(bad(entry.offset, reason));
    };
    if u32_at(r, 0) != LOCAL_SIGNATURE {
        return Err(bad(at as u64, "no local header signature".into()));
    }
    if u16_at(r, 8) != entry.method {
        let reason = format!("its local header gives method {}", u16_at(r, 8));
        return Err(bad(at as u64, reason));
    }
    // At most 30 + 2 * 65535 past `at`, an index into the input: no overflow.
    let name_at = at + LOCAL_BYTES;
    let name_end = name_at + usize::from(u16_at(r, 26));
    let data_start = name_end + usize::from(u16_at(r, 28));
    match members.get(name_at..name_end) {
        Some(local_name) if local_name == name.as_bytes() => {}
        Some(local_name) => {
            let reason = format!(
                "its local header names {:?}",
                String::from_utf8_lossy(local_name)
            );
            return Err(bad(at as u64, reason));
        }
        None => {
            return Err(bad(
                at as u64,
                "its local header runs past the members".into(),
            ))
        }
    }
    let data = usize::try_from(entry.size_bytes)
        .ok()
        .and_then(|size| Some(data_start..data_start.checked_add(size)?))
        .filter(|data| data.end <= members.len())
        .ok_or_else(|| {
            let reason = format!(
                "its {} bytes of data at {data_start} run past the central directory at \
                 {members_end}",
                entry.size_bytes
            );
            bad(at as u64, reason)
        })?;
    let actual = crc32fast::hash(&members[data.clone()]);
    if actual != entry.crc {
        return Err(ArrayError::Crc {
            name: name.clone(),
            expected: entry.crc,
            actual,
        });
    }
    Ok(Stored {
        span: at..data.end,
        data,
    })
}

/// Refuses members whose spans overlap, naming two of them; `spans` holds each member's
/// span and its index in `entries`.
pub(crate) fn disjoint(
    spans: &mut [(Range<usize>, usize)],
    entries: &[Entry],
) -> Result<(), ArrayError> {
    spans.sort_by_key(|(span, _)| (span.start, span.end));
    for pair in spans.windows(2) {
        if let [(first, i), (second, j)] = pair {
            if first.end > second.start {
                let name = |k: usize| entries.get(k).map(|e| e.name.clone()).unwrap_or_default();
                return Err(ArrayError::Overlap {
                    name: name(*i),
                    other: name(*j),
                });
            }
        }
    }
    Ok(())
}
