//! The batch arena: memory shared by the node's host and its ranks.
//!
//! A `memfd_create` file has no name in any file system, so nothing is left behind in
//! `/dev/shm` or on disk however the processes end (SIGKILL included): the memory goes when
//! the last descriptor and mapping of it go. The host makes it and passes the descriptor to
//! each rank with `SCM_RIGHTS` (see `fdpass`); the host writes batches, ranks read them in
//! place.
//!
//! # Sharing
//! Every process maps the same pages, so who may touch which range when is the slot
//! protocol's business, not this type's: a range is written by one writer while no one reads
//! it, and read only while no one writes it. `SharedArena::write_at` and `SharedArena::read_at` check
//! bounds but cannot check that protocol.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};

use crate::error::NodeError;

/// The seals every arena carries: its size fixed for good. A rank maps nothing without them.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A shared memory region made with `memfd_create`, mapped `MAP_SHARED`.
pub struct SharedArena {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    name: String,
}

// SAFETY: the mapping is process-wide memory owned by the arena until it drops, not tied to
// the thread that made it; which thread may touch which range is the slot protocol's
// contract (see the module docs), the same across threads as across processes.
unsafe impl Send for SharedArena {}
// SAFETY: as above; `&SharedArena` gives only bounds-checked access to the mapping.
unsafe impl Sync for SharedArena {}

impl SharedArena {
    /// Makes an arena of `bytes`, named `name` (it shows in `/proc/PID/fd` as `memfd:name`),
    /// closed on exec. Pages are not faulted in here: memory is used as batches land.
    ///
    /// # Errors
    /// `bytes` is 0 or over `isize::MAX`, or `name` holds a NUL ([`NodeError::Os`] with
    /// `InvalidInput`); `bytes` is over `MemAvailable` in `/proc/meminfo`
    /// ([`NodeError::ArenaTooLarge`]; not checked when that file cannot be read); a system
    /// call fails ([`NodeError::Os`]).
    pub fn create(name: &str, bytes: u64) -> Result<SharedArena, NodeError> {
        let what = format!("arena {name:?} of {bytes} bytes");
        let len = checked_len(bytes, "mmap", &what)?;
        match mem_available_bytes() {
            Some(available_bytes) if bytes > available_bytes => {
                return Err(NodeError::ArenaTooLarge {
                    bytes,
                    available_bytes,
                })
            }
            Some(_) => {}
            None => log::debug!("/proc/meminfo unreadable: {what} made unchecked"),
        }
        let c_name = CString::new(name).map_err(|_| NodeError::Os {
            call: "memfd_create",
            what: what.clone(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the name holds a NUL byte"),
        })?;
        // Sealing is allowed so the size can be sealed below.
        // SAFETY: `c_name` is a NUL-terminated string that outlives the call.
        let raw = unsafe {
            libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(NodeError::last_os("memfd_create", what));
        }
        // SAFETY: memfd_create just returned this descriptor, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // `len` <= isize::MAX, so it fits off_t (i64).
        // SAFETY: plain system call on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(NodeError::last_os("ftruncate", what));
        }
        // A shrunk file would make every process's reads past the end SIGBUS: fix the size.
        // SAFETY: plain system call on a descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(NodeError::last_os("fcntl(F_ADD_SEALS)", what));
        }
        let base = map(fd.as_fd(), len, &what)?;
        Ok(SharedArena {
            fd,
            base,
            len,
            name: name.to_owned(),
        })
    }

    /// Maps an arena received from the host, after checking that its file is a memfd sealed
    /// as [`SharedArena::create`] seals it (its size can never change, so no read of the
    /// mapping can fault past the end) and, with `fstat`, that it is `bytes` long.
    ///
    /// # Errors
    /// `bytes` is 0 or over `isize::MAX` (`InvalidInput`); the file is not a memfd or lacks a
    /// seal (`PermissionDenied`: whoever passed it is not a host of this crate); the file is
    /// not `bytes` long (`InvalidData`); or a system call fails: all [`NodeError::Os`].
    pub fn from_fd(fd: OwnedFd, bytes: u64) -> Result<SharedArena, NodeError> {
        let name = fd_name(fd.as_fd());
        let what = format!("arena {name:?} of {bytes} bytes");
        let len = checked_len(bytes, "mmap", &what)?;
        // SAFETY: plain system call on an open descriptor.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            let found = match seals < 0 {
                true => format!("no seals ({})", io::Error::last_os_error()),
                false => format!("seals {seals:#x}"),
            };
            return Err(NodeError::Os {
                call: "fcntl(F_GET_SEALS)",
                what,
                source: io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the file has {found}, not the host's {SEALS:#x} (shrink, grow, seal):                          not an arena from a lobster-node host"
                    ),
                ),
            });
        }
        let mut stat = MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `stat` is writable and sized for a `struct stat`; the descriptor is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
            return Err(NodeError::last_os("fstat", what));
        }
        // SAFETY: fstat succeeded, so it filled `stat`.
        let file_bytes = unsafe { stat.assume_init() }.st_size;
        if u64::try_from(file_bytes).ok() != Some(bytes) {
            return Err(NodeError::Os {
                call: "fstat",
                what,
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the file is {file_bytes} bytes, expected {bytes} bytes"),
                ),
            });
        }
        let base = map(fd.as_fd(), len, &what)?;
        Ok(SharedArena {
            fd,
            base,
            len,
            name,
        })
    }

    /// The arena's file, to pass to a rank.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The arena's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an arena is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `bytes` into the arena at `offset`.
    ///
    /// The caller (the slot protocol) guarantees nobody reads or writes that range meanwhile.
    ///
    /// # Panics
    /// The range is out of bounds.
    #[track_caller]
    pub(crate) fn write_at(&self, offset: usize, bytes: &[u8]) {
        self.check(offset, bytes.len());
        // SAFETY: the range is inside the mapping (checked above), which lives as long as
        // `self`; the slot protocol keeps other readers and writers off it. `ptr::copy`, not
        // `copy_nonoverlapping`, in case `bytes` is itself a view of this arena.
        unsafe { ptr::copy(bytes.as_ptr(), self.base.as_ptr().add(offset), bytes.len()) };
    }

    /// The arena's bytes at `offset..offset + len`, valid while the slot protocol keeps the
    /// range unwritten (a rank holds it until it releases the slot).
    ///
    /// # Panics
    /// The range is out of bounds.
    #[track_caller]
    pub(crate) fn read_at(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: the range is inside the mapping (checked above), which lives as long as the
        // borrow of `self`; the mapping is initialised (a memfd reads as zeros until written);
        // the slot protocol keeps writers off the range while the slice lives.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    /// A pointer to `offset`, for writers that fill `len` bytes in place (decoding straight
    /// into the arena).
    ///
    /// # Safety
    /// The caller may read and write `len` bytes from the pointer only:
    /// - while the slot protocol gives it the range alone: no other writer, and no reader
    ///   (in this process or another) and no slice from `SharedArena::read_at` over the range;
    /// - while this `SharedArena` lives: the pointer dangles once it drops.
    ///
    /// # Panics
    /// The range is out of bounds.
    #[track_caller]
    pub unsafe fn range_ptr(&self, offset: usize, len: usize) -> *mut u8 {
        self.check(offset, len);
        // SAFETY: `offset` <= `self.len` (checked above), so the result is inside the mapping
        // or one past its end.
        unsafe { self.base.as_ptr().add(offset) }
    }

    #[track_caller]
    fn check(&self, offset: usize, len: usize) {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => panic!(
                "arena {:?}: range of {len} bytes at {offset} out of bounds of {} bytes",
                self.name, self.len
            ),
        }
    }
}

