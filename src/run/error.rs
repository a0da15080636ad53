use crate::config::ConfigError;
use crate::error::{classify_delta, Classify, ErrorClass};
use crate::lake::LakeError;

/// Why a run stopped. Nothing is committed to the target when a run returns one of these,
/// except rows written to the quarantine table for inspection.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// A query over the source or the target failed.
    #[error("{phase}: query failed: {source}{}", memory_hint(source))]
    Query {
        phase: &'static str,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// A Delta operation failed.
    #[error("{phase}: {uri}: {source}")]
    Delta {
        phase: &'static str,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// Arrow compute failed (a bug or an unsupported type).
    #[error("{phase}: {source}")]
    Arrow {
        phase: &'static str,
        #[source]
        source: arrow::error::ArrowError,
    },
    /// More rows failed validation than the pipeline tolerates.
    #[error("{rejected} of {read} rows read failed validation, over the limit ({limit}); nothing was merged. The rows are in the quarantine table {uri}: inspect them, fix the source or raise `quarantine.max_rows`/`max_fraction`, then rerun")]
    QuarantineLimit {
        rejected: u64,
        read: u64,
        limit: String,
        uri: String,
    },
    /// The source's columns changed in a way the pipeline's `on_schema_change` does not allow.
    #[error("schema change in {uri}: {message}")]
    SchemaDrift { uri: String, message: String },
    /// Another writer committed to the target after this run planned.
    #[error("another writer committed version {found} of {uri} after this run planned against version {planned}; rerun the same command (it plans again from the new version)")]
    Conflict {
        uri: String,
        planned: u64,
        found: u64,
    },
    /// A failpoint armed for testing fired.
    #[error(transparent)]
    Injected(#[from] crate::failpoint::Injected),
    /// A data file of the source could not be read: its log references a file that is missing
    /// or is not Parquet. Nothing was written to the target.
    #[error("cannot read the source table {uri}: {source}. A data file its log references is missing or damaged: repair the source (restore it to a good version, or have the producer re-deliver those rows), then rerun; the target was not changed")]
    SourceRead {
        uri: String,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// The source is a different Delta table than the one the target was built from.
    #[error("the source {uri} is not the table the target was built from: its table id is now {table_id} (deleted and recreated, or replaced, since the target's last run), so its version numbers cannot tell which rows the target has seen; nothing was read or written. Rebuild the target from the new source with `tidemark run {path} --full-reload`, or — if the new table re-delivers the old one's history — set `source.on_recreate: read_all` in {path} to merge all of it")]
    SourceReplaced {
        uri: String,
        table_id: String,
        pipeline: String,
        path: String,
    },
    /// The source's latest version is older than the one the target recorded.
    #[error("the source {uri} is at version {found}, but the target's last run of `{pipeline}` read version {recorded}: the source's log was truncated or the table replaced; nothing was read or written. Rebuild the target with `--full-reload`")]
    SourceWentBack {
        uri: String,
        recorded: i64,
        found: u64,
        pipeline: String,
    },
    /// The source stopped being append-only: rows the target may hold were taken away.
    #[error("the source {uri} is no longer append-only: commit {version} ({operation}) removed {files_removed} data file(s) after version {recorded}, which the target's last run read{}; rows the target may hold were deleted or rewritten upstream, and an incremental merge cannot take them back. Nothing was written. Rebuild the target with `tidemark run {pipeline} --full-reload` (or `tidemark job run <job> --full-reload`); compaction with dataChange = false is fine", if *more > 0 { format!(", and {more} later commit(s) did too") } else { String::new() })]
    SourceRewritten {
        uri: String,
        version: u64,
        operation: String,
        files_removed: u64,
        more: usize,
        recorded: i64,
        pipeline: String,
    },
    /// The target holds the same key twice: it was corrupted outside tidemark.
    #[error("target {uri} holds {count} duplicate key(s) (first: {first}); an incremental merge cannot fix that. Rebuild with --full-reload, or restore a good version (`tidemark history`, `tidemark restore`)")]
    DuplicateTargetKeys {
        uri: String,
        count: u64,
        first: String,
    },
}

/// What to do when a query ran out of its memory pool (DataFusion says what it could not
/// allocate, not how to fix it).
fn memory_hint(e: &datafusion::error::DataFusionError) -> &'static str {
    if matches!(
        e.find_root(),
        datafusion::error::DataFusionError::ResourcesExhausted(_)
    ) {
        ". The run needed more memory than its limit: raise --memory-limit (or the job cluster's memory_limit), or run with fewer --threads; nothing was committed"
    } else {
        ""
    }
}

impl RunError {
    pub(crate) fn query(
        phase: &'static str,
    ) -> impl FnOnce(datafusion::error::DataFusionError) -> Self {
        move |source| RunError::Query {
            phase,
            source: Box::new(source),
        }
    }

    pub(crate) fn delta<'u>(
        phase: &'static str,
        uri: &'u str,
    ) -> impl FnOnce(deltalake::DeltaTableError) -> Self + 'u {
        move |source| RunError::Delta {
            phase,
            uri: uri.to_string(),
            source: Box::new(source),
        }
    }

    /// For queries that scan the source: a failure to read one of its data files becomes
    /// [`RunError::SourceRead`] (naming the table and the repair), anything else a query error.
    pub(crate) fn scan<'u>(
        phase: &'static str,
        uri: &'u str,
    ) -> impl FnOnce(datafusion::error::DataFusionError) -> Self + 'u {
        move |source| {
            if file_error_class(&source).is_some() && !crate::error::is_disk_full(&source) {
                RunError::SourceRead {
                    uri: uri.to_string(),
                    source: Box::new(source),
                }
            } else {
                RunError::Query {
                    phase,
                    source: Box::new(source),
                }
            }
        }
    }

    pub(crate) fn arrow(phase: &'static str) -> impl FnOnce(arrow::error::ArrowError) -> Self {
        move |source| RunError::Arrow { phase, source }
    }
}

