//! Other nodes' caches: the transport a loader fetches planned remote hits through
//! ([`LoaderBuilder::peers`](crate::LoaderBuilder::peers)), in one process
//! ([`InProcessNodes`]), over MPI (`MpiNodes`, with the feature `mpi`) or any other a job brings,
//! and an emulated interconnect around any of them ([`EmulatedLink`]).

pub use lobster_net::{
    Agreement, Answer, Bytes, Done, EmulatedLink, Fields, InProcessNode, InProcessNodes,
    LinkParams, NetError, Reply, Served, Transport, TransportStats,
};
#[cfg(feature = "mpi")]
pub use lobster_net::{MpiNodes, Timeouts};
