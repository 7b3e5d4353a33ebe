//! One batch as Python sees it: its images as numpy arrays over the buffer the batch holds
//! (a collated buffer of this process, or the batch's slot of the node's shared arena),
//! returned to the loader when the batch and every view of it are gone.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use numpy::ndarray::{ArrayViewMut3, ArrayViewMut4};
use numpy::{PyArray1, PyArray3, PyArray4};
use pyo3::prelude::*;
use pyo3::types::PyList;

/// Bytes before a decoded sample's pixels: its width and height, `u32` little-endian.
pub(crate) const HEADER_BYTES: usize = 8;

/// Pixels the holder owns, written by nobody else while it lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    ptr: NonNull<u8>,
}

// SAFETY: a span points into memory its batch's holder owns (a heap buffer or the batch's
// arena slot), which nothing else touches while the holder lives and which does not move
// when the holder moves between threads.
unsafe impl Send for Span {}
// SAFETY: as above; a span is only turned into arrays, whose writers are Python's.
unsafe impl Sync for Span {}

impl Span {
    pub(crate) fn of(bytes: &mut [u8]) -> Span {
        Span {
            ptr: NonNull::new(bytes.as_mut_ptr()).unwrap_or(NonNull::dangling()),
        }
    }

    pub(crate) fn address(self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

/// What holds a batch's bytes (a collated batch, a batch in the node's arena, a batch of
/// samples); dropping it returns them. `None`: they went back already (a decode callable
/// made its own arrays).
pub(crate) type Holder = Option<Box<dyn Any + Send + Sync>>;

/// A batch's images.
pub(crate) enum Images {
    /// One `[B, H, W, 3]` array.
    Stacked { span: Span, shape: [usize; 4] },
    /// One `[H, W, 3]` array a sample.
    Each(Vec<(Span, [usize; 3])>),
    /// What the decode callable returned, a sample each.
    Objects(Vec<Py<PyAny>>),
}

/// A batch made by the feeder thread, before Python wraps it.
pub(crate) struct Made {
    pub epoch: u32,
    pub iteration: u32,
    pub ids: Vec<u32>,
    pub labels: Vec<u32>,
    pub skipped: Vec<u32>,
    pub images: Images,
    /// Kept for its drop, which returns the bytes.
    pub _holder: Holder,
    /// Counts it among the feeder's batches not back yet; after the holder, so the bytes
    /// are back first.
    pub _made: Option<Mark>,
}

/// A count of a loader's batches (those Python holds, or those the feeder made and that
/// are not back yet), with a wait for it to fall.
#[derive(Clone, Debug, Default)]
pub(crate) struct Count(Arc<(Mutex<usize>, Condvar)>);

impl Count {
    fn lock(&self) -> MutexGuard<'_, usize> {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now(&self) -> usize {
        *self.lock()
    }

    /// One more, until the returned mark drops.
    pub(crate) fn take(&self) -> Mark {
        *self.lock() += 1;
        Mark(self.clone())
    }

    /// Waits up to `timeout` for the count to be below `n`; whether it is.
    pub(crate) fn wait_below(&self, n: usize, timeout: Duration) -> bool {
        let count = self.lock();
        let (count, _) = self
            .0
             .1
            .wait_timeout_while(count, timeout, |c| *c >= n)
            .unwrap_or_else(|e| e.into_inner());
        *count < n
    }
}

/// One counted batch; dropped after the batch's holder gave its bytes back.
#[derive(Debug)]
pub(crate) struct Mark(Count);

impl Drop for Mark {
    fn drop(&mut self) {
        *self.0.lock() -= 1;
        self.0 .0 .1.notify_all();
    }
}

/// One batch: `images` (one `[B, H, W, 3]` uint8 array, `[B, 3, H, W]` with
/// `channels_first`, or a list of arrays for `transform="none"` and decode callables),
/// `labels` and `ids` (`[B]` int64), `epoch`, `iteration`, `skipped`.
#[pyclass(frozen, module = "lobster_io")]
pub(crate) struct Batch {
    made: Made,
    channels_first: bool,
    /// Last: fields drop in order, so the bytes are back before the count says so.
    _held: Option<Mark>,
}

impl Batch {
    pub(crate) fn new(made: Made, channels_first: bool, held: Option<Mark>) -> Batch {
        Batch {
            made,
            channels_first,
            _held: held,
        }
    }
}

#[pymethods]
impl Batch {
    /// The images, without a copy: each array's base is this batch, whose buffer goes back
    /// to the loader when the batch and every view of it are gone. The arrays are writable:
    /// the buffer is this batch's alone until then (in-place normalisation needs no copy).
    #[getter]
    fn images<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let owner = || slf.clone().into_any();
        match &this.made.images {
            Images::Stacked { span, shape } => {
                let [b, h, w, c] = *shape;
                // SAFETY: the span is `b * h * w * c` bytes the batch's holder owns and keeps
                // in place while the batch lives; the batch is the array's base, so it lives
                // as long as any view; nothing but the array's users writes the bytes.
                let array = unsafe {
                    let view = ArrayViewMut4::from_shape_ptr((b, h, w, c), span.ptr.as_ptr());
                    PyArray4::borrow_from_array(&view, owner())
                }
                .into_any();
                if this.channels_first {
                    array.call_method1("transpose", ((0, 3, 1, 2),))
                } else {
                    Ok(array)
                }
            }
            Images::Each(each) => {
                let list = PyList::empty(py);
                for (span, [h, w, c]) in each {
                    // SAFETY: as for a stacked batch, for one sample's `h * w * c` bytes.
                    let array = unsafe {
                        let view = ArrayViewMut3::from_shape_ptr((*h, *w, *c), span.ptr.as_ptr());
                        PyArray3::borrow_from_array(&view, owner())
                    }
                    .into_any();
                    let array = if this.channels_first {
                        array.call_method1("transpose", ((2, 0, 1),))?
                    } else {
                        array
                    };
                    list.append(array)?;
                }
                Ok(list.into_any())
            }
            Images::Objects(objects) => {
                Ok(PyList::new(py, objects.iter().map(|o| o.bind(py)))?.into_any())
            }
        }
    }

