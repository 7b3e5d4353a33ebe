//! The job's other nodes. Under an MPI launcher (Open MPI's `mpirun`, or `srun` with PMI), a
//! build with the `mpi` feature joins `MPI_COMM_WORLD`, each process one node as in
//! `lobster run --mpi`, and fetches planned misses from its peers' caches. Under a launcher
//! of several processes without MPI, the loader runs without peers and says so once.
//!
//! MPI is initialised once per process (it cannot be initialised again after it is
//! finalised): the first loader under the launcher starts lobster-net's `MpiNodes`, later
//! loaders reuse it, and Python's `atexit` closes the live loaders and finalises MPI, as
//! `mpirun` expects of every process.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use pyo3::PyTypeInfo;

use lobster_node::NodeEnv;

use crate::params::{self, Given};

/// Whether the package was built with the `mpi` feature.
pub(crate) const BUILT_WITH_MPI: bool = cfg!(feature = "mpi");

/// The command that builds the package with MPI.
const REBUILD: &str = "`pip install ./crates/python \
                       --config-settings=build-args='--features mpi'` (or `maturin build \
                       --release --features mpi` in crates/python; needs Open MPI and libclang: \
                       apt-get install libopenmpi-dev openmpi-bin libclang-dev)";

/// The once of "runs without peers".
static WARNED: AtomicBool = AtomicBool::new(false);

/// What started this process, as its variables say.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Launcher {
    /// The launcher's name, for messages.
    pub name: &'static str,
    /// The variable that gave the count.
    pub variable: &'static str,
    /// Processes it started.
    pub processes: usize,
    /// Whether MPI_Init finds the job's world: mpirun's, or srun's through PMI.
    pub mpi_wired: bool,
}

/// The launcher of several processes that started this one, if any. `get` reads a
/// variable (the process's environment, or a test's).
pub(crate) fn launcher(get: impl Fn(&str) -> Option<String>) -> Option<Launcher> {
    let count = |name: &str| get(name).and_then(|v| v.trim().parse::<usize>().ok());
    let pmi = get("PMI_RANK").is_some() || get("PMIX_RANK").is_some();
    let found = if let Some(n) = count("OMPI_COMM_WORLD_SIZE") {
        Launcher {
            name: "mpirun",
            variable: "OMPI_COMM_WORLD_SIZE",
            processes: n,
            mpi_wired: true,
        }
    } else if let Some(n) = count("PMI_SIZE") {
        Launcher {
            name: "a PMI launcher",
            variable: "PMI_SIZE",
            processes: n,
            mpi_wired: true,
        }
    } else if get("SLURM_PROCID").is_some() {
        // The step's count first: a batch script's SLURM_NTASKS is the allocation's.
        let (variable, n) = ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"]
            .into_iter()
            .find_map(|v| count(v).map(|n| (v, n)))?;
        Launcher {
            name: "srun",
            variable,
            processes: n,
            mpi_wired: pmi,
        }
    } else {
        return None;
    };
    (found.processes > 1).then_some(found)
}

/// Says once per process, as a `RuntimeWarning`, that this loader has no peers.
pub(crate) fn warn_once(py: Python<'_>, message: &str) -> PyResult<()> {
    if WARNED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let text = CString::new(message).unwrap_or_else(|_| c"lobster_io: runs without peers".into());
    // Level 1: the Python code that built the Loader.
    PyErr::warn(py, PyRuntimeWarning::type_object(py).as_any(), &text, 1)
}

/// The warning: a loader under `l` runs without peers, and why (`because`).
pub(crate) fn without_peers(l: &Launcher, because: &str) -> String {
    format!(
        "lobster_io: {} started {} processes ({} = {}), but this one runs without peers (no \
         remote cache hits: every miss is read from storage) because {because}",
        l.name, l.processes, l.variable, l.processes
    )
}

/// The reason a build without MPI gives.
pub(crate) fn built_without_mpi() -> String {
    format!("this lobster_io was built without MPI; rebuild it with {REBUILD}")
}

