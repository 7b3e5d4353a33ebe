//! A rank process's side: attach to the node's host, then take batches placed in the shared
//! arena, reading them in place; a batch's slot goes back to the host when it is dropped.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lobster_io::Positions;

use crate::arena::SharedArena;
use crate::barrier::{self, Broken};
use crate::cred;
use crate::error::NodeError;
use crate::fdpass::recv_with_fd;
use crate::launch::NodeEnv;
use crate::wire::{read_body, read_frame, stop_error, Placed, ToHost, ToRank};

/// How often a waiting attach asks its caller whether to keep waiting.
pub const ATTACH_POLL: Duration = Duration::from_millis(50);

struct Inner {
    arena: SharedArena,
    /// For releases, which batches send from whichever thread drops them.
    writer: Mutex<UnixStream>,
}

/// A local rank attached to its node's host: an iterator of [`NodeBatch`]es.
pub struct NodeRank {
    inner: Arc<Inner>,
    reader: UnixStream,
    buf: Vec<u8>,
    address: String,
    host_pid: u32,
    local_rank: usize,
    /// The node's local ranks: the parties of a step.
    ranks: u32,
    /// Set by a [`RankStopper`]: the rank ends rather than reading on.
    stopped: Arc<AtomicBool>,
    /// How the host's run maps this rank's batch count to a position.
    positions: Positions,
    done: bool,
}

impl std::fmt::Debug for NodeRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRank")
            .field("address", &self.address)
            .field("local_rank", &self.local_rank)
            .field("host_pid", &self.host_pid)
            .finish_non_exhaustive()
    }
}

/// Connects to the node's host, waiting up to `timeout` from `started` for it to come up and
/// asking `keep_waiting` every [`ATTACH_POLL`] meanwhile.
fn connect(
    env: &NodeEnv,
    timeout: Duration,
    started: Instant,
    keep_waiting: &mut impl FnMut() -> bool,
) -> Result<UnixStream, NodeError> {
    let address = env.address();
    let addr = SocketAddr::from_abstract_name(address.as_bytes()).map_err(|e| NodeError::Os {
        call: "connect",
        what: address.clone(),
        source: e,
    })?;
    let mut said = false;
    let mut polled = Instant::now();
    loop {
        if polled.elapsed() >= ATTACH_POLL {
            polled = Instant::now();
            if !keep_waiting() {
                return Err(NodeError::Interrupted {
                    address,
                    waited_s: started.elapsed().as_secs_f64(),
                });
            }
        }
        match UnixStream::connect_addr(&addr) {
            Ok(s) => return Ok(s),
            Err(e) if started.elapsed() >= timeout => {
                log::warn!("lobster-node: no host at {address}: {e}");
                return Err(NodeError::NoHost {
                    address,
                    waited_s: started.elapsed().as_secs_f64(),
                });
            }
            Err(_) => {
                if !said {
                    log::info!(
                        "lobster-node: local rank {} waiting up to {:.0} s for the host of \
                         job {} node {} at @{address}",
                        env.local_rank,
                        timeout.as_secs_f64(),
                        env.job_id,
                        env.node
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The host's answer to a hello.
struct Answer {
    buf: Vec<u8>,
    /// The arena's descriptor, riding on a welcome.
    fd: Option<std::os::fd::OwnedFd>,
    /// Why the hello could not be sent, if it could not.
    unsent: Option<NodeError>,
}

/// A rank attaching to its host, connected and trusting it: what its waits are measured
/// from and what their errors name.
struct Waiting<'a> {
    address: &'a String,
    host_pid: u32,
    /// When the rank began to wait for the host.
    started: Instant,
    timeout: Duration,
}

impl Waiting<'_> {
    fn gone(&self, reason: String) -> NodeError {
        NodeError::HostGone {
            address: self.address.clone(),
            pid: self.host_pid,
            reason,
        }
    }

    /// Says hello and reads the host's answer: its bytes, the arena's descriptor where the
    /// answer is a welcome, and the hello's failure to send (a refusal is still read: a host
    /// that refuses closes without reading). The welcome has as long as the host had to come
    /// up, from now.
    fn welcome(
        &self,
        stream: &mut UnixStream,
        hello: &ToHost,
        keep_waiting: &mut impl FnMut() -> bool,
    ) -> Result<Answer, NodeError> {
        let connected = Instant::now();
        let welcome_by = connected + self.timeout;
        let no_welcome = || NodeError::NoWelcome {
            address: self.address.clone(),
            pid: self.host_pid,
            waited_s: connected.elapsed().as_secs_f64(),
        };
        let left = |stream: &UnixStream| {
            let left = welcome_by.saturating_duration_since(Instant::now());
            let left = left.max(Duration::from_millis(1));
            stream.set_read_timeout(Some(left))
        };
        stream
            .set_write_timeout(Some(self.timeout.max(Duration::from_millis(1))))
            .map_err(|e| self.gone(format!("setting a write timeout: {e}")))?;
        let sent = stream.write_all(&hello.encode());
        let sent = || {
            sent.as_ref()
                .map_err(|e| self.gone(format!("sending the hello: {e}")))
                .map(|_| ())
        };
        // The length prefix first, with the arena's descriptor riding on its first byte.
        let mut len = [0u8; 4];
        let waited = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => no_welcome(),
            _ => self.gone(format!("awaiting welcome: {e}")),
        };
        // The welcome may wait for the node's other ranks: waited for in slices, so that
        // `keep_waiting` is asked meanwhile.
        let (n, fd) = loop {
            let slice = welcome_by
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), ATTACH_POLL);
            stream.set_read_timeout(Some(slice)).map_err(waited)?;
            match recv_with_fd(stream, &mut len) {
                Ok(got) => break got,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) && Instant::now() < welcome_by =>
                {
                    if !keep_waiting() {
                        return Err(NodeError::Interrupted {
                            address: self.address.clone(),
                            waited_s: self.started.elapsed().as_secs_f64(),
                        });
                    }
                }
                Err(e) => {
                    sent()?;
                    return Err(waited(e));
                }
            }
        };
        if n == 0 {
            sent()?;
            return Err(self.gone("closed the connection before answering".into()));
        }
        left(stream).map_err(waited)?;
        stream.read_exact(&mut len[n..]).map_err(waited)?;
        let mut buf = Vec::new();
        left(stream).map_err(waited)?;
        read_body(stream, u32::from_le_bytes(len), &mut buf).map_err(waited)?;
        Ok(Answer {
            buf,
            fd,
            unsent: sent().err(),
        })
    }
}

