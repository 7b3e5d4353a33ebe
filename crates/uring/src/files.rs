//! Open files: the id table of the files opened on a reader, and O_DIRECT alignment.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use slab::Slab;

use crate::error::ReadError;
use crate::file_ref::FileRef;
use crate::pool::BUFFER_ALIGN;
use crate::types::FileId;

/// Alignment used when the file system does not report one.
pub(crate) const DEFAULT_DIO_ALIGN: u64 = 4096;

pub(crate) struct FileEntry {
    pub(crate) path: PathBuf,
    pub(crate) fd: OwnedFd,
    pub(crate) direct: bool,
    /// Offset and length alignment of reads (1 without O_DIRECT).
    pub(crate) align: u64,
}

impl fmt::Debug for FileEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileEntry")
            .field("path", &self.path)
            .field("fd", &self.fd.as_raw_fd())
            .field("direct", &self.direct)
            .field("align", &self.align)
            .finish()
    }
}

impl FileEntry {
    /// Opens `file` (by its name in its held directory, if it has one) and asks its O_DIRECT
    /// alignment.
    pub(crate) fn open(file: FileRef<'_>, direct: bool) -> Result<FileEntry, ReadError> {
        let path = file.path;
        let open_err = |source: io::Error| ReadError::Open {
            path: path.to_path_buf(),
            source,
        };
        let is_dir_err = || open_err(io::Error::from_raw_os_error(libc::EISDIR));
        let flags = if direct { libc::O_DIRECT } else { 0 };
        let file = match file.open(flags) {
            Ok(file) => file,
            // Some file systems refuse O_DIRECT on directories with EINVAL; say what it is.
            Err(_) if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) => return Err(is_dir_err()),
            Err(e) => return Err(open_err(e)),
        };
        if file.metadata().map_err(open_err)?.is_dir() {
            return Err(is_dir_err());
        }
        let fd = OwnedFd::from(file);
        let align = if direct {
            let (mem_align, offset_align) = dio_align(fd.as_raw_fd()).unwrap_or((0, 0));
            if mem_align as usize > BUFFER_ALIGN {
                return Err(open_err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("O_DIRECT needs {mem_align}-byte aligned memory; buffers are {BUFFER_ALIGN}-byte aligned"),
                )));
            }
            if offset_align == 0 {
                DEFAULT_DIO_ALIGN
            } else {
                u64::from(offset_align)
            }
        } else {
            1
        };
        Ok(FileEntry {
            path: path.to_path_buf(),
            fd,
            direct,
            align,
        })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `(memory, offset)` alignment for O_DIRECT from statx, `None` when not reported.
fn dio_align(fd: RawFd) -> Option<(u32, u32)> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, the path is an empty C string used with AT_EMPTY_PATH, and stx is
    // a valid, writable statx buffer.
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// The ids of open files.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    slots: Mutex<FileSlots>,
}

#[derive(Debug, Default)]
struct FileSlots {
    entries: Slab<(u32, Arc<FileEntry>)>,
    next_generation: u32,
}

impl FileTable {
    fn lock(&self) -> MutexGuard<'_, FileSlots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, entry: FileEntry) -> FileId {
        let mut slots = self.lock();
        let generation = slots.next_generation;
        slots.next_generation = generation.wrapping_add(1);
        let index = slots.entries.insert((generation, Arc::new(entry)));
        FileId {
            index: u32::try_from(index).expect("more than 2^32 open files"),
            generation,
        }
    }

    pub(crate) fn get(&self, id: FileId) -> Option<Arc<FileEntry>> {
        let slots = self.lock();
        match slots.entries.get(id.index as usize) {
            Some((generation, entry)) if *generation == id.generation => Some(entry.clone()),
            _ => None,
        }
    }

    pub(crate) fn remove(&self, id: FileId) -> Option<Arc<FileEntry>> {
        let mut slots = self.lock();
        match slots.entries.get(id.index as usize) {
            Some((generation, _)) if *generation == id.generation => {
                Some(slots.entries.remove(id.index as usize).1)
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}
