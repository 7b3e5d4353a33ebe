//! Where a rank process stands in the job, read from its launcher's environment.
//!
//! torchrun, Open MPI's `mpirun` and Slurm's `srun` each describe a rank with their own
//! variables. The `LOBSTER_*` variables stand in for any other launcher, and
//! `LOBSTER_JOB_ID` replaces whatever job id the launcher gave.

use crate::error::NodeError;

/// Longest job id: keeps the socket name well inside the 107 bytes an abstract address has.
const JOB_ID_MAX_BYTES: usize = 64;

/// torchrun's run id when `--rdzv-id` is not given: unrelated jobs share it.
const TORCHRUN_DEFAULT_RUN_ID: &str = "none";

/// Where a rank process stands in the job, and the job's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEnv {
    /// Global rank, in `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Rank within this node, in `0..local_world_size`; local rank 0 hosts the node's engine.
    pub local_rank: usize,
    /// Number of ranks on this node.
    pub local_world_size: usize,
    /// This node's index, in `0..nodes`.
    pub node: usize,
    /// Number of nodes in the job.
    pub nodes: usize,
    /// Keys the rendezvous, so two jobs on one machine never meet: 1 to 64 bytes of
    /// `[A-Za-z0-9._-]`.
    pub job_id: String,
}

/// What each field is called in errors: `new`'s parameters, or the variables it came from.
struct Names {
    rank: &'static str,
    world_size: &'static str,
    local_rank: &'static str,
    local_world_size: &'static str,
    node: &'static str,
    nodes: &'static str,
    job_id: &'static str,
}

const PARAMETERS: Names = Names {
    rank: "rank",
    world_size: "world_size",
    local_rank: "local_rank",
    local_world_size: "local_world_size",
    node: "node",
    nodes: "nodes",
    job_id: "job_id",
};

type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A job id and the variable it came from.
type JobId = (String, &'static str);

/// A launcher's view of this rank, before `LOBSTER_JOB_ID` has its say.
struct Found {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    node: usize,
    nodes: usize,
    names: Names,
    /// Sanitized. An error (no id, or a malformed one) only counts without `LOBSTER_JOB_ID`.
    job_id: Result<JobId, NodeError>,
}

impl NodeEnv {
    /// Checks an explicit position: `local_rank < local_world_size <= world_size`,
    /// `rank < world_size`, `node < nodes`, and a job id of 1 to 64 bytes of
    /// `[A-Za-z0-9._-]`. Errors name the parameter.
    pub fn new(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        local_world_size: usize,
        node: usize,
        nodes: usize,
        job_id: impl Into<String>,
    ) -> Result<Self, NodeError> {
        let env = NodeEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node,
            nodes,
            job_id: job_id.into(),
        };
        env.checked(&PARAMETERS)
    }

    /// Reads this process's environment; see [`NodeEnv::from_vars`].
    pub fn from_env() -> Result<Self, NodeError> {
        // Lossy, so a non-UTF-8 value is refused by its parser with its name, not taken as unset.
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Finds where this rank stands from variables looked up with `get`.
    ///
    /// The first of these that is present decides: `LOBSTER_LOCAL_RANK` (then all six
    /// `LOBSTER_*` positions are required), torchrun's `LOCAL_RANK`, Open MPI's
    /// `OMPI_COMM_WORLD_LOCAL_RANK`, Slurm's `SLURM_LOCALID`. `LOBSTER_JOB_ID`, if set,
    /// replaces the launcher's job id. Errors name the variable and its value.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, NodeError> {
        let get: Get<'_> = &get;
        let found = if get("LOBSTER_LOCAL_RANK").is_some() {
            explicit(get)?
        } else if get("LOCAL_RANK").is_some() {
            torchrun(get)?
        } else if get("OMPI_COMM_WORLD_LOCAL_RANK").is_some() {
            open_mpi(get)?
        } else if get("SLURM_LOCALID").is_some() {
            slurm(get)?
        } else {
            return Err(launch_error(
                "LOCAL_RANK",
                "no launcher environment found (torchrun, Open MPI or Slurm variables), \
                 and no LOBSTER_LOCAL_RANK",
            ));
        };
        // An explicit id is checked as given, never sanitized: a typo should be seen.
        let (job_id, job_id_name) = match get("LOBSTER_JOB_ID") {
            Some(id) => (id, "LOBSTER_JOB_ID"),
            None => found.job_id?,
        };
        let names = Names {
            job_id: job_id_name,
            ..found.names
        };
        let env = NodeEnv {
            rank: found.rank,
            world_size: found.world_size,
            local_rank: found.local_rank,
            local_world_size: found.local_world_size,
            node: found.node,
            nodes: found.nodes,
            job_id,
        };
        env.checked(&names)
    }

    /// The abstract Unix socket name of this node's host, without the leading NUL
    /// (for `SocketAddr::from_abstract_name`).
    pub fn address(&self) -> String {
        format!("lobster-io/{}/node-{}", self.job_id, self.node)
    }

    /// Whether this process hosts the node's engine.
    pub fn is_host(&self) -> bool {
        self.local_rank == 0
    }

    fn checked(self, names: &Names) -> Result<Self, NodeError> {
        // A count of at least one, and an index below its count, each named.
        let at_least_one = |count: usize, name: &str, what: &str| match count {
            0 => Err(launch_error(name, format!("is 0: {what}"))),
            _ => Ok(()),
        };
        let below = |index: usize, name: &str, count: usize, count_name: &str| match index < count {
            true => Ok(()),
            false => Err(launch_error(
                name,
                format!("{index} is not below {count_name} {count}"),
            )),
        };
        at_least_one(
            self.local_world_size,
            names.local_world_size,
            "a node has at least one rank",
        )?;
        below(
            self.local_rank,
            names.local_rank,
            self.local_world_size,
            names.local_world_size,
        )?;
        at_least_one(
            self.world_size,
            names.world_size,
            "a job has at least one rank",
        )?;
        below(self.rank, names.rank, self.world_size, names.world_size)?;
        if self.local_world_size > self.world_size {
            return Err(launch_error(
                names.local_world_size,
                format!(
                    "{} ranks on this node are more than {} {}",
                    self.local_world_size, names.world_size, self.world_size
                ),
            ));
        }
        at_least_one(self.nodes, names.nodes, "a job has at least one node")?;
        below(self.node, names.node, self.nodes, names.nodes)?;
        check_job_id(&self.job_id, names.job_id)?;
        Ok(self)
    }
}

