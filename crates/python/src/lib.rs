//! lobster_io for Python: the facade's image loader as a Python iterator whose batches are
//! numpy arrays over the loader's own buffers, without copies. The package holds no logic
//! of its own: it maps Python's arguments onto the facade's [`lobster_io::LoaderBuilder`]
//! (and, with several ranks a node, onto lobster-node's host and ranks), the errors onto an
//! exception hierarchy, and the batches onto arrays.

mod batch;
mod errors;
mod groups;
mod loader;
mod mpi;
mod params;
mod recycle;

use numpy::ndarray::ArrayView3;
use numpy::PyArray3;
use pyo3::prelude::*;

use crate::errors::DecodeError;

/// Decodes one JPEG or PNG to an `[H, W, 3]` uint8 array (lobster-image's decoder, as the
/// loader's workers run it).
#[pyfunction]
fn decode_image<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyArray3<u8>>> {
    let image =
        lobster_io::images::decode(data).map_err(|e| DecodeError::new_err(e.to_string()))?;
    let (w, h) = (image.width() as usize, image.height() as usize);
    let view = ArrayView3::from_shape((h, w, 3), image.pixels()).expect("RGB rows");
    Ok(PyArray3::from_array(py, &view))
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
