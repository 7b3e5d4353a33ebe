//! [`DiskTier`]: the segment files, their extents' owners, and the index.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::alloc::{extent_bytes, FreeList, BLOCK_BYTES};
use crate::error::{Damage, TierError};
use crate::index::{self, Geometry, IndexEntry, IndexError};
use crate::io;

/// Segment files per tier: the capacity is cut in this many (the last maybe shorter).
pub const SEGMENTS_MAX: u64 = 4;

const INDEX: &str = "index";
const INDEX_TMP: &str = "index.tmp";

/// How to open a tier.
#[derive(Clone, Copy, Debug)]
pub struct TierOptions {
    /// Use O_DIRECT where the file system takes it (probed at open). Off: buffered I/O
    /// always (what a file system without O_DIRECT gets anyway).
    pub allow_direct: bool,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions { allow_direct: true }
    }
}

/// What [`DiskTier::open`] made of the index it found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexStatus {
    /// No index: the tier starts empty.
    Missing,
    /// Trusted: `kept` entries loaded, `dropped` ones left out because their segment file
    /// ends before them.
    Loaded { kept: u64, dropped: u64 },
    /// Not trusted (damaged, cut short, too long, or of another dataset or capacity): the
    /// tier starts empty and reuses the files as free space.
    Ignored { reason: IndexError },
    /// Not readable (not a regular file, or a read failed): as `Ignored`.
    Unreadable { reason: String },
}

/// Counters of a tier since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Entries readable now.
    pub entries: u64,
    /// Extent bytes held (entries, and extents being written or read after their removal).
    pub used_bytes: u64,
    /// Entries written, and the bytes of their samples.
    pub writes: u64,
    pub write_bytes: u64,
    /// Reads that returned checked bytes, and their bytes.
    pub reads: u64,
    pub read_bytes: u64,
    /// Reads that found the bytes damaged or short (their entries dropped).
    pub damaged: u64,
    /// Reads or writes failed by the system (their entries dropped).
    pub io_errors: u64,
    /// Writes refused for want of a free extent.
    pub full: u64,
    /// Entries removed by [`DiskTier::remove`].
    pub removes: u64,
    /// Indexes written by [`DiskTier::persist`].
    pub persists: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    addr: u64,
    len: u32,
    crc: u32,
    /// Tells this entry from a later one of the same sample.
    generation: u64,
    /// Reads in flight.
    readers: u32,
    /// Written: readable. Until then its one holder is the writer.
    ready: bool,
}

/// An extent whose entry was removed while reads or its write were in flight: freed when
/// the last of them ends, so no extent is reused under an I/O.
#[derive(Debug)]
struct Retiring {
    addr: u64,
    extent_bytes: u64,
    holders: u32,
}

#[derive(Debug)]
struct State {
    entries: HashMap<u32, Entry>,
    retiring: HashMap<u64, Retiring>,
    free: FreeList,
    used_bytes: u64,
    next_generation: u64,
    stats: TierStats,
}

impl State {
    fn free_extent(&mut self, addr: u64, extent_bytes: u64) {
        self.free.free(addr, extent_bytes);
        self.used_bytes -= extent_bytes;
    }

    /// Drops `sample`'s entry: its extent is freed now, or when its I/O in flight ends.
    fn drop_entry(&mut self, sample: u32) -> bool {
        let Some(e) = self.entries.remove(&sample) else {
            return false;
        };
        let extent = extent_bytes(e.len);
        let holders = e.readers + u32::from(!e.ready);
        if holders == 0 {
            self.free_extent(e.addr, extent);
        } else {
            self.retiring.insert(
                e.generation,
                Retiring {
                    addr: e.addr,
                    extent_bytes: extent,
                    holders,
                },
            );
        }
        true
    }

    /// Takes the first free extent that holds `len` bytes for `sample`'s entry, not readable
    /// until [`end_write`](State::end_write).
    fn begin_write(
        &mut self,
        sample: u32,
        len: u32,
        capacity_bytes: u64,
    ) -> Result<(u64, u64), TierError> {
        if self.entries.contains_key(&sample) {
            return Err(TierError::Exists { sample });
        }
        let extent = extent_bytes(len);
        let Some(addr) = self.free.alloc(extent) else {
            self.stats.full += 1;
            return Err(TierError::Full {
                sample,
                extent_bytes: extent,
                free_bytes: self.free.free_bytes(),
                capacity_bytes,
            });
        };
        self.used_bytes += extent;
        assert!(
            self.used_bytes <= capacity_bytes,
            "disk tier holds {} bytes, over its capacity of {capacity_bytes}",
            self.used_bytes
        );
        let generation = self.next_generation;
        self.next_generation += 1;
        self.entries.insert(
            sample,
            Entry {
                addr,
                len,
                crc: 0,
                generation,
                readers: 0,
                ready: false,
            },
        );
        Ok((addr, generation))
    }