/// Where this process stands, and its MPI job if it joins one: under an MPI launcher a
/// build with MPI joins it (each process a node); otherwise the launcher's variables (or
/// `launch=`) place it, and a launcher of several processes gets the warning.
pub(crate) fn place(py: Python<'_>, given: &Given) -> PyResult<(NodeEnv, Option<World>)> {
    let found = launcher(|v| std::env::var(v).ok());
    let Some(l) = found else {
        return Ok((params::place(given)?, None));
    };
    if !BUILT_WITH_MPI {
        warn_once(py, &without_peers(&l, &built_without_mpi()))?;
        return Ok((params::place(given)?, None));
    }
    if !l.mpi_wired {
        let why = "srun did not wire MPI (no PMI_RANK or PMIX_RANK): run it as `srun \
                   --mpi=pmix` (or --mpi=pmi2)";
        warn_once(py, &without_peers(&l, why))?;
        return Ok((params::place(given)?, None));
    }
    join_world(py, given, &l)
}

#[cfg(feature = "mpi")]
fn join_world(py: Python<'_>, given: &Given, l: &Launcher) -> PyResult<(NodeEnv, Option<World>)> {
    let world = join(py)?;
    if world.nodes() != l.processes {
        let why = format!(
            "MPI_COMM_WORLD has {} processes (the launcher did not wire MPI, or another MPI \
             library was loaded)",
            world.nodes()
        );
        warn_once(py, &without_peers(l, &why))?;
        return Ok((params::place(given)?, None));
    }
    let env = params::mpi_place(given, world.node(), world.nodes())?;
    Ok((env, Some(world)))
}

#[cfg(not(feature = "mpi"))]
fn join_world(
    _py: Python<'_>,
    _given: &Given,
    _l: &Launcher,
) -> PyResult<(NodeEnv, Option<World>)> {
    unreachable!("only a build with MPI joins it")
}

#[cfg(feature = "mpi")]
pub(crate) use with_mpi::{join, World};

/// A loader holding the MPI transport, closed at exit before MPI is finalised.
#[cfg_attr(
    not(feature = "mpi"),
    expect(dead_code, reason = "only a build with MPI closes loaders at exit")
)]
pub(crate) trait Closable: Send {
    /// Whether the loader is still open.
    fn open(&self) -> bool;
    fn close(&self);
}

/// Without MPI there is no MPI job to be a node of.
#[cfg(not(feature = "mpi"))]
#[derive(Clone)]
pub(crate) enum World {}

#[cfg(not(feature = "mpi"))]
impl World {
    pub(crate) fn transport(&self) -> std::sync::Arc<dyn lobster_io::net::Transport> {
        match *self {}
    }

    pub(crate) fn agree(&self, _fields: Vec<(String, String)>) -> PyResult<()> {
        match *self {}
    }

    pub(crate) fn barrier(&self) -> PyResult<()> {
        match *self {}
    }

    pub(crate) fn track(&self, _loader: Box<dyn Closable>) {
        match *self {}
    }
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::sync::{Arc, Mutex};

    use lobster_io::net::{Agreement, MpiNodes, Transport};
    use pyo3::prelude::*;

    use super::Closable;
    use crate::errors::NodeError;

    /// The process's MPI, from the first loader that joined it to `atexit`.
    enum State {
        NotJoined,
        Joined(Arc<MpiNodes>),
        /// Starting failed: MPI cannot be initialised again, so the reason stays.
        Failed(String),
        Finalized,
    }

    static STATE: Mutex<State> = Mutex::new(State::NotJoined);

    /// Loaders to close before MPI is finalised.
    static LIVE: Mutex<Vec<Box<dyn Closable>>> = Mutex::new(Vec::new());