    /// The labels, `[B]` int64.
    #[getter]
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let v: Vec<i64> = self.made.labels.iter().map(|&l| i64::from(l)).collect();
        PyArray1::from_vec(py, v)
    }

    /// The samples' ids (their index in the dataset's order, as `lobster ls` lists them),
    /// `[B]` int64.
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let v: Vec<i64> = self.made.ids.iter().map(|&i| i64::from(i)).collect();
        PyArray1::from_vec(py, v)
    }

    #[getter]
    fn epoch(&self) -> u32 {
        self.made.epoch
    }

    #[getter]
    fn iteration(&self) -> u32 {
        self.made.iteration
    }

    /// Ids of the samples the error policy left out of this batch.
    #[getter]
    fn skipped(&self) -> Vec<u32> {
        self.made.skipped.clone()
    }

    /// The address of the batch's first image (to check that views are not copies); 0 when
    /// a decode callable made the arrays.
    #[getter]
    fn buffer_address(&self) -> usize {
        match &self.made.images {
            Images::Stacked { span, .. } => span.address(),
            Images::Each(each) => each.first().map_or(0, |(s, _)| s.address()),
            Images::Objects(_) => 0,
        }
    }

    fn __len__(&self) -> usize {
        self.made.ids.len()
    }

    fn __repr__(&self) -> String {
        let what = match &self.made.images {
            Images::Stacked { shape, .. } => format!("images {shape:?}"),
            Images::Each(e) => format!("{} decoded images", e.len()),
            Images::Objects(o) => format!("{} decoded objects", o.len()),
        };
        format!(
            "Batch(epoch={}, iteration={}, {} samples, {what}, {} skipped)",
            self.made.epoch,
            self.made.iteration,
            self.made.ids.len(),
            self.made.skipped.len()
        )
    }
}
