// `cargo test` links the test binary against libpython: find the interpreter's own library
// at run time, not whichever libpython the system's loader finds first. Nothing under maturin.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
