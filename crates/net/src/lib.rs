//! lobster-io across nodes.
//!
//! Every node computes every node's cache plan from the same inputs (seed, world, sizes,
//! capacity, policy), so who holds which sample when is known locally, without traffic. That
//! holds only if the nodes really share those inputs: [`Agreement`] is the start-up check
//! that they do, refusing to run with an error naming the first field where a node differs
//! from node 0.
//!
//! A loader reaches its peers through a [`Transport`]: it fetches samples a peer's cache holds
//! and serves its own cache to them. [`InProcessNodes`] connects nodes in one process;
//! [`EmulatedLink`] charges any transport's answers an emulated fabric's latency and bandwidth.
//!
//! With the `mpi` feature, `MpiNodes` runs the check over MPI: one thread owns MPI (so the
//! library needs only `MPI_THREAD_SERIALIZED`), and a program that initialised MPI itself
//! keeps it: lobster uses it and does not finalise it.

mod agreement;
mod error;
mod in_process;
mod link;
#[cfg(feature = "mpi")]
mod mpi_nodes;
mod transport;
pub mod wire;

pub use agreement::{Agreement, Fields};
pub use bytes::Bytes;
pub use error::NetError;
pub use in_process::{InProcessNode, InProcessNodes};
pub use link::{EmulatedLink, LinkParams};
#[cfg(feature = "mpi")]
pub use mpi_nodes::{MpiNodes, Timeouts};
pub use transport::{Answer, Done, Reply, Served, Transport, TransportStats};