impl Drop for SharedArena {
    fn drop(&mut self) {
        // SAFETY: the mapping is this arena's; slices from `read_at` borrow `self` so none
        // outlives it, and `range_ptr`'s contract forbids using its pointers after the drop.
        if unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) } != 0 {
            log::warn!(
                "munmap of arena {:?} ({} bytes): {}",
                self.name,
                self.len,
                io::Error::last_os_error()
            );
        }
    }
}

impl fmt::Debug for SharedArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArena")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// `bytes` as a mapping length: mappings and slices hold at most `isize::MAX` bytes.
fn checked_len(bytes: u64, call: &'static str, what: &str) -> Result<usize, NodeError> {
    match usize::try_from(bytes) {
        Ok(len) if len > 0 && len <= isize::MAX as usize => Ok(len),
        _ => Err(NodeError::Os {
            call,
            what: what.to_owned(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an arena holds 1 to {} bytes", isize::MAX),
            ),
        }),
    }
}

/// Maps `len` bytes of `fd`, shared, for reading and writing. Not `MAP_POPULATE`: pages are
/// faulted in as batches land.
fn map(fd: BorrowedFd<'_>, len: usize, what: &str) -> Result<NonNull<u8>, NodeError> {
    // SAFETY: with no address hint the kernel picks a fresh range, aliasing no Rust memory;
    // the descriptor is open for the call.
    let ptr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(NodeError::last_os("mmap", what));
    }
    Ok(NonNull::new(ptr.cast()).expect("mmap without an address hint never maps page 0"))
}

