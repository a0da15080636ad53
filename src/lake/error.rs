use crate::error::{classify_delta, Classify, ErrorClass};

/// A failure talking to a Delta table, with the table it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// The table is not there (or is not a Delta table).
    #[error("{role} table not found at {uri}: {reason}; check `{role}.uri` (and `--var`) in the pipeline")]
    NotFound {
        role: &'static str,
        uri: String,
        reason: String,
    },
    /// The URI cannot be turned into a location.
    #[error("{uri:?} is not a usable table location: {reason}")]
    BadUri { uri: String, reason: String },
    /// Any other delta-rs failure, with what we were doing.
    #[error("{action} {uri}: {source}")]
    Delta {
        action: &'static str,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
}

impl LakeError {
    /// Wraps a delta-rs error with what was being done to which table.
    pub fn delta(action: &'static str, uri: &str, source: deltalake::DeltaTableError) -> Self {
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
            LakeError::NotFound { .. } => ErrorClass::Unavailable,
            LakeError::BadUri { .. } => ErrorClass::Config,
            LakeError::Delta { source, .. } => classify_delta(source),
        }
    }
}