    /// This process as one node of the MPI job.
    #[derive(Clone)]
    pub(crate) struct World {
        nodes: Arc<MpiNodes>,
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the MPI job, starting MPI on the first call (and registering its finalising
    /// at exit).
    pub(crate) fn join(py: Python<'_>) -> PyResult<World> {
        let mut state = lock(&STATE);
        match &*state {
            State::Joined(nodes) => {
                return Ok(World {
                    nodes: nodes.clone(),
                })
            }
            State::Failed(reason) => return Err(NodeError::new_err(reason.clone())),
            State::Finalized => {
                return Err(NodeError::new_err(
                    "MPI was finalised at exit: no loader can join it again",
                ))
            }
            State::NotJoined => {}
        }
        // With the GIL held: a thread that released it here would need it back for atexit
        // while another, holding it, waits for the state.
        match MpiNodes::start() {
            Ok(nodes) => {
                let nodes = Arc::new(nodes);
                py.import("atexit")?
                    .call_method1("register", (wrap_pyfunction!(finalize_at_exit, py)?,))?;
                *state = State::Joined(nodes.clone());
                Ok(World { nodes })
            }
            Err(e) => {
                let reason = format!("joining the MPI job: {e}");
                *state = State::Failed(reason.clone());
                Err(NodeError::new_err(reason))
            }
        }
    }

    impl World {
        pub(crate) fn node(&self) -> usize {
            self.nodes.node()
        }

        pub(crate) fn nodes(&self) -> usize {
            self.nodes.nodes()
        }

        pub(crate) fn transport(&self) -> Arc<dyn Transport> {
            self.nodes.clone()
        }

        /// Refuses to go on unless every node brings the same `fields`: collective.
        pub(crate) fn agree(&self, fields: Vec<(String, String)>) -> PyResult<()> {
            self.nodes.agree(Agreement::new(fields)).map_err(|e| {
                NodeError::new_err(format!(
                    "checking that every node plans from the same inputs: {e}"
                ))
            })
        }

        /// Waits until every node is here, serving peers meanwhile: collective.
        pub(crate) fn barrier(&self) -> PyResult<()> {
            self.nodes
                .barrier()
                .map_err(|e| NodeError::new_err(format!("the MPI job's barrier: {e}")))
        }

        /// Remembers a loader to close before MPI is finalised.
        pub(crate) fn track(&self, loader: Box<dyn Closable>) {
            let mut live = lock(&LIVE);
            live.retain(|l| l.open());
            live.push(loader);
        }
    }

    /// Closes the loaders still open, then finalises MPI (lobster-net's thread does when its
    /// last handle drops).
    #[pyfunction]
    fn finalize_at_exit(py: Python<'_>) {
        let live = std::mem::take(&mut *lock(&LIVE));
        let state = std::mem::replace(&mut *lock(&STATE), State::Finalized);
        py.detach(move || {
            for loader in live {
                loader.close();
            }
            if let State::Joined(nodes) = state {
                if Arc::strong_count(&nodes) > 1 {
                    log::warn!("lobster_io: MPI is still in use at exit; not finalising it");
                }
                drop(nodes);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            v.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn mpirun_of_several_processes_is_a_launcher_wired_for_mpi() {
        let l = launcher(vars(&[("OMPI_COMM_WORLD_SIZE", "4")])).expect("a launcher");
        assert_eq!((l.name, l.processes, l.mpi_wired), ("mpirun", 4, true));
    }

    #[test]
    fn one_process_is_no_job_of_several() {
        assert_eq!(launcher(vars(&[("OMPI_COMM_WORLD_SIZE", "1")])), None);
        assert_eq!(launcher(vars(&[])), None);
    }

    #[test]
    fn srun_without_pmi_is_not_wired_for_mpi_and_the_step_count_wins() {
        let v = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ];
        let l = launcher(vars(&v)).expect("a launcher");
        assert_eq!(
            (l.variable, l.processes, l.mpi_wired),
            ("SLURM_STEP_NUM_TASKS", 2, false)
        );
        let with_pmi = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("PMIX_RANK", "1"),
        ];
        assert!(launcher(vars(&with_pmi)).expect("a launcher").mpi_wired);
    }
}
