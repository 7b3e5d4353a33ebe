//! The nodes of an MPI job, on one thread that owns MPI.
//!
//! lobster's threads never call MPI themselves: they send commands to the owning thread and
//! wait for its answer, so MPI is called from one thread at a time and
//! `MPI_THREAD_SERIALIZED` is enough. If the program initialised MPI before, lobster uses that
//! library and leaves finalising it to the program; otherwise it initialises MPI on its
//! thread and finalises it when [`MpiNodes`] drops.

use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};
use mpi::datatype::PartitionMut;
use mpi::environment::{self, Threading};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use mpi::Count;

use crate::agreement::{Agreement, ENCODED_MAX_BYTES};
use crate::error::NetError;

/// What the owning thread is asked to do; each command carries where its answer goes.
enum Command {
    Agree(Agreement, Sender<Result<(), NetError>>),
    Barrier(Sender<()>),
}

/// This process as one node of the MPI job.
#[derive(Debug)]
pub struct MpiNodes {
    commands: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    node: usize,
    nodes: usize,
}

impl MpiNodes {
    /// Starts the thread that owns MPI (initialising it if the program has not).
    ///
    /// # Errors
    /// MPI initialised, by the program or here, with less than `MPI_THREAD_SERIALIZED`, or the
    /// thread could not start.
    pub fn start() -> Result<MpiNodes, NetError> {
        let (started_tx, started_rx) = bounded(1);
        let (commands, queue) = bounded(16);
        let thread = std::thread::Builder::new()
            .name("lobster-mpi".into())
            .spawn(move || own_mpi(started_tx, queue))
            .map_err(|e| NetError::Mpi {
                reason: format!("cannot start the thread that owns MPI: {e}"),
            })?;
        let started = started_rx.recv().unwrap_or(Err(NetError::Stopped));
        let (node, nodes) = match started {
            Ok(place) => place,
            Err(e) => {
                let _ = thread.join();
                return Err(e);
            }
        };
        Ok(MpiNodes {
            commands: Some(commands),
            thread: Some(thread),
            node,
            nodes,
        })
    }

    /// This process's node, its rank in `MPI_COMM_WORLD`.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Nodes in the job.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Checks that every node brings the same fields: collective, every node must call it.
    ///
    /// # Errors
    /// [`NetError::Disagree`] on every node, naming the first node and field that differ from
    /// node 0's; [`NetError::Garbled`] if a node's fields did not decode.
    pub fn agree(&self, ours: Agreement) -> Result<(), NetError> {
        let (tx, rx) = bounded(1);
        self.send(Command::Agree(ours, tx))?;
        rx.recv().map_err(|_| NetError::Stopped)?
    }

    /// Waits until every node is here.
    ///
    /// # Errors
    /// The owning thread has stopped.
    pub fn barrier(&self) -> Result<(), NetError> {
        let (tx, rx) = bounded(1);
        self.send(Command::Barrier(tx))?;
        rx.recv().map_err(|_| NetError::Stopped)
    }

    fn send(&self, c: Command) -> Result<(), NetError> {
        self.commands
            .as_ref()
            .ok_or(NetError::Stopped)?
            .send(c)
            .map_err(|_| NetError::Stopped)
    }
}

impl Drop for MpiNodes {
    fn drop(&mut self) {
        // The thread ends when its queue closes, finalising MPI if it initialised it.
        drop(self.commands.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The owning thread: initialise (or take up) MPI, say where this node stands, then serve
/// commands until the queue closes.
fn own_mpi(started: Sender<Result<(usize, usize), NetError>>, queue: Receiver<Command>) {
    let universe = if environment::is_initialized() {
        None
    } else {
        match mpi::initialize_with_threading(Threading::Serialized) {
            Some((universe, _)) => Some(universe),
            None => {
                let _ = started.send(Err(NetError::Mpi {
                    reason: "MPI_Init_thread failed".into(),
                }));
                return;
            }
        }
    };
    let level = environment::threading_support();
    if level < Threading::Serialized {
        let _ = started.send(Err(NetError::Mpi {
            reason: format!(
                "MPI was initialised with threading {level:?}; lobster calls MPI from its own \
                 thread and needs Serialized or Multiple (MPI_Init_thread)"
            ),
        }));
        return;
    }
    let world = SimpleCommunicator::world();
    let place = (world.rank() as usize, world.size() as usize);
    if started.send(Ok(place)).is_err() {
        return;
    }
    for command in queue {
        match command {
            Command::Agree(ours, answer) => {
                let _ = answer.send(agree(&world, &ours));
            }
            Command::Barrier(answer) => {
                world.barrier();
                let _ = answer.send(());
            }
        }
    }
    drop(universe);
}

/// One allgather of the digests; if they differ, an allgather of the fields' lengths and one
/// of the fields, so that every node can name what differs.
fn agree(world: &SimpleCommunicator, ours: &Agreement) -> Result<(), NetError> {
    let nodes = world.size() as usize;
    let mut digests = vec![0u64; nodes];
    world.all_gather_into(&ours.digest(), &mut digests[..]);
    if digests.iter().all(|&d| d == digests[0]) {
        return Ok(());
    }
    let bytes = ours.encode();
    // Every node sends its length whatever it is, so the collectives stay matched; a length
    // past the bound is refused after the exchange, on every node alike.
    let mut lens = vec![0u64; nodes];
    world.all_gather_into(&(bytes.len() as u64), &mut lens[..]);
    if let Some(node) = lens.iter().position(|&l| l as usize > ENCODED_MAX_BYTES) {
        return Err(NetError::Garbled {
            node,
            reason: format!("{} bytes of plan inputs", lens[node]),
        });
    }
    let counts: Vec<Count> = lens.iter().map(|&l| l as Count).collect();
    let displs: Vec<Count> = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let total = lens.iter().sum::<u64>() as usize;
    let mut all = vec![0u8; total];
    {
        let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        world.all_gather_varcount_into(&bytes[..], &mut partition);
    }
    let agreements = (0..nodes)
        .map(|n| {
            let at = displs[n] as usize;
            Agreement::decode(n, &all[at..at + lens[n] as usize])
        })
        .collect::<Result<Vec<_>, _>>()?;
    Agreement::check(&agreements)?;
    // Digests differed but the fields did not: only a broken exchange does that.
    Err(NetError::Garbled {
        node: digests.iter().position(|&d| d != digests[0]).unwrap_or(0),
        reason: "its digest differs from node 0's though its fields do not".into(),
    })
}
