//! numpy arrays from `.npy` and `.npz` bytes: lobster-array's parser, each array's data
//! copied once into the array's own memory, as `np.load` gives it (writable, in the file's
//! dtype, byte order and memory order), or on request a read-only view of the bytes.

use lobster_io::arrays::{self, NpyArray};
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::errors::DecodeError;

/// The array `array` of `bytes` describes: its data copied into a new numpy array, or
/// (`copy` false) a read-only view of `bytes` that keeps it alive.
fn to_numpy<'py>(
    py: Python<'py>,
    bytes: &Bound<'py, PyBytes>,
    array: &NpyArray,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let range = array.data_range();
    let data = array
        .data(bytes.as_bytes())
        .ok_or_else(|| DecodeError::new_err("an array's data outside its bytes"))?;
    let typed = if copy {
        // numpy's allocator aligns the buffer for any scalar, so the view is aligned.
        let flat = PyArray1::<u8>::from_slice(py, data);
        flat.call_method1(intern!(py, "view"), (array.dtype().descr(),))?
    } else {
        // A misaligned view is still correct: numpy reads it element by element.
        let frombuffer = py
            .import(intern!(py, "numpy"))?
            .getattr(intern!(py, "frombuffer"))?;
        let count = usize::try_from(array.elements()).map_err(|_| {
            DecodeError::new_err("an array of more elements than this machine addresses")
        })?;
        frombuffer.call1((bytes, array.dtype().descr(), count, range.start))?
    };
    let shape = PyTuple::new(py, array.shape())?;
    if array.fortran_order() {
        let order = PyDict::new(py);
        order.set_item(intern!(py, "order"), "F")?;
        typed.call_method(intern!(py, "reshape"), (shape,), Some(&order))
    } else {
        typed.call_method1(intern!(py, "reshape"), (shape,))
    }
}

/// Decodes one `.npy` file's bytes to the array `np.load` gives: its dtype, shape and order.
/// Refused (a `DecodeError` naming what) if the header is malformed, the data is not as
/// long as the header says, its dtype is not a bool, integer, float or complex scalar, or
/// it holds more than `bytes_max` bytes of data (1 GiB by default). `copy=False` gives a
/// read-only view of `data` instead of a copy: no time in the data's size.
#[pyfunction]
#[pyo3(signature = (data, bytes_max = arrays::BYTES_MAX_DEFAULT, copy = true))]
pub(crate) fn decode_array<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    bytes_max: u64,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let array = arrays::parse_npy(data.as_bytes(), bytes_max)
        .map_err(|e| DecodeError::new_err(e.to_string()))?;
    to_numpy(py, data, &array, copy)
}

/// Decodes one `.npz` archive of stored members (`np.savez`) to a dict of its arrays by
/// name, in the archive's order (`dict(np.load(f))`). Compressed archives
/// (`np.savez_compressed`) are refused, as is any member that `decode_array` would refuse;
/// `bytes_max` bounds each member's data; `copy` is as `decode_array`'s.
#[pyfunction]
#[pyo3(signature = (data, bytes_max = arrays::BYTES_MAX_DEFAULT, copy = true))]
pub(crate) fn decode_npz<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    bytes_max: u64,
    copy: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let members = arrays::parse_npz(data.as_bytes(), bytes_max)
        .map_err(|e| DecodeError::new_err(e.to_string()))?;
    let out = PyDict::new(py);
    for member in &members {
        out.set_item(member.key(), to_numpy(py, data, member.array(), copy)?)?;
    }
    Ok(out)
}