impl NodeRank {
    /// Attaches this process, local rank `env.local_rank`, to the host at `env.address()`,
    /// presenting `config` (see [`crate::fingerprint`]); waits up to `timeout` for the host
    /// to come up, logging what it waits for.
    ///
    /// The process listening at the address must run as this process's user or as root, and
    /// the arena it passes must be a memfd sealed against resizing; the welcome must come
    /// within `timeout` of connecting.
    ///
    /// # Errors
    /// No host within `timeout`, a listener of another user ([`NodeError::Untrusted`], told
    /// nothing), a host that refuses this user ([`NodeError::NotAllowed`]) or this
    /// configuration ([`NodeError::Mismatch`], naming the field), no welcome in time
    /// ([`NodeError::NoWelcome`]), an arena without the host's seals, or a host that went
    /// away while attaching.
    pub fn attach(
        env: &NodeEnv,
        config: Vec<(String, String)>,
        timeout: Duration,
    ) -> Result<NodeRank, NodeError> {
        NodeRank::attach_while(env, config, timeout, || true)
    }

    /// [`NodeRank::attach`], asking `keep_waiting` every [`ATTACH_POLL`] while it waits for
    /// the host or its welcome: a caller that must answer signals (Python's Ctrl-C) stops
    /// the wait by returning `false`.
    ///
    /// # Errors
    /// As [`NodeRank::attach`], and [`NodeError::Interrupted`] when `keep_waiting` said no.
    pub fn attach_while(
        env: &NodeEnv,
        config: Vec<(String, String)>,
        timeout: Duration,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Result<NodeRank, NodeError> {
        let address = env.address();
        let started = Instant::now();
        let mut stream = connect(env, timeout, started, &mut keep_waiting)?;
        // Before saying anything: the listener must be this user's or root's, or it is a
        // squatter on the job's name.
        let host = cred::peer(&stream).map_err(|e| NodeError::Os {
            call: "getsockopt(SO_PEERCRED)",
            what: address.clone(),
            source: e,
        })?;
        if !host.trusted() {
            return Err(NodeError::Untrusted {
                address,
                pid: host.pid,
                uid: host.uid,
                our_uid: cred::our_uid(),
            });
        }
        let hello = ToHost::Hello {
            local_rank: env.local_rank as u32,
            pid: std::process::id(),
            config,
        };
        let at = Waiting {
            address: &address,
            host_pid: host.pid,
            started,
            timeout,
        };
        let Answer { buf, fd, unsent } = at.welcome(&mut stream, &hello, &mut keep_waiting)?;
        let (host_pid, arena_bytes, positions) = match ToRank::decode(&buf)? {
            ToRank::Welcome {
                pid,
                arena_bytes,
                positions,
                ..
            } => (pid, arena_bytes, positions),
            ToRank::Refused { field, .. } if field.is_empty() => {
                return Err(NodeError::NotAllowed {
                    address,
                    our_uid: cred::our_uid(),
                })
            }
            ToRank::Refused { field, host, rank } => {
                return Err(NodeError::Mismatch { field, host, rank })
            }
            other => {
                return Err(NodeError::Protocol {
                    reason: format!("expected a welcome, got {other:?}"),
                })
            }
        };
        if let Some(e) = unsent {
            return Err(e);
        }
        // Attached: reads and writes wait as long as training does.
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .map_err(|e| at.gone(format!("clearing the timeouts: {e}")))?;
        let fd = fd.ok_or_else(|| NodeError::Protocol {
            reason: "the welcome came without the arena".into(),
        })?;
        let arena = SharedArena::from_fd(fd, arena_bytes)?;
        let positions: Positions =
            serde_json::from_str(&positions).map_err(|e| NodeError::Protocol {
                reason: format!("the welcome's positions are not readable: {e}"),
            })?;
        let writer = stream.try_clone().map_err(|e| NodeError::Os {
            call: "dup",
            what: address.clone(),
            source: e,
        })?;
        Ok(NodeRank {
            inner: Arc::new(Inner {
                arena,
                writer: Mutex::new(writer),
            }),
            reader: stream,
            buf,
            address,
            host_pid,
            local_rank: env.local_rank,
            ranks: env.local_world_size as u32,
            stopped: Arc::new(AtomicBool::new(false)),
            positions,
            done: false,
        })
    }

    /// What ends this rank's iteration from another thread, while `next` waits for a batch.
    ///
    /// # Errors
    /// The socket could not be duplicated.
    pub fn stopper(&self) -> Result<RankStopper, NodeError> {
        let stream = self.reader.try_clone().map_err(|e| NodeError::Os {
            call: "dup",
            what: self.address.clone(),
            source: e,
        })?;
        Ok(RankStopper {
            stream,
            stopped: Arc::clone(&self.stopped),
        })
    }

    /// This process's local rank.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How the host's run maps a local rank's batch count to its position: a rank that
    /// counts the batches it handed on saves its state with
    /// `positions().after(local_rank, count)`.
    pub fn positions(&self) -> &Positions {
        &self.positions
    }

    /// The host's process id.
    pub fn host_pid(&self) -> u32 {
        self.host_pid
    }

    /// Where the shared arena is mapped in this process: every batch's bytes lie inside.
    pub fn arena_span(&self) -> std::ops::Range<usize> {
        let all = self.inner.arena.read_at(0, self.inner.arena.len());
        let start = all.as_ptr() as usize;
        start..start + all.len()
    }

    /// Meets every local rank at the end of step `step` (counted from 0 across epochs), as
    /// synchronous training does, recording whether this rank's step `failed`. `Ok(true)`
    /// when some rank failed at or before `step`: every rank then stops together.
    ///
    /// # Errors
    /// The job stopped (a rank went away) or the host went away while waiting.
    pub fn step(&self, step: u64, failed: bool) -> Result<bool, NodeError> {
        let fd = self.reader.as_raw_fd();
        // The host is there while its end of the socket is open; a hang-up shows even with
        // batches still queued unread.
        let alive = || {
            let mut fds = libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            };
            // SAFETY: one pollfd, a live local, for the socket this rank owns; no wait.
            let n = unsafe { libc::poll(&mut fds, 1, 0) };
            n <= 0 || fds.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) == 0
        };
        match barrier::wait(&self.inner.arena, self.ranks, step, failed, alive) {
            Ok(failed) => Ok(failed),
            Err(Broken::Stopped) => Err(self.why_stopped()),
            Err(Broken::Dead) => Err(self.host_gone("it went away during a step".into())),
        }
    }

    /// The host's stop message, read past any batches still queued (it follows them).
    fn why_stopped(&self) -> NodeError {
        let mut reader = &self.reader;
        let _ = reader.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = Vec::new();
        loop {
            match read_frame(&mut reader, &mut buf) {
                Ok(true) => match ToRank::decode(&buf) {
                    Ok(ToRank::Stop { rank, reason }) => return stop_error(rank, reason),
                    Ok(ToRank::Batch { slot, .. }) => {
                        if let Ok(mut w) = self.inner.writer.lock() {
                            let _ = w.write_all(&ToHost::Release { slot }.encode());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return e,
                },
                Ok(false) => return self.host_gone("it closed the connection".into()),
                Err(e) => return self.host_gone(e.to_string()),
            }
        }
    }

    fn host_gone(&self, reason: String) -> NodeError {
        NodeError::HostGone {
            address: self.address.clone(),
            pid: self.host_pid,
            reason,
        }
    }
}

impl Iterator for NodeRank {
    type Item = Result<NodeBatch, NodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let want = self
            .inner
            .writer
            .lock()
            .map(|mut w| w.write_all(&ToHost::Want.encode()));
        if let Ok(Err(e)) = want {
            self.done = true;
            return Some(Err(self.host_gone(format!("asking for a batch: {e}"))));
        }
        let item = match read_frame(&mut self.reader, &mut self.buf) {
            Ok(true) => match ToRank::decode(&self.buf) {
                Ok(ToRank::Batch {
                    slot,
                    epoch,
                    iteration,
                    samples,
                    skipped,
                }) => {
                    let end = samples.iter().map(|s| s.offset + s.len).max().unwrap_or(0);
                    if end > self.inner.arena.len() as u64 {
                        Err(NodeError::Protocol {
                            reason: format!("a batch placed past the arena's end ({end} bytes)"),
                        })
                    } else {
                        Ok(NodeBatch {
                            epoch,
                            iteration,
                            samples,
                            skipped,
                            slot,
                            inner: Arc::clone(&self.inner),
                        })
                    }
                }
                Ok(ToRank::Failed { kind, reason }) => Err(NodeError::Batch { kind, reason }),
                Ok(ToRank::Stop { rank, reason }) => {
                    self.done = true;
                    Err(stop_error(rank, reason))
                }
                Ok(ToRank::End) => {
                    self.done = true;
                    return None;
                }
                Ok(other) => Err(NodeError::Protocol {
                    reason: format!("unexpected {other:?}"),
                }),
                Err(e) => Err(e),
            },
            // Stopped by its stopper: an end, not a host gone.
            Ok(false) | Err(_) if self.stopped.load(Ordering::Acquire) => {
                self.done = true;
                return None;
            }
            Ok(false) => Err(self.host_gone("it closed the connection".into())),
            Err(e) => Err(self.host_gone(e.to_string())),
        };
        if matches!(
            item,
            Err(NodeError::HostGone { .. } | NodeError::Protocol { .. })
        ) {
            self.done = true;
        }
        Some(item)
    }
}

