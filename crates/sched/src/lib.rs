//! lobster-sched: the cost model and the min-max allocator of io_depth and decode threads.
//!
//! Pure logic: no I/O, no threads of its own.
#![forbid(unsafe_code)]
