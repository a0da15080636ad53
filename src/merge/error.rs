//! The merge's own failures (the shared ones are [`crate::run::RunError`]'s).

use crate::error::{Classify, ErrorClass};

/// Why a merge run stopped, beyond what every kind can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The target holds the same key twice: it was corrupted outside tidemark.
    #[error("target {uri} holds {count} duplicate key(s) (first: {first}); an incremental merge cannot fix that. Rebuild with --full-reload, or restore a good version (`tidemark history`, `tidemark restore`)")]
    DuplicateTargetKeys {
        uri: String,
        count: u64,
        first: String,
    },
}

impl Classify for MergeError {
    fn class(&self) -> ErrorClass {
        match self {
            MergeError::DuplicateTargetKeys { .. } => ErrorClass::BadData,
        }
    }
}

impl From<MergeError> for crate::run::RunError {
    fn from(e: MergeError) -> Self {
        crate::run::RunError::kind(e)
    }
}