/// Ends a [`NodeRank`]'s iteration from another thread: the rank stops reading (its `next`
/// returns `None`), and the host, whose next message to it fails, counts it gone, as if its
/// process had exited.
#[derive(Debug)]
pub struct RankStopper {
    stream: UnixStream,
    stopped: Arc<AtomicBool>,
}

impl RankStopper {
    /// Stops the rank; a `next` waiting for a batch returns at once.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        // Wakes a blocked read (it returns 0); releases of batches still held can be sent.
        let _ = self.stream.shutdown(std::net::Shutdown::Read);
    }
}

/// One batch, read in place from the shared arena; its slot returns to the host on drop.
pub struct NodeBatch {
    /// The epoch.
    pub epoch: u32,
    /// The iteration within the epoch.
    pub iteration: u32,
    /// Where each sample's bytes are, in the sampler's order.
    pub samples: Vec<Placed>,
    /// Samples left out by the skip error policy.
    pub skipped: Vec<u32>,
    slot: u32,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NodeBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBatch")
            .field("epoch", &self.epoch)
            .field("iteration", &self.iteration)
            .field("samples", &self.samples.len())
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl NodeBatch {
    /// Sample `i`'s bytes.
    pub fn bytes(&self, i: usize) -> &[u8] {
        let p = &self.samples[i];
        self.inner.arena.read_at(p.offset as usize, p.len as usize)
    }

    /// Every sample's bytes as one run, when they lie back to back in sample order (the
    /// host places them so): a batch of equal-sized samples is then one array. `None` for
    /// an empty batch or samples placed apart.
    pub fn contiguous(&self) -> Option<&[u8]> {
        let first = self.samples.first()?;
        let mut end = first.offset;
        for p in &self.samples {
            if p.offset != end {
                return None;
            }
            end += p.len;
        }
        Some(
            self.inner
                .arena
                .read_at(first.offset as usize, (end - first.offset) as usize),
        )
    }

    /// As [`NodeBatch::contiguous`], writable: the slot is this rank's alone until the batch
    /// drops (the host writes a slot only after its release).
    pub fn contiguous_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.contiguous()?.len();
        let offset = self.samples[0].offset as usize;
        // SAFETY: the range was checked to be this batch's samples, inside the arena; the
        // slot protocol gives the range to this batch alone until it drops and releases the
        // slot, and the `&mut self` borrow keeps every other slice of it from this batch
        // away while this one lives.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.inner.arena.range_ptr(offset, len), len)
        })
    }

    /// The batch's slot, for a consumer that tracks buffers.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

