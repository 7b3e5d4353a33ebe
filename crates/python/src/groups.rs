//! `Loader`'s grouped settings: `cache=lobster_io.Cache(...)`, `budgets=lobster_io.Budgets(...)`,
//! `launch=lobster_io.Launch(...)` and `limits=lobster_io.Limits(...)`, as the facade groups `LoaderConfig` by stage. The
//! classes and their defaults live once, in Python (`lobster_io/__init__.py`); this reads
//! their fields, each refused by its dotted name.

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::params::{Given, SLOTS_MAX};

/// What `cache=` says.
#[derive(Debug)]
pub(crate) struct CacheGroup {
    pub bytes: Option<u64>,
    pub frac: f64,
    pub policy: String,
    pub forms: Option<String>,
    pub decoded_max_side: Option<u32>,
    /// Both bandwidths, or neither: what a cluster plan prices a remote hit with.
    pub link_prices: Option<lobster_io::LinkPrices>,
    /// Both the directory and its bytes, or neither: the local disk below the memory cache.
    pub disk: Option<lobster_io::DiskCache>,
}

/// What `budgets=` says.
#[derive(Debug)]
pub(crate) struct BudgetGroup {
    pub io_depth: usize,
    pub decode_threads: usize,
    pub slots: usize,
    pub slot_bytes: Option<u64>,
}

/// The group `group` was given as, or the class's defaults; anything else is a `TypeError`.
fn group<'py>(
    py: Python<'py>,
    given: Option<Bound<'py, PyAny>>,
    keyword: &str,
    class: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let class = py.import("lobster_io")?.getattr(class)?;
    match given {
        None => class.call0(),
        Some(g) if g.is_instance(&class)? => Ok(g),
        Some(g) => Err(PyTypeError::new_err(format!(
            "{keyword}= takes a lobster_io.{}(...), not {}",
            class.getattr("__name__")?,
            g.get_type().name()?
        ))),
    }
}

/// Field `name` of group `keyword`, as `T`; a value of another type is refused by its dotted
/// name, with Python's reason.
fn field<'py, T: FromPyObjectOwned<'py>>(
    g: &Bound<'py, PyAny>,
    keyword: &str,
    name: &str,
) -> PyResult<T> {
    let v = g.getattr(name)?;
    v.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        let shown = v.repr().map_or_else(|_| "?".into(), |r| r.to_string());
        PyValueError::new_err(format!("{keyword}.{name} = {shown}: {e}"))
    })
}

pub(crate) fn cache(py: Python<'_>, given: Option<Bound<'_, PyAny>>) -> PyResult<CacheGroup> {
    let g = group(py, given, "cache", "Cache")?;
    let c = CacheGroup {
        bytes: field(&g, "cache", "bytes")?,
        frac: field(&g, "cache", "frac")?,
        policy: field(&g, "cache", "policy")?,
        forms: field(&g, "cache", "forms")?,
        decoded_max_side: field(&g, "cache", "decoded_max_side")?,
        link_prices: link_prices(
            field(&g, "cache", "storage_bytes_per_s")?,
            field(&g, "cache", "net_bytes_per_s")?,
        )?,
        disk: disk(
            field(&g, "cache", "disk")?,
            field(&g, "cache", "disk_bytes")?,
        )?,
    };
    if !(0.0..=1.0).contains(&c.frac) {
        return Err(PyValueError::new_err(format!(
            "cache.frac = {}: allowed 0 to 1",
            c.frac
        )));
    }
    Ok(c)
}

/// `cache.storage_bytes_per_s` and `cache.net_bytes_per_s`: both, in the loader's range, or
/// neither.
fn link_prices(storage: Option<u64>, net: Option<u64>) -> PyResult<Option<lobster_io::LinkPrices>> {
    for (name, value) in [("storage_bytes_per_s", storage), ("net_bytes_per_s", net)] {
        if let Some(v) = value.filter(|v| !lobster_io::LINK_BYTES_PER_S.contains(v)) {
            return Err(PyValueError::new_err(format!(
                "cache.{name} = {v}: allowed 1 to 2^50 bytes per second"
            )));
        }
    }
    match (storage, net) {
        (Some(storage_bytes_per_s), Some(net_bytes_per_s)) => Ok(Some(lobster_io::LinkPrices {
            storage_bytes_per_s,
            net_bytes_per_s,
        })),
        (None, None) => Ok(None),
        _ => Err(PyValueError::new_err(
            "cache.storage_bytes_per_s, cache.net_bytes_per_s: give both or neither (a cluster \
             plan prices a remote hit against a storage read with both)",
        )),
    }
}