/// The memfd name of `fd` (from `/proc/self/fd`), else its number.
fn fd_name(fd: BorrowedFd<'_>) -> String {
    let raw = fd.as_raw_fd();
    std::fs::read_link(format!("/proc/self/fd/{raw}"))
        .ok()
        .and_then(|target| {
            let target = target.to_str()?;
            let name = target.strip_prefix("/memfd:")?;
            Some(name.strip_suffix(" (deleted)").unwrap_or(name).to_owned())
        })
        .unwrap_or_else(|| format!("fd {raw}"))
}

/// `MemAvailable` of `/proc/meminfo` in bytes; `None` when it cannot be read.
fn mem_available_bytes() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let rest = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let mut words = rest.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_BYTES: u64 = 4096;

    /// A name no other test (or test run) uses.
    fn unique(tag: &str) -> String {
        format!("lobster-test-{tag}-{}", std::process::id())
    }

    fn os_kind(err: &NodeError) -> io::ErrorKind {
        match err {
            NodeError::Os { source, .. } => source.kind(),
            other => panic!("expected NodeError::Os, got {other:?}"),
        }
    }

    fn fd_flags(fd: BorrowedFd<'_>) -> libc::c_int {
        // SAFETY: plain system call on an open descriptor.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0, "{}", io::Error::last_os_error());
        flags
    }

    #[test]
    fn arena_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<SharedArena>();
    }

    #[test]
    fn write_then_read_round_trips() {
        let arena = SharedArena::create(&unique("round-trip"), 4 * PAGE_BYTES).unwrap();
        assert_eq!(arena.len(), 4 * PAGE_BYTES as usize);
        assert!(!arena.is_empty());
        assert_eq!(
            arena.read_at(0, 16),
            &[0; 16],
            "a fresh memfd reads as zeros"
        );
        let data: Vec<u8> = (0..=255).cycle().take(5000).collect();
        arena.write_at(1000, &data);
        assert_eq!(arena.read_at(1000, data.len()), &data[..]);
        // Up to the last byte, and nothing around the write touched.
        arena.write_at(arena.len() - 3, b"end");
        assert_eq!(arena.read_at(arena.len() - 3, 3), b"end");
        assert_eq!(arena.read_at(999, 1), &[0]);
        assert_eq!(arena.read_at(6000, 1), &[0]);
    }

    #[test]
    fn range_ptr_writes_land_in_the_arena() {
        let arena = SharedArena::create(&unique("range-ptr"), PAGE_BYTES).unwrap();
        // SAFETY: this test alone uses the arena, and no slice over the range is alive.
        unsafe {
            let ptr = arena.range_ptr(100, 4);
            ptr::copy_nonoverlapping(b"lob!".as_ptr(), ptr, 4);
        }
        assert_eq!(arena.read_at(100, 4), b"lob!");
    }

    #[test]
    fn a_second_mapping_shares_the_pages() {
        let bytes = 2 * PAGE_BYTES;
        let first = SharedArena::create(&unique("shared"), bytes).unwrap();
        let second = SharedArena::from_fd(first.fd().try_clone_to_owned().unwrap(), bytes).unwrap();
        assert_eq!(second.len(), first.len());
        assert_ne!(first.base, second.base, "two mappings, not one");
        first.write_at(5000, b"from the first");
        assert_eq!(second.read_at(5000, 14), b"from the first");
        second.write_at(10, b"and back");
        assert_eq!(first.read_at(10, 8), b"and back");
        // The pages outlive the maker while a mapping holds them.
        drop(first);
        assert_eq!(second.read_at(5000, 14), b"from the first");
        assert_eq!(
            format!("{second:?}"),
            format!(
                "SharedArena {{ name: {:?}, len: 8192, .. }}",
                unique("shared")
            )
        );
    }

    #[test]
    fn from_fd_refuses_the_wrong_size() {
        let arena = SharedArena::create(&unique("wrong-size"), PAGE_BYTES).unwrap();
        for bytes in [PAGE_BYTES + 1, PAGE_BYTES - 1] {
            let dup = arena.fd().try_clone_to_owned().unwrap();
            let err = SharedArena::from_fd(dup, bytes).unwrap_err();
            assert_eq!(os_kind(&err), io::ErrorKind::InvalidData, "{err}");
            let message = err.to_string();
            assert!(message.contains("fstat"), "{message}");
            assert!(
                message.contains(&format!("{PAGE_BYTES} bytes")),
                "{message}"
            );
            assert!(
                message.contains(&format!("expected {bytes} bytes")),
                "{message}"
            );
        }
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        for bytes in [0, isize::MAX as u64 + 1, u64::MAX] {
            let err = SharedArena::create(&unique("bad-size"), bytes).unwrap_err();
            assert_eq!(os_kind(&err), io::ErrorKind::InvalidInput, "{err}");
        }
        let err = SharedArena::create("nul\0name", PAGE_BYTES).unwrap_err();
        assert_eq!(os_kind(&err), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn more_than_mem_available_is_refused() {
        let available = mem_available_bytes().expect("/proc/meminfo has MemAvailable");
        // Twice over, so memory freed meanwhile does not let it through.
        let bytes = available.saturating_mul(2).saturating_add(1 << 30);
        match SharedArena::create(&unique("too-large"), bytes) {
            Err(NodeError::ArenaTooLarge {
                bytes: asked,
                available_bytes,
            }) => {
                assert_eq!(asked, bytes);
                assert!(available_bytes < bytes);
            }
            other => panic!("expected ArenaTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn mem_available_parses_kib() {
        let meminfo =
            "MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   24124920 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(24_124_920 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 5 MB\n"), None);
    }

    #[test]
    fn size_is_sealed_and_fd_closes_on_exec() {
        let arena = SharedArena::create(&unique("sealed"), PAGE_BYTES).unwrap();
        assert_ne!(fd_flags(arena.fd()) & libc::FD_CLOEXEC, 0);
        // SAFETY: plain system call on an open descriptor.
        let rc = unsafe { libc::ftruncate(arena.fd().as_raw_fd(), 0) };
        assert_eq!(rc, -1, "a sealed arena cannot shrink");
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn from_fd_refuses_an_unsealed_memfd_or_another_file() {
        // SAFETY: a NUL-terminated literal; the descriptor returned is owned at once.
        let raw = unsafe { libc::memfd_create(c"lobster-test-unsealed".as_ptr(), 0) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: memfd_create just returned it, owned by nothing else.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain system call on a descriptor we own.
        assert_eq!(
            unsafe { libc::ftruncate(raw, PAGE_BYTES as libc::off_t) },
            0
        );
        // Sealable but sealed against shrinking only: it could still grow.
        // SAFETY: as above.
        let raw =
            unsafe { libc::memfd_create(c"lobster-test-half".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: as above.
        let half = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::ftruncate(raw, PAGE_BYTES as libc::off_t), 0);
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        }
        let file = tempfile::tempfile().unwrap();
        file.set_len(PAGE_BYTES).unwrap();
        for fd in [unsealed, half, OwnedFd::from(file)] {
            let err = SharedArena::from_fd(fd, PAGE_BYTES).unwrap_err();
            assert_eq!(os_kind(&err), io::ErrorKind::PermissionDenied, "{err}");
            assert!(err.to_string().contains("F_GET_SEALS"), "{err}");
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn read_past_the_end_panics() {
        let arena = SharedArena::create(&unique("oob-read"), PAGE_BYTES).unwrap();
        arena.read_at(PAGE_BYTES as usize - 2, 4);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn read_with_overflowing_range_panics() {
        let arena = SharedArena::create(&unique("oob-overflow"), PAGE_BYTES).unwrap();
        arena.read_at(usize::MAX, 2);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn write_past_the_end_panics() {
        let arena = SharedArena::create(&unique("oob-write"), PAGE_BYTES).unwrap();
        arena.write_at(PAGE_BYTES as usize, b"x");
    }

    fn dev_shm_entries_named(name: &str) -> Vec<String> {
        match std::fs::read_dir("/dev/shm") {
            Ok(dir) => dir
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|file| file.contains(name))
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("/dev/shm: {e}"),
        }
    }

    fn mapped(name: &str) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .any(|line| line.ends_with(&format!("/memfd:{name} (deleted)")))
    }

    #[test]
    fn leaves_nothing_in_dev_shm_and_unmaps_on_drop() {
        let name = unique("no-trace");
        let arena = SharedArena::create(&name, PAGE_BYTES).unwrap();
        arena.write_at(0, b"x");
        // A memfd, named as asked, lives in no file system.
        let target = std::fs::read_link(format!("/proc/self/fd/{}", arena.fd().as_raw_fd()));
        assert_eq!(
            target.unwrap().to_str(),
            Some(format!("/memfd:{name} (deleted)").as_str())
        );
        assert_eq!(dev_shm_entries_named(&name), Vec::<String>::new());
        assert!(mapped(&name));
        drop(arena);
        assert!(!mapped(&name), "munmap on drop");
        assert_eq!(dev_shm_entries_named(&name), Vec::<String>::new());
    }
}
