//! The five loading strategies `lobster run` compares, and what each sets on the loader.

use std::fmt;
use std::str::FromStr;

use lobster_io::{CachePolicy, Execution, LoaderConfig, PeerPlanChoice, PipelineThreads, Schedule};
use serde::Serialize;

/// A loading strategy; all of them run on the same loader, with different settings. The
/// command line and the JSON call it `strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// PyTorch's DataLoader: fixed equal workers per rank that read then decode; no cache.
    Pytorch,
    /// NoPFS: static placement cache; fixed equal workers that read then decode.
    Nopfs,
    /// Lobster: reuse-distance cache; io_uring io_depth and decode threads allocated per rank.
    Lobster,
    /// Ablation: Lobster's cache with fixed equal read-then-decode workers.
    LobsterCacheOnly,
    /// Ablation: NoPFS's cache with Lobster's per-rank allocation.
    LobsterAllocOnly,
    /// Lobster with each node planning its own cache, peers serving what they happen to
    /// hold: lobster without the cluster plan (with peers only; not in `all`).
    LobsterNodePlan,
}

/// What the strategies share, from the command line: the pipelined strategies' schedule and
/// decode threads, and the read-then-decode baselines' workers per rank.
#[derive(Clone, Copy, Debug)]
pub struct Budgets {
    pub pipelined_schedule: Schedule,
    pub decode_threads: usize,
    pub workers_per_rank: usize,
    pub cache_bytes: u64,
    /// For lobster's own strategies; the baselines' workers are normal threads, as theirs are.
    pub pipeline_threads: PipelineThreads,
}

impl Strategy {
    pub(crate) const ALL: [Strategy; 5] = [
        Strategy::Pytorch,
        Strategy::Nopfs,
        Strategy::LobsterCacheOnly,
        Strategy::LobsterAllocOnly,
        Strategy::Lobster,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Pytorch => "pytorch",
            Strategy::Nopfs => "nopfs",
            Strategy::Lobster => "lobster",
            Strategy::LobsterCacheOnly => "lobster-cache-only",
            Strategy::LobsterAllocOnly => "lobster-alloc-only",
            Strategy::LobsterNodePlan => "lobster-node-plan",
        }
    }

    pub(crate) fn cache(self) -> CachePolicy {
        match self {
            Strategy::Pytorch => CachePolicy::None,
            Strategy::Nopfs | Strategy::LobsterAllocOnly => CachePolicy::Static,
            Strategy::Lobster | Strategy::LobsterCacheOnly | Strategy::LobsterNodePlan => {
                CachePolicy::Reuse
            }
        }
    }

    pub(crate) fn execution(self) -> Execution {
        match self {
            Strategy::Pytorch | Strategy::Nopfs | Strategy::LobsterCacheOnly => {
                Execution::ReadThenDecode
            }
            Strategy::Lobster | Strategy::LobsterAllocOnly | Strategy::LobsterNodePlan => {
                Execution::Pipelined
            }
        }
    }

    /// Sets this strategy's cache, execution, schedule and threads on `config`; the layout,
    /// io_depth budget and storage settings are left as they are.
    pub fn apply(self, budgets: &Budgets, config: &mut LoaderConfig) {
        let cache = self.cache();
        config.cache.policy = cache;
        config.cache.capacity_bytes = if cache == CachePolicy::None {
            0
        } else {
            budgets.cache_bytes
        };
        config.execution = self.execution();
        config.cache.peer_plan = match self {
            Strategy::LobsterNodePlan => PeerPlanChoice::Node,
            _ => PeerPlanChoice::Auto,
        };
        // Decoded forms are the reuse cache's; the others keep encoded bytes.
        if cache != CachePolicy::Reuse {
            config.cache.forms = None;
        }
        config.budgets.pipeline_threads = match self {
            Strategy::Pytorch | Strategy::Nopfs => PipelineThreads::Normal,
            _ => budgets.pipeline_threads,
        };
        match config.execution {
            Execution::Pipelined => {
                config.budgets.schedule = budgets.pipelined_schedule;
                config.budgets.decode_threads = budgets.decode_threads;
            }
            // A worker holds one read in flight: its workers are the baseline's I/O depth.
            Execution::ReadThenDecode => {
                config.budgets.schedule = Schedule::EqualSplit;
                config.budgets.decode_threads =
                    budgets.workers_per_rank * config.job.ranks_per_node;
            }
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `all` or a comma-separated list of strategies (the `--strategy` flag), run in that order.
#[derive(Clone, Debug)]
pub struct Strategies(pub Vec<Strategy>);

impl FromStr for Strategies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Strategies(Strategy::ALL.to_vec()));
        }
        let mut out = Vec::new();
        for name in s.split(',') {
            let p = Strategy::ALL
                .into_iter()
                .chain([Strategy::LobsterNodePlan])
                .find(|p| p.name() == name.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown strategy {name:?}: expected all, or a list of pytorch, nopfs, \
                         lobster, lobster-cache-only, lobster-alloc-only, lobster-node-plan"
                    )
                })?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(Strategies(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_order_and_drops_repeats_and_all_is_every_strategy() {
        let got = "lobster, pytorch,lobster".parse::<Strategies>().unwrap().0;
        assert_eq!(got, [Strategy::Lobster, Strategy::Pytorch]);
        assert_eq!("all".parse::<Strategies>().unwrap().0, Strategy::ALL);
        let e = "pytorch,torch".parse::<Strategies>().unwrap_err();
        assert!(e.contains("\"torch\""), "{e}");
        for s in Strategy::ALL.into_iter().chain([Strategy::LobsterNodePlan]) {
            assert_eq!(s.name().parse::<Strategies>().unwrap().0, [s]);
            // The JSON spells a strategy as the command line does.
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }

    #[test]
    fn baselines_get_workers_per_rank_and_pipelined_ones_the_decode_threads() {
        let budgets = Budgets {
            pipelined_schedule: Schedule::Allocate { hysteresis: 0.1 },
            decode_threads: 8,
            workers_per_rank: 3,
            cache_bytes: 1000,
            pipeline_threads: PipelineThreads::Batch,
        };
        for s in Strategy::ALL {
            let mut config = LoaderConfig::default();
            config.job.ranks_per_node = 4;
            s.apply(&budgets, &mut config);
            let read_then_decode = matches!(
                s,
                Strategy::Pytorch | Strategy::Nopfs | Strategy::LobsterCacheOnly
            );
            assert_eq!(
                config.execution == Execution::ReadThenDecode,
                read_then_decode,
                "{s}"
            );
            if read_then_decode {
                assert_eq!(config.budgets.decode_threads, 12, "{s}");
                assert_eq!(config.budgets.schedule, Schedule::EqualSplit, "{s}");
            } else {
                assert_eq!(config.budgets.decode_threads, 8, "{s}");
                assert_eq!(config.budgets.schedule, budgets.pipelined_schedule, "{s}");
            }
            let baseline = matches!(s, Strategy::Pytorch | Strategy::Nopfs);
            let expected = if baseline {
                PipelineThreads::Normal
            } else {
                PipelineThreads::Batch
            };
            assert_eq!(config.budgets.pipeline_threads, expected, "{s}");
            let cached = s != Strategy::Pytorch;
            assert_eq!(config.cache.policy != CachePolicy::None, cached, "{s}");
            assert_eq!(config.cache.capacity_bytes, if cached { 1000 } else { 0 });
        }
    }
}
