use crate::error::{classify_delta, Classify, ErrorClass};

use super::store_fault::{store_fault, StoreFault};

/// A failure talking to a Delta table, with the table it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// The table is not there (or is not a Delta table). `role` is the pipeline key's prefix
    /// (`source`, `target`, `quarantine`) or `table` for a URI given on the command line.
    #[error(
        "{} not found at {uri}: {reason}; {}",
        table_word(role),
        not_found_fix(role)
    )]
    NotFound {
        role: &'static str,
        uri: String,
        reason: String,
    },
    /// A URI scheme tidemark has no storage for (`gs://`, `az://`, `http://` …).
    #[error("{uri}: the {scheme}:// scheme is not supported; tidemark reads local paths, file:// and s3:// URIs (any S3-compatible store; Google Cloud Storage through its S3 interoperability endpoint: set AWS_ENDPOINT_URL=https://storage.googleapis.com and use s3://)")]
    UnsupportedScheme { uri: String, scheme: String },
    /// The URI cannot be turned into a location.
    #[error("{uri:?} is not a usable table location: {reason}")]
    BadUri { uri: String, reason: String },
    /// A local table location that cannot be created (a path through a regular file, no
    /// permission): nothing was written.
    #[error("cannot create a table at {uri}: {reason}; check the URI in the pipeline (and `--var`) and that this directory can be created")]
    CannotCreate { uri: String, reason: String },
    /// A location that holds other files but no Delta table: creating a table there would mix
    /// tidemark's files with someone else's (and a later vacuum could delete theirs).
    #[error("{uri} is not a Delta table but is not empty either (it holds {example}); tidemark will not create a table among other files. Point the pipeline's location for it (`target.uri`, `quarantine.uri`, `target.record`, …) at an empty or new location, or move those files away")]
    NotEmpty { uri: String, example: String },
    /// The table's `_delta_log` cannot be read: a commit file is damaged or missing.
    #[error("the Delta log of {uri} is damaged: {reason}. tidemark will neither read nor write this table until it is repaired: put back the damaged or missing file under {uri}/_delta_log from a backup (or from the producer, for a source). For a target you may instead move the table aside and rerun: the run rebuilds it from the whole source")]
    CorruptLog { uri: String, reason: String },
    /// The object store could not be reached or refused access: the table was not read, and
    /// nothing says it is damaged.
    #[error("cannot {action} {uri}: {}; {}", fault.cause, fault.advice())]
    Store {
        action: &'static str,
        uri: String,
        fault: StoreFault,
    },
    /// Any other delta-rs failure, with what we were doing.
    #[error("{action} {uri}: {source}")]
    Delta {
        action: &'static str,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
}

/// What to do about a missing table: fix the pipeline key, or the path on the command line.
/// "source table", "target table"…, or just "table" when the role is the table itself.
fn table_word(role: &str) -> String {
    if role == "table" {
        "table".to_string()
    } else {
        format!("{role} table")
    }
}

fn not_found_fix(role: &str) -> String {
    match role {
        "source" | "target" | "quarantine" => {
            format!("check `{role}.uri` (and `--var`) in the pipeline")
        }
        _ => "check the path: it must be a Delta table's folder (the one holding `_delta_log`) or an s3:// URI".to_string(),
    }
}

impl LakeError {
    /// Wraps a delta-rs error with what was being done to which table.
    /// A store or network fault (see [`StoreFault`]) becomes [`LakeError::Store`], in one line.
    pub fn delta(action: &'static str, uri: &str, source: deltalake::DeltaTableError) -> Self {
        if let Some(fault) = store_fault(&source) {
            return LakeError::Store {
                action: action.strip_prefix("cannot ").unwrap_or(action),
                uri: uri.to_string(),
                fault,
            };
        }
        LakeError::Delta {
            action,
            uri: uri.to_string(),
            source: Box::new(source),
        }
    }
}

impl Classify for LakeError {
    fn class(&self) -> ErrorClass {
        match self {
            LakeError::NotFound { .. }
            | LakeError::CannotCreate { .. }
            | LakeError::NotEmpty { .. } => ErrorClass::Unavailable,
            LakeError::CorruptLog { .. } => ErrorClass::BadData,
            LakeError::BadUri { .. } | LakeError::UnsupportedScheme { .. } => ErrorClass::Config,
            LakeError::Store { fault, .. } => fault.class,
            LakeError::Delta { source, .. } => classify_delta(source),
        }
    }
}
