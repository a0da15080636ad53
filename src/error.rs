//! Error classes and the exit codes they map to.
//!
//! Every module returns its own `thiserror` enum; at the edge each error is reduced to an
//! [`ErrorClass`], which decides the process exit code. The codes follow BSD `sysexits.h` so
//! schedulers and shell scripts can tell "fix your config" from "try again later".

use std::fmt;

/// What kind of failure an error is, from the point of view of whoever has to react to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The command line itself is wrong (unknown flag, malformed `--var`).
    Usage,
    /// A pipeline or bundle file is invalid: nothing was read or written.
    Config,
    /// The data broke a rule the pipeline enforces (quarantine limit exceeded, corrupt target).
    BadData,
    /// A table or file could not be reached: missing, unreadable, or not a Delta table.
    Unavailable,
    /// Local I/O failed (disk full, permission denied on a spill or output path).
    Io,
    /// Another writer got there first, or a transient failure: rerunning is safe.
    Retryable,
    /// A bug in tidemark: please report it with the log.
    Internal,
    /// Stopped by SIGINT (Ctrl-C): the work was cancelled and cleaned up; rerunning is safe.
    Interrupted,
    /// Stopped by SIGTERM: the work was cancelled and cleaned up; rerunning is safe.
    Terminated,
}

impl ErrorClass {
    /// The process exit code for this class; documented in docs/operations/exit-codes.md and stable.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorClass::Usage => 64,
            ErrorClass::BadData => 65,
            ErrorClass::Unavailable => 66,
            ErrorClass::Internal => 70,
            ErrorClass::Io => 74,
            ErrorClass::Retryable => 75,
            ErrorClass::Config => 78,
            ErrorClass::Interrupted => 130,
            ErrorClass::Terminated => 143,
        }
    }

    /// Whether a scheduler may retry the same command unchanged.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorClass::Retryable)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorClass::Usage => "usage",
            ErrorClass::Config => "config",
            ErrorClass::BadData => "bad_data",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Io => "io",
            ErrorClass::Retryable => "retryable",
            ErrorClass::Internal => "internal",
            ErrorClass::Interrupted => "interrupted",
            ErrorClass::Terminated => "terminated",
        };
        f.write_str(s)
    }
}

/// What `--output json` prints on failure: the command's own JSON object (a job's report, a
/// reconciliation's differences, an invalid bundle's problems) when it printed one, with
/// `error: {class, exit_code, message}` added; otherwise an object holding only `error`. So
/// stdout is exactly one JSON object whatever the outcome.
pub fn json_failure(stdout: &str, class: ErrorClass, message: &str) -> String {
    let error = serde_json::json!({
        "class": class.to_string(),
        "exit_code": class.exit_code(),
        "message": message,
    });
    let mut obj = match serde_json::from_str::<serde_json::Value>(stdout.trim()) {
        Ok(serde_json::Value::Object(obj)) => obj,
        _ => serde_json::Map::new(),
    };
    obj.insert("error".into(), error);
    serde_json::Value::Object(obj).to_string() + "\n"
}

/// Implemented by every module error so the binary can pick an exit code without knowing
/// the module's internals.
pub trait Classify {
    /// The class that decides the exit code.
    fn class(&self) -> ErrorClass;
}

/// Whether delta-rs' kernel says a file the log references (a data file, a deletion vector) is
/// missing or damaged — its errors carry no type tidemark can name, only their text.
pub(crate) fn kernel_file_damage(text: &str) -> bool {
    [
        "File not found:",
        "Deletion Vector error:",
        "Selection vector is larger",
    ]
    .iter()
    .any(|p| text.starts_with(p))
}

/// [`kernel_file_damage`] for a message that quotes the kernel's error
/// (`… Kernel error: File not found: …`).
pub(crate) fn kernel_file_damage_within(text: &str) -> bool {
    text.match_indices("Kernel error: ")
        .any(|(i, m)| kernel_file_damage(&text[i + m.len()..]))
}

/// The next error in a chain. An `io::Error` that wraps another error (`io::Error::other(e)`)
/// reports `e`'s source as its own, skipping `e`; this steps into `e` itself, so a store error
/// a writer wrapped in an `io::Error` is still found.
pub fn next_in_chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    match e
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
    {
        Some(inner) => Some(inner),
        None => e.source(),
    }
}

