//! lobster_io for Python: the facade's image loader as a Python iterator whose batches are
//! numpy arrays over the loader's own buffers, without copies. The package holds no logic
//! of its own: it maps Python's arguments onto [`lobster_io::LoaderBuilder`], the facade's
//! errors onto an exception hierarchy, and its batches onto arrays.
//!
//! This build serves a process that is one rank of a one-rank node (a single process, or
//! each process of a launcher as a node of its own is not offered: a node's ranks as
//! processes share one engine, which the node host brings).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use lobster_io::image::Transform;
use lobster_io::images::{ImageBatch, ImageBatches, Pixels};
use lobster_io::{CachePolicy, Dataset, ErrorPolicy, FailureBudget, LoaderBuilder};
use numpy::ndarray::{ArrayView3, ArrayView4};
use numpy::{PyArray1, PyArray3, PyArray4, PyArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    lobster_io,
    Error,
    PyException,
    "Base class of every lobster_io error."
);
create_exception!(
    lobster_io,
    ReadError,
    Error,
    "A sample could not be read: its id, file and cause are in the message."
);
create_exception!(
    lobster_io,
    DecodeError,
    Error,
    "A sample could not be decoded: its id, file and cause are in the message."
);
create_exception!(
    lobster_io,
    DatasetError,
    Error,
    "The dataset could not be opened or indexed."
);
create_exception!(
    lobster_io,
    TooManyFailures,
    Error,
    "An epoch skipped more samples than its failure budget allows."
);
create_exception!(
    lobster_io,
    StoppedError,
    Error,
    "The loader stopped (dropped, or failed earlier)."
);

/// The facade's error as the exception a Python caller catches.
fn to_py(e: lobster_io::Error) -> PyErr {
    use lobster_io::Error as E;
    let text = e.to_string();
    match e {
        E::InvalidParameter { .. } => PyValueError::new_err(text),
        E::Read { .. } | E::SizeChanged { .. } => ReadError::new_err(text),
        E::Decode { .. } => DecodeError::new_err(text),
        E::TooManyFailures { .. } => TooManyFailures::new_err(text),
        E::Stopped { .. } => StoppedError::new_err(text),
        E::Dataset { .. } => DatasetError::new_err(text),
        _ => Error::new_err(text),
    }
}

/// How long a waiting iteration sleeps between looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// Batches the feeder may have made beyond those the caller holds.
const FEEDER_AHEAD: usize = 1;

/// The loader: one rank's batches, epoch after epoch.
#[pyclass(frozen, module = "lobster_io")]
struct Loader {
    /// Kept for its pipeline's life; dropping it stops the feeder's rank.
    loader: Mutex<Option<lobster_io::Loader<Pixels>>>,
    batches: Receiver<Result<ImageBatch, lobster_io::Error>>,
    per_epoch: usize,
    epochs: u32,
    /// The epoch the next iteration yields, and the batches of it already taken.
    next_epoch: AtomicU32,
    taken: Mutex<usize>,
    channels_first: bool,
    /// The process that built it: a forked child has the loader's memory but none of its
    /// threads, so it must not wait on them.
    pid: u32,
}

fn transform(name: &str, size: u32) -> PyResult<Transform> {
    match name {
        "train" => Ok(Transform::Train { size }),
        "eval" => Ok(Transform::Eval { size }),
        other => Err(PyValueError::new_err(format!(
            "transform = {other:?}: this build collates images of one size, \"train\" or \
             \"eval\""
        ))),
    }
}

fn cache_policy(name: &str) -> PyResult<CachePolicy> {
    match name {
        "lobster" | "reuse" => Ok(CachePolicy::Reuse),
        "nopfs" | "static" => Ok(CachePolicy::Static),
        "lru" => Ok(CachePolicy::Lru),
        "none" => Ok(CachePolicy::None),
        other => Err(PyValueError::new_err(format!(
            "policy = {other:?}: one of \"lobster\", \"nopfs\", \"lru\", \"none\""
        ))),
    }
}

fn error_policy(on_error: &str, max_failures: Option<f64>) -> PyResult<ErrorPolicy> {
    match (on_error, max_failures) {
        ("fail", None) => Ok(ErrorPolicy::Fail),
        ("fail", Some(_)) => Err(PyValueError::new_err(
            "max_failures is for on_error=\"skip\"",
        )),
        ("skip", budget) => {
            let max_failures = match budget {
                None => FailureBudget::Fraction(0.01),
                Some(f) if (0.0..1.0).contains(&f) => FailureBudget::Fraction(f),
                Some(n) if n >= 1.0 && n.fract() == 0.0 => FailureBudget::Count(n as u64),
                Some(x) => {
                    return Err(PyValueError::new_err(format!(
                        "max_failures = {x}: a count (1, 2, ...) or a fraction in [0, 1)"
                    )))
                }
            };
            Ok(ErrorPolicy::Skip { max_failures })
        }
        (other, _) => Err(PyValueError::new_err(format!(
            "on_error = {other:?}: \"fail\" or \"skip\""
        ))),
    }
}