impl RunError {
    /// Whether the run lost a commit race: planning again from the new snapshot is safe and
    /// will not overwrite the winner.
    pub fn is_commit_conflict(&self) -> bool {
        use deltalake::kernel::transaction::TransactionError as T;
        match self {
            RunError::Conflict { .. } => true,
            RunError::Delta { source, .. } => matches!(
                source.as_ref(),
                deltalake::DeltaTableError::Transaction {
                    source: T::CommitConflict(_)
                        | T::MaxCommitAttempts(_)
                        | T::VersionAlreadyExists(_)
                } | deltalake::DeltaTableError::VersionAlreadyExists(_)
            ),
            _ => false,
        }
    }
}

impl Classify for RunError {
    fn class(&self) -> ErrorClass {
        match self {
            RunError::Config(e) => e.class(),
            RunError::Lake(e) => e.class(),
            RunError::Query { source, .. } | RunError::SourceRead { source, .. } => {
                classify_datafusion(source)
            }
            RunError::Delta { source, .. } => classify_delta(source),
            RunError::Arrow { .. } => ErrorClass::Internal,
            RunError::Injected(_) | RunError::Conflict { .. } => ErrorClass::Retryable,
            RunError::QuarantineLimit { .. }
            | RunError::SchemaDrift { .. }
            | RunError::DuplicateTargetKeys { .. }
            | RunError::SourceReplaced { .. }
            | RunError::SourceWentBack { .. }
            | RunError::SourceRewritten { .. } => ErrorClass::BadData,
        }
    }
}

/// The class of a failure to read a data file, found anywhere in an error's chain: a file that
/// is missing (the log references it) or is not Parquet is bad data; a file that may not be read
/// is unavailable; other storage failures are I/O. `None` when no file was involved.
fn file_error_class(e: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    use deltalake::ObjectStoreError as O;
    let mut found = None;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(o) = e.downcast_ref::<O>() {
            return Some(match o {
                O::NotFound { .. } => ErrorClass::BadData,
                O::PermissionDenied { .. } | O::Unauthenticated { .. } => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            });
        }
        if e.downcast_ref::<parquet::errors::ParquetError>().is_some() {
            found = Some(ErrorClass::BadData);
        }
        next = e.source();
    }
    found
}

fn classify_datafusion(e: &datafusion::error::DataFusionError) -> ErrorClass {
    use datafusion::error::DataFusionError as D;
    if crate::error::is_disk_full(e) {
        return ErrorClass::Io;
    }
    if let Some(class) = file_error_class(e) {
        return class;
    }
    match e {
        D::ResourcesExhausted(_) | D::IoError(_) => ErrorClass::Io,
        D::ObjectStore(_) => ErrorClass::Unavailable,
        D::ParquetError(_) => ErrorClass::BadData,
        D::External(inner) => match inner.downcast_ref::<deltalake::DeltaTableError>() {
            Some(d) => classify_delta(d),
            None => ErrorClass::Internal,
        },
        D::Context(_, inner) => classify_datafusion(inner),
        _ => ErrorClass::Internal,
    }
}
