//! `lobster run --mpi`: this process is one node of an MPI job. Nodes agree on the plan's
//! inputs at start-up, train in lock-step (the step barrier is an MPI collective, standing in
//! for DDP's gradient all-reduce), fetch planned misses from each other's caches, and gather
//! their results for node 0's table.

use std::sync::Arc;

use anyhow::Result;

#[cfg(feature = "mpi")]
use anyhow::Context;
#[cfg(feature = "mpi")]
use lobster_io::net::{Agreement, MpiNodes, Transport};

/// The MPI job this process is a node of.
#[cfg(feature = "mpi")]
pub(crate) struct Cluster {
    nodes: Arc<MpiNodes>,
    /// Whether misses are fetched from peers' caches (`--no-remote` turns it off).
    remote: bool,
}

/// Without the `mpi` feature no cluster can be started; `--mpi` is refused.
#[cfg(not(feature = "mpi"))]
pub(crate) enum Cluster {}

#[cfg(feature = "mpi")]
impl Cluster {
    /// Joins the MPI job (`None` without `--mpi`), checking `--nodes` against its size.
    pub(crate) fn start(mpi: bool, nodes: usize, remote: bool) -> Result<Option<Cluster>> {
        if !mpi {
            return Ok(None);
        }
        let job = MpiNodes::start().context("joining the MPI job")?;
        if job.nodes() != nodes {
            anyhow::bail!(
                "--nodes {nodes} but the MPI job has {} processes: run mpirun -np {nodes}, or \
                 pass --nodes {}",
                job.nodes(),
                job.nodes()
            );
        }
        Ok(Some(Cluster {
            nodes: Arc::new(job),
            remote,
        }))
    }

    pub(crate) fn node(&self) -> usize {
        self.nodes.node()
    }

    /// Refuses to run unless every node brings the same `fields` (the run's configuration
    /// but the node).
    pub(crate) fn agree(&self, fields: Vec<(String, String)>) -> Result<()> {
        self.nodes
            .agree(Agreement::new(fields))
            .context("checking that every node plans from the same inputs")
    }

    /// The transport the loader fetches through, unless remote hits are off.
    pub(crate) fn peers(&self) -> Option<Arc<dyn Transport>> {
        self.remote
            .then(|| self.nodes.clone() as Arc<dyn Transport>)
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        self.nodes.barrier().context("the job's step barrier")
    }

    /// Every node's bytes, in node order.
    pub(crate) fn gather(&self, ours: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.nodes
            .all_gather(ours)
            .context("gathering every node's results")
    }
}

#[cfg(not(feature = "mpi"))]
impl Cluster {
    pub(crate) fn start(mpi: bool, _nodes: usize, _remote: bool) -> Result<Option<Cluster>> {
        if mpi {
            anyhow::bail!(
                "--mpi: this lobster was built without MPI; build it with \
                 `cargo build --release -p lobster-cli --features mpi` (needs Open MPI and \
                 libclang: apt-get install libopenmpi-dev openmpi-bin libclang-dev)"
            );
        }
        Ok(None)
    }

    pub(crate) fn node(&self) -> usize {
        match *self {}
    }

    pub(crate) fn agree(&self, _fields: Vec<(String, String)>) -> Result<()> {
        match *self {}
    }

    pub(crate) fn peers(&self) -> Option<Arc<dyn lobster_io::net::Transport>> {
        match *self {}
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        match *self {}
    }

    pub(crate) fn gather(&self, _ours: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        match *self {}
    }
}
