use crate::error::{Classify, ErrorClass};

use super::store_fault::{store_fault, StoreFault};

/// Classifies a delta-rs error: a missing table or object-store failure is "unavailable",
/// a lost commit race is "retryable", anything else is internal unless the caller knows better.
pub fn classify_delta(err: &deltalake::DeltaTableError) -> ErrorClass {
    use deltalake::DeltaTableError as E;
    if crate::error::is_disk_full(err) {
        return ErrorClass::Io;
    }
    if let Some(fault) = store_fault(err) {
        return fault.class;
    }
    match err {
        E::NotATable(_) | E::InvalidTableLocation(_) => ErrorClass::Unavailable,
        E::ObjectStore { source } => match source {
            deltalake::ObjectStoreError::NotFound { .. } => ErrorClass::Unavailable,
            deltalake::ObjectStoreError::PermissionDenied { .. }
            | deltalake::ObjectStoreError::Unauthenticated { .. } => ErrorClass::Unavailable,
            _ => ErrorClass::Io,
        },
        E::Io { .. } => ErrorClass::Io,
        E::Transaction { .. } | E::VersionAlreadyExists(_) => ErrorClass::Retryable,
        E::InvalidJsonLog { .. } | E::InvalidStatsJson { .. } => ErrorClass::BadData,
        E::KernelError(k) if crate::error::kernel_file_damage(&k.to_string()) => {
            ErrorClass::BadData
        }
        // (delta-rs' MERGE flattens the kernel's error into its message)
        E::Generic(text) if crate::error::kernel_file_damage_within(text) => ErrorClass::BadData,
        _ => ErrorClass::Internal,
    }
}

/// Classifies a failed delta-rs *write* (data files, a commit, the quarantine table): a full disk
/// and an OS refusal to write (a read-only directory or `_delta_log`) are local I/O (74), not
/// "unavailable" — the table was found; what failed is writing to it. Anything else is
/// classified as by [`classify_delta`].
pub fn classify_delta_write(err: &deltalake::DeltaTableError) -> ErrorClass {
    if crate::error::is_disk_full(err)
        || crate::error::os_error_kind(err) == Some(std::io::ErrorKind::PermissionDenied)
    {
        return ErrorClass::Io;
    }
    if let Some(fault) = store_fault(err) {
        return fault.class;
    }
    let class = classify_delta(err);
    if class != ErrorClass::Internal {
        return class;
    }
    // The Parquet writer reports a failed upload of a data file as a Parquet error around the
    // store's error: a storage failure, not a bug.
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(o) = e.downcast_ref::<deltalake::ObjectStoreError>() {
            return match o {
                deltalake::ObjectStoreError::PermissionDenied { .. }
                | deltalake::ObjectStoreError::Unauthenticated { .. } => ErrorClass::Unavailable,
                _ => ErrorClass::Io,
            };
        }
        next = crate::error::next_in_chain(e);
    }
    class
}

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
    /// A table the run reads is not there yet, and `writers` are the pipelines that write it:
    /// run them first (`advice`: the commands).
    #[error("{role} table {uri} does not exist yet: {writers}. {advice} (a bundle job with these pipelines as tasks runs them in order)")]
    NotYetWritten {
        role: &'static str,
        uri: String,
        writers: String,
        advice: String,
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
            | LakeError::NotYetWritten { .. }
            | LakeError::CannotCreate { .. }
            | LakeError::NotEmpty { .. } => ErrorClass::Unavailable,
            LakeError::CorruptLog { .. } => ErrorClass::BadData,
            LakeError::BadUri { .. } | LakeError::UnsupportedScheme { .. } => ErrorClass::Config,
            LakeError::Store { fault, .. } => fault.class,
            LakeError::Delta { source, .. } => classify_delta(source),
        }
    }
}

#[cfg(test)]
mod classify_tests {
    use super::*;

    /// A local store wraps the OS error in a generic store error; a write refused by the OS is
    /// local I/O, a read refused stays "unavailable" (see `run::error`).
    #[test]
    fn a_write_refused_by_the_os_is_local_io() {
        let denied = || deltalake::DeltaTableError::ObjectStore {
            source: deltalake::ObjectStoreError::Generic {
                store: "LocalFileSystem",
                source: Box::new(std::io::Error::from_raw_os_error(13)),
            },
        };
        assert_eq!(
            crate::error::os_error_kind(&denied()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert_eq!(classify_delta_write(&denied()), ErrorClass::Io);
        let full = deltalake::DeltaTableError::Generic(
            "Arrow error: Io error: No space left on device (os error 28)".into(),
        );
        assert_eq!(classify_delta_write(&full), ErrorClass::Io);
        assert_eq!(classify_delta(&full), ErrorClass::Io);
        let flattened = deltalake::DeltaTableError::Generic(
            "Failed to write: Permission denied (os error 13)".into(),
        );
        assert_eq!(classify_delta_write(&flattened), ErrorClass::Io);
        assert_eq!(
            classify_delta_write(&deltalake::DeltaTableError::VersionAlreadyExists(3)),
            ErrorClass::Retryable
        );
        // A data file's failed upload, as the Parquet writer wraps it.
        let upload = deltalake::DeltaTableError::Parquet {
            source: parquet::errors::ParquetError::External(Box::new(
                deltalake::ObjectStoreError::Generic {
                    store: "S3",
                    source: "connection reset".into(),
                },
            )),
        };
        assert_eq!(classify_delta(&upload), ErrorClass::Internal);
        assert_eq!(classify_delta_write(&upload), ErrorClass::Io);
        // ... or inside an io::Error, which hides it from `source()`.
        let wrapped = deltalake::DeltaTableError::Parquet {
            source: parquet::errors::ParquetError::External(Box::new(std::io::Error::other(
                deltalake::ObjectStoreError::Generic {
                    store: "S3",
                    source: "connection reset".into(),
                },
            ))),
        };
        assert_eq!(classify_delta_write(&wrapped), ErrorClass::Io);
    }
}