/// A launcher that starts several processes per node needs the node host, which this
/// build does not have: refuse rather than load the wrong share.
fn check_single_process() -> PyResult<()> {
    for var in ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"] {
        if let Some(n) = std::env::var(var).ok().and_then(|v| v.parse::<u32>().ok()) {
            if n > 1 {
                return Err(Error::new_err(format!(
                    "{var}={n}: this build of lobster_io loads for a single process; a job \
                     of several processes needs the node host (lobster-node)"
                )));
            }
        }
    }
    Ok(())
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (
        data, batch_size, *, epochs = 1, seed = 0, cache_bytes = None, cache_frac = 0.2,
        policy = "lobster", image_size = 224, transform = "train", drop_last = false,
        on_error = "fail", max_failures = None, decode_threads = 2, io_depth = 128,
        channels_first = false, slots = 2
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        data: &str,
        batch_size: usize,
        epochs: u32,
        seed: u64,
        cache_bytes: Option<u64>,
        cache_frac: f64,
        policy: &str,
        image_size: u32,
        transform: &str,
        drop_last: bool,
        on_error: &str,
        max_failures: Option<f64>,
        decode_threads: usize,
        io_depth: usize,
        channels_first: bool,
        slots: usize,
    ) -> PyResult<Self> {
        check_single_process()?;
        if !(0.0..=1.0).contains(&cache_frac) {
            return Err(PyValueError::new_err(format!(
                "cache_frac = {cache_frac}: allowed 0 to 1"
            )));
        }
        if slots == 0 {
            return Err(PyValueError::new_err("slots = 0: at least 1"));
        }
        let transform = self::transform(transform, image_size)?;
        let policy = cache_policy(policy)?;
        let errors = error_policy(on_error, max_failures)?;
        let data = data.to_owned();
        let (loader, rank, dataset) = py
            .detach(move || {
                let dataset = Arc::new(Dataset::open(&data)?);
                let capacity =
                    cache_bytes.unwrap_or((dataset.total_bytes() as f64 * cache_frac) as u64);
                // A cache of nothing is no cache, whatever the policy.
                let policy = if capacity == 0 {
                    CachePolicy::None
                } else {
                    policy
                };
                let mut loader = LoaderBuilder::<Pixels>::new(dataset.clone())
                    .world(1, 1, 0)
                    .seed(seed)
                    .batch_size(batch_size)
                    .epochs(epochs)
                    .drop_last(drop_last)
                    .cache(policy, capacity)
                    .decode_threads(decode_threads)
                    .io_depth_budget(io_depth)
                    .on_error(errors)
                    .decode_images(transform)
                    .build()?;
                let rank = loader
                    .ranks()
                    .and_then(|mut r| r.pop())
                    .expect("a new loader has its one rank");
                Ok::<_, lobster_io::Error>((loader, rank, dataset))
            })
            .map_err(to_py)?;
        let per_epoch = loader.iterations_per_epoch();
        // The feeder makes each batch as soon as a slot is free and waits on a channel of
        // one; the caller's iteration waits on the channel with the GIL released.
        let (tx, rx) = crossbeam_channel::bounded(FEEDER_AHEAD);
        std::thread::Builder::new()
            .name("lobster-py-feeder".into())
            .spawn(move || {
                for b in ImageBatches::new(rank, dataset, slots + FEEDER_AHEAD + 1) {
                    if tx.send(b).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::new_err(format!("cannot start the feeder thread: {e}")))?;
        Ok(Loader {
            loader: Mutex::new(Some(loader)),
            batches: rx,
            per_epoch,
            epochs,
            next_epoch: AtomicU32::new(0),
            taken: Mutex::new(0),
            channels_first,
            pid: std::process::id(),
        })
    }

    /// Batches per epoch.
    fn __len__(&self) -> usize {
        self.per_epoch
    }

    /// Epochs the loader was built for.
    #[getter]
    fn epochs(&self) -> u32 {
        self.epochs
    }

    /// Names the epoch the next iteration yields. Epochs come in order (the plan covers
    /// them all from the start): `epoch` must be the next one, or the one under way.
    fn set_epoch(&self, epoch: u32) -> PyResult<()> {
        let current = self.next_epoch.load(Ordering::SeqCst);
        if epoch != current {
            return Err(PyValueError::new_err(format!(
                "epoch = {epoch}: the loader's next epoch is {current} (epochs are loaded in \
                 order, 0 to {})",
                self.epochs.saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// One epoch's batches: the next epoch, from where it stands.
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        if std::process::id() != self.pid {
            return Err(Error::new_err(
                "this Loader was built in another process (this one is a fork of it, e.g. a \
                 DataLoader worker): build a Loader in the process that iterates it",
            ));
        }
        let epoch = self.next_epoch.load(Ordering::SeqCst);
        if epoch >= self.epochs {
            return Ok(None);
        }
        {
            let mut taken = lock(&self.taken);
            if *taken == self.per_epoch {
                // The epoch is over: this iteration ends, the next begins the next epoch.
                *taken = 0;
                self.next_epoch.store(epoch + 1, Ordering::SeqCst);
                return Ok(None);
            }
        }
        let batch = loop {
            let rx = self.batches.clone();
            match py.detach(move || rx.recv_timeout(SIGNAL_POLL)) {
                Ok(b) => break b.map_err(to_py)?,
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(StoppedError::new_err(
                        "the loader has no more batches (it stopped or ended)",
                    ))
                }
            }
        };
        *lock(&self.taken) += 1;
        Ok(Some(Batch {
            channels_first: self.channels_first,
            batch,
        }))
    }

    /// The run's figures so far (hits, accesses, stall and load times...), as a dict.
    fn metrics(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let m = lock(&self.loader)
            .as_ref()
            .map(|l| l.metrics())
            .ok_or_else(|| StoppedError::new_err("the loader was closed"))?;
        let dict = pyo3::types::PyDict::new(py);
        dict.set_item("hits", m.hits)?;
        dict.set_item("accesses", m.accesses)?;
        dict.set_item("hit_ratio", m.hit_ratio)?;
        dict.set_item("skipped", m.skipped)?;
        dict.set_item("read_path", m.read_path)?;
        Ok(dict.into_any().unbind())
    }

    /// Stops the pipeline now; iterating afterwards raises `StoppedError`.
    fn close(&self, py: Python<'_>) {
        let loader = lock(&self.loader).take();
        py.detach(move || drop(loader));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One batch: `images` `[B, H, W, 3]` uint8 (or `[B, 3, H, W]` with `channels_first`),
/// a view of the loader's buffer that holds it until the last view is gone.
#[pyclass(frozen, module = "lobster_io")]
struct Batch {
    channels_first: bool,
    batch: ImageBatch,
}

#[pymethods]
impl Batch {
    /// The images, without a copy: the array's base is this batch, whose buffer goes back
    /// to the loader when the batch and every view of it are gone.
    #[getter]
    fn images<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        let this = slf.get();
        let [b, h, w, c] = this.batch.shape();
        let bytes = this.batch.images();
        let view = ArrayView4::from_shape((b, h, w, c), bytes).expect("a batch's shape fits it");
        // SAFETY: the batch becomes the array's base, so its buffer outlives the array; the
        // class is frozen and the buffer is neither written nor moved while a batch holds it.
        let array = unsafe { PyArray4::borrow_from_array(&view, slf.clone().into_any()) };
        array.readwrite().make_nonwriteable();
        let array = array.into_any();
        if this.channels_first {
            array
                .call_method1("transpose", ((0, 3, 1, 2),))
                .expect("a 4-d array transposes")
        } else {
            array
        }
    }

    /// The labels, `[B]` int64.
    #[getter]
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let v: Vec<i64> = self.batch.labels().iter().map(|&l| i64::from(l)).collect();
        PyArray1::from_vec(py, v)
    }

    /// The samples' ids (their index in the dataset's order, as `lobster ls` lists them),
    /// `[B]` int64.
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let v: Vec<i64> = self.batch.ids.iter().map(|&i| i64::from(i)).collect();
        PyArray1::from_vec(py, v)
    }

    #[getter]
    fn epoch(&self) -> u32 {
        self.batch.epoch
    }

    #[getter]
    fn iteration(&self) -> u32 {
        self.batch.iteration
    }

    /// Ids of the samples the error policy left out of this batch.
    #[getter]
    fn skipped(&self) -> Vec<u32> {
        self.batch.skipped.clone()
    }

    /// The address of the batch's buffer (to check that views are not copies).
    #[getter]
    fn buffer_address(&self) -> usize {
        self.batch.images().as_ptr() as usize
    }

    fn __len__(&self) -> usize {
        self.batch.ids.len()
    }
}

/// Decodes one JPEG or PNG to an `[H, W, 3]` uint8 array (lobster-image's decoder, as the
/// loader's workers run it).
#[pyfunction]
fn decode_image<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyArray3<u8>>> {
    let image = lobster_io::image::decode(data).map_err(|e| DecodeError::new_err(e.to_string()))?;
    let (w, h) = (image.width() as usize, image.height() as usize);
    let view = ArrayView3::from_shape((h, w, 3), image.pixels()).expect("RGB rows");
    Ok(PyArray3::from_array(py, &view))
}

#[pymodule]
mod _lobster_io {
    #[pymodule_export]
    use super::{
        decode_image, Batch, DatasetError, DecodeError, Error, Loader, ReadError, StoppedError,
        TooManyFailures,
    };
}