fn launch_error(variable: &str, reason: impl Into<String>) -> NodeError {
    NodeError::Launch {
        variable: variable.to_owned(),
        reason: reason.into(),
    }
}

fn job_id_byte_allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn check_job_id(id: &str, name: &str) -> Result<(), NodeError> {
    if id.is_empty() {
        return Err(launch_error(name, "is empty"));
    }
    if id.len() > JOB_ID_MAX_BYTES {
        return Err(launch_error(
            name,
            format!("{id:?} is {} bytes, more than {JOB_ID_MAX_BYTES}", id.len()),
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii() && job_id_byte_allowed(*c as u8)))
    {
        return Err(launch_error(
            name,
            format!("{id:?} has {c:?}: only A-Z a-z 0-9 . _ - are allowed"),
        ));
    }
    Ok(())
}

/// Makes a launcher's id a valid job id: its ids are not ours to refuse.
fn sanitize_job_id(raw: &str) -> String {
    let clean: String = raw
        .bytes()
        .map(|b| {
            if job_id_byte_allowed(b) {
                char::from(b)
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= JOB_ID_MAX_BYTES {
        return clean;
    }
    // A readable prefix, and a hash of the whole id so long ids that share it stay apart.
    let hash = fnv1a_64(raw.as_bytes());
    format!("{}-{hash:016x}", &clean[..JOB_ID_MAX_BYTES - 17])
}

/// FNV-1a: every rank must derive the same id, and std's hasher may change between builds.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn missing_job_id(variable: &str, also: &str) -> NodeError {
    launch_error(
        variable,
        format!(
            "not set{also}, so this job cannot be told apart from others on the machine: \
             set LOBSTER_JOB_ID to an id unique to the job (1 to {JOB_ID_MAX_BYTES} of \
             A-Z a-z 0-9 . _ -)"
        ),
    )
}

fn parse_count(variable: &str, value: &str) -> Result<usize, NodeError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(launch_error(
            variable,
            format!("value {value:?} is not a non-negative integer"),
        ));
    }
    value
        .parse()
        .map_err(|_| launch_error(variable, format!("value {value:?} is too large")))
}

/// A launcher's variables, for errors that say why a missing one was expected.
struct Vars<'a> {
    get: Get<'a>,
    /// The variable that chose this launcher, and what it was taken for.
    trigger: &'static str,
    taken_for: &'static str,
}

