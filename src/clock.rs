//! Injectable time.
//!
//! "Now" decides which rows are future-dated and deferred. Tests (and the scheduler, later)
//! need to move time without waiting, so nothing in the run path calls `Utc::now()` directly.

use chrono::{DateTime, Utc};

/// Environment variable that pins the clock of the binary to a fixed instant (RFC 3339).
/// Meant for tests and for replaying a past hour; never set it in production.
pub const FAKE_NOW_ENV: &str = "TIDEMARK_FAKE_NOW";

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that always returns the same instant.
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub DateTime<Utc>);

impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }
}

/// The clock the binary uses: the system clock unless [`FAKE_NOW_ENV`] is set.
pub fn from_env() -> Result<Box<dyn Clock>, String> {
    match std::env::var(FAKE_NOW_ENV) {
        Ok(v) => DateTime::parse_from_rfc3339(v.trim())
            .map(|t| Box::new(FixedClock(t.with_timezone(&Utc))) as Box<dyn Clock>)
            .map_err(|e| {
                format!("{FAKE_NOW_ENV}={v:?} is not an RFC 3339 time ({e}); unset it or use e.g. 2025-01-06T12:00:00Z")
            }),
        Err(_) => Ok(Box::new(SystemClock)),
    }
}