impl Drop for NodeBatch {
    fn drop(&mut self) {
        // A host that is gone cannot take the slot back; the next call says so.
        if let Ok(mut w) = self.inner.writer.lock() {
            let _ = w.write_all(&ToHost::Release { slot: self.slot }.encode());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    use crate::fdpass::send_with_fd;

    /// A squatter of this user on the name of job `tag`, answering the first connection with
    /// `answer`, and the local rank 1 env that connects to it.
    fn squat(tag: &str, answer: impl FnOnce(UnixStream) + Send + 'static) -> NodeEnv {
        let env = NodeEnv::new(
            1,
            2,
            1,
            2,
            0,
            1,
            format!("unit-{}-{tag}", std::process::id()),
        )
        .unwrap();
        let addr = SocketAddr::from_abstract_name(env.address().as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            answer(stream);
        });
        env
    }

    /// Attaches on a thread: a hang fails the test instead of stalling it.
    fn attach_within(env: NodeEnv, timeout: Duration) -> Result<NodeRank, NodeError> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(NodeRank::attach(&env, vec![], timeout));
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("attach hung past its timeout")
    }

    #[test]
    fn an_unsealed_arena_from_a_squatter_is_refused() {
        let bytes = 2 * 4096u64;
        let env = squat("unsealed", move |mut stream| {
            let mut buf = Vec::new();
            assert!(read_frame(&mut stream, &mut buf).unwrap(), "a hello came");
            // SAFETY: a NUL-terminated literal; the descriptor is owned at once below.
            let raw = unsafe { libc::memfd_create(c"lobster-test-squat".as_ptr(), 0) };
            assert!(raw >= 0);
            // SAFETY: memfd_create just returned it, owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: plain system call on a descriptor we own.
            assert_eq!(unsafe { libc::ftruncate(raw, bytes as libc::off_t) }, 0);
            let welcome = ToRank::Welcome {
                pid: 1,
                arena_bytes: bytes,
                slots: 1,
                positions: String::new(),
            };
            send_with_fd(&stream, &welcome.encode(), fd.as_fd()).unwrap();
            // Held open until the rank has looked at it.
            let _ = stream.read(&mut [0u8; 1]);
        });
        let e = attach_within(env, Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("F_GET_SEALS"), "{e}");
    }

