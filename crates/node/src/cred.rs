//! Who is at the other end of a Unix socket (`SO_PEERCRED`), and whether to trust them.
//!
//! The host's name in the abstract namespace is visible to every user of the machine
//! (`/proc/net/unix`), and abstract sockets have no file permissions, so each side checks the
//! other's user: the same user as this process, or root (who could read this process's memory
//! anyway). Anyone else learns nothing and gets nothing.

use std::io;
use std::mem;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// The process at the other end of a socket, as the kernel recorded it when the connection
/// was made (the listener's at `listen`, the connecting one's at `connect`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
}

impl Peer {
    /// Whether this process trusts the peer: its own effective user, or root.
    pub(crate) fn trusted(&self) -> bool {
        self.uid == 0 || self.uid == our_uid()
    }
}

/// This process's effective user id: the one the kernel records for its sockets.
pub(crate) fn our_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The credentials of the process at the other end of `sock`.
///
/// # Errors
/// `getsockopt(SO_PEERCRED)` fails.
pub(crate) fn peer(sock: &UnixStream) -> io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` and `len` its size, both live locals; the kernel
    // writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED gave {len} bytes"),
        ));
    }
    Ok(Peer {
        pid: cred.pid as u32,
        uid: cred.uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_sees_this_process_and_trusts_it() {
        let (a, b) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            let p = peer(s).unwrap();
            assert_eq!(p.pid, std::process::id());
            assert_eq!(p.uid, our_uid());
            assert!(p.trusted());
        }
    }

    #[test]
    fn only_this_user_or_root_is_trusted() {
        let ours = our_uid();
        assert!(Peer { pid: 1, uid: 0 }.trusted(), "root");
        assert!(Peer { pid: 1, uid: ours }.trusted(), "this user");
        let other = if ours == 65534 { 65533 } else { 65534 };
        assert!(!Peer { pid: 1, uid: other }.trusted(), "another user");
    }
}
