//! The start-up agreement across real processes, for `mpirun -np N`:
//!
//! `mpi_agree agree`: every node brings the same inputs; every node must pass.
//! `mpi_agree hosted`: the program initialises MPI first; lobster agrees over it and, when
//! dropped, leaves it initialised (the program's own barrier after it must work).
//! `mpi_agree funneled`: the program initialises MPI with `MPI_THREAD_FUNNELED`; lobster
//! must refuse, naming the level.
//! `mpi_agree differ K`: node K brings another seed; every node must fail naming the seed
//! and node K (node 1 when K is 0: node 0 is the reference). Exits 0 only if what happened is what was expected, so `.ci/run` can run
//! it under mpirun as a test.

use anyhow::{bail, Context, Result};
use lobster_net::{Agreement, MpiNodes, NetError};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("hosted") => return hosted(),
        Some("funneled") => return funneled(),
        _ => {}
    }
    let nodes = MpiNodes::start()?;
    let me = nodes.node();
    let differ: Option<usize> = match args.first().map(String::as_str) {
        Some("agree") => None,
        Some("differ") => Some(
            args.get(1)
                .context("differ needs the node that differs")?
                .parse()?,
        ),
        _ => bail!("usage: mpi_agree agree | differ NODE | hosted | funneled"),
    };
    let seed = if differ == Some(me) { "8" } else { "7" };
    let fields = vec![
        ("seed".to_owned(), seed.to_owned()),
        ("nodes".to_owned(), nodes.nodes().to_string()),
        ("samples".to_owned(), "100000".to_owned()),
    ];
    let result = nodes.agree(Agreement::new(fields));
    nodes.barrier()?;
    match (differ, result) {
        (None, Ok(())) => println!("node {me}: agreed"),
        // Node 0 is the reference: when it is the odd one, node 1 is named as differing.
        (
            Some(k),
            Err(NetError::Disagree {
                node,
                field,
                ours,
                theirs,
            }),
        ) if field == "seed"
            && ((k > 0 && node == k && ours == "7" && theirs == "8")
                || (k == 0 && node == 1 && ours == "8" && theirs == "7")) =>
        {
            println!("node {me}: refused as expected: node {node} has seed {theirs}")
        }
        (expected, got) => bail!("node {me}: expected a differing node {expected:?}, got {got:?}"),
    }
    Ok(())
}

fn same_fields(nodes: &MpiNodes) -> Agreement {
    Agreement::new(vec![("nodes".to_owned(), nodes.nodes().to_string())])
}

fn hosted() -> Result<()> {
    use mpi::traits::{Communicator, CommunicatorCollectives};
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
        .context("initialising MPI in the program")?;
    {
        let nodes = MpiNodes::start()?;
        nodes.agree(same_fields(&nodes))?;
    }
    // lobster is gone; MPI must still be the program's.
    let world = universe.world();
    world.barrier();
    println!("node {}: MPI still up after lobster", world.rank());
    Ok(())
}

fn funneled() -> Result<()> {
    let (_universe, level) = mpi::initialize_with_threading(mpi::Threading::Funneled)
        .context("initialising MPI in the program")?;
    if level >= mpi::Threading::Serialized {
        // The library gave more than was asked: nothing to refuse.
        println!("MPI gave {level:?} for Funneled; nothing to check");
        return Ok(());
    }
    match MpiNodes::start() {
        Err(NetError::Mpi { reason }) if reason.contains("Funneled") => {
            println!("refused as expected: {reason}");
            Ok(())
        }
        other => bail!("expected a refusal naming Funneled, got {other:?}"),
    }
}
