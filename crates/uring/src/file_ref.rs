//! How a read names its file: by its whole path, or by its name in its parent directory held
//! open. The kernel walks a path one component at a time; for a small file in the page cache
//! that walk is a large part of the read (a fifth of it for a 2 KiB file seven components
//! deep), and a held directory leaves one component to walk.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file to open: `path`, or `path`'s last component relative to `dir`.
#[derive(Clone, Copy, Debug)]
pub struct FileRef<'a> {
    /// The file's whole path: what errors name, and what is opened without `dir`.
    pub path: &'a Path,
    /// `path`'s parent directory, held open (from [`open_dir`]).
    pub dir: Option<BorrowedFd<'a>>,
}

impl<'a> FileRef<'a> {
    /// `path`, opened by its name in `dir`, which must be `path`'s parent directory.
    pub fn in_dir(dir: BorrowedFd<'a>, path: &'a Path) -> Self {
        FileRef {
            path,
            dir: Some(dir),
        }
    }

    /// Opens the file read-only, with `flags` (such as `O_DIRECT`) added.
    pub(crate) fn open(&self, flags: i32) -> io::Result<File> {
        let (Some(dir), Some(name)) = (self.dir, self.path.file_name()) else {
            return std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(flags)
                .open(self.path);
        };
        let name = name.as_bytes();
        // NAME_MAX is 255: a name and its NUL fit on the stack.
        let mut stack = [0u8; 256];
        let heap;
        let c_name = if name.len() < stack.len() && !name.contains(&0) {
            stack[..name.len()].copy_from_slice(name);
            stack.as_ptr().cast::<libc::c_char>()
        } else {
            heap = CString::new(name)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
            heap.as_ptr()
        };
        // SAFETY: `c_name` is NUL-terminated and outlives the call; `dir` is an open
        // descriptor for its lifetime.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c_name,
                libc::O_RDONLY | libc::O_CLOEXEC | flags,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `openat` just returned this descriptor, which nothing else owns.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl<'a> From<&'a Path> for FileRef<'a> {
    fn from(path: &'a Path) -> Self {
        FileRef { path, dir: None }
    }
}

impl<'a> From<&'a PathBuf> for FileRef<'a> {
    fn from(path: &'a PathBuf) -> Self {
        FileRef::from(path.as_path())
    }
}

/// Opens directory `dir` to hold for [`FileRef::in_dir`]: a handle that reads nothing
/// (`O_PATH`).
///
/// # Errors
/// `dir` cannot be opened or is not a directory.
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map(OwnedFd::from)
}

/// The process's soft limit on open descriptors (`RLIMIT_NOFILE`), so that a caller holding
/// descriptors for speed can leave the rest to its host program.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the call to fill.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn a_file_opens_by_its_name_in_its_held_directory() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("class_a");
        std::fs::create_dir(&sub).unwrap();
        let path = sub.join("x.jpg");
        std::fs::write(&path, b"bytes of x").unwrap();
        let held = open_dir(&sub).unwrap();
        let mut text = String::new();
        FileRef::in_dir(held.as_fd(), &path)
            .open(0)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "bytes of x");
        // The held directory is what counts: renaming the path's parent away leaves the
        // held one opening what it held.
        std::fs::rename(&sub, dir.path().join("moved")).unwrap();
        assert!(FileRef::from(&path).open(0).is_err());
        assert!(FileRef::in_dir(held.as_fd(), &path).open(0).is_ok());
    }

    #[test]
    fn a_missing_file_or_a_non_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let held = open_dir(dir.path()).unwrap();
        let missing = dir.path().join("missing");
        let e = FileRef::in_dir(held.as_fd(), &missing).open(0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::fs::write(&missing, b"").unwrap();
        assert!(open_dir(&missing).is_err());
    }

    #[test]
    fn the_descriptor_limit_is_the_one_proc_reports() {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let soft = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap();
        assert_eq!(open_files_limit(), soft.parse().ok());
    }
}
