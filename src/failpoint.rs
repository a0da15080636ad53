//! Named fault-injection points, compiled in only with the `failpoints` cargo feature.
//!
//! Reliability is proved by crashing a run at every phase and checking that a rerun converges.
//! In builds with the feature, `TIDEMARK_FAILPOINTS="name=action[;name=action]"` arms points:
//!
//! | action | effect |
//! | --- | --- |
//! | `error` | the point returns a retryable error |
//! | `error*N` | the first N hits return an error, later hits pass (retry tests) |
//! | `enospc` | the point fails as a full disk does (`No space left on device`, os error 28) |
//! | `efbig` | the point fails as a file past the process's file-size limit does (`File too large`, os error 27) |
//! | `eacces` | the point fails as a denied permission does (`Permission denied`, os error 13) |
//! | `panic` | the process panics at the point |
//! | `abort` | the process aborts (no destructors, like `kill -9`) |
//! | `exit(C)` | the process exits with code C |
//! | `sleep(MS)` | the point waits MS milliseconds (to widen race windows) |
//! | `pause(DIR)` | the point creates `DIR/reached`, then waits (up to 2 minutes) until `DIR/go` exists: tests order two processes exactly |
//!
//! Without the feature every point compiles to nothing.

/// What an armed failpoint makes its caller see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A transient failure (`error`, `error*N`).
    Error,
    /// The disk is full (`enospc`): the OS error a write gets then.
    DiskFull,
    /// Permission denied (`eacces`): the OS error an access without the right gets.
    PermissionDenied,
    /// A file past the process's file-size limit (`efbig`, RLIMIT_FSIZE).
    FileTooLarge,
}

/// An armed `error`, `enospc` or `eacces` failpoint fired.
#[derive(Debug, Clone, thiserror::Error)]
#[error("injected failure at failpoint `{point}` (TIDEMARK_FAILPOINTS){}; rerun without it", self.detail())]
pub struct Injected {
    pub point: String,
    pub fault: Fault,
}

impl Injected {
    fn detail(&self) -> String {
        self.io_error()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    }

    /// The class of what the fault stands for: a plain injected error is transient; a full
    /// disk or a denied permission is local I/O the operator has to fix.
    pub fn class(&self) -> crate::error::ErrorClass {
        match self.fault {
            Fault::Error => crate::error::ErrorClass::Retryable,
            Fault::DiskFull | Fault::PermissionDenied | Fault::FileTooLarge => {
                crate::error::ErrorClass::Io
            }
        }
    }

    /// The OS error the fault stands for (`None` for a plain injected error).
    pub fn io_error(&self) -> Option<std::io::Error> {
        match self.fault {
            Fault::Error => None,
            Fault::DiskFull => Some(std::io::Error::from_raw_os_error(28)),
            Fault::PermissionDenied => Some(std::io::Error::from_raw_os_error(13)),
            Fault::FileTooLarge => Some(std::io::Error::from_raw_os_error(27)),
        }
    }
}

impl crate::error::Classify for Injected {
    fn class(&self) -> crate::error::ErrorClass {
        Injected::class(self)
    }
}

/// Environment variable that arms failpoints.
pub const ENV: &str = "TIDEMARK_FAILPOINTS";

#[cfg(feature = "failpoints")]
mod imp {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::{Fault, Injected, ENV};

    static HITS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

    fn action_for(name: &str) -> Option<String> {
        let spec = std::env::var(ENV).ok()?;
        spec.split(';').find_map(|part| {
            let (n, a) = part.split_once('=')?;
            (n.trim() == name).then(|| a.trim().to_string())
        })
    }

    pub fn hit(name: &str) -> Result<(), Injected> {
        let Some(action) = action_for(name) else {
            return Ok(());
        };
        let count = {
            let mut guard = HITS.lock().unwrap_or_else(|e| e.into_inner());
            let map = guard.get_or_insert_with(HashMap::new);
            let c = map.entry(name.to_string()).or_insert(0);
            *c += 1;
            *c
        };
        tracing::warn!(failpoint = name, action = %action, hit = count, "failpoint reached");
        let injected = |fault| Injected {
            point: name.to_string(),
            fault,
        };
        match action.as_str() {
            "error" => return Err(injected(Fault::Error)),
            "enospc" => return Err(injected(Fault::DiskFull)),
            "eacces" => return Err(injected(Fault::PermissionDenied)),
            "efbig" => return Err(injected(Fault::FileTooLarge)),
            _ => {}
        }
        if let Some(n) = action.strip_prefix("error*") {
            let limit: u64 = n.parse().unwrap_or(1);
            return if count <= limit {
                Err(injected(Fault::Error))
            } else {
                Ok(())
            };
        }
        if action == "panic" {
            panic!("failpoint {name}: panic");
        }
        if action == "abort" {
            std::process::abort();
        }
        if let Some(code) = action
            .strip_prefix("exit(")
            .and_then(|r| r.strip_suffix(')'))
        {
            std::process::exit(code.parse().unwrap_or(1));
        }
        if let Some(dir) = action
            .strip_prefix("pause(")
            .and_then(|r| r.strip_suffix(')'))
        {
            let dir = std::path::Path::new(dir);
            let _ = std::fs::write(dir.join("reached"), std::process::id().to_string());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while !dir.join("go").exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            return Ok(());
        }
        if let Some(ms) = action
            .strip_prefix("sleep(")
            .and_then(|r| r.strip_suffix(')'))
        {
            std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0)));
        }
        Ok(())
    }
}

/// Passes through unless the point is armed (only possible with the `failpoints` feature).
#[inline]
pub fn hit(name: &str) -> Result<(), Injected> {
    #[cfg(feature = "failpoints")]
    {
        imp::hit(name)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        Ok(())
    }
}

/// [`hit`] for async code whose task must stay responsive while the point waits (`pause`,
/// `sleep`): the wait runs on a blocking thread, so a `select!` on stop signals still runs.
pub async fn hit_async(name: &'static str) -> Result<(), Injected> {
    #[cfg(feature = "failpoints")]
    {
        tokio::task::spawn_blocking(move || hit(name))
            .await
            .unwrap_or(Ok(()))
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        Ok(())
    }
}
