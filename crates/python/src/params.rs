//! Python's keyword arguments as the Rust crates' settings, each refused with its name.

use lobster_io::images::{Decoding, Transform};
use lobster_io::{CachePolicy, FailureBudget, OnError};
use std::fmt::Display;
use std::ops::RangeInclusive;

use lobster_node::NodeEnv;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::errors::node_error;

/// The largest `image_size`, as `lobster run --image-size` allows: a batch of 16 such
/// images is already 3 GiB.
pub(crate) const IMAGE_SIZE_MAX: u32 = 8192;

/// The most batches a caller may hold at once (`budgets.slots`): each is a batch's buffer.
pub(crate) const SLOTS_MAX: usize = 1024;

/// An integer argument as Python gave it, checked against its range by [`int`], which
/// names the parameter (Python's own conversion would raise an `OverflowError` that does
/// not).
pub(crate) enum Int {
    Value(i128),
    /// An int too large for `i128`, as Python shows it.
    Huge(String),
    /// Not an int: its repr and its type's name.
    Other {
        shown: String,
        type_name: String,
    },
}

impl From<i128> for Int {
    fn from(v: i128) -> Int {
        Int::Value(v)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Int> {
        let shown = || obj.repr().map_or_else(|_| "?".into(), |r| r.to_string());
        // A bool is an int to Python, but never a count.
        if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<pyo3::types::PyBool>() {
            let type_name = obj
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string());
            return Ok(Int::Other {
                shown: shown(),
                type_name,
            });
        }
        Ok(obj
            .extract::<i128>()
            .map_or_else(|_| Int::Huge(shown()), Int::Value))
    }
}

/// `value` of parameter `name` as a `T` within `range`: a `ValueError` naming the parameter
/// and its range when outside, a `TypeError` naming it when not an integer.
pub(crate) fn int<T>(name: &str, value: &Int, range: RangeInclusive<T>) -> PyResult<T>
where
    T: TryFrom<i128> + PartialOrd + Display + Copy,
{
    let outside = |shown: &dyn Display| {
        PyValueError::new_err(format!(
            "{name} = {shown}: allowed {} to {}",
            range.start(),
            range.end()
        ))
    };
    match value {
        Int::Value(v) => T::try_from(*v)
            .ok()
            .filter(|t| range.contains(t))
            .ok_or_else(|| outside(v)),
        Int::Huge(shown) => Err(outside(shown)),
        Int::Other { shown, type_name } => Err(PyTypeError::new_err(format!(
            "{name} = {shown}: an integer, not {type_name}"
        ))),
    }
}

/// The dataset's path or spec (`str` or any `os.PathLike`) as the facade opens it.
pub(crate) fn data(path: std::path::PathBuf) -> PyResult<String> {
    path.into_os_string().into_string().map_err(|p| {
        PyValueError::new_err(format!(
            "data = {p:?}: the path is not valid UTF-8, which dataset paths must be"
        ))
    })
}

/// What the loader's workers make of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Output {
    /// Decoded (as much as `Decoding` says) and transformed to `size` x `size`: one
    /// `[B, H, W, 3]` array a batch.
    Stacked(Transform, Decoding),
    /// Decoded at its own size: one `[H, W, 3]` array a sample.
    Decoded,
    /// The sample's bytes, for a Python decode callable in the iterating process.
    Raw,
}

impl Output {
    /// The side of a stacked batch's square images.
    pub(crate) fn side(self) -> Option<u32> {
        match self {
            Output::Stacked(Transform::Train { size } | Transform::Eval { size }, _) => Some(size),
            _ => None,
        }
    }

    /// The configuration field ranks must agree on.
    pub(crate) fn name(self) -> String {
        match self {
            Output::Stacked(Transform::Train { size }, d) => format!("train {size}{}", whole(d)),
            Output::Stacked(Transform::Eval { size }, d) => format!("eval {size}{}", whole(d)),
            Output::Stacked(Transform::None, _) | Output::Decoded => "none".into(),
            Output::Raw => "python".into(),
        }
    }
}

/// How a node's ranks name a decoding in what they agree on: nothing for the default.
fn whole(d: Decoding) -> &'static str {
    match d {
        Decoding::Region => "",
        Decoding::Whole => " whole",
    }
}

/// `decoding`: "region" (only what the transform keeps) or "whole".
pub(crate) fn decoding(name: &str) -> PyResult<Decoding> {
    match name {
        "region" => Ok(Decoding::Region),
        "whole" => Ok(Decoding::Whole),
        other => Err(PyValueError::new_err(format!(
            "decoding = {other:?}: one of \"region\", \"whole\""
        ))),
    }
}

pub(crate) fn output(
    name: &str,
    size: &Int,
    decoding: Decoding,
    python_decode: bool,
) -> PyResult<Output> {
    let size = int("image_size", size, 1..=IMAGE_SIZE_MAX)?;
    match (name, python_decode) {
        ("train", false) => Ok(Output::Stacked(Transform::Train { size }, decoding)),
        ("eval", false) => Ok(Output::Stacked(Transform::Eval { size }, decoding)),
        ("none", false) => Ok(Output::Decoded),
        ("none", true) => Ok(Output::Raw),
        (other @ ("train" | "eval"), true) => Err(PyValueError::new_err(format!(
            "transform = {other:?} with decode: a Python decode callable returns its own \
             arrays; give transform=\"none\""
        ))),
        (other, _) => Err(PyValueError::new_err(format!(
            "transform = {other:?}: one of \"train\", \"eval\", \"none\""
        ))),
    }
}

