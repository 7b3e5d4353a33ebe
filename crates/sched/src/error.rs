use std::fmt;

/// Why the cost model or the allocator refused its input.
///
/// Every variant names the parameter that failed, so a log line says what to fix.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SchedError {
    /// A budget (`io_depth_total` or `decode_threads_total`) is zero.
    ZeroBudget {
        /// `"io_depth_total"` or `"decode_threads_total"`.
        parameter: &'static str,
    },
    /// A budget cannot give every rank its minimum.
    BudgetBelowMinimums {
        /// `"io_depth_total"` or `"decode_threads_total"`.
        parameter: &'static str,
        /// The budget given.
        budget: u32,
        /// Sum of the per-rank minimums over all ranks.
        minimum_sum: u64,
        /// Number of ranks.
        ranks: usize,
    },
    /// A per-rank minimum exceeds the per-rank maximum.
    MinAboveMax {
        /// `"io_depth_min"` or `"decode_threads_min"`.
        parameter: &'static str,
        /// The minimum given.
        min: u32,
        /// The maximum given.
        max: u32,
    },
    /// A cost is NaN, negative or infinite, or a bandwidth is NaN or not positive.
    InvalidCost {
        /// The field, e.g. `"storage.request_s"`.
        parameter: &'static str,
        /// The value given.
        value: f64,
    },
    /// The hysteresis fraction is not in `[0, 1)`.
    InvalidHysteresis {
        /// The value given for `hysteresis_fraction`.
        value: f64,
    },
    /// `loads` is empty: there is no rank to allocate to.
    NoRanks,
    /// More ranks than [`MAX_RANKS`](crate::MAX_RANKS).
    TooManyRanks {
        /// Number of loads given.
        ranks: usize,
        /// The bound.
        max: usize,
    },
    /// A load has bytes but no samples for a tier (or for decode).
    InconsistentLoad {
        /// Index of the rank in `loads`.
        rank: usize,
        /// The field, e.g. `"storage"` or `"decode"`.
        parameter: &'static str,
        /// The bytes given with zero samples.
        bytes: u64,
    },
}

impl SchedError {
    /// The name of the parameter that failed.
    pub fn parameter(&self) -> &'static str {
        match self {
            SchedError::ZeroBudget { parameter }
            | SchedError::BudgetBelowMinimums { parameter, .. }
            | SchedError::MinAboveMax { parameter, .. }
            | SchedError::InvalidCost { parameter, .. }
            | SchedError::InconsistentLoad { parameter, .. } => parameter,
            SchedError::InvalidHysteresis { .. } => "hysteresis_fraction",
            SchedError::NoRanks | SchedError::TooManyRanks { .. } => "loads",
        }
    }
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::ZeroBudget { parameter } => {
                write!(f, "{parameter} is zero; a budget must be at least 1")
            }
            SchedError::BudgetBelowMinimums {
                parameter,
                budget,
                minimum_sum,
                ranks,
            } => write!(
                f,
                "{parameter} = {budget} is below the sum of the per-rank minimums \
                 ({minimum_sum} over {ranks} ranks)"
            ),
            SchedError::MinAboveMax {
                parameter,
                min,
                max,
            } => write!(f, "{parameter} = {min} is above the per-rank maximum {max}"),
            SchedError::InvalidCost { parameter, value } => write!(
                f,
                "cost parameter {parameter} = {value} is invalid (costs must be finite and \
                 non-negative, bandwidths positive)"
            ),
            SchedError::InvalidHysteresis { value } => {
                write!(f, "hysteresis_fraction = {value} is not in [0, 1)")
            }
            SchedError::NoRanks => write!(f, "loads is empty: no rank to allocate to"),
            SchedError::TooManyRanks { ranks, max } => {
                write!(f, "loads has {ranks} ranks, more than the bound {max}")
            }
            SchedError::InconsistentLoad {
                rank,
                parameter,
                bytes,
            } => write!(
                f,
                "loads[{rank}].{parameter} has {bytes} bytes but zero samples"
            ),
        }
    }
}

impl std::error::Error for SchedError {}
