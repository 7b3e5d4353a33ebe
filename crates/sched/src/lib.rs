//! lobster-sched: the cost model and the min-max allocator of io_depth and decode threads.
//!
//! Every window of iterations the planner knows exactly what each local rank will load: how
//! many samples (and bytes) hit the node cache, come from storage, or (later) from a remote
//! node, and how many it must decode. [`CostModel`] turns that [`RankLoad`] into a predicted
//! window time for any (io_depth, decode threads); [`Allocator`] splits the node's budgets so
//! that the slowest rank is as fast as possible. Pure logic: no I/O, no threads of its own.
//!
//! ```
//! use lobster_sched::{AllocConfig, Allocator, Budgets, CostModel, RankLoad, Tier};
//!
//! let model = CostModel::new();
//! // Rank 0 reads its window from storage, rank 1 finds everything in the cache.
//! let mut loads = vec![RankLoad::default(); 2];
//! for _ in 0..64 {
//!     loads[0].add_read(Tier::Storage, 110 << 10);
//!     loads[1].add_read(Tier::Cache, 110 << 10);
//!     for load in &mut loads {
//!         load.add_decode(110 << 10);
//!     }
//! }
//! let budgets = Budgets { io_depth_total: 16, decode_threads_total: 8 };
//! let mut allocator = Allocator::new(AllocConfig::new(budgets))?;
//! let allocation = allocator.allocate(&loads, &model)?;
//! // The cache-only rank needs no reads in flight beyond its minimum of one.
//! assert_eq!(allocation.ranks[0].io_depth, 15);
//! assert_eq!(allocation.ranks[1].io_depth, 1);
//! let report = allocation.imbalance();
//! assert!(report.max_after_s <= report.max_before_s);
//! # Ok::<(), lobster_sched::SchedError>(())
//! ```
//!
//! # The model
//!
//! For one rank and one window, with `n_k` samples and `B_k` bytes from tier `k`
//! (cache, storage, remote) and `n_d` samples of `B_d` bytes to decode; per-tier request
//! latency `a_k` and per-byte time `b_k` (seconds), shared tier bandwidth `β_k` (bytes/s,
//! ∞ when unknown); per-sample decode time `c` and per-byte decode time `e`:
//!
//! ```text
//! C  = n_cache·a_cache + B_cache·b_cache           cache hits: handed over in planner order
//! R  = Σ_{k∈{storage,remote}} n_k·a_k + B_k·b_k    total service time of the reads
//! N  = Σ_{k∈{storage,remote}} n_k                  reads; no more than N can be in flight
//! F  = max_{k∈{storage,remote}} B_k / β_k          one rank cannot outrun the device
//! io(d)  = C + max(R / min(d, N), F)     (= C if N = 0; = ∞ if d = 0 < N)
//! D  = n_d·c + B_d·e
//! dec(t) = D / min(t, n_d)               (= 0 if n_d = 0; = ∞ if t = 0 < n_d)
//! time(d, t) = max(io(d), dec(t))        the two stages are pipelined: the slower dominates
//! ```
//!
//! Reads overlap up to `d` in flight (Little's law on a device that is not saturated), which
//! divides their total service time by the number in flight, never by more than the number of
//! reads. Decode spreads over `t` threads, never over more threads than samples. Pipeline fill
//! (one read before the first decode, one decode after the last read) is a single sample's
//! time against a window of many and is left out.
//!
//! **Shared bandwidth.** Storage bandwidth is shared by all ranks, so the node as a whole
//! cannot finish before `Φ = max_k Σ_r B_{r,k} / β_k` ([`CostModel::bandwidth_floor_s`]).
//! `Φ` depends on the loads only, not on the allocation: a work-conserving device moves the
//! same bytes whoever holds the depth. The predicted window is therefore
//! `max(max_r time_r(d_r, t_r), Φ)` ([`Allocation::window_s`]), and since `Φ` is a constant
//! the allocation minimising `max_r time_r` also minimises the window. Per rank, `F` keeps the
//! allocator from handing one rank depth beyond what the device could serve it.
//!
//! # Calibration
//!
//! The model starts from [`CostParams::PRIORS`] (or priors you give) and calibrates online:
//! [`CostModel::observe_read`] feeds `(bytes, latency)` of each completed read to its tier's
//! fit of `latency = a + b·bytes`; [`CostModel::observe_decode`] feeds per-sample averages to
//! the fit of `c + e·bytes`. Each fit keeps the last 64 observations `(x_i, y_i)` and is a
//! Huber M-estimate on relative residuals (latency noise grows with latency), computed by
//! iteratively reweighted least squares warm-started from the current estimate `ŷ = a + b·x`:
//!
//! ```text
//! r_i = (y_i − ŷ_i) / ŷ_i                  relative residual
//! s   = 1.4826 · median_i |r_i|            robust scale
//! w_i = min(1, 1.345·s / |r_i|) / ŷ_i²     Huber weight, on the absolute residual
//! (a, b) = argmin Σ w_i (y_i − a − b·x_i)²  then clamped to a, b >= 0
//! ```
//!
//! A single wild observation thus counts as if it were only about `1.345·s` off, in 64: it
//! cannot swing the fit. The prior stands until 8 observations arrived; once 64 are held the
//! fit is refreshed every 4th observation (a refit costs microseconds); when all sizes are
//! equal the per-byte cost is not identifiable and keeps its previous value.
//! [`CostModel::observe_throughput`] feeds bytes per second measured while a
//! tier was saturated; `β` is the median of the last 16 (from the third on).
//!
//! # The allocator
//!
//! Given loads, the model, [`Budgets`] and per-rank [`RankLimits`], [`Allocator::allocate`]
//! picks `d_r` and `t_r` with `Σ d_r <= io_depth_total`, `Σ t_r <= decode_threads_total`,
//! each within its limits, minimising `max_r time_r(d_r, t_r)`. Because the two budgets and
//! limits are independent and `max_r max(io_r, dec_r) = max(max_r io_r, max_r dec_r)`,
//!
//! ```text
//! min_{d,t} max_r time_r = max( min_d max_r io_r(d_r), min_t max_r dec_r(t_r) )
//! ```
//!
//! so it solves two 1-D min-max problems, each over nonincreasing step functions, exactly
//! (the result of the bottleneck greedy, found by a search over the candidate levels rather
//! than unit by unit; cost `O(ranks² · log budget)`). Units that lower no rank's predicted
//! time stay unassigned ([`Allocation::io_depth_spare`]). Hysteresis keeps the previous
//! allocation unless the new one is predicted better by more than `hysteresis_fraction`
//! (both judged under the current loads and model), and only while the previous one is no
//! worse than the equal split, so an allocation is never worse than the equal split.
//! [`imbalance`] and [`Allocation::imbalance`] report max/mean of the predicted rank times
//! before (equal split) and after allocation.
#![forbid(unsafe_code)]

mod alloc;
#[cfg(any(test, fuzzing))]
mod check;
mod error;
mod fit;
mod imbalance;
mod load;
mod minmax;
mod model;
#[cfg(test)]
mod tests;

pub use alloc::{
    equal_split, AllocConfig, Allocation, Allocator, Budgets, ImbalanceReport, RankAllocation,
    RankLimits, MAX_RANKS,
};
#[cfg(any(test, fuzzing))]
pub use check::check_allocator;
pub use error::SchedError;
pub use imbalance::imbalance;
pub use load::{RankLoad, Tier, Volume};
pub use model::{CostModel, CostParams, DecodeCost, StageTimes, TierCost};
