//! Why `tidemark lateness` could not profile a table.

use std::path::PathBuf;

use crate::error::{is_disk_full, next_in_chain, Classify, ErrorClass};
use crate::lake::classify_delta;

#[derive(Debug, thiserror::Error)]
pub enum LatenessError {
    /// A bare table URI names no event-time column.
    #[error("{uri} {what}: pass --event-time COLUMN (the column holding when each event happened; a cdc_merge pipeline's default is its `sequence_by`){columns}")]
    NoEventTime {
        uri: String,
        /// "is a table, not a pipeline", or what the pipeline is.
        what: String,
        columns: String,
    },
    /// A flag names a column the table does not have.
    #[error("{uri} has no column `{column}` for {flag}{hint}; pass {flag} COLUMN with one of its columns: {columns}")]
    NoSuchColumn {
        flag: &'static str,
        column: String,
        uri: String,
        hint: String,
        columns: String,
    },
    /// A time column of a type lateness cannot be measured on.
    #[error("column `{column}` ({flag}) of {uri} is {data_type}; lateness needs a timestamp (with or without time zone, any unit) or a date column: pass {flag} COLUMN")]
    NotATime {
        flag: &'static str,
        column: String,
        uri: String,
        data_type: String,
    },
    /// `--by` names a column whose values cannot be shown as text (a struct, a list).
    #[error("column `{column}` (--by) of {uri} is {data_type}: group by a column of plain values (text, numbers, dates, booleans)")]
    NotAGroup {
        column: String,
        uri: String,
        data_type: String,
    },
    /// `--event-time` and `--arrival` name the same column.
    #[error("--event-time and --arrival both name `{column}`: lateness is the difference between two clocks; pass the arrival (ingestion) column with --arrival")]
    SameColumn { column: String },
    /// `--by` found more groups than a profile can show.
    #[error("--by {column} has more than {max} distinct values: group by a column with fewer values (a source system, a client, a currency)")]
    TooManyGroups { column: String, max: usize },
    /// A flag value the command cannot use.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Lake(#[from] crate::lake::LakeError),
    #[error("cannot read {uri}: {source}")]
    Delta {
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    #[error("reading {uri} failed: {source}{}", crate::error::query_hint(source))]
    Query {
        uri: String,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// The scan's worker task failed (a panic).
    #[error("the scan of {uri} stopped: {message}; this is a bug in tidemark")]
    Task { uri: String, message: String },
    /// `--plot`'s directory does not exist.
    #[error(
        "--plot {path}: the directory {dir} does not exist; create it or write the plot elsewhere"
    )]
    PlotDirectory { path: PathBuf, dir: PathBuf },
    /// Writing `--plot`'s file failed.
    #[error("--plot {path}: cannot write the file: {source}")]
    PlotWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Drawing the curve failed.
    #[error("--plot {path}: drawing the curve failed: {message}; this is a bug in tidemark")]
    PlotDraw { path: PathBuf, message: String },
    /// `--runs` could not read the run ledger.
    #[error(transparent)]
    Ledger(#[from] crate::jobs::JobsError),
}

impl Classify for LatenessError {
    fn class(&self) -> ErrorClass {
        use LatenessError as E;
        match self {
            E::NoEventTime { .. }
            | E::NoSuchColumn { .. }
            | E::NotATime { .. }
            | E::NotAGroup { .. }
            | E::SameColumn { .. }
            | E::TooManyGroups { .. }
            | E::Usage(_)
            | E::PlotDirectory { .. } => ErrorClass::Usage,
            E::Lake(e) => e.class(),
            E::Delta { source, .. } => classify_delta(source),
            E::Query { source, .. } => classify_query(source),
            E::Task { .. } | E::PlotDraw { .. } => ErrorClass::Internal,
            E::PlotWrite { .. } => ErrorClass::Io,
            E::Ledger(e) => e.class(),
        }
    }
}

/// A failed scan: a data file the store no longer has, or that is not Parquet, is bad data (65,
/// as for a run's source); a refused read is "unavailable"; a full disk or other local I/O is 74.
fn classify_query(err: &datafusion::error::DataFusionError) -> ErrorClass {
    // out of the --memory-limit: a setting to raise, as for a run
    let exhausted = matches!(
        err.find_root(),
        datafusion::error::DataFusionError::ResourcesExhausted(_)
    );
    if exhausted || is_disk_full(err) {
        return ErrorClass::Io;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(o) = e.downcast_ref::<object_store::Error>() {
            return match o {
                object_store::Error::NotFound { .. } => ErrorClass::BadData,
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            };
        }
        if e.downcast_ref::<parquet::errors::ParquetError>().is_some() {
            return ErrorClass::BadData;
        }
        if let Some(d) = e.downcast_ref::<deltalake::DeltaTableError>() {
            return classify_delta(d);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::NotFound => ErrorClass::BadData,
                std::io::ErrorKind::PermissionDenied => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            };
        }
        next = next_in_chain(e);
    }
    ErrorClass::Internal
}
