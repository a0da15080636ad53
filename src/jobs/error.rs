use crate::error::{Classify, ErrorClass};
use crate::lake::classify_delta;

use super::lease::Holder;

/// A failure of the job machinery itself (leases, ledger), as opposed to a task's own failure,
/// which a job run records and reports as a task status.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// Another run of the job holds its lease.
    #[error("job `{job}` is already running: {holder}. This run was skipped; try again when it has finished (exit code 75 means: safe to retry)")]
    AlreadyRunning { job: String, holder: Box<Holder> },
    /// The lease store could not be read or written.
    #[error(
        "lease {path}: {}; check that the lake is reachable and writable",
        lease_cause(source)
    )]
    Lease {
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },
    /// A lease file is not what tidemark writes.
    #[error(
        "lease file {path} is unreadable ({reason}); if no run of the job is active, delete it"
    )]
    LeaseCorrupt { path: String, reason: String },
    /// The run ledger could not be written or read.
    #[error("run ledger {uri}: {source}")]
    Ledger {
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// A query over the run ledger failed.
    #[error("run ledger {uri}: query failed: {source}")]
    LedgerQuery {
        uri: String,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// Ledger rows did not convert to or from the table's columns: on reading, a row another
    /// writer changed the type of; on writing, a bug.
    #[error("run ledger {uri}: rows do not {direction} the table's columns: {source}")]
    LedgerRows {
        uri: String,
        /// `read back from` or `convert to`.
        direction: &'static str,
        #[source]
        source: Box<serde_arrow::Error>,
    },
    /// A failpoint armed for testing fired.
    #[error(transparent)]
    Injected(#[from] crate::failpoint::Injected),
    /// The lake root is not a usable location.
    #[error(transparent)]
    Lake(#[from] crate::lake::LakeError),
}

impl Classify for JobsError {
    fn class(&self) -> ErrorClass {
        match self {
            JobsError::AlreadyRunning { .. } => ErrorClass::Retryable,
            JobsError::Lease { source, .. } => match source.as_ref() {
                e if crate::lake::store_fault(e).is_some() => {
                    crate::lake::store_fault(e).map_or(ErrorClass::Io, |f| f.class)
                }
                object_store::Error::NotFound { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            },
            JobsError::LeaseCorrupt { .. } => ErrorClass::BadData,
            JobsError::Ledger { source, .. } => classify_delta(source),
            JobsError::LedgerQuery { .. } => ErrorClass::Internal,
            JobsError::LedgerRows { direction, .. } if *direction == READ_BACK => {
                ErrorClass::BadData
            }
            JobsError::LedgerRows { .. } => ErrorClass::Internal,
            JobsError::Lake(e) => e.class(),
            JobsError::Injected(e) => e.class(),
        }
    }
}

/// [`JobsError::LedgerRows`]' direction when a stored row does not read back.
pub(crate) const READ_BACK: &str = "read back from";

/// The store's error in one line when it is a store or network fault (no request dump).
fn lease_cause(e: &object_store::Error) -> String {
    match crate::lake::store_fault(e) {
        Some(fault) => fault.cause,
        None => e.to_string(),
    }
}