    /// Attaches with `keep_waiting` saying no at its `n`th question, on a thread.
    fn attach_asked(env: NodeEnv, n: usize) -> (Result<NodeRank, NodeError>, usize) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut asked = 0;
            let got = NodeRank::attach_while(&env, vec![], Duration::from_secs(300), || {
                asked += 1;
                asked < n
            });
            let _ = tx.send((got, asked));
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the attach went on waiting after its caller said no")
    }

    #[test]
    fn a_wait_for_a_host_not_there_ends_when_the_caller_says_no() {
        let env = NodeEnv::new(
            1,
            2,
            1,
            2,
            0,
            1,
            format!("unit-{}-absent", std::process::id()),
        )
        .unwrap();
        let (got, asked) = attach_asked(env, 3);
        assert!(matches!(got, Err(NodeError::Interrupted { .. })), "{got:?}");
        assert_eq!(asked, 3);
    }

    #[test]
    fn a_wait_for_the_welcome_ends_when_the_caller_says_no() {
        let (hold, held) = mpsc::channel::<()>();
        let env = squat("interrupted-welcome", move |stream| {
            let _ = held.recv();
            drop(stream);
        });
        let (got, asked) = attach_asked(env, 3);
        drop(hold);
        assert!(matches!(got, Err(NodeError::Interrupted { .. })), "{got:?}");
        assert_eq!(asked, 3);
    }

    #[test]
    fn a_host_that_never_welcomes_is_given_up_naming_it() {
        let (hold, held) = mpsc::channel::<()>();
        let env = squat("no-welcome", move |stream| {
            // Reads nothing, answers nothing, until the rank gave up.
            let _ = held.recv();
            drop(stream);
        });
        let address = env.address();
        let e = attach_within(env, Duration::from_millis(300)).unwrap_err();
        drop(hold);
        assert!(
            matches!(&e, NodeError::NoWelcome { address: a, pid, .. }
                if *a == address && *pid == std::process::id()),
            "{e}"
        );
    }
}
