//! The code of the `lobster` command that its bench binary, `lobster-bench` (in
//! `benches/commands`), runs too: the main job's loop and strategies (`run`), the dataset
//! generator (`gen`) and the process figures (`process`). Not a library for embedders: it
//! is the CLI's own code, shared so the bench commands measure exactly what `lobster run`
//! runs without a second copy.
//!
//! ```no_run
//! // Both binaries hold the heap the same way before any thread starts.
//! lobster_cli::hold_heap_unless_set();
//! ```

#![forbid(unsafe_code)]

pub mod gen;
pub mod process;
pub mod run;

/// Holds the heap as a loader wants it (see `lobster_io::hold_heap`), unless the
/// environment sets one of glibc's malloc variables, which then decide. Call it before any
/// thread starts: left to glibc, resident memory creeps up epoch after epoch.
pub fn hold_heap_unless_set() {
    let set = |name| std::env::var_os(name).is_some();
    if ![
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
    ]
    .into_iter()
    .any(set)
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        lobster_io::hold_heap(lobster_io::HeapLimits::for_loader(cores));
    }
}