    /// The write of `begin_write`'s `generation` has ended, its bytes' CRC if it succeeded.
    fn end_write(&mut self, sample: u32, generation: u64, crc: Option<u32>) {
        match self.entries.get_mut(&sample) {
            Some(e) if e.generation == generation => match crc {
                Some(crc) => {
                    e.ready = true;
                    e.crc = crc;
                    let len = e.len;
                    self.stats.writes += 1;
                    self.stats.write_bytes += u64::from(len);
                }
                None => {
                    // Its writer was its one holder: no read can have begun.
                    let e = self.entries.remove(&sample).expect("just found");
                    self.free_extent(e.addr, extent_bytes(e.len));
                    self.stats.io_errors += 1;
                }
            },
            // Removed while written.
            _ => {
                self.release_retiring(generation);
                if crc.is_none() {
                    self.stats.io_errors += 1;
                }
            }
        }
    }

    /// `sample`'s entry, held against reuse until [`end_read`](State::end_read).
    fn begin_read(&mut self, sample: u32) -> Result<Entry, TierError> {
        match self.entries.get_mut(&sample) {
            None => Err(TierError::Missing { sample }),
            Some(e) if !e.ready => Err(TierError::Pending { sample }),
            Some(e) => {
                e.readers += 1;
                Ok(*e)
            }
        }
    }

    /// The read of `e` has ended with `result`; a failed one drops the entry.
    fn end_read(&mut self, sample: u32, e: &Entry, result: &Result<Bytes, TierError>) {
        match self.entries.get_mut(&sample) {
            Some(cur) if cur.generation == e.generation => {
                cur.readers -= 1;
                if result.is_err() {
                    self.drop_entry(sample);
                }
            }
            // Removed while read.
            _ => self.release_retiring(e.generation),
        }
        match result {
            Ok(b) => {
                self.stats.reads += 1;
                self.stats.read_bytes += b.len() as u64;
            }
            Err(TierError::Damaged { .. }) => self.stats.damaged += 1,
            Err(_) => self.stats.io_errors += 1,
        }
    }

    /// One I/O on the removed entry of `generation` has ended.
    fn release_retiring(&mut self, generation: u64) {
        let r = self
            .retiring
            .get_mut(&generation)
            .expect("an I/O in flight holds its retiring extent");
        r.holders -= 1;
        if r.holders == 0 {
            let r = self.retiring.remove(&generation).expect("just found");
            self.free_extent(r.addr, r.extent_bytes);
        }
    }
}

#[derive(Debug)]
struct Segment {
    path: PathBuf,
    file: File,
}

/// The files of a local disk cache below the memory cache, for one dataset.
///
/// `DIR/<fingerprint as 16 hex digits>/` holds up to [`SEGMENTS_MAX`] segment files
/// `seg-<i>` (the capacity, rounded down to 4 KiB, cut in four, each rounded up to 4 KiB),
/// the index `index`, and a lock (an flock on the directory) while a tier is open. Each entry
/// is one extent of whole 4 KiB blocks in one segment, taken first fit; the extents held
/// never exceed the capacity (asserted). Every read checks its CRC32.
///
/// All methods take `&self` from any thread: a mutex guards the entries and the free list,
/// never held across a read, a write or a sync. An extent is not reused while an I/O on it
/// is in flight, even if its entry is removed meanwhile.
#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    sizes: Arc<[u32]>,
    geometry: Geometry,
    segments: Vec<Segment>,
    direct: bool,
    index_status: IndexStatus,
    state: Mutex<State>,
    /// One index written at a time (its temporary file's name is fixed).
    persisting: Mutex<()>,
    /// Holds the directory's flock while the tier is open.
    _lock: File,
}

