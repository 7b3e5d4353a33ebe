//! lobster_io for Python: the facade's image loader as a Python iterator whose batches are
//! numpy arrays over the loader's own buffers, without copies. The package holds no logic
//! of its own: it maps Python's arguments onto the facade's [`lobster_io::LoaderBuilder`]
//! (and, with several ranks a node, onto lobster-node's host and ranks), the errors onto an
//! exception hierarchy, and the batches onto arrays.

mod arrays;
mod batch;
mod errors;
mod groups;
mod loader;
mod mpi;
mod params;
mod recycle;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;

use crate::errors::DecodeError;

/// Decodes one JPEG or PNG to an `[H, W, 3]` uint8 array (lobster-image's decoder, as the
/// loader's workers run it), decoded into the array's own memory.
#[pyfunction]
fn decode_image<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut pixels = Vec::new();
    let (w, h) = lobster_io::images::decode_into(
        data,
        lobster_io::images::PIXELS_MAX_DEFAULT,
        &mut pixels,
        0,
    )
    .map_err(|e| DecodeError::new_err(e.to_string()))?;
    // The array takes the buffer as it is: no copy.
    PyArray1::from_vec(py, pixels)
        .reshape([h as usize, w as usize, 3])
        .map(Bound::into_any)
}

/// Whether this lobster_io was built with MPI (the `mpi` feature): under `mpirun`, or `srun`
/// with PMI, each process is then a node whose loader fetches from its peers' caches.
#[pyfunction]
fn built_with_mpi() -> bool {
    mpi::BUILT_WITH_MPI
}

#[pymodule]
mod _lobster_io {
    #[pymodule_export]
    use super::arrays::{decode_array, decode_npz};
    #[pymodule_export]
    use super::batch::Batch;
    #[pymodule_export]
    use super::built_with_mpi;
    #[pymodule_export]
    use super::decode_image;
    #[pymodule_export]
    use super::errors::{
        DatasetError, DecodeError, Error, NodeError, ReadError, StateError, StoppedError,
        TooManyFailures,
    };
    #[pymodule_export]
    use super::loader::{_close_at_exit, Loader};
}
