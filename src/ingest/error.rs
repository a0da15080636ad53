//! What can stop an ingest run, beyond what every kind shares ([`crate::run::RunError`]).

use crate::error::{Classify, ErrorClass};

/// Why an ingest run stopped. Nothing was committed to bronze when a run returns one.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The landing location does not exist (a local folder).
    #[error("the landing folder {uri} does not exist: create it (producers deliver files into it) or fix `landing.uri` in {pipeline}; nothing was written")]
    LandingMissing { uri: String, pipeline: String },
    /// The landing location is not a URI tidemark can list.
    #[error(
        "`landing.uri: {uri}` cannot be used: {reason}. Give a local folder or an s3:// prefix"
    )]
    LandingUri { uri: String, reason: String },
    /// Listing or reading the landing location failed.
    #[error("cannot {action} {uri}: {source}. {}", store_advice(source))]
    Landing {
        action: &'static str,
        uri: String,
        #[source]
        source: Box<object_store::Error>,
    },
    /// A landing file changed while this run read it (a producer is still writing it).
    #[error("the landing file {uri} changed while it was read (listed at {listed} bytes, read {read}): a producer is still writing it. Rerun; producers should write under a temporary name (starting with `.` or `_`, which ingest skips) and rename the file when it is complete")]
    ChangedWhileRead { uri: String, listed: u64, read: u64 },
    /// Files recorded as ingested changed since (`on_file_change: fail`).
    #[error("{count} landing file(s) changed after they were ingested (first: {first}, ingested at {ingested_at}): their size or modification time differs from the ingest record. Their rows are in bronze as they were delivered; nothing was written. If the producer re-delivered them on purpose, set `on_file_change: reingest` in {pipeline} (the new contents are appended; the merge keeps the newest version per key); otherwise move the rewritten files out of the landing location")]
    FileChanged {
        count: usize,
        first: String,
        ingested_at: String,
        pipeline: String,
    },
    /// Bronze keeps `txn` actions only for a while: files would be ingested twice.
    #[error("{uri} sets `delta.setTransactionRetentionDuration`, so the ingest record of old files would expire and they would be ingested again; remove the property from the table (ALTER TABLE … UNSET TBLPROPERTIES) before ingesting into it")]
    RecordExpires { uri: String },
    /// The ingest record's index misses runs whose commits bronze's log no longer holds.
    #[error("the ingest record {record} {held}, but {bronze} committed runs up to {committed} and its log no longer holds the commit of {runs} (cleaned up by log retention), so which files those runs ingested is unknown; nothing was written. Run the pipeline with `--full-reload`: it rebuilds bronze from the landing files and records them again, each file keeping the `_ingested_at` its rows in bronze hold")]
    RecordBehind {
        record: String,
        bronze: String,
        /// "holds this pipeline's runs up to N" or "holds none of this pipeline's runs".
        held: String,
        committed: i64,
        /// "run N" or "runs A to B".
        runs: String,
    },
    /// `target.record` names a Delta table that is not an ingest record.
    #[error("`target.record` ({uri}) is a Delta table that is not an ingest record (it has no column `{column}`); nothing was written. Point `target.record` at a location of its own (or leave it out: the default is `<target>_ingest_record`)")]
    NotARecord { uri: String, column: String },
    /// The files' columns changed in a way `on_schema_change` does not allow.
    #[error("schema change in the landing files of {pipeline}: {message}")]
    Schema { pipeline: String, message: String },
    /// A compressed landing file that does not decompress (cut short, or not what its name says).
    #[error("the landing file {uri} is named as {codec}-compressed but does not decompress ({reason}): it is cut short, still being written, or not {codec}. Nothing was written and it is not recorded as ingested; replace it with a complete file (or move it out of the landing location), then rerun")]
    Decompress {
        uri: String,
        codec: &'static str,
        reason: String,
    },
    /// Another writer took rows out of bronze after this pipeline's last run.
    #[error("{uri} was changed by another writer after this pipeline's last run: commit {version} ({operation}) removed {files_removed} data file(s), so rows of files the ingest record lists as ingested may be gone; nothing was written. Rebuild bronze from the landing files with `tidemark run {pipeline} --full-reload` (each file keeps the `_ingested_at` it was first given), or undo that commit with `tidemark restore`")]
    BronzeRewritten {
        uri: String,
        version: u64,
        operation: String,
        files_removed: u64,
        pipeline: String,
    },
    /// A Debezium truncate event: every row of the table deleted at once.
    #[error("line {line} of {uri} is a Debezium truncate event (`op: t`): the source table was emptied, which tidemark cannot apply as row changes (it does not know every key the truncate deleted), and ignoring it would keep every truncated row live downstream. Nothing was written and the file is not recorded as ingested. To ignore the truncate, delete its line from the file and rerun. To apply it, start the tables over: move bronze and silver aside (or point both pipelines' `target.uri` at new locations), move the landing files of the events before the truncate out of the landing location, delete the truncate's line, and run the chain again: it builds bronze and silver from the events after it")]
    Truncate { uri: String, line: u64 },
    /// A `format: debezium` file holding plain rows only.
    #[error("{uri} holds rows without Debezium's envelope (no `op`, `before`, `after` or `source` in any line): the sink that wrote it unwrapped the change events (Debezium's ExtractNewRecordState). Nothing was written and the file is not recorded. Ingest such files with `format: json` (the row's own columns; deletes, if the sink keeps them, as it marks them), or have the sink write the events whole")]
    NotDebezium { uri: String },
    /// A full reload would drop rows whose landing files are gone.
    #[error("a full reload of {uri} would drop the rows of {count} file(s) ingested from {landing} that are no longer there (first: {first}); nothing was written. Restore those files to the landing location first, or rebuild the table another way")]
    ReloadWouldDrop {
        uri: String,
        landing: String,
        count: usize,
        first: String,
    },
}

fn store_advice(e: &object_store::Error) -> &'static str {
    match e {
        object_store::Error::NotFound { .. } => {
            "It was removed while the run listed it: rerun (nothing was written)"
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            "Access was refused: make the landing files readable for the user running tidemark (or fix the store's credentials), then rerun; nothing was written"
        }
        _ => "Rerun once the storage is reachable; nothing was written",
    }
}

impl Classify for IngestError {
    fn class(&self) -> ErrorClass {
        match self {
            IngestError::LandingMissing { .. } => ErrorClass::Unavailable,
            IngestError::LandingUri { .. }
            | IngestError::RecordExpires { .. }
            | IngestError::NotARecord { .. } => ErrorClass::Config,
            IngestError::Landing { source, .. } => match source.as_ref() {
                object_store::Error::NotFound { .. } => ErrorClass::Retryable,
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => ErrorClass::Unavailable,
                e => crate::lake::store_fault(e)
                    .map(|f| f.class)
                    .unwrap_or(ErrorClass::Io),
            },
            IngestError::ChangedWhileRead { .. } => ErrorClass::Retryable,
            IngestError::FileChanged { .. }
            | IngestError::BronzeRewritten { .. }
            | IngestError::Schema { .. }
            | IngestError::ReloadWouldDrop { .. }
            | IngestError::Decompress { .. }
            | IngestError::Truncate { .. }
            | IngestError::NotDebezium { .. }
            | IngestError::RecordBehind { .. } => ErrorClass::BadData,
        }
    }
}

impl From<IngestError> for crate::run::RunError {
    fn from(e: IngestError) -> Self {
        crate::run::RunError::kind(e)
    }
}