impl Vars<'_> {
    fn count(&self, name: &'static str) -> Result<usize, NodeError> {
        match (self.get)(name) {
            Some(value) => parse_count(name, &value),
            None => Err(launch_error(
                name,
                format!(
                    "not set, though {} is (taken for {})",
                    self.trigger, self.taken_for
                ),
            )),
        }
    }

    /// The first of `names` that is set, parsed.
    fn first_count(
        &self,
        names: &[&'static str],
    ) -> Result<Option<(usize, &'static str)>, NodeError> {
        for &name in names {
            if let Some(value) = (self.get)(name) {
                return Ok(Some((parse_count(name, &value)?, name)));
            }
        }
        Ok(None)
    }
}

/// A set, non-empty value: launchers' empty ids are no ids.
fn non_empty(get: Get<'_>, name: &'static str) -> Option<JobId> {
    get(name).filter(|v| !v.is_empty()).map(|v| (v, name))
}

fn sanitized(id: JobId) -> JobId {
    (sanitize_job_id(&id.0), id.1)
}

fn explicit(get: Get<'_>) -> Result<Found, NodeError> {
    let v = Vars {
        get,
        trigger: "LOBSTER_LOCAL_RANK",
        taken_for: "the LOBSTER_* layer, which needs all six positions",
    };
    Ok(Found {
        rank: v.count("LOBSTER_RANK")?,
        world_size: v.count("LOBSTER_WORLD_SIZE")?,
        local_rank: v.count("LOBSTER_LOCAL_RANK")?,
        local_world_size: v.count("LOBSTER_LOCAL_WORLD_SIZE")?,
        node: v.count("LOBSTER_NODE")?,
        nodes: v.count("LOBSTER_NODES")?,
        names: Names {
            rank: "LOBSTER_RANK",
            world_size: "LOBSTER_WORLD_SIZE",
            local_rank: "LOBSTER_LOCAL_RANK",
            local_world_size: "LOBSTER_LOCAL_WORLD_SIZE",
            node: "LOBSTER_NODE",
            nodes: "LOBSTER_NODES",
            job_id: "LOBSTER_JOB_ID",
        },
        // Positions may be overridden under a real launcher whose job id still holds.
        job_id: launcher_job_id(get),
    })
}

fn launcher_job_id(get: Get<'_>) -> Result<JobId, NodeError> {
    let first = [
        torchrun_job_id(get),
        open_mpi_job_id(get)?,
        slurm_job_id(get),
    ]
    .into_iter()
    .flatten()
    .next();
    first.map(sanitized).ok_or_else(|| {
        missing_job_id(
            "LOBSTER_JOB_ID",
            ", nor any launcher's job id (TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid, \
             PMIX_NAMESPACE, SLURM_JOB_ID)",
        )
    })
}

fn torchrun(get: Get<'_>) -> Result<Found, NodeError> {
    let v = Vars {
        get,
        trigger: "LOCAL_RANK",
        taken_for: "torchrun",
    };
    let local_rank = v.count("LOCAL_RANK")?;
    let local_world_size = v.count("LOCAL_WORLD_SIZE")?;
    let rank = v.count("RANK")?;
    let world_size = v.count("WORLD_SIZE")?;
    let node = v.count("GROUP_RANK")?;
    let (nodes, nodes_name) = match v.first_count(&["GROUP_WORLD_SIZE"])? {
        Some(found) => found,
        None => {
            if local_world_size == 0 || world_size % local_world_size != 0 {
                return Err(launch_error(
                    "WORLD_SIZE",
                    format!(
                        "{world_size} is not a multiple of LOCAL_WORLD_SIZE \
                         {local_world_size}, and no GROUP_WORLD_SIZE gives the nodes"
                    ),
                ));
            }
            (world_size / local_world_size, "WORLD_SIZE")
        }
    };
    Ok(Found {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node,
        nodes,
        names: Names {
            rank: "RANK",
            world_size: "WORLD_SIZE",
            local_rank: "LOCAL_RANK",
            local_world_size: "LOCAL_WORLD_SIZE",
            node: "GROUP_RANK",
            nodes: nodes_name,
            job_id: "TORCHELASTIC_RUN_ID",
        },
        job_id: torchrun_job_id(get)
            .map(sanitized)
            .ok_or_else(|| missing_job_id("TORCHELASTIC_RUN_ID", "")),
    })
}

