//! Dropping the loader mid-epoch returns promptly and leaves no thread behind. Its own test
//! binary, since it counts the process's threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_io::{Dataset, Execution, LoaderBuilder, StorageEmulation};

fn make_dataset(dir: &std::path::Path, samples: u32) -> Arc<Dataset> {
    for i in 0..samples {
        let class = dir.join(format!("c{}", i % 2));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(
            class.join(format!("{i:06}.bin")),
            vec![i as u8; 1000 + i as usize],
        )
        .unwrap();
    }
    Arc::new(Dataset::open_image_folder(dir).unwrap())
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn dropping_the_loader_mid_epoch_returns_promptly_and_joins_its_threads() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 200);
    for execution in [Execution::Pipelined, Execution::ReadThenDecode] {
        let before = thread_count();
        let mut loader = LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(4)
            .epochs(50)
            .execution(execution)
            .decode_threads(4)
            .storage_emulation(Some(StorageEmulation {
                bandwidth_bytes_per_s: 1e6,
                latency_us: 2000,
            }))
            .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.len()))
            .build()
            .unwrap();
        let mut handles = loader.ranks().unwrap();
        let first = handles[0].next().unwrap().unwrap();
        assert_eq!(first.samples.len(), 4);
        assert!(thread_count() > before);
        let started = Instant::now();
        drop(loader);
        let took = started.elapsed();
        // Not a speed assertion: a hung join would never return; this bounds a broken one.
        assert!(took < Duration::from_secs(10), "drop took {took:?}");
        assert_eq!(thread_count(), before, "{execution:?}: every thread joined");
        // Handles outliving the loader report that it stopped.
        let after = handles[1].next();
        assert!(matches!(after, Some(Err(_)) | None | Some(Ok(_))));
        drop(handles);
    }
}
