//! What can go wrong between nodes.

use std::fmt;

/// An error of lobster-net, naming what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetError {
    /// Node `node` was started with `field = theirs` where node 0 has `ours`.
    Disagree {
        node: usize,
        field: String,
        ours: String,
        theirs: String,
    },
    /// A node's fields did not decode: the exchange itself is broken.
    Garbled { node: usize, reason: String },
    /// MPI is missing something lobster needs (a threading level, an initialised library).
    Mpi { reason: String },
    /// `what` did not complete within `after`: a node is gone or stuck.
    Timeout {
        what: String,
        after: std::time::Duration,
    },
    /// The thread that owns MPI has stopped.
    Stopped,
    /// The emulated link's `parameter` is `value`, where `expected`.
    Link {
        parameter: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::Disagree {
                node,
                field,
                ours,
                theirs,
            } => write!(
                f,
                "node {node} was started with {field} = {theirs:?}, node 0 with {field} = \
                 {ours:?}: every node must plan from the same inputs"
            ),
            NetError::Garbled { node, reason } => {
                write!(f, "node {node}'s plan inputs did not decode: {reason}")
            }
            NetError::Mpi { reason } => write!(f, "MPI: {reason}"),
            NetError::Timeout { what, after } => write!(
                f,
                "{what} did not complete within {after:?}: a node has stopped or hangs"
            ),
            NetError::Stopped => write!(f, "the thread that owns MPI has stopped"),
            NetError::Link {
                parameter,
                value,
                expected,
            } => write!(
                f,
                "emulated link: {parameter} = {value}, expected {expected}"
            ),
        }
    }
}

impl std::error::Error for NetError {}