/// The kind of the first OS (`std::io`) error in an error's chain, also when a library flattened
/// it into a message (`... Permission denied (os error 13)`). An `io::Error` of kind `Other` that
/// only wraps another error's text (as the Parquet writer does) does not hide the OS error in
/// that text.
pub fn os_error_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut wrapped = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() != std::io::ErrorKind::Other {
                return Some(io.kind());
            }
            wrapped = true;
        }
        next = next_in_chain(e);
    }
    let text = err.to_string();
    let found = [
        ("(os error 13)", std::io::ErrorKind::PermissionDenied),
        ("(os error 1)", std::io::ErrorKind::PermissionDenied),
        ("(os error 2)", std::io::ErrorKind::NotFound),
        ("(os error 28)", std::io::ErrorKind::StorageFull),
        ("(os error 122)", std::io::ErrorKind::QuotaExceeded),
        ("(os error 27)", std::io::ErrorKind::FileTooLarge),
    ]
    .into_iter()
    .find_map(|(code, kind)| text.contains(code).then_some(kind));
    found.or(wrapped.then_some(std::io::ErrorKind::Other))
}

/// Whether an error (anywhere in its chain, or in a message that flattened the chain) is a full
/// disk, an exhausted quota or a file past the process's file-size limit (EFBIG: `ulimit -f`,
/// as container runtimes set): local I/O the operator can fix, not a bug.
pub fn is_disk_full(err: &(dyn std::error::Error + 'static)) -> bool {
    any_in_chain(err, |io, text| {
        matches!(
            io,
            Some(std::io::ErrorKind::StorageFull)
                | Some(std::io::ErrorKind::QuotaExceeded)
                | Some(std::io::ErrorKind::FileTooLarge)
        ) || text.contains("No space left on device")
            || text.contains("Disk quota exceeded")
            || text.contains("File too large")
    })
}

/// Whether the space that ran out is a per-process file-size limit (EFBIG), not the disk.
pub fn is_file_too_large(err: &(dyn std::error::Error + 'static)) -> bool {
    any_in_chain(err, |io, text| {
        io == Some(std::io::ErrorKind::FileTooLarge) || text.contains("File too large")
    })
}

/// Whether `test` holds for some error of the chain (its OS error kind, if any, and its text).
fn any_in_chain(
    err: &(dyn std::error::Error + 'static),
    test: impl Fn(Option<std::io::ErrorKind>, &str) -> bool,
) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let io = e.downcast_ref::<std::io::Error>().map(std::io::Error::kind);
        if test(io, &e.to_string()) {
            return true;
        }
        next = next_in_chain(e);
    }
    false
}

/// What to do when a query ran out of its memory pool, or its spill files out of disk or of
/// the file-size limit (DataFusion says what it could not allocate, not how to fix it); empty
/// for any other failure.
pub fn query_hint(e: &datafusion::error::DataFusionError) -> &'static str {
    if matches!(
        e.find_root(),
        datafusion::error::DataFusionError::ResourcesExhausted(_)
    ) {
        ". The run needed more memory than its limit: raise --memory-limit (or the job cluster's memory_limit), or run with fewer --threads; nothing was committed"
    } else if crate::error::is_file_too_large(e) {
        ". A file grew past this process's file-size limit (EFBIG: `ulimit -f`, or the container's RLIMIT_FSIZE; spill files go to --spill-dir, or the job cluster's spill_directory): raise or lift the limit, or give the run more --memory-limit so it spills less, then rerun; nothing was committed"
    } else if crate::error::is_disk_full(e) {
        ". The disk is full (spill files go to --spill-dir, or the job cluster's spill_directory): free space or point it at a larger disk, then rerun; nothing was committed"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_local_io_not_a_bug() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "write failed");
        assert!(is_disk_full(&io));
        let flattened = datafusion::error::DataFusionError::Execution(
            "Arrow error: Io error: No space left on device (os error 28)".into(),
        );
        assert!(is_disk_full(&flattened));
        let other = datafusion::error::DataFusionError::Execution("bad plan".into());
        assert!(!is_disk_full(&other));
        let efbig = std::io::Error::from_raw_os_error(27);
        assert!(is_disk_full(&efbig) && is_file_too_large(&efbig));
        assert!(!is_file_too_large(&io));
        let flattened = datafusion::error::DataFusionError::Execution(
            "Arrow error: Io error: File too large (os error 27)".into(),
        );
        assert!(is_disk_full(&flattened) && is_file_too_large(&flattened));
    }
}
