//! Passing one descriptor (the arena's) over a Unix stream socket with `SCM_RIGHTS`.
//!
//! On a stream socket the descriptor rides with the first byte of the payload it was sent
//! with, and message boundaries are not kept: the caller frames its messages, and
//! [`recv_with_fd`] may return fewer bytes than were sent (the rest come with ordinary reads).

use std::io::{self, Write};
use std::mem::{self, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr;

/// The most a payload sent with a descriptor may hold.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Descriptors a receive has room for: more than one, so extras sent by mistake arrive and
/// are closed here rather than cut off unseen.
const MAX_RECEIVED_FDS: usize = 8;

const FD_BYTES: usize = mem::size_of::<RawFd>();

// SAFETY: CMSG_SPACE is arithmetic on its argument only.
const SEND_SPACE_BYTES: usize = unsafe { libc::CMSG_SPACE(FD_BYTES as libc::c_uint) } as usize;
// SAFETY: as above.
const RECV_SPACE_BYTES: usize =
    unsafe { libc::CMSG_SPACE((FD_BYTES * MAX_RECEIVED_FDS) as libc::c_uint) } as usize;

/// A control buffer aligned for `cmsghdr`, as CMSG_FIRSTHDR and CMSG_NXTHDR assume.
#[repr(C)]
union Control<const N: usize> {
    header: libc::cmsghdr,
    bytes: [u8; N],
}

impl<const N: usize> Control<N> {
    fn new() -> Self {
        Control { bytes: [0; N] }
    }
}

/// Sends `payload` (1 to 64 KiB) with `fd` attached (`SCM_RIGHTS`) in one `sendmsg`.
///
/// Should the socket take only part of the payload (a signal, a send timeout), the rest
/// follows with ordinary writes, so the whole payload is always sent.
///
/// # Errors
/// The payload is empty or over 64 KiB (`InvalidInput`), or sending fails.
pub(crate) fn send_with_fd(
    sock: &UnixStream,
    payload: &[u8],
    fd: BorrowedFd<'_>,
) -> io::Result<()> {
    if payload.is_empty() || payload.len() > MAX_PAYLOAD_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a payload sent with a descriptor holds 1 to {MAX_PAYLOAD_BYTES} bytes, not {}",
                payload.len()
            ),
        ));
    }
    let mut control = Control::<SEND_SPACE_BYTES>::new();
    let mut iov = libc::iovec {
        // sendmsg only reads through it.
        iov_base: payload.as_ptr().cast_mut().cast(),
        iov_len: payload.len(),
    };
    let msg = message(&mut iov, &mut control);
    // SAFETY: `msg` points at `control`, which is aligned for `cmsghdr` and holds
    // CMSG_SPACE(one fd) bytes, so the first header and its data fit in it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_len = libc::CMSG_LEN(FD_BYTES as libc::c_uint) as _;
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd.as_raw_fd());
    }
    let sent = loop {
        // SAFETY: `msg` points at `iov` and `control`, both alive and unmoved for the call;
        // the payload outlives it.
        let sent = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            break sent as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    // The descriptor went with the first byte; the rest needs none.
    (&*sock).write_all(&payload[sent..])
}

/// Receives into `buf` (not empty) with at most one descriptor attached: the bytes received
/// and the descriptor if one came, closed on exec. 0 bytes means the peer closed.
///
/// The bytes may be fewer than the peer sent: the caller frames its messages and reads the
/// rest with ordinary reads.
///
/// # Errors
/// `buf` is empty (`InvalidInput`); more than one descriptor came, or the control data was
/// truncated (`InvalidData`, every descriptor that came is closed); or receiving fails.
pub(crate) fn recv_with_fd(
    sock: &UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    if buf.is_empty() {
        // recvmsg would return 0, which reads as the peer closing.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "receiving into an empty buffer",
        ));
    }
    let mut control = Control::<RECV_SPACE_BYTES>::new();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = message(&mut iov, &mut control);
    let received = loop {
        // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both alive, unmoved and
        // writable for the call, with their true lengths.
        let received = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if received >= 0 {
            break received as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    // Own every descriptor that came first, so each is closed whatever is returned.
    let mut fds = Vec::new();
    // SAFETY: recvmsg filled `control` with `msg.msg_controllen` bytes of well-formed
    // headers; CMSG_FIRSTHDR/CMSG_NXTHDR keep within them, and each SCM_RIGHTS header's
    // data holds (cmsg_len - CMSG_LEN(0)) / FD_BYTES descriptors, new in this process and
    // owned by nothing else.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                let data_bytes =
                    ((*header).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..data_bytes / FD_BYTES {
                    fds.push(OwnedFd::from_raw_fd(ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "control data truncated ({} descriptors kept, closed)",
                fds.len()
            ),
        ));
    }
    if fds.len() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} descriptors came where one was expected", fds.len()),
        ));
    }
    Ok((received, fds.pop()))
}