/// `cache.policy`: `reuse`, `static`, `lru` or `none`; `lobster` and `nopfs`, the older
/// spellings, still name reuse and static.
pub(crate) fn cache_policy(name: &str) -> PyResult<CachePolicy> {
    name.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "cache.policy = {name:?}: one of \"reuse\", \"static\", \"lru\", \"none\""
        ))
    })
}

/// `assign`: which rank of a step gets which of its samples.
pub(crate) fn assign(name: &str) -> PyResult<lobster_io::Assign> {
    name.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "assign = {name:?}: one of \"sampler\", \"locality\""
        ))
    })
}

/// `cache_forms`: `None` leaves the loader's default (auto for transformed images).
pub(crate) fn cache_forms(name: Option<&str>) -> PyResult<Option<lobster_io::FormChoice>> {
    name.map(|n| {
        n.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "cache.forms = {n:?}: one of \"encoded\", \"decoded\", \"auto\""
            ))
        })
    })
    .transpose()
}

pub(crate) fn on_error_rule(on_error: &str, max_failures: Option<f64>) -> PyResult<OnError> {
    match (on_error, max_failures) {
        ("fail", None) => Ok(OnError::Fail),
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
            Ok(OnError::Skip { max_failures })
        }
        (other, _) => Err(PyValueError::new_err(format!(
            "on_error = {other:?}: \"fail\" or \"skip\""
        ))),
    }
}

/// The position a caller gave, all of it or none.
#[derive(Clone, Debug, Default)]
pub(crate) struct Given {
    pub rank: Option<usize>,
    pub world_size: Option<usize>,
    pub local_rank: Option<usize>,
    pub local_world_size: Option<usize>,
    pub job_id: Option<String>,
}

/// Variables whose presence says a launcher started this process.
const LAUNCHER_VARS: [&str; 4] = [
    "LOBSTER_LOCAL_RANK",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
];

/// Where this process stands: given, else read from the launcher's variables, else a
/// single process (one rank on one node).
pub(crate) fn place(given: &Given) -> PyResult<NodeEnv> {
    let parts = [
        given.rank,
        given.world_size,
        given.local_rank,
        given.local_world_size,
    ];
    if parts.iter().any(Option::is_some) {
        let [Some(rank), Some(world_size), Some(local_rank), Some(local_world_size)] = parts else {
            return Err(PyValueError::new_err(
                "launch.rank, world_size, local_rank, local_world_size: give all four or none \
                 (none: the launcher's environment says)",
            ));
        };
        if local_world_size == 0 || world_size % local_world_size != 0 {
            return Err(PyValueError::new_err(format!(
                "launch.local_world_size = {local_world_size}: every node runs as many ranks, \
                 so it must divide launch.world_size = {world_size}"
            )));
        }
        let job_id =
            match (given.job_id.clone(), std::env::var("LOBSTER_JOB_ID").ok()) {
                (Some(id), _) | (None, Some(id)) => id,
                (None, None) if local_world_size == 1 => "single".into(),
                (None, None) => return Err(PyValueError::new_err(
                    "launch.job_id: needed (or LOBSTER_JOB_ID) when several local ranks meet, so \
                     that two jobs on one machine never do",
                )),
            };
        return NodeEnv::new(
            rank,
            world_size,
            local_rank,
            local_world_size,
            rank / local_world_size,
            world_size / local_world_size,
            job_id,
        )
        .map_err(node_error);
    }
    if LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
        let mut env = NodeEnv::from_env().map_err(node_error)?;
        if let Some(id) = &given.job_id {
            env = NodeEnv::new(
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size,
                env.node,
                env.nodes,
                id.clone(),
            )
            .map_err(node_error)?;
        }
        return Ok(env);
    }
    NodeEnv::new(0, 1, 0, 1, 0, 1, "single").map_err(node_error)
}

/// Where this process stands as node `node` of an MPI job of `nodes` processes: each
/// process a node of one rank, as `lobster run --mpi` runs them. A `launch=` that says
/// otherwise is refused by its field.
#[cfg(feature = "mpi")]
pub(crate) fn mpi_place(given: &Given, node: usize, nodes: usize) -> PyResult<NodeEnv> {
    let fields = [
        ("launch.rank", given.rank, node),
        ("launch.world_size", given.world_size, nodes),
        ("launch.local_rank", given.local_rank, 0),
        ("launch.local_world_size", given.local_world_size, 1),
    ];
    for (name, said, is) in fields {
        if let Some(said) = said.filter(|&s| s != is) {
            return Err(PyValueError::new_err(format!(
                "{name} = {said}, but this process is node {node} of an MPI job of {nodes} \
                 processes, each a node of one rank, so {name} = {is}: drop launch= or make \
                 it agree"
            )));
        }
    }
    let job_id = given.job_id.clone().unwrap_or_else(|| "mpi".into());
    NodeEnv::new(node, nodes, 0, 1, node, nodes, job_id).map_err(node_error)
}

/// A parameter that must be a callable, if given: `decode` takes a sample's bytes and returns
/// its array.
pub(crate) fn callable(py: Python<'_>, name: &str, f: Option<&Py<PyAny>>) -> PyResult<()> {
    match f {
        Some(f) if !f.bind(py).is_callable() => Err(PyValueError::new_err(format!(
            "{name}: a callable taking a sample's bytes and returning its array"
        ))),
        _ => Ok(()),
    }
}
