//! One lobster-io engine per node, shared by the node's rank processes.
//!
//! PyTorch DDP runs a process per GPU. Lobster's decisions (a node-wide cache, I/O and
//! decode threads balanced across the node's ranks) need one engine per node, so local rank
//! 0's process hosts the in-process loader for all the node's ranks on its own threads, and
//! every local rank (rank 0 too) attaches to it over a Unix socket in the abstract namespace.
//! Batches land in a shared arena made with `memfd_create` and passed to each rank with
//! `SCM_RIGHTS`: nothing is left in `/dev/shm` or on disk whatever way a process ends.
//!
//! The socket's name (`lobster-io/<job>/node-<n>`) is visible to every user of the machine,
//! so each side checks the other's user with `SO_PEERCRED`: the host takes ranks of its own
//! user or root only, telling anyone else nothing (not even which field of the configuration
//! differs), and a rank says nothing to a listener of another user (a squatter on the name)
//! and maps only an arena sealed as the host seals it. A host whose name is already held
//! fails saying so ([`NodeError::AddressTaken`]). Each hello is read on its own thread under
//! one deadline, so a connection that trickles its bytes or says nothing holds up no rank.
//!
//! Local rank 0 hosts, on its own threads, rather than starting a separate `lobster host`
//! process: the host lives and dies with a process the launcher already supervises, so no
//! orphan can outlive the job, and a host that dies takes down the rank the launcher
//! restarts the job for anyway.
//!
//! ```no_run
//! use std::time::Duration;
//! use lobster_io::{Dataset, LoaderBuilder};
//! use lobster_node::{fingerprint, HostOptions, NodeEnv, NodeHost, NodeRank};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = NodeEnv::from_env()?; // torchrun, srun or mpirun
//! let dataset = std::sync::Arc::new(Dataset::open("/data/train")?);
//! let loader_config = lobster_io::LoaderConfig {
//!     job: lobster_io::JobConfig {
//!         nodes: env.nodes,
//!         node: env.node,
//!         ranks_per_node: env.local_world_size,
//!         batch_size: 32,
//!         ..Default::default()
//!     },
//!     ..Default::default()
//! };
//! // What every rank must agree on, checked when it attaches.
//! let config = fingerprint(&dataset, &loader_config, 7);
//! let builder = LoaderBuilder::new(dataset.clone())
//!     .config(loader_config)
//!     .seed(7)
//!     .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()));
//! let host = if env.is_host() {
//!     let options = HostOptions {
//!         slots_per_rank: 3,
//!         slot_bytes: 32 * dataset.max_sample_bytes(),
//!         attach_timeout: Duration::from_secs(60),
//!     };
//!     Some(NodeHost::start(&env, builder.build()?, config.clone(), options)?)
//! } else {
//!     None
//! };
//! for batch in NodeRank::attach(&env, config, Duration::from_secs(60))? {
//!     let batch = batch?;
//!     for i in 0..batch.samples.len() {
//!         let _bytes: &[u8] = batch.bytes(i); // in the shared arena, not copied
//!     }
//! } // each batch's slot goes back to the host as it drops
//! if let Some(host) = host {
//!     host.wait()?;
//! }
//! # Ok(())
//! # }
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod arena;
mod barrier;
mod cred;
mod error;
mod fdpass;
mod host;
mod launch;
mod rank;
mod wire;

pub use arena::SharedArena;
pub use error::{Failure, NodeError};
pub use host::{fingerprint, HostOptions, NodeHost, HELLOS_MAX};
pub use launch::NodeEnv;
pub use rank::{NodeBatch, NodeRank, RankStopper, ATTACH_POLL};
pub use wire::Placed;

/// Checker run by the fuzz target `node_wire`: arbitrary bytes through the decoders of the
/// hello, welcome, refusal and rank messages, and through the frame reader, never panic,
/// never allocate past a bounded multiple of the input, and what decodes encodes back the
/// same.
#[cfg(fuzzing)]
pub fn fuzz_check_wire(data: &[u8]) {
    wire::fuzz_check(data);
}
