//! Benchmarks of lobster-io live in this package's `[[bench]]` targets.