fn torchrun_job_id(get: Get<'_>) -> Option<JobId> {
    let (id, name) = non_empty(get, "TORCHELASTIC_RUN_ID")?;
    if id != TORCHRUN_DEFAULT_RUN_ID {
        return Some((id, name));
    }
    // Without --rdzv-id every job is "none". The master's address and port are the same for
    // all the job's ranks and no two live jobs share them (the port is bound by the store).
    match (get("MASTER_ADDR"), get("MASTER_PORT")) {
        (Some(addr), Some(port)) => Some((format!("{id}-{addr}-{port}"), name)),
        _ => Some((id, name)),
    }
}

fn open_mpi(get: Get<'_>) -> Result<Found, NodeError> {
    let v = Vars {
        get,
        trigger: "OMPI_COMM_WORLD_LOCAL_RANK",
        taken_for: "Open MPI",
    };
    let rank = v.count("OMPI_COMM_WORLD_RANK")?;
    let world_size = v.count("OMPI_COMM_WORLD_SIZE")?;
    let local_rank = v.count("OMPI_COMM_WORLD_LOCAL_RANK")?;
    let local_world_size = v.count("OMPI_COMM_WORLD_LOCAL_SIZE")?;
    // Open MPI exports no node index (OMPI_COMM_WORLD_NODE_RANK is a rank within the node),
    // so assume the default mapping by slot: each node holds a block of consecutive ranks,
    // the same number on every node. Uneven blocks would give the ranks of one node
    // different indices, so refuse them instead of leaving ranks waiting on a host that
    // is not there.
    let block_start = rank.checked_sub(local_rank);
    let even = local_world_size > 0
        && world_size % local_world_size == 0
        && block_start.is_some_and(|start| start % local_world_size == 0);
    if !even {
        return Err(launch_error(
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            format!(
                "ranks are not laid out node by node in equal blocks (rank {rank}, local rank \
                 {local_rank} of {local_world_size}, {world_size} ranks), so the node index \
                 cannot be derived: use --map-by slot with as many ranks on every node, or set \
                 the LOBSTER_* variables"
            ),
        ));
    }
    Ok(Found {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node: rank / local_world_size,
        nodes: world_size / local_world_size,
        names: Names {
            rank: "OMPI_COMM_WORLD_RANK",
            world_size: "OMPI_COMM_WORLD_SIZE",
            local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
            local_world_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
            node: "OMPI_COMM_WORLD_RANK",
            nodes: "OMPI_COMM_WORLD_SIZE",
            job_id: "OMPI_MCA_ess_base_jobid",
        },
        job_id: open_mpi_job_id(get).and_then(|id| {
            id.map(sanitized).ok_or_else(|| {
                missing_job_id(
                    "OMPI_MCA_ess_base_jobid",
                    " (nor OMPI_MCA_orte_ess_jobid, PMIX_NAMESPACE or PMIX_ID)",
                )
            })
        }),
    })
}

fn open_mpi_job_id(get: Get<'_>) -> Result<Option<JobId>, NodeError> {
    let named = [
        "OMPI_MCA_ess_base_jobid",
        "OMPI_MCA_orte_ess_jobid",
        "PMIX_NAMESPACE",
    ]
    .into_iter()
    .find_map(|name| non_empty(get, name));
    if named.is_some() {
        return Ok(named);
    }
    let Some((id, name)) = non_empty(get, "PMIX_ID") else {
        return Ok(None);
    };
    // PMIX_ID is "<namespace>.<rank>": only the namespace is the same on every rank.
    match id.rsplit_once('.') {
        Some((namespace, rank))
            if !namespace.is_empty()
                && !rank.is_empty()
                && rank.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Ok(Some((namespace.to_owned(), name)))
        }
        _ => Err(launch_error(
            name,
            format!("value {id:?} is not <namespace>.<rank>"),
        )),
    }
}