impl DiskTier {
    /// Opens (creating) `dir/<fingerprint as 16 hex digits>/` for a dataset whose samples
    /// are sized by `sizes`, bounded by `capacity_bytes` of extents (rounded down to 4 KiB),
    /// with O_DIRECT where the file system takes it, and loads the entries a previous run
    /// left there when its index is sealed, of this fingerprint, capacity and size table,
    /// and every entry lies inside its file; an index that is not is ignored and the files
    /// reused as free space.
    ///
    /// # Errors
    /// [`TierError::Capacity`] under 4 KiB; [`TierError::Busy`] if another open tier holds
    /// the directory; [`TierError::Io`] if the directory or a segment cannot be made or
    /// opened.
    pub fn open(
        dir: &Path,
        fingerprint: u64,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
    ) -> Result<DiskTier, TierError> {
        Self::open_with(
            dir,
            fingerprint,
            sizes,
            capacity_bytes,
            TierOptions::default(),
        )
    }

    /// [`open`](DiskTier::open) with `options`.
    ///
    /// # Errors
    /// As [`open`](DiskTier::open).
    pub fn open_with(
        dir: &Path,
        fingerprint: u64,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        options: TierOptions,
    ) -> Result<DiskTier, TierError> {
        let total_bytes = capacity_bytes / BLOCK_BYTES * BLOCK_BYTES;
        if total_bytes == 0 {
            return Err(TierError::Capacity { capacity_bytes });
        }
        let segment_bytes = total_bytes
            .div_ceil(SEGMENTS_MAX)
            .next_multiple_of(BLOCK_BYTES);
        let geometry = Geometry {
            fingerprint,
            capacity_bytes: total_bytes,
            segment_bytes,
            num_samples: sizes.len() as u64,
        };
        let dir = dir.join(format!("{fingerprint:016x}"));
        let io_err = |path: &Path, op, source| TierError::Io {
            path: path.to_path_buf(),
            op,
            sample: None,
            source,
        };
        fs::create_dir_all(&dir).map_err(|e| io_err(&dir, "create", e))?;
        let lock = io::lock_dir(&dir)
            .map_err(|e| io_err(&dir, "lock", e))?
            .ok_or_else(|| TierError::Busy { dir: dir.clone() })?;
        // Left by a run that stopped while writing its index.
        let _ = fs::remove_file(dir.join(INDEX_TMP));
        let direct = options.allow_direct && io::probe_direct(&dir);

        let count = total_bytes.div_ceil(segment_bytes);
        let mut segments = Vec::with_capacity(count as usize);
        let mut file_bytes = Vec::with_capacity(count as usize);
        for i in 0..SEGMENTS_MAX {
            let path = dir.join(format!("seg-{i}"));
            if i >= count {
                // A larger capacity's segment: its bytes are beyond this one's bound.
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io_err(&path, "remove", e))
                    }
                    _ => continue,
                }
            }
            let len = segment_bytes.min(total_bytes - i * segment_bytes);
            let file = io::open_segment(&path, direct).map_err(|e| io_err(&path, "open", e))?;
            let mut have = file.metadata().map_err(|e| io_err(&path, "stat", e))?.len();
            if have > len {
                file.set_len(len)
                    .map_err(|e| io_err(&path, "truncate", e))?;
                have = len;
            }
            file_bytes.push(have);
            segments.push(Segment { path, file });
        }

        let mut free = FreeList::new(total_bytes, segment_bytes);
        let mut entries = HashMap::new();
        let mut used_bytes = 0;
        // Past every loaded entry's generation, dropped ones' too.
        let mut next_generation = 0;
        let index_status = match read_index(&dir.join(INDEX), &geometry) {
            Ok(None) => IndexStatus::Missing,
            Ok(Some(bytes)) => match index::parse(&bytes, &geometry, &sizes) {
                Ok(found) => {
                    next_generation = found.len() as u64;
                    let mut dropped = 0;
                    for (generation, e) in found.into_iter().enumerate() {
                        let extent = extent_bytes(e.len);
                        let (seg, offset) = locate(&geometry, e.addr);
                        if offset + u64::from(e.len) > file_bytes[seg] {
                            dropped += 1;
                            continue;
                        }
                        assert!(free.reserve(e.addr, extent), "parsed entries are disjoint");
                        used_bytes += extent;
                        entries.insert(
                            e.sample,
                            Entry {
                                addr: e.addr,
                                len: e.len,
                                crc: e.crc,
                                generation: generation as u64,
                                readers: 0,
                                ready: true,
                            },
                        );
                    }
                    IndexStatus::Loaded {
                        kept: entries.len() as u64,
                        dropped,
                    }
                }
                Err(reason) => IndexStatus::Ignored { reason },
            },
            Err(reason) => reason,
        };
        assert!(used_bytes <= total_bytes);
        Ok(DiskTier {
            dir,
            sizes,
            geometry,
            segments,
            direct,
            index_status,
            state: Mutex::new(State {
                entries,
                retiring: HashMap::new(),
                free,
                used_bytes,
                next_generation,
                stats: TierStats::default(),
            }),
            persisting: Mutex::new(()),
            _lock: lock,
        })
    }

    /// The tier's own directory, `DIR/<fingerprint>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What open made of the index it found.
    pub fn index_status(&self) -> &IndexStatus {
        &self.index_status
    }

    /// Sample ids with a readable entry now, ascending (the plan's seeds on open).
    pub fn entries(&self) -> Vec<u32> {
        let st = self.lock();
        let mut out: Vec<u32> = st
            .entries
            .iter()
            .filter(|(_, e)| e.ready)
            .map(|(&s, _)| s)
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether `sample` has a readable entry (written, not removed).
    pub fn contains(&self, sample: u32) -> bool {
        self.lock().entries.get(&sample).is_some_and(|e| e.ready)
    }

    /// Writes `bytes` as `sample`'s entry, in the first free extent that holds it.
    ///
    /// # Errors
    /// [`TierError::SampleOutOfRange`], [`TierError::SizeMismatch`] (the bytes are not the
    /// size table's size), [`TierError::Exists`] (an entry, or one being written),
    /// [`TierError::Full`] (no free extent holds it: nothing written), [`TierError::Io`]
    /// (the write failed: no entry).
    pub fn write(&self, sample: u32, bytes: &[u8]) -> Result<(), TierError> {
        let len = self.check_size(sample, bytes.len())?;
        let extent = extent_bytes(len);
        let (addr, generation) =
            self.lock()
                .begin_write(sample, len, self.geometry.capacity_bytes)?;
        let crc = crc32fast::hash(bytes);
        let (seg, offset) = locate(&self.geometry, addr);
        let segment = &self.segments[seg];
        let written = io::write_extent(&segment.file, offset, bytes, extent as usize, self.direct);
        self.lock()
            .end_write(sample, generation, written.as_ref().ok().map(|()| crc));
        written.map_err(|source| TierError::Io {
            path: segment.path.clone(),
            op: "write",
            sample: Some(sample),
            source,
        })
    }

    /// Reads `sample`'s entry and checks its CRC32.
    ///
    /// # Errors
    /// [`TierError::Missing`], [`TierError::Pending`] (still being written);
    /// [`TierError::Damaged`] (short or not the bytes written) and [`TierError::Io`], after
    /// which the entry is dropped.
    pub fn read(&self, sample: u32) -> Result<Bytes, TierError> {
        let e = self.lock().begin_read(sample)?;
        let extent = extent_bytes(e.len);
        let (seg, offset) = locate(&self.geometry, e.addr);
        let segment = &self.segments[seg];
        let want = e.len as usize;
        let damaged = |damage| TierError::Damaged {
            sample,
            file: segment.path.clone(),
            offset,
            damage,
        };
        let result =
            match io::read_extent(&segment.file, offset, want, extent as usize, self.direct) {
                Ok(b) if b.len() < want => Err(damaged(Damage::Short {
                    got_bytes: b.len() as u64,
                    want_bytes: want as u64,
                })),
                Ok(b) => match crc32fast::hash(&b) {
                    found if found == e.crc => Ok(b),
                    found => Err(damaged(Damage::Checksum {
                        expected: e.crc,
                        found,
                    })),
                },
                Err(source) => Err(TierError::Io {
                    path: segment.path.clone(),
                    op: "read",
                    sample: Some(sample),
                    source,
                }),
            };
        self.lock().end_read(sample, &e, &result);
        result
    }

    /// Drops `sample`'s entry (readable or being written); false if it has none. Its extent
    /// is free once no I/O on it is in flight.
    pub fn remove(&self, sample: u32) -> bool {
        let mut st = self.lock();
        let removed = st.drop_entry(sample);
        if removed {
            st.stats.removes += 1;
        }
        removed
    }

    /// Extent bytes held: entries, and extents of removed entries whose I/O is in flight.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    /// The most extent bytes the tier holds: the capacity asked for, rounded down to 4 KiB.
    pub fn capacity_bytes(&self) -> u64 {
        self.geometry.capacity_bytes
    }

    /// Writes the index of the readable entries (segments synced first; the index written
    /// to a temporary file, synced, renamed over the old one, the directory synced), so a
    /// next run finds them. Called at epoch ends, and on drop (errors ignored there).
    ///
    /// # Errors
    /// [`TierError::Io`] naming the file a sync, write or rename failed on; the previous
    /// index is then left as it was.
    pub fn persist(&self) -> Result<(), TierError> {
        let _one = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        let entries: Vec<IndexEntry> = self
            .lock()
            .entries
            .iter()
            .filter(|(_, e)| e.ready)
            .map(|(&sample, e)| IndexEntry {
                sample,
                len: e.len,
                crc: e.crc,
                addr: e.addr,
            })
            .collect();
        let io_err = |path: &Path, op, source| TierError::Io {
            path: path.to_path_buf(),
            op,
            sample: None,
            source,
        };
        for s in &self.segments {
            s.file.sync_data().map_err(|e| io_err(&s.path, "sync", e))?;
        }
        let bytes = index::encode(&self.geometry, &entries);
        let tmp = self.dir.join(INDEX_TMP);
        let mut file = File::create(&tmp).map_err(|e| io_err(&tmp, "create", e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_err(&tmp, "write", e))?;
        let index = self.dir.join(INDEX);
        fs::rename(&tmp, &index).map_err(|e| io_err(&index, "rename", e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(&self.dir, "sync", e))?;
        self.lock().stats.persists += 1;
        Ok(())
    }

    /// Whether the segments are read and written with O_DIRECT (probed at open).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Counters since open.
    pub fn stats(&self) -> TierStats {
        let st = self.lock();
        TierStats {
            entries: st.entries.values().filter(|e| e.ready).count() as u64,
            used_bytes: st.used_bytes,
            ..st.stats
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated in whole steps: a panic elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_size(&self, sample: u32, len_bytes: usize) -> Result<u32, TierError> {
        let Some(&size_bytes) = self.sizes.get(sample as usize) else {
            return Err(TierError::SampleOutOfRange {
                sample,
                num_samples: self.sizes.len(),
            });
        };
        if len_bytes != size_bytes as usize {
            return Err(TierError::SizeMismatch {
                sample,
                len_bytes,
                size_bytes,
            });
        }
        Ok(size_bytes)
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Best effort: without it the next run finds the index of the last persist, whose
        // stale entries fail their CRC and are dropped.
        let _ = self.persist();
    }
}

/// The segment of `addr` and the offset in it.
fn locate(geometry: &Geometry, addr: u64) -> (usize, u64) {
    (
        (addr / geometry.segment_bytes) as usize,
        addr % geometry.segment_bytes,
    )
}

/// The index at `path`, at most the geometry's bound; `None` if there is none.
fn read_index(path: &Path, geometry: &Geometry) -> Result<Option<Vec<u8>>, IndexStatus> {
    let unreadable = |e: &dyn std::fmt::Display| IndexStatus::Unreadable {
        reason: e.to_string(),
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(&e)),
    };
    if !meta.is_file() {
        return Err(unreadable(&"not a regular file"));
    }
    let max_bytes = geometry.index_bytes_max();
    if meta.len() > max_bytes {
        return Err(IndexStatus::Ignored {
            reason: IndexError::TooLarge {
                len_bytes: meta.len(),
                max_bytes,
            },
        });
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(max_bytes + 1).read_to_end(&mut bytes))
        .map_err(|e| unreadable(&e))?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK_BYTES;

    fn state(total_bytes: u64) -> State {
        State {
            entries: HashMap::new(),
            retiring: HashMap::new(),
            free: FreeList::new(total_bytes, total_bytes),
            used_bytes: 0,
            next_generation: 0,
            stats: TierStats::default(),
        }
    }

    fn written(st: &mut State, sample: u32, len: u32) -> u64 {
        let (addr, generation) = st.begin_write(sample, len, 16 * B).unwrap();
        st.end_write(sample, generation, Some(7));
        addr
    }

    #[test]
    fn an_extent_removed_under_a_read_is_not_reused_until_the_read_ends() {
        let mut st = state(16 * B);
        let a = written(&mut st, 1, 100);
        let e = st.begin_read(1).unwrap();
        let e2 = st.begin_read(1).unwrap();
        assert!(st.drop_entry(1));
        assert!(matches!(
            st.begin_read(1),
            Err(TierError::Missing { sample: 1 })
        ));
        // The same sample written again goes elsewhere while the reads are in flight.
        let b = written(&mut st, 1, 100);
        assert_ne!(a, b);
        assert_eq!(st.used_bytes, 2 * B);
        st.end_read(1, &e, &Ok(Bytes::new()));
        assert_eq!(st.used_bytes, 2 * B, "one read still holds it");
        st.end_read(1, &e2, &Ok(Bytes::new()));
        assert_eq!(st.used_bytes, B);
        assert!(st.retiring.is_empty());
        // The later entry is untouched, and the extent is free again.
        assert!(st.begin_read(1).is_ok());
        assert_eq!(written(&mut st, 2, 100), a);
    }

    #[test]
    fn an_extent_removed_under_its_write_is_freed_when_the_write_ends() {
        let mut st = state(16 * B);
        let (addr, generation) = st.begin_write(3, 5000, 16 * B).unwrap();
        assert!(matches!(
            st.begin_read(3),
            Err(TierError::Pending { sample: 3 })
        ));
        assert!(matches!(
            st.begin_write(3, 5000, 16 * B),
            Err(TierError::Exists { sample: 3 })
        ));
        assert!(st.drop_entry(3));
        let (again, g2) = st.begin_write(3, 5000, 16 * B).unwrap();
        assert_ne!(again, addr);
        st.end_write(3, generation, Some(1));
        assert_eq!(
            st.used_bytes,
            2 * B,
            "the old write's extent freed, the new one held"
        );
        assert!(matches!(
            st.begin_read(3),
            Err(TierError::Pending { sample: 3 })
        ));
        st.end_write(3, g2, Some(2));
        assert_eq!(st.begin_read(3).unwrap().crc, 2);
        assert_eq!(st.stats.writes, 1);
    }

    #[test]
    fn a_failed_write_frees_its_extent_and_leaves_no_entry() {
        let mut st = state(4 * B);
        let (addr, generation) = st.begin_write(0, 3 * 4096, 4 * B).unwrap();
        st.end_write(0, generation, None);
        assert_eq!((st.used_bytes, st.stats.io_errors), (0, 1));
        assert!(st.entries.is_empty());
        assert_eq!(written(&mut st, 1, 4 * 4096), addr);
        assert!(matches!(
            st.begin_write(2, 1, 4 * B),
            Err(TierError::Full {
                sample: 2,
                free_bytes: 0,
                ..
            })
        ));
    }

    #[test]
    fn a_damaged_read_drops_the_entry_once_every_read_of_it_ends() {
        let mut st = state(16 * B);
        written(&mut st, 5, 100);
        let e = st.begin_read(5).unwrap();
        let e2 = st.begin_read(5).unwrap();
        let damage = TierError::Damaged {
            sample: 5,
            file: PathBuf::from("seg-0"),
            offset: 0,
            damage: Damage::Checksum {
                expected: 7,
                found: 8,
            },
        };
        st.end_read(5, &e, &Err(damage));
        assert!(matches!(
            st.begin_read(5),
            Err(TierError::Missing { sample: 5 })
        ));
        assert_eq!(st.used_bytes, B, "the other read holds the extent");
        st.end_read(5, &e2, &Ok(Bytes::new()));
        assert_eq!(st.used_bytes, 0);
        assert_eq!((st.stats.damaged, st.stats.reads), (1, 1));
    }

    #[test]
    fn generations_after_an_index_with_a_dropped_entry_are_new() {
        let dir = tempfile::tempdir().unwrap();
        let sizes: Arc<[u32]> = vec![200 << 10; 2].into();
        let tier = DiskTier::open(dir.path(), 1, sizes.clone(), 1 << 20).unwrap();
        tier.write(0, &vec![1; 200 << 10]).unwrap();
        tier.write(1, &vec![2; 200 << 10]).unwrap();
        // Sample 0 fills most of segment 0, so sample 1 went to segment 1.
        assert_eq!(tier.lock().entries[&1].addr, tier.geometry.segment_bytes);
        let seg0 = tier.segments[0].path.clone();
        drop(tier);
        File::options()
            .write(true)
            .open(&seg0)
            .unwrap()
            .set_len(10)
            .unwrap();
        let tier = DiskTier::open(dir.path(), 1, sizes, 1 << 20).unwrap();
        assert_eq!(
            tier.index_status(),
            &IndexStatus::Loaded {
                kept: 1,
                dropped: 1
            }
        );
        let st = tier.lock();
        assert!(st.entries[&1].generation < st.next_generation);
    }
}
