//! Integration tests across the lobster-io crates live in this package's `[[test]]` targets.