fn slurm(get: Get<'_>) -> Result<Found, NodeError> {
    let v = Vars {
        get,
        trigger: "SLURM_LOCALID",
        taken_for: "Slurm",
    };
    let rank = v.count("SLURM_PROCID")?;
    let local_rank = v.count("SLURM_LOCALID")?;
    let node = v.count("SLURM_NODEID")?;
    // The step's own counts first: a step may use less of the allocation than the job has.
    let (world_size, world_size_name) =
        v.first_count(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])?
            .ok_or_else(|| launch_error("SLURM_NTASKS", "not set, though SLURM_LOCALID is"))?;
    let (nodes, nodes_name) = v
        .first_count(&[
            "SLURM_STEP_NUM_NODES",
            "SLURM_NNODES",
            "SLURM_JOB_NUM_NODES",
        ])?
        .ok_or_else(|| launch_error("SLURM_NNODES", "not set, though SLURM_LOCALID is"))?;
    // The step's layout first: SLURM_NTASKS_PER_NODE is the request, and an srun that
    // inherits it from sbatch may run fewer tasks on a node.
    let (local_world_size, local_world_size_name) =
        if let Some(value) = get("SLURM_STEP_TASKS_PER_NODE") {
            let count = tasks_on_node("SLURM_STEP_TASKS_PER_NODE", &value, node)?;
            (count, "SLURM_STEP_TASKS_PER_NODE")
        } else if let Some(found) = v.first_count(&["SLURM_NTASKS_PER_NODE"])? {
            found
        } else if let Some(value) = get("SLURM_TASKS_PER_NODE") {
            let count = tasks_on_node("SLURM_TASKS_PER_NODE", &value, node)?;
            (count, "SLURM_TASKS_PER_NODE")
        } else {
            return Err(launch_error(
                "SLURM_TASKS_PER_NODE",
                "not set (nor SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE), though \
                 SLURM_LOCALID is",
            ));
        };
    Ok(Found {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node,
        nodes,
        names: Names {
            rank: "SLURM_PROCID",
            world_size: world_size_name,
            local_rank: "SLURM_LOCALID",
            local_world_size: local_world_size_name,
            node: "SLURM_NODEID",
            nodes: nodes_name,
            job_id: "SLURM_JOB_ID",
        },
        job_id: slurm_job_id(get)
            .map(sanitized)
            .ok_or_else(|| missing_job_id("SLURM_JOB_ID", "")),
    })
}

fn slurm_job_id(get: Get<'_>) -> Option<JobId> {
    let (job, name) = non_empty(get, "SLURM_JOB_ID").or_else(|| non_empty(get, "SLURM_JOBID"))?;
    // Steps of one job may run side by side on a node.
    match non_empty(get, "SLURM_STEP_ID").or_else(|| non_empty(get, "SLURM_STEPID")) {
        Some((step, _)) => Some((format!("{job}.{step}"), name)),
        None => Some((job, name)),
    }
}