/// `cache.disk` and `cache.disk_bytes`: both or neither. Their values are the loader's to
/// judge (it refuses a capacity under one block, or a directory it cannot make, lock and
/// write in, when it starts), so that the package and the CLI refuse the same disks.
fn disk(dir: Option<PathBuf>, bytes: Option<u64>) -> PyResult<Option<lobster_io::DiskCache>> {
    match (dir, bytes) {
        (Some(dir), Some(capacity_bytes)) => Ok(Some(lobster_io::DiskCache {
            dir,
            capacity_bytes,
        })),
        (None, None) => Ok(None),
        (Some(dir), None) => Err(PyValueError::new_err(format!(
            "cache.disk = {dir:?} needs cache.disk_bytes: the bytes the disk cache may hold"
        ))),
        (None, Some(bytes)) => Err(PyValueError::new_err(format!(
            "cache.disk_bytes = {bytes} needs cache.disk: the directory the disk cache keeps \
             its files in"
        ))),
    }
}

pub(crate) fn budgets(py: Python<'_>, given: Option<Bound<'_, PyAny>>) -> PyResult<BudgetGroup> {
    let g = group(py, given, "budgets", "Budgets")?;
    let b = BudgetGroup {
        io_depth: field(&g, "budgets", "io_depth")?,
        decode_threads: field(&g, "budgets", "decode_threads")?,
        slots: field(&g, "budgets", "slots")?,
        slot_bytes: field(&g, "budgets", "slot_bytes")?,
    };
    if !(1..=SLOTS_MAX).contains(&b.slots) {
        return Err(PyValueError::new_err(format!(
            "budgets.slots = {}: allowed 1 to {SLOTS_MAX}",
            b.slots
        )));
    }
    if b.slot_bytes == Some(0) {
        return Err(PyValueError::new_err("budgets.slot_bytes = 0: at least 1"));
    }
    Ok(b)
}

pub(crate) fn launch(py: Python<'_>, given: Option<Bound<'_, PyAny>>) -> PyResult<Given> {
    let g = group(py, given, "launch", "Launch")?;
    Ok(Given {
        rank: field(&g, "launch", "rank")?,
        world_size: field(&g, "launch", "world_size")?,
        local_rank: field(&g, "launch", "local_rank")?,
        local_world_size: field(&g, "launch", "local_world_size")?,
        job_id: field(&g, "launch", "job_id")?,
    })
}

/// The pixel bound `limits=` says (`None`: lobster-image's default).
pub(crate) fn limits(py: Python<'_>, given: Option<Bound<'_, PyAny>>) -> PyResult<u64> {
    let g = group(py, given, "limits", "Limits")?;
    let pixels_max: Option<u64> = field(&g, "limits", "image_pixels_max")?;
    match pixels_max {
        Some(0) => Err(PyValueError::new_err(
            "limits.image_pixels_max = 0: at least 1",
        )),
        Some(p) => Ok(p),
        None => Ok(lobster_io::images::PIXELS_MAX_DEFAULT),
    }
}

/// Keywords `Loader` took before its settings were grouped, and where each went.
const MOVED: [(&str, &str, &str); 14] = [
    ("cache_bytes", "cache", "Cache(bytes=...)"),
    ("cache_frac", "cache", "Cache(frac=...)"),
    ("policy", "cache", "Cache(policy=...)"),
    ("cache_forms", "cache", "Cache(forms=...)"),
    ("decoded_max_side", "cache", "Cache(decoded_max_side=...)"),
    ("io_depth", "budgets", "Budgets(io_depth=...)"),
    ("decode_threads", "budgets", "Budgets(decode_threads=...)"),
    ("slots", "budgets", "Budgets(slots=...)"),
    ("slot_bytes", "budgets", "Budgets(slot_bytes=...)"),
    ("rank", "launch", "Launch(rank=...)"),
    ("world_size", "launch", "Launch(world_size=...)"),
    ("local_rank", "launch", "Launch(local_rank=...)"),
    ("local_world_size", "launch", "Launch(local_world_size=...)"),
    ("job_id", "launch", "Launch(job_id=...)"),
];

/// Refuses keywords `Loader` does not take, saying where a moved one went.
pub(crate) fn refuse_unknown(extra: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(extra) = extra else { return Ok(()) };
    let Some((key, _)) = extra.iter().next() else {
        return Ok(());
    };
    let key = key.to_string();
    Err(PyTypeError::new_err(
        match MOVED.iter().find(|(old, _, _)| *old == key) {
            Some((old, keyword, new)) => format!(
                "Loader(): {old}= is now {keyword}=lobster_io.{new} (settings are grouped: \
                 cache=, budgets=, launch=, limits=)"
            ),
            None => format!("Loader() got an unexpected keyword argument '{key}'"),
        },
    ))
}
