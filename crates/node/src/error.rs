//! What can go wrong between a node's host and its rank processes.

use std::fmt;

/// An error of lobster-node: every variant names what failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum NodeError {
    /// The launcher's environment does not say where this process stands, or says it
    /// inconsistently: the variable and its value.
    Launch { variable: String, reason: String },
    /// A system call failed: which, on what.
    Os {
        call: &'static str,
        what: String,
        source: std::io::Error,
    },
    /// The arena cannot be made: its size against the memory available.
    ArenaTooLarge { bytes: u64, available_bytes: u64 },
    /// The host refused a rank's configuration: the first field that differs.
    Mismatch {
        field: String,
        host: String,
        rank: String,
    },
    /// No host answered in time.
    NoHost { address: String, waited_s: f64 },
    /// The caller stopped the wait for the host (a signal arrived): what it waited for.
    Interrupted { address: String, waited_s: f64 },
    /// The host's name is held by another process (a host of the same job id and node still
    /// running, or a squatter), so this host cannot listen.
    AddressTaken { address: String },
    /// The process listening at the host's name runs as another user (and not root): a
    /// squatter, refused before this rank says anything.
    Untrusted {
        address: String,
        pid: u32,
        uid: u32,
        our_uid: u32,
    },
    /// The host refused this process's user; it says nothing more to another user.
    NotAllowed { address: String, our_uid: u32 },
    /// The host accepted the connection but sent no welcome in time.
    NoWelcome {
        address: String,
        pid: u32,
        waited_s: f64,
    },
    /// The host went away (closed its socket, died): named by its address and pid.
    HostGone {
        address: String,
        pid: u32,
        reason: String,
    },
    /// Another rank of the node went away, so this synchronous job cannot go on.
    RankGone { rank: usize, reason: String },
    /// A message that does not parse: the protocol was broken.
    Protocol { reason: String },
    /// The loader failed; its error, as the host reported it.
    Loader { reason: String },
    /// The loader failed this rank's batch (the job may go on, as the error policy says).
    Batch { kind: Failure, reason: String },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Launch { variable, reason } => {
                write!(f, "launcher environment: {variable}: {reason}")
            }
            NodeError::Os { call, what, source } => write!(f, "{call} on {what}: {source}"),
            NodeError::ArenaTooLarge {
                bytes,
                available_bytes,
            } => write!(
                f,
                "the batch arena needs {bytes} bytes but only {available_bytes} are available \
                 (MemAvailable): lower the slots or the batch size"
            ),
            NodeError::Mismatch { field, host, rank } => write!(
                f,
                "configuration differs from the host's in {field}: host {host}, this rank {rank}"
            ),
            NodeError::NoHost { address, waited_s } => write!(
                f,
                "no host answered at {address} after {waited_s:.1} s (is local rank 0 running \
                 with the same job id?)"
            ),
            NodeError::Interrupted { address, waited_s } => write!(
                f,
                "waiting for the host at @{address} interrupted after {waited_s:.1} s"
            ),
            NodeError::AddressTaken { address } => write!(
                f,
                "the host's socket @{address} is held by another process: a host of the same \
                 job id and node still running (a stale job?) or a squatter; end it or choose \
                 another job id (LOBSTER_JOB_ID)"
            ),
            NodeError::Untrusted {
                address,
                pid,
                uid,
                our_uid,
            } => write!(
                f,
                "the process listening at @{address} (pid {pid}) runs as uid {uid}, neither \
                 this process's uid {our_uid} nor root: refusing it as the host (a squatter on \
                 the job's name?)"
            ),
            NodeError::NotAllowed { address, our_uid } => write!(
                f,
                "the host at @{address} refused this process (uid {our_uid}): only the host's \
                 own user or root may attach"
            ),
            NodeError::NoWelcome {
                address,
                pid,
                waited_s,
            } => write!(
                f,
                "the host at @{address} (pid {pid}) sent no welcome within {waited_s:.1} s"
            ),
            NodeError::HostGone {
                address,
                pid,
                reason,
            } => write!(
                f,
                "the node's host (pid {pid}, {address}) went away: {reason}"
            ),
            NodeError::RankGone { rank, reason } => {
                write!(f, "local rank {rank} went away: {reason}")
            }
            NodeError::Protocol { reason } => write!(f, "host protocol: {reason}"),
            NodeError::Loader { reason } => write!(f, "loader: {reason}"),
            NodeError::Batch { reason, .. } => write!(f, "loader: {reason}"),
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NodeError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl NodeError {
    /// The last OS error of `call` on `what`.
    pub(crate) fn last_os(call: &'static str, what: impl Into<String>) -> Self {
        NodeError::Os {
            call,
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}

/// What kind of failure a failed batch was, so that a rank reports it as the in-process
/// loader would (a Python caller catches a read error as a read error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A sample could not be read.
    Read,
    /// A sample could not be decoded.
    Decode,
    /// An epoch skipped more samples than its budget allows.
    TooManyFailures,
    /// Anything else the loader reported.
    Other,
}

impl Failure {
    /// The class of one of the facade's errors.
    pub fn of(e: &lobster_io::Error) -> Failure {
        use lobster_io::Error as E;
        match e {
            E::Read { .. } | E::SizeChanged { .. } => Failure::Read,
            E::Decode { .. } => Failure::Decode,
            E::TooManyFailures { .. } => Failure::TooManyFailures,
            _ => Failure::Other,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Failure::Read => 1,
            Failure::Decode => 2,
            Failure::TooManyFailures => 3,
            Failure::Other => 0,
        }
    }

    pub(crate) fn from_code(c: u8) -> Result<Failure, NodeError> {
        match c {
            0 => Ok(Failure::Other),
            1 => Ok(Failure::Read),
            2 => Ok(Failure::Decode),
            3 => Ok(Failure::TooManyFailures),
            k => Err(NodeError::Protocol {
                reason: format!("unknown failure kind {k}"),
            }),
        }
    }
}
