//! lobster-uring: the io_uring sample reader of lobster-io.
//!
//! Turns "class `c` wants bytes `[offset, offset + len)` of file `f`" into `Bytes` in memory,
//! with each class (a rank) limited to its own io_depth of reads in flight.
