//! Loaders on real processes fetching from each other's caches, for `mpirun -np N
//! mpi_peers DIR`: node 0 writes a dataset of generated files into DIR, then every node runs
//! its loader (2 ranks as threads, a static cache of a third of the dataset, slow emulated
//! storage so the peers are preferred) with its peers over MPI, the nodes in lock-step.
//! Exits 0 only if every rank got its batches with every sample's file bytes, every planned
//! remote hit was served (no remote miss), and some were planned.

use std::sync::{Arc, Barrier};

use anyhow::{bail, Context, Result};
use lobster_io::net::{MpiNodes, Transport};
use lobster_io::{CachePolicy, Dataset, LoaderBuilder, StorageEmulation};

fn main() -> Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).context("usage: mpi_peers DIR")?);
    let nodes = Arc::new(MpiNodes::start()?);
    let (me, n) = (nodes.node(), nodes.nodes());
    if me == 0 {
        let _ = std::fs::remove_dir_all(&dir);
        for i in 0..240u32 {
            let class = dir.join(format!("c{}", i % 4));
            std::fs::create_dir_all(&class)?;
            let bytes: Vec<u8> = (0..200 + (i as usize * 37) % 900)
                .map(|k| (k as u32 ^ i) as u8)
                .collect();
            std::fs::write(class.join(format!("{i:04}.bin")), bytes)?;
        }
    }
    nodes.barrier()?;
    let ds = Arc::new(Dataset::open_folder(
        &dir,
        &lobster_io::FolderOptions {
            extensions: vec!["bin".into()],
            table_dir: None,
        },
    )?);
    let third = ds.total_bytes() / 3;
    let ranks = 2;
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(n, ranks, me)
        .seed(3)
        .batch_size(4)
        .epochs(4)
        .cache(CachePolicy::Static, third)
        .decode_threads(2)
        .io_depth(4)
        .storage_emulation(Some(StorageEmulation {
            bandwidth_bytes_per_s: 50e6,
            latency_us: 500,
        }))
        .peers(nodes.clone() as Arc<dyn Transport>)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()?;
    nodes.barrier()?;
    let local = Barrier::new(ranks);
    let handles = loader.ranks().context("rank handles")?;
    let wrong: usize = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|h| {
                let (local, nodes, ds) = (&local, &nodes, &ds);
                s.spawn(move || {
                    let mut wrong = 0;
                    for batch in h {
                        match batch {
                            Ok(b) => {
                                for smp in &b.samples {
                                    let file = std::fs::read(&ds.samples()[smp.id as usize].path);
                                    if file.ok().as_ref() != Some(&smp.value) {
                                        wrong += 1;
                                    }
                                }
                            }
                            Err(e) => {
                                eprintln!("node {me}: {e}");
                                wrong += 1;
                            }
                        }
                        // The step ends for the whole job, as DDP's all-reduce ends it.
                        if local.wait().is_leader() && nodes.barrier().is_err() {
                            wrong += 1;
                        }
                        local.wait();
                    }
                    wrong
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank panicked"))
            .sum()
    });
    let m = loader.metrics();
    drop(loader);
    println!(
        "node {me}: {} samples, {} local hits, {} planned remote, {} remote hits, {} remote misses",
        m.samples, m.hits, m.planned_remote_hits, m.remote_hits, m.remote_misses
    );
    let planned_total = nodes.all_gather(m.planned_remote_hits.to_le_bytes().to_vec())?;
    let planned_total: u64 = planned_total
        .iter()
        .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
        .sum();
    if wrong > 0 {
        bail!("node {me}: {wrong} samples or steps went wrong");
    }
    if m.remote_hits != m.planned_remote_hits || m.remote_misses != 0 {
        bail!("node {me}: planned remote hits not all served: {m:?}");
    }
    if planned_total == 0 {
        bail!("no remote hit was planned on any node: the test plans none");
    }
    Ok(())
}
