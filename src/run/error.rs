use super::Phase;
use crate::config::ConfigError;
use crate::error::{Classify, ErrorClass};
use crate::lake::LakeError;
use crate::lake::{classify_delta, classify_delta_write};

/// What a kind's own error enum implements to be carried by [`RunError::Kind`]: a message a
/// user can act on and a class (exit code); the shared error never names a kind.
pub trait KindError: std::error::Error + Classify + Send + Sync + 'static {}

impl<T: std::error::Error + Classify + Send + Sync + 'static> KindError for T {}

/// A kind's error inside [`RunError`] (each kind converts its enum with `From`).
#[derive(Debug)]
pub struct KindFailure(pub Box<dyn KindError>);

impl std::fmt::Display for KindFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for KindFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl RunError {
    /// Wraps a kind's own error.
    pub fn kind(e: impl KindError) -> Self {
        RunError::Kind(KindFailure(Box::new(e)))
    }
}

/// Why a run stopped. Nothing is committed to the target when a run returns one of these,
/// except rows written to the quarantine table for inspection.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// A kind's own error, kept in its folder and converted into this one.
    #[error(transparent)]
    Kind(KindFailure),
    /// A query over the source or the target failed.
    #[error("{phase}: query failed: {source}{}", crate::error::query_hint(source))]
    Query {
        phase: Phase,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// A Delta operation failed.
    #[error("{phase}: {uri}: {source}")]
    Delta {
        phase: Phase,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// Writing to a table failed: its data files, its commit, or the quarantine table.
    #[error("{phase}: cannot write to {uri}: {source}{}", write_hint(source))]
    Write {
        phase: Phase,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// Arrow compute failed (a bug or an unsupported type).
    #[error("{phase}: {source}")]
    Arrow {
        phase: Phase,
        #[source]
        source: arrow::error::ArrowError,
    },
    /// An invariant of tidemark itself broke: a bug, never a fault of the data or the world.
    #[error("{phase}: internal error (a bug in tidemark, not in your data or setup): {message}; nothing was committed. Please report it with the run's log (-v)")]
    Internal { phase: Phase, message: String },
    /// More rows failed validation than the pipeline tolerates.
    #[error("{rejected} of {read} rows read failed validation, over the limit ({limit}); nothing was written to the target. The rows are in the quarantine table {uri}: inspect them, fix the source (for an ingest: the landing file, then `on_file_change: reingest` or a new file) or raise `quarantine.max_rows`/`max_fraction`, then rerun")]
    QuarantineLimit {
        rejected: u64,
        read: u64,
        limit: String,
        uri: String,
    },
    /// A row failed an expectation whose `on_fail` is `fail`.
    #[error("expectation `{rule}` (`{sql}`) failed for {failed} row(s) read by this run (e.g. {examples}); nothing was written. Fix the rows upstream, or change the rule's `on_fail` to `quarantine` (set them aside) or `warn` (keep and count them), then rerun")]
    ExpectationFailed {
        rule: String,
        sql: String,
        failed: u64,
        examples: String,
    },
    /// The source's columns changed in a way the pipeline's `on_schema_change` does not allow.
    #[error("schema change in {uri}: {message}")]
    SchemaDrift { uri: String, message: String },
    /// Another writer committed to the target after this run planned.
    #[error("{}; rerun the same command (it plans again from the new version)", conflict_cause(uri, *planned, *found))]
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
    #[error("the source {uri} is not the table the target was built from: its table id is now {table_id} (deleted and recreated, or replaced, since the target's last run), so its version numbers cannot tell which rows the target has seen; nothing was read or written. Rebuild the target from the new source with `tidemark run {path} --full-reload` (in a bundle: `tidemark job run <job> --full-reload`){}", if *on_recreate { format!(", or — if the new table re-delivers the old one's history — set `source.on_recreate: read_all` in {path} to merge all of it") } else { String::new() })]
    SourceReplaced {
        uri: String,
        table_id: String,
        pipeline: String,
        /// Whether the kind offers `source.on_recreate: read_all`.
        on_recreate: bool,
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
    #[error("the source {uri} is no longer append-only: commit {version} ({operation}) removed {files_removed} data file(s) after version {recorded}, which the target's last run read{}; rows the target may hold were deleted or rewritten upstream, and an incremental merge cannot take them back. Nothing was written. Rebuild the target with `tidemark run {pipeline} --full-reload` (in a bundle: `tidemark job run <job> --full-reload`); compaction with dataChange = false is fine", if *more > 0 { format!(", and {more} later commit(s) did too") } else { String::new() })]
    SourceRewritten {
        uri: String,
        version: u64,
        operation: String,
        files_removed: u64,
        more: usize,
        recorded: i64,
        pipeline: String,
    },
    /// A setting that gives the target's rows their meaning changed since the target was built.
    #[error("{settings} of `{pipeline}` changed since {uri} was written: an incremental run would write rows under the new definition beside rows written under the old one, so one table would hold two meanings. Nothing was written. Rebuild the table under the new definition with `tidemark run {path}{var_args} --full-reload` (in a bundle: `tidemark job run <job> --full-reload`), or put the old setting back")]
    DefinitionChanged {
        settings: String,
        pipeline: String,
        uri: String,
        path: String,
        var_args: String,
    },
    /// A data file of the source may not be read: the OS (file permissions) or the store
    /// (credentials, policy) refused. Nothing was written to the target.
    #[error("cannot read the source table {uri}: {source}. Reading one of its data files was refused: make the table's files readable for the user running tidemark (or fix the store's credentials or policy), then rerun; the target was not changed")]
    SourceUnreadable {
        uri: String,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// A data file of the target could not be read: missing, cut short, not Parquet (the target
    /// is damaged), or refused by the OS or the store. Nothing was committed.
    #[error(
        "cannot read the target table {uri}: {source}. {}",
        target_read_advice(source)
    )]
    TargetRead {
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// A sum of a decimal column does not fit 38 digits (Delta's widest decimal).
    #[error("a sum does not fit 38 decimal digits ({detail}); nothing was written. A sum of a decimal(p, s) column is kept as a decimal(38, s) at most, so a column declared with p above 28 can overflow: check the values (an amount of 1e36 is a data error), or declare the column with the precision its values need (decimal(18, 2) holds amounts up to 10^16), then rerun")]
    DecimalOverflow { detail: String },
}

/// The text of a decimal overflow in an error's chain (a checked cast of a wide sum back to 38
/// digits), if that is what it is.
fn decimal_overflow(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let text = e.to_string();
    let at = text.find("Cannot cast to Decimal128(38")?;
    text[at..]
        .contains("Overflowing")
        .then(|| text[at..].to_string())
}

/// What to do about a target data file that could not be read, by what went wrong.
fn target_read_advice(e: &deltalake::DeltaTableError) -> &'static str {
    if let Some(fault) = crate::lake::store_fault(e) {
        return fault.advice();
    }
    match target_read_class(e) {
        ErrorClass::BadData => "A data file its log references is missing or damaged: the target is damaged. Rebuild it with `tidemark run <pipeline> --full-reload` (the reload replaces every file without reading them), or restore a good version (`tidemark history`, `tidemark restore`); nothing was committed",
        ErrorClass::Unavailable => "Reading one of its data files was refused: make the table's files readable for the user running tidemark (or fix the store's credentials or policy), then rerun; nothing was committed",
        _ => "Rerun once the storage is reachable (for a full disk, free space first); nothing was committed",
    }
}

/// The class of a failure to read a target data file: a file that is gone, shorter than its log
/// entry says, or not Parquet is a damaged target (bad data); a refused read is unavailable; a
/// full disk or another storage failure is I/O.
fn target_read_class(e: &deltalake::DeltaTableError) -> ErrorClass {
    if crate::error::is_disk_full(e) {
        return ErrorClass::Io;
    }
    match file_error_class(e) {
        Some(class) => class,
        // delta-rs' own parquet and generic errors (a footer that does not decode)
        None => match e {
            deltalake::DeltaTableError::Parquet { .. }
            | deltalake::DeltaTableError::Arrow { .. }
            | deltalake::DeltaTableError::Generic(_) => ErrorClass::BadData,
            other => classify_delta(other),
        },
    }
}

/// What to do about a failed write, when the OS said why.
fn write_hint(e: &deltalake::DeltaTableError) -> &'static str {
    if crate::error::is_file_too_large(e) {
        ". A file grew past this process's file-size limit (EFBIG: `ulimit -f`, or the container's RLIMIT_FSIZE): raise or lift the limit (or lower the target's file size), then rerun; nothing was committed"
    } else if crate::error::is_disk_full(e) {
        ". The disk (or quota) is full: free space, then rerun; nothing was committed"
    } else if crate::error::os_error_kind(e) == Some(std::io::ErrorKind::PermissionDenied) {
        ". The OS refused the write: make the table's directory (and its _delta_log) writable for the user running tidemark, then rerun; nothing was committed"
    } else if crate::lake::classify_delta(e) == crate::error::ErrorClass::BadData {
        ". A file the target's log references is missing or damaged, and this write had to read it (a target with a change data feed is read by a full reload, to write the feed): `tidemark restore` a version from before the damage (`tidemark history` lists them); nothing was committed"
    } else {
        ""
    }
}

impl RunError {
    /// For delta-rs operations that write (see [`RunError::Write`]).
    pub(crate) fn write<'u>(
        phase: Phase,
        uri: &'u str,
    ) -> impl FnOnce(deltalake::DeltaTableError) -> Self + 'u {
        move |source| {
            if let Some(fault) = crate::lake::store_fault(&source) {
                return RunError::Lake(LakeError::Store {
                    action: "write to",
                    uri: uri.to_string(),
                    fault,
                });
            }
            if let Some(detail) = decimal_overflow(&source) {
                return RunError::DecimalOverflow { detail };
            }
            RunError::Write {
                phase,
                uri: uri.to_string(),
                source: Box::new(source),
            }
        }
    }

    pub(crate) fn query(phase: Phase) -> impl FnOnce(datafusion::error::DataFusionError) -> Self {
        move |source| match decimal_overflow(&source) {
            Some(detail) => RunError::DecimalOverflow { detail },
            None => RunError::Query {
                phase,
                source: Box::new(source),
            },
        }
    }

    pub(crate) fn delta<'u>(
        phase: Phase,
        uri: &'u str,
    ) -> impl FnOnce(deltalake::DeltaTableError) -> Self + 'u {
        move |source| match crate::lake::store_fault(&source) {
            Some(fault) => RunError::Lake(LakeError::Store {
                action: "read",
                uri: uri.to_string(),
                fault,
            }),
            None => RunError::Delta {
                phase,
                uri: uri.to_string(),
                source: Box::new(source),
            },
        }
    }

    /// For queries that scan the source: a failure to read one of its data files becomes
    /// [`RunError::SourceRead`] (naming the table and the repair), anything else a query error.
    pub(crate) fn scan<'u>(
        phase: Phase,
        uri: &'u str,
    ) -> impl FnOnce(datafusion::error::DataFusionError) -> Self + 'u {
        move |source| {
            if let Some(fault) = crate::lake::store_fault(&source) {
                return RunError::Lake(LakeError::Store {
                    action: "read",
                    uri: uri.to_string(),
                    fault,
                });
            }
            if crate::error::is_disk_full(&source) {
                return RunError::Query {
                    phase,
                    source: Box::new(source),
                };
            }
            if file_error_class(&source) == Some(ErrorClass::Unavailable) {
                return RunError::SourceUnreadable {
                    uri: uri.to_string(),
                    source: Box::new(source),
                };
            }
            if let Some(detail) = decimal_overflow(&source) {
                return RunError::DecimalOverflow { detail };
            }
            if file_error_class(&source).is_some() {
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

    pub(crate) fn arrow(phase: Phase) -> impl FnOnce(arrow::error::ArrowError) -> Self {
        move |source| RunError::Arrow { phase, source }
    }
}

impl RunError {
    /// What the race a [`RunError::is_commit_conflict`] error lost was, in one line and without
    /// the advice to run again (for the warning of a run that plans again by itself).
    pub fn race_cause(&self) -> String {
        let first_line = |text: String| text.lines().next().unwrap_or_default().to_string();
        match self {
            RunError::Conflict {
                uri,
                planned,
                found,
            } => conflict_cause(uri, *planned, *found),
            RunError::Delta { source, .. } | RunError::Write { source, .. } => {
                first_line(source.to_string())
            }
            other => first_line(other.to_string()),
        }
    }

    /// Whether the run lost a commit race: planning again from the new snapshot is safe and
    /// will not overwrite the winner.
    pub fn is_commit_conflict(&self) -> bool {
        use deltalake::kernel::transaction::TransactionError as T;
        match self {
            RunError::Conflict { .. } => true,
            RunError::Delta { source, .. } | RunError::Write { source, .. } => matches!(
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
            RunError::Kind(e) => e.0.class(),
            RunError::Query { source, .. } | RunError::SourceRead { source, .. } => {
                classify_datafusion(source)
            }
            RunError::SourceUnreadable { .. } => ErrorClass::Unavailable,
            RunError::TargetRead { source, .. } => target_read_class(source),
            RunError::Delta { source, .. } => classify_delta(source),
            RunError::Write { source, .. } => classify_delta_write(source),
            RunError::Arrow { .. } | RunError::Internal { .. } => ErrorClass::Internal,
            RunError::Injected(e) => e.class(),
            RunError::Conflict { .. } => ErrorClass::Retryable,
            RunError::QuarantineLimit { .. }
            | RunError::ExpectationFailed { .. }
            | RunError::SchemaDrift { .. }
            | RunError::SourceReplaced { .. }
            | RunError::SourceWentBack { .. }
            | RunError::SourceRewritten { .. }
            | RunError::DefinitionChanged { .. }
            | RunError::DecimalOverflow { .. } => ErrorClass::BadData,
        }
    }
}

/// The class of a failure to read a data file, found anywhere in an error's chain: a file that
/// is missing (the log references it) or is not Parquet is bad data; a file that may not be read
/// (the OS or the store refused: permissions, credentials) is unavailable; other storage failures
/// are I/O. `None` when no file was involved.
pub(crate) fn file_error_class(e: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    use deltalake::ObjectStoreError as O;
    if let Some(fault) = crate::lake::store_fault(e) {
        return Some(fault.class);
    }
    let mut found = None;
    let mut next = Some(e);
    while let Some(e) = next {
        // A deletion vector that is missing, cut short or not one: damage, like its data file's.
        if let Some(dv) = e.downcast_ref::<crate::lake::dv::DvError>() {
            if !matches!(dv, crate::lake::dv::DvError::Store { .. }) {
                return Some(ErrorClass::BadData);
            }
        }
        if let Some(deltalake::DeltaTableError::KernelError(k)) =
            e.downcast_ref::<deltalake::DeltaTableError>()
        {
            if crate::error::kernel_file_damage(&k.to_string()) {
                return Some(ErrorClass::BadData);
            }
        }
        if let Some(o) = e.downcast_ref::<O>() {
            return Some(match o {
                O::NotFound { .. } => ErrorClass::BadData,
                O::PermissionDenied { .. } | O::Unauthenticated { .. } => ErrorClass::Unavailable,
                // A local store reports the OS error under a generic one.
                _ => match crate::error::os_error_kind(o) {
                    Some(std::io::ErrorKind::PermissionDenied) => ErrorClass::Unavailable,
                    Some(std::io::ErrorKind::NotFound) => ErrorClass::BadData,
                    // A range past the file's end: the file is shorter than its log entry says.
                    _ if is_short_file(o) => ErrorClass::BadData,
                    _ => ErrorClass::Io,
                },
            });
        }
        if e.downcast_ref::<parquet::errors::ParquetError>().is_some() {
            found = Some(ErrorClass::BadData);
        }
        next = crate::error::next_in_chain(e);
    }
    // The Parquet reader flattens the store's error into its message: a refused or failed read
    // is not a damaged file.
    if found.is_some() {
        match crate::error::os_error_kind(e) {
            Some(std::io::ErrorKind::PermissionDenied) => return Some(ErrorClass::Unavailable),
            Some(
                std::io::ErrorKind::StorageFull
                | std::io::ErrorKind::QuotaExceeded
                | std::io::ErrorKind::FileTooLarge,
            ) => return Some(ErrorClass::Io),
            _ => {}
        }
    }
    found
}

/// Whether a store error says a requested byte range is not in the object: the file is shorter
/// than the size its log entry records (cut short by hand or by a crashed copy).
fn is_short_file(e: &deltalake::ObjectStoreError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("requested range was invalid")
        || text.contains("range not satisfiable")
        || text.contains("out of range for object")
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

/// What [`RunError::Conflict`] says happened (its message adds what to do).
fn conflict_cause(uri: &str, planned: u64, found: u64) -> String {
    format!("another writer committed version {found} of {uri} after this run planned against version {planned}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::error::DataFusionError as D;

    #[test]
    fn a_lost_race_says_what_happened_and_only_its_message_says_to_rerun() {
        let e = RunError::Conflict {
            uri: "/l/silver".into(),
            planned: 3,
            found: 4,
        };
        let cause = "another writer committed version 4 of /l/silver after this run planned against version 3";
        assert_eq!(
            e.to_string(),
            format!("{cause}; rerun the same command (it plans again from the new version)")
        );
        assert_eq!(e.race_cause(), cause);
    }

    fn store(source: std::io::Error) -> deltalake::ObjectStoreError {
        deltalake::ObjectStoreError::Generic {
            store: "LocalFileSystem",
            source: Box::new(source),
        }
    }

    /// How the Parquet reader reports a data file it could not read: the store's error
    /// flattened into its message.
    fn flattened(store_error: &str) -> D {
        D::ParquetError(Box::new(parquet::errors::ParquetError::General(format!(
            "Parquet error: Failed to fetch metadata for file t/part-0.parquet: Object Store error: {store_error}"
        ))))
    }

    #[test]
    fn a_refused_read_is_unavailable_and_a_short_or_missing_file_is_damage() {
        let refused = D::ObjectStore(Box::new(store(std::io::Error::from_raw_os_error(13))));
        assert_eq!(file_error_class(&refused), Some(ErrorClass::Unavailable));
        assert_eq!(
            file_error_class(&flattened(
                "Generic LocalFileSystem error: Permission denied (os error 13)"
            )),
            Some(ErrorClass::Unavailable)
        );
        assert_eq!(
            file_error_class(&flattened(
                "Generic LocalFileSystem error: Requested range was invalid"
            )),
            Some(ErrorClass::BadData)
        );
        let missing = D::ObjectStore(Box::new(deltalake::ObjectStoreError::NotFound {
            path: "t/part-0.parquet".into(),
            source: "gone".into(),
        }));
        assert_eq!(file_error_class(&missing), Some(ErrorClass::BadData));
        let other = D::ObjectStore(Box::new(store(std::io::Error::other("connection reset"))));
        assert_eq!(file_error_class(&other), Some(ErrorClass::Io));
        assert_eq!(file_error_class(&D::Execution("no file".into())), None);
    }

    #[test]
    fn scans_name_a_refused_source_read_and_leave_a_full_disk_to_io() {
        let err = RunError::scan(Phase::Read, "s3://b/src")(flattened(
            "Generic LocalFileSystem error: Permission denied (os error 13)",
        ));
        assert!(matches!(err, RunError::SourceUnreadable { .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Unavailable);
        assert!(err.to_string().contains("readable"), "{err}");
        let full = RunError::scan(Phase::Read, "s3://b/src")(D::Execution(
            "Arrow error: Io error: No space left on device (os error 28)".into(),
        ));
        assert_eq!(full.class(), ErrorClass::Io);
        assert!(full.to_string().contains("free space"), "{full}");
        let damaged = RunError::scan(Phase::Read, "s3://b/src")(flattened(
            "Object at location t/part-0.parquet not found: No such file or directory (os error 2)",
        ));
        assert_eq!(damaged.class(), ErrorClass::BadData);
    }

    #[test]
    fn a_damaged_target_file_says_full_reload_and_a_refused_write_is_local_io() {
        let gone = RunError::TargetRead {
            uri: "t".into(),
            source: Box::new(deltalake::DeltaTableError::ObjectStore {
                source: deltalake::ObjectStoreError::NotFound {
                    path: "t/part-0.parquet".into(),
                    source: "gone".into(),
                },
            }),
        };
        assert_eq!(gone.class(), ErrorClass::BadData);
        assert!(gone.to_string().contains("--full-reload"), "{gone}");
        let refused = RunError::TargetRead {
            uri: "t".into(),
            source: Box::new(deltalake::DeltaTableError::ObjectStore {
                source: store(std::io::Error::from_raw_os_error(13)),
            }),
        };
        assert_eq!(refused.class(), ErrorClass::Unavailable);
        let write = RunError::write(Phase::Commit, "t")(deltalake::DeltaTableError::ObjectStore {
            source: store(std::io::Error::from_raw_os_error(13)),
        });
        assert_eq!(write.class(), ErrorClass::Io);
        assert!(write.to_string().contains("writable"), "{write}");
        let race =
            RunError::write(Phase::Write, "t")(deltalake::DeltaTableError::VersionAlreadyExists(4));
        assert!(race.is_commit_conflict());
        assert_eq!(race.class(), ErrorClass::Retryable);
    }
}
