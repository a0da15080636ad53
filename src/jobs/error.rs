use crate::error::{classify_delta, Classify, ErrorClass};

use super::lease::Holder;

/// A failure of the job machinery itself (leases, ledger), as opposed to a task's own failure,
/// which a job run records and reports as a task status.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// Another run of the job holds its lease.
    #[error("job `{job}` is already running: {holder}. This run was skipped; try again when it has finished (exit code 75 means: safe to retry)")]
    AlreadyRunning { job: String, holder: Box<Holder> },
    /// The lease store could not be read or written.
    #[error("lease {path}: {source}; check that the lake is reachable and writable")]
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
                object_store::Error::NotFound { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            },
            JobsError::LeaseCorrupt { .. } => ErrorClass::BadData,
            JobsError::Ledger { source, .. } => classify_delta(source),
            JobsError::LedgerQuery { .. } => ErrorClass::Internal,
            JobsError::Lake(e) => e.class(),
            JobsError::Injected(e) => e.class(),
        }
    }
}
