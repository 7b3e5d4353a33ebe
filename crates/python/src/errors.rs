//! The `lobster_io.Error` hierarchy and the mapping of the Rust crates' errors onto it.

use lobster_node::{Failure, NodeError as Node};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::PyErr;

create_exception!(
    lobster_io,
    Error,
    PyException,
    "Base class of every lobster_io error."
);
create_exception!(
    lobster_io,
    ReadError,
    Error,
    "A sample could not be read: its id, file and cause are in the message."
);
create_exception!(
    lobster_io,
    DecodeError,
    Error,
    "A sample could not be decoded: its id, file and cause are in the message."
);
create_exception!(
    lobster_io,
    DatasetError,
    Error,
    "The dataset could not be opened or indexed."
);
create_exception!(
    lobster_io,
    TooManyFailures,
    Error,
    "An epoch skipped more samples than its failure budget allows."
);
create_exception!(
    lobster_io,
    StoppedError,
    Error,
    "The loader stopped (closed, ended, or failed earlier)."
);
create_exception!(
    lobster_io,
    NodeError,
    Error,
    "The node's ranks could not meet or lost each other (the host, local rank 0, went away, \
     a rank was refused, or another rank failed)."
);

create_exception!(
    lobster_io,
    StateError,
    Error,
    "A saved loader state cannot be loaded: damaged, or of another job (the message names the \
     field that differs)."
);

/// The facade's parameters that `Loader` takes under other names, as those names.
const RENAMED: [(&str, &str); 2] = [
    ("disk_cache", "cache.disk"),
    ("disk_cache_bytes", "cache.disk_bytes"),
];

/// The facade's error as the exception a Python caller catches.
pub(crate) fn loader_error(e: lobster_io::Error) -> PyErr {
    use lobster_io::Error as E;
    let text = e.to_string();
    match e {
        E::InvalidParameter {
            parameter,
            value,
            allowed,
        } => match RENAMED.iter().find(|(facade, _)| *facade == parameter) {
            Some((_, name)) => {
                PyValueError::new_err(format!("invalid {name} = {value}: allowed {allowed}"))
            }
            None => PyValueError::new_err(text),
        },
        E::Read { .. } | E::SizeChanged { .. } => ReadError::new_err(text),
        E::Decode { .. } => DecodeError::new_err(text),
        E::TooManyFailures { .. } => TooManyFailures::new_err(text),
        E::Stopped { .. } => StoppedError::new_err(text),
        E::Dataset { .. } => DatasetError::new_err(text),
        E::Resume { .. } | E::StateUnreadable { .. } => StateError::new_err(text),
        _ => Error::new_err(text),
    }
}

/// The node's error as an exception: a failed batch as the in-process loader raises it.
pub(crate) fn node_error(e: Node) -> PyErr {
    match e {
        Node::Batch { kind, reason } => match kind {
            Failure::Read => ReadError::new_err(reason),
            Failure::Decode => DecodeError::new_err(reason),
            Failure::TooManyFailures => TooManyFailures::new_err(reason),
            Failure::Other => Error::new_err(reason),
        },
        Node::Launch { .. } => PyValueError::new_err(e.to_string()),
        // Ranks that loaded different states (their hellos say where they resume).
        Node::Mismatch { ref field, .. } if field.starts_with("resume") => {
            StateError::new_err(e.to_string())
        }
        other => NodeError::new_err(other.to_string()),
    }
}