/// A `msghdr` over one buffer and a control buffer, with no address (a connected socket).
fn message<const N: usize>(iov: &mut libc::iovec, control: &mut Control<N>) -> libc::msghdr {
    // msghdr has private padding fields on some targets, so start from zeros.
    let msg = MaybeUninit::<libc::msghdr>::zeroed();
    // SAFETY: all zeros is a valid msghdr (null pointers, zero lengths).
    let mut msg = unsafe { msg.assume_init() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ptr::from_mut(control).cast();
    msg.msg_controllen = N as _;
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SharedArena;
    use std::io::Read;
    use std::os::fd::AsFd;

    fn cloexec(fd: BorrowedFd<'_>) -> bool {
        // SAFETY: plain system call on an open descriptor.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0, "{}", io::Error::last_os_error());
        flags & libc::FD_CLOEXEC != 0
    }

    /// Sends `fds` (any number) with `payload` in one sendmsg, which `send_with_fd` cannot.
    fn send_fds(sock: &UnixStream, payload: &[u8], fds: &[RawFd]) {
        let mut control = Control::<256>::new();
        let mut iov = libc::iovec {
            iov_base: payload.as_ptr().cast_mut().cast(),
            iov_len: payload.len(),
        };
        let mut msg = message(&mut iov, &mut control);
        let data_bytes = mem::size_of_val(fds) as libc::c_uint;
        // SAFETY: as in `send_with_fd`; the assert keeps the header and `fds` inside
        // `control`.
        unsafe {
            let space = libc::CMSG_SPACE(data_bytes) as usize;
            assert!(space <= 256);
            msg.msg_controllen = space as _;
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_len = libc::CMSG_LEN(data_bytes) as _;
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            let data = libc::CMSG_DATA(header).cast::<RawFd>();
            for (i, &fd) in fds.iter().enumerate() {
                ptr::write_unaligned(data.add(i), fd);
            }
            let sent = libc::sendmsg(sock.as_raw_fd(), &msg, 0);
            assert_eq!(
                sent,
                payload.len() as isize,
                "{}",
                io::Error::last_os_error()
            );
        }
    }

    /// This process's descriptors open on the memfd `name`: other tests open and close
    /// descriptors meanwhile, so counting all of them would race.
    fn fds_on(name: &str) -> usize {
        let target = format!("/memfd:{name} (deleted)");
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|link| link.to_str() == Some(target.as_str()))
            .count()
    }

    #[test]
    fn an_arena_passed_over_a_socket_shows_the_senders_writes() {
        let (host, rank) = UnixStream::pair().unwrap();
        let bytes = 3 * 4096;
        let arena = SharedArena::create("lobster-test-fdpass", bytes).unwrap();
        arena.write_at(4097, b"batch 0");
        send_with_fd(&host, b"arena 12288", arena.fd()).unwrap();

        let mut buf = [0u8; 64];
        let (n, fd) = recv_with_fd(&rank, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"arena 12288");
        let fd = fd.expect("a descriptor came");
        assert_ne!(fd.as_raw_fd(), arena.fd().as_raw_fd(), "a new descriptor");
        assert!(cloexec(fd.as_fd()), "received with MSG_CMSG_CLOEXEC");
        let mapped = SharedArena::from_fd(fd, bytes).unwrap();
        assert_eq!(mapped.read_at(4097, 7), b"batch 0");
        // Later writes too: the same pages, not a copy.
        arena.write_at(0, b"batch 1");
        assert_eq!(mapped.read_at(0, 7), b"batch 1");
    }

    #[test]
    fn a_message_without_a_descriptor_gives_none() {
        let (host, rank) = UnixStream::pair().unwrap();
        (&host).write_all(b"plain").unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&rank, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"plain");
        assert!(fd.is_none());
    }

    #[test]
    fn a_closed_peer_reads_as_zero_bytes() {
        let (host, rank) = UnixStream::pair().unwrap();
        drop(host);
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&rank, &mut buf).unwrap();
        assert_eq!(n, 0);
        assert!(fd.is_none());
    }

    #[test]
    fn a_short_buffer_leaves_the_rest_for_ordinary_reads() {
        let (host, rank) = UnixStream::pair().unwrap();
        let arena = SharedArena::create("lobster-test-fdpass-short", 4096).unwrap();
        let payload: Vec<u8> = (0..MAX_PAYLOAD_BYTES).map(|i| (i % 251) as u8).collect();
        // The socket buffer may not hold 64 KiB at once: send from another thread.
        let fd = arena.fd().try_clone_to_owned().unwrap();
        let sent = payload.clone();
        let sender = std::thread::spawn(move || send_with_fd(&host, &sent, fd.as_fd()));
        let mut head = [0u8; 10];
        let (n, fd) = recv_with_fd(&rank, &mut head).unwrap();
        assert!(fd.is_some());
        let mut rest = vec![0u8; payload.len() - n];
        (&rank).read_exact(&mut rest).unwrap();
        sender.join().unwrap().unwrap();
        assert_eq!(&head[..n], &payload[..n]);
        assert_eq!(rest, &payload[n..]);
    }

    #[test]
    fn payload_sizes_out_of_range_are_refused() {
        let (host, _rank) = UnixStream::pair().unwrap();
        for len in [0, MAX_PAYLOAD_BYTES + 1] {
            let err = send_with_fd(&host, &vec![1; len], host.as_fd()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        }
        let err = recv_with_fd(&host, &mut []).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn extra_descriptors_are_refused_and_closed() {
        let name = "lobster-test-fdpass-extra";
        let (host, rank) = UnixStream::pair().unwrap();
        let arena = SharedArena::create(name, 4096).unwrap();
        let raw = arena.fd().as_raw_fd();
        send_fds(&host, b"two", &[raw, raw]);
        assert_eq!(fds_on(name), 1);
        let mut buf = [0u8; 16];
        let err = recv_with_fd(&rank, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(fds_on(name), 1, "both received descriptors closed");
    }

    #[test]
    fn truncated_control_data_is_refused_and_closed() {
        let name = "lobster-test-fdpass-ctrunc";
        let (host, rank) = UnixStream::pair().unwrap();
        let arena = SharedArena::create(name, 4096).unwrap();
        // More than the receive buffer has room for.
        send_fds(
            &host,
            b"many",
            &[arena.fd().as_raw_fd(); MAX_RECEIVED_FDS + 1],
        );
        let mut buf = [0u8; 16];
        let err = recv_with_fd(&rank, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("truncated"), "{err}");
        assert_eq!(fds_on(name), 1, "the descriptors that fit were closed");
    }
}