/// The entry for `node` in Slurm's compressed tasks-per-node list, like `4(x2),3`
/// (4, 4, 3). The whole list is checked, and repeats are counted rather than expanded.
fn tasks_on_node(variable: &str, value: &str, node: usize) -> Result<usize, NodeError> {
    let malformed = || {
        launch_error(
            variable,
            format!("value {value:?} is not a tasks-per-node list like \"4(x2),3\""),
        )
    };
    let number = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        s.parse::<usize>().map_err(|_| malformed())
    };
    let mut listed_nodes = 0usize;
    let mut found = None;
    for item in value.split(',') {
        let (count, repeat) = match item.strip_suffix(')') {
            Some(head) => {
                let (count, repeat) = head.split_once("(x").ok_or_else(malformed)?;
                (number(count)?, number(repeat)?)
            }
            None => (number(item)?, 1),
        };
        if repeat == 0 {
            return Err(malformed());
        }
        let next = listed_nodes.saturating_add(repeat);
        if found.is_none() && node < next {
            found = Some(count);
        }
        listed_nodes = next;
    }
    found.ok_or_else(|| {
        launch_error(
            variable,
            format!("value {value:?} lists {listed_nodes} nodes, but SLURM_NODEID is {node}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    type Var = (&'static str, &'static str);
    type VarList = Vec<Var>;

    fn from(vars: &[(&str, &str)]) -> Result<NodeEnv, NodeError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NodeEnv::from_vars(|name| map.get(name).cloned())
    }

    fn env(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        local_world_size: usize,
        node: usize,
        nodes: usize,
        job_id: &str,
    ) -> NodeEnv {
        NodeEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node,
            nodes,
            job_id: job_id.to_owned(),
        }
    }

    /// torchrun, 2 nodes of 4: rank 5 is local rank 1 on node 1.
    const TORCHRUN: &[(&str, &str)] = &[
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("GROUP_RANK", "1"),
        ("TORCHELASTIC_RUN_ID", "run-a"),
    ];

    fn with(base: &[Var], extra: &[Var]) -> VarList {
        let mut vars: Vec<_> = base
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        vars.extend_from_slice(extra);
        vars
    }

    fn without(base: &[Var], name: &str) -> VarList {
        base.iter().filter(|(k, _)| *k != name).copied().collect()
    }

    // One table of every launcher's variables: it reads better whole than split.
    #[test]
    fn detects_each_launcher() {
        let cases: Vec<(&str, VarList, NodeEnv)> = vec![
            (
                "torchrun 2 nodes x 4, nodes from WORLD_SIZE / LOCAL_WORLD_SIZE",
                TORCHRUN.to_vec(),
                env(5, 8, 1, 4, 1, 2, "run-a"),
            ),
            (
                "torchrun, GROUP_WORLD_SIZE wins",
                with(TORCHRUN, &[("GROUP_WORLD_SIZE", "3"), ("WORLD_SIZE", "12")]),
                env(5, 12, 1, 4, 1, 3, "run-a"),
            ),
            (
                "torchrun's default run id is told apart by its master",
                with(
                    TORCHRUN,
                    &[
                        ("TORCHELASTIC_RUN_ID", "none"),
                        ("MASTER_ADDR", "10.0.0.7"),
                        ("MASTER_PORT", "29500"),
                    ],
                ),
                env(5, 8, 1, 4, 1, 2, "none-10.0.0.7-29500"),
            ),
            (
                "Open MPI rank 5 of 8, local size 4: node 1 of 2",
                vec![
                    ("OMPI_COMM_WORLD_RANK", "5"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                    ("OMPI_COMM_WORLD_NODE_RANK", "1"),
                    ("OMPI_MCA_ess_base_jobid", "3735879681"),
                ],
                env(5, 8, 1, 4, 1, 2, "3735879681"),
            ),
            (
                "Open MPI rank 2: node 0 although its NODE_RANK is 2; PMIX_ID's rank dropped",
                vec![
                    ("OMPI_COMM_WORLD_RANK", "2"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                    ("OMPI_COMM_WORLD_NODE_RANK", "2"),
                    ("PMIX_ID", "prterun-gpu01-4242@1.2"),
                ],
                env(2, 8, 2, 4, 0, 2, "prterun-gpu01-4242_1"),
            ),
            (
                "Slurm 4(x2),3 on node 2: 3 local ranks, job id with step",
                vec![
                    ("SLURM_PROCID", "9"),
                    ("SLURM_NTASKS", "11"),
                    ("SLURM_LOCALID", "1"),
                    ("SLURM_NODEID", "2"),
                    ("SLURM_NNODES", "3"),
                    ("SLURM_TASKS_PER_NODE", "4(x2),3"),
                    ("SLURM_JOB_ID", "4242"),
                    ("SLURM_STEP_ID", "0"),
                ],
                env(9, 11, 1, 3, 2, 3, "4242.0"),
            ),
            (
                "Slurm: the step's layout beats an inherited SLURM_NTASKS_PER_NODE",
                vec![
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_LOCALID", "1"),
                    ("SLURM_NODEID", "0"),
                    ("SLURM_NNODES", "1"),
                    ("SLURM_NTASKS_PER_NODE", "4"),
                    ("SLURM_STEP_TASKS_PER_NODE", "2"),
                    ("SLURM_TASKS_PER_NODE", "4"),
                    ("SLURM_JOB_ID", "77"),
                ],
                env(1, 2, 1, 2, 0, 1, "77"),
            ),
            (
                "LOBSTER_JOB_ID replaces the launcher's id",
                with(TORCHRUN, &[("LOBSTER_JOB_ID", "mine.1")]),
                env(5, 8, 1, 4, 1, 2, "mine.1"),
            ),
            (
                "the LOBSTER_* layer wins over torchrun, keeping its run id",
                with(
                    TORCHRUN,
                    &[
                        ("LOBSTER_RANK", "6"),
                        ("LOBSTER_WORLD_SIZE", "9"),
                        ("LOBSTER_LOCAL_RANK", "0"),
                        ("LOBSTER_LOCAL_WORLD_SIZE", "3"),
                        ("LOBSTER_NODE", "2"),
                        ("LOBSTER_NODES", "3"),
                    ],
                ),
                env(6, 9, 0, 3, 2, 3, "run-a"),
            ),
            (
                "a launcher's id is sanitized, not refused",
                with(TORCHRUN, &[("TORCHELASTIC_RUN_ID", "job 7/a")]),
                env(5, 8, 1, 4, 1, 2, "job_7_a"),
            ),
        ];
        for (name, vars, expected) in cases {
            match from(&vars) {
                Ok(found) => assert_eq!(found, expected, "{name}"),
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    // One table of refused environments and the variable each error names: it reads better
    // whole than split.
    #[test]
    fn refuses_naming_the_variable() {
        let ompi_uneven = vec![
            ("OMPI_COMM_WORLD_RANK", "9"),
            ("OMPI_COMM_WORLD_SIZE", "11"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("OMPI_MCA_ess_base_jobid", "1"),
        ];
        let slurm = vec![
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "11"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_NNODES", "3"),
            ("SLURM_TASKS_PER_NODE", "4(x2),3"),
            ("SLURM_JOB_ID", "4242"),
        ];
        let cases: Vec<(&str, VarList, &str, &str)> = vec![
            (
                "missing job id",
                without(TORCHRUN, "TORCHELASTIC_RUN_ID"),
                "TORCHELASTIC_RUN_ID",
                "LOBSTER_JOB_ID",
            ),
            (
                "missing Slurm job id",
                without(&slurm, "SLURM_JOB_ID"),
                "SLURM_JOB_ID",
                "LOBSTER_JOB_ID",
            ),
            (
                "missing Open MPI job id",
                vec![
                    ("OMPI_COMM_WORLD_RANK", "5"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                ],
                "OMPI_MCA_ess_base_jobid",
                "LOBSTER_JOB_ID",
            ),
            (
                "non-numeric LOCAL_RANK",
                with(TORCHRUN, &[("LOCAL_RANK", "x")]),
                "LOCAL_RANK",
                "\"x\" is not a non-negative integer",
            ),
            (
                "local rank not below local world size",
                with(TORCHRUN, &[("LOCAL_RANK", "4")]),
                "LOCAL_RANK",
                "4 is not below LOCAL_WORLD_SIZE 4",
            ),
            (
                "no launcher",
                vec![("PATH", "/usr/bin")],
                "LOCAL_RANK",
                "no launcher environment found",
            ),
            (
                "a bad explicit job id is refused",
                with(TORCHRUN, &[("LOBSTER_JOB_ID", "a/b")]),
                "LOBSTER_JOB_ID",
                "'/'",
            ),
            (
                "the LOBSTER_* layer needs all six",
                with(TORCHRUN, &[("LOBSTER_LOCAL_RANK", "0")]),
                "LOBSTER_RANK",
                "not set",
            ),
            (
                "torchrun nodes that do not divide",
                with(TORCHRUN, &[("WORLD_SIZE", "10")]),
                "WORLD_SIZE",
                "not a multiple",
            ),
            (
                "torchrun missing GROUP_RANK",
                without(TORCHRUN, "GROUP_RANK"),
                "GROUP_RANK",
                "not set",
            ),
            (
                "Open MPI uneven blocks",
                ompi_uneven,
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "equal blocks",
            ),
            (
                "Slurm list cut short",
                with(&slurm, &[("SLURM_TASKS_PER_NODE", "4(x2")]),
                "SLURM_TASKS_PER_NODE",
                "\"4(x2\"",
            ),
            (
                "Slurm list without this node",
                with(&slurm, &[("SLURM_TASKS_PER_NODE", "4(x2)")]),
                "SLURM_TASKS_PER_NODE",
                "lists 2 nodes",
            ),
            (
                "PMIX_ID without a rank",
                vec![
                    ("OMPI_COMM_WORLD_RANK", "5"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                    ("PMIX_ID", "namespace"),
                ],
                "PMIX_ID",
                "<namespace>.<rank>",
            ),
        ];
        for (name, vars, variable, reason_part) in cases {
            match from(&vars) {
                Err(NodeError::Launch {
                    variable: v,
                    reason,
                }) => {
                    assert_eq!(v, variable, "{name}: {reason}");
                    assert!(reason.contains(reason_part), "{name}: {reason}");
                }
                other => panic!("{name}: expected a launch error, got {other:?}"),
            }
        }
    }

    #[test]
    fn different_run_ids_give_different_addresses() {
        let a = from(TORCHRUN).unwrap();
        let b = from(&with(TORCHRUN, &[("TORCHELASTIC_RUN_ID", "run-b")])).unwrap();
        assert_eq!(a.address(), "lobster-io/run-a/node-1");
        assert_ne!(a.address(), b.address());
        // Two torchrun jobs without --rdzv-id: their masters keep them apart.
        let none = |port| {
            from(&with(
                TORCHRUN,
                &[
                    ("TORCHELASTIC_RUN_ID", "none"),
                    ("MASTER_ADDR", "localhost"),
                    ("MASTER_PORT", port),
                ],
            ))
            .unwrap()
        };
        assert_ne!(none("29500").address(), none("29501").address());
    }

    #[test]
    fn long_launcher_ids_are_shortened_apart() {
        let a = sanitize_job_id(&format!("{}a", "n".repeat(100)));
        let b = sanitize_job_id(&format!("{}b", "n".repeat(100)));
        assert_eq!(a.len(), JOB_ID_MAX_BYTES);
        assert_ne!(a, b);
        assert!(check_job_id(&a, "x").is_ok());
        assert_eq!(sanitize_job_id("ok-1.2_3"), "ok-1.2_3");
    }

    #[test]
    fn new_validates_naming_the_parameter() {
        assert!(NodeEnv::new(0, 1, 0, 1, 0, 1, "j").unwrap().is_host());
        assert!(!NodeEnv::new(3, 4, 1, 2, 1, 2, "j").unwrap().is_host());
        let long = "j".repeat(JOB_ID_MAX_BYTES + 1);
        let cases: [(NodeEnv, &str); 9] = [
            (env(0, 4, 2, 2, 0, 2, "j"), "local_rank"),
            (env(0, 4, 0, 0, 0, 2, "j"), "local_world_size"),
            (env(4, 4, 0, 2, 0, 2, "j"), "rank"),
            (env(0, 2, 0, 4, 0, 1, "j"), "local_world_size"),
            (env(0, 4, 0, 2, 2, 2, "j"), "node"),
            (env(0, 4, 0, 2, 0, 0, "j"), "nodes"),
            (env(0, 4, 0, 2, 0, 2, ""), "job_id"),
            (env(0, 4, 0, 2, 0, 2, &long), "job_id"),
            (env(0, 4, 0, 2, 0, 2, "a b"), "job_id"),
        ];
        for (bad, parameter) in cases {
            let e = bad.clone();
            match NodeEnv::new(
                e.rank,
                e.world_size,
                e.local_rank,
                e.local_world_size,
                e.node,
                e.nodes,
                e.job_id,
            ) {
                Err(NodeError::Launch { variable, .. }) => {
                    assert_eq!(variable, parameter, "{bad:?}")
                }
                other => panic!("{bad:?}: expected a launch error, got {other:?}"),
            }
        }
    }

    #[test]
    fn slurm_lists_expand_by_node() {
        let entries: Vec<usize> = (0..5)
            .map(|node| tasks_on_node("V", "2,4(x3),1", node).unwrap())
            .collect();
        assert_eq!(entries, [2, 4, 4, 4, 1]);
        assert!(tasks_on_node("V", "4(x0)", 0).is_err());
        assert!(tasks_on_node("V", "", 0).is_err());
    }
}
