//! The dimension's own failures (the shared ones are [`crate::run::RunError`]'s).

use crate::error::{Classify, ErrorClass};

/// Why a dimension run stopped, beyond what every kind can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DimensionError {
    /// Placeholders stayed pending past `fail_after`.
    #[error("{count} inferred member(s) of `{pipeline}` are older than fail_after ({after}; oldest: {oldest}, since {since}): the facts name keys the dimension's feed never delivered, so its feed is broken, not slow. Nothing was written. Fix the feed (or raise `fail_after`), then rerun")]
    InferredOverdue {
        pipeline: String,
        count: u64,
        oldest: String,
        since: String,
        after: String,
    },
}

impl Classify for DimensionError {
    fn class(&self) -> ErrorClass {
        match self {
            DimensionError::InferredOverdue { .. } => ErrorClass::BadData,
        }
    }
}

impl From<DimensionError> for crate::run::RunError {
    fn from(e: DimensionError) -> Self {
        crate::run::RunError::kind(e)
    }
}
