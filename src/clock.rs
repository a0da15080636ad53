//! Injectable time.
//!
//! "Now" decides which rows are future-dated and deferred, and when the scheduler fires a job.
//! Tests need to move time without waiting, so nothing in the run or scheduler path calls
//! `Utc::now()` or sleeps on the wall clock directly: it asks a [`Clock`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Environment variable that pins the clock of the binary to a fixed instant (RFC 3339).
/// Meant for tests and for replaying a past hour; never set it in production.
pub const FAKE_NOW_ENV: &str = "TIDEMARK_FAKE_NOW";

/// Environment variable that makes the clock of the binary run this many times faster than the
/// wall clock (a positive whole number): now = origin + elapsed × N, where the origin is
/// [`FAKE_NOW_ENV`] when set, else the wall clock at start; waits are N times shorter. For tests
/// only (ten minutes of a continuous job in ten seconds); never set it in production.
pub const TIME_SCALE_ENV: &str = "TIDEMARK_TIME_SCALE";

/// Largest [`TIME_SCALE_ENV`].
const MAX_TIME_SCALE: u32 = 100_000;

/// A future returned by [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A source of the current time, and a way to wait for a later one.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;

    /// Completes once [`Clock::now`] has reached `deadline` (at once if it already has). The
    /// scheduler waits for its next fire with this, so a test clock can make days pass in
    /// milliseconds.
    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_>;

    /// How long `d` of this clock's time lasts on the wall clock: `d` itself, except for a
    /// sped-up test clock ([`TIME_SCALE_ENV`]). Timers that keep state other processes judge by
    /// this clock (a lease's heartbeat) wait this long.
    fn wall(&self, d: Duration) -> Duration {
        d
    }
}

/// Longest single wait of the system clock: the wall clock is re-read at least this often, so
/// a suspended laptop or a stepped clock delays a fire by at most this much.
const MAX_WALL_SLEEP: Duration = Duration::from_secs(30);

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                let left = deadline - Utc::now();
                let Ok(left) = left.to_std() else { return };
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(MAX_WALL_SLEEP)).await;
            }
        })
    }
}

/// A clock that always returns the same instant. Time never passes, so sleeping until a later
/// instant never completes (a scheduler on a pinned clock only handles what is already due).
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub DateTime<Utc>);

impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        let due = deadline <= self.0;
        Box::pin(async move {
            if !due {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// A clock that reads tokio's clock, starting at a chosen instant.
///
/// In a runtime whose time is paused (`#[tokio::test(start_paused = true)]`), tokio advances
/// its clock to the next timer whenever every task is idle, so a scheduler driven by this clock
/// runs through days of fires in milliseconds, deterministically. In a normal runtime it is a
/// real clock that started at `origin`.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: DateTime<Utc>,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `origin` now and advances with tokio's clock.
    pub fn starting_at(origin: DateTime<Utc>) -> Self {
        TokioClock {
            origin,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = self.started.elapsed();
        self.origin + chrono::TimeDelta::from_std(elapsed).unwrap_or(chrono::TimeDelta::MAX)
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        let offset = (deadline - self.origin).to_std().unwrap_or(Duration::ZERO);
        let at = self.started + offset;
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that runs `scale` times faster than the wall clock from `origin` (tests only, see
/// [`TIME_SCALE_ENV`]).
#[derive(Debug, Clone, Copy)]
pub struct ScaledClock {
    origin: DateTime<Utc>,
    started: std::time::Instant,
    scale: u32,
}

impl ScaledClock {
    /// A clock that reads `origin` now and then advances `scale` times faster than real time.
    pub fn starting_at(origin: DateTime<Utc>, scale: u32) -> Self {
        ScaledClock {
            origin,
            started: std::time::Instant::now(),
            scale: scale.max(1),
        }
    }
}

impl Clock for ScaledClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = self.started.elapsed().saturating_mul(self.scale);
        self.origin + chrono::TimeDelta::from_std(elapsed).unwrap_or(chrono::TimeDelta::MAX)
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                let Ok(left) = (deadline - self.now()).to_std() else {
                    return;
                };
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(self.wall(left).max(Duration::from_millis(1))).await;
            }
        })
    }

    fn wall(&self, d: Duration) -> Duration {
        d / self.scale
    }
}

/// The clock the binary uses: the system clock, unless [`FAKE_NOW_ENV`] pins it or
/// [`TIME_SCALE_ENV`] speeds it up (from the pinned instant when both are set).
pub fn from_env() -> Result<std::sync::Arc<dyn Clock>, String> {
    let fake_now = match std::env::var(FAKE_NOW_ENV) {
        Ok(v) => Some(DateTime::parse_from_rfc3339(v.trim()).map(|t| t.with_timezone(&Utc)).map_err(|e| {
            format!("{FAKE_NOW_ENV}={v:?} is not an RFC 3339 time ({e}); unset it or use e.g. 2025-01-06T12:00:00Z")
        })?),
        Err(_) => None,
    };
    let scale = match std::env::var(TIME_SCALE_ENV) {
        Ok(v) => Some(
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_TIME_SCALE).contains(n))
                .ok_or_else(|| {
                    format!("{TIME_SCALE_ENV}={v:?} is not a whole number from 1 to {MAX_TIME_SCALE}; unset it (it is for tests only)")
                })?,
        ),
        Err(_) => None,
    };
    Ok(match (fake_now, scale) {
        (origin, Some(scale)) => std::sync::Arc::new(ScaledClock::starting_at(
            origin.unwrap_or_else(Utc::now),
            scale,
        )),
        (Some(t), None) => std::sync::Arc::new(FixedClock(t)),
        (None, None) => std::sync::Arc::new(SystemClock),
    })
}

/// The one timestamp format of every summary, report, ledger listing and history: RFC 3339 in
/// UTC with `Z` and microseconds (`2024-01-06T11:00:00.000000Z`).
pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// [`rfc3339`] of milliseconds since the epoch (a Delta commit's timestamp).
pub fn rfc3339_ms(ms: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp_millis(ms).map(|t| rfc3339(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_jumps_to_the_deadline_when_idle() {
        let clock = TokioClock::starting_at(at("2027-03-28T00:00:00Z"));
        clock.sleep_until(at("2027-03-30T12:00:00Z")).await;
        assert_eq!(clock.now(), at("2027-03-30T12:00:00Z"));
        // a deadline in the past completes at once
        clock.sleep_until(at("2027-01-01T00:00:00Z")).await;
        assert_eq!(clock.now(), at("2027-03-30T12:00:00Z"));
    }

    #[tokio::test]
    async fn scaled_clock_runs_faster_and_sleeps_shorter() {
        let clock = ScaledClock::starting_at(at("2027-01-01T00:00:00Z"), 1000);
        let wall = std::time::Instant::now();
        clock.sleep_until(at("2027-01-01T00:00:20Z")).await;
        assert!(clock.now() >= at("2027-01-01T00:00:20Z"));
        assert!(
            wall.elapsed() < Duration::from_secs(5),
            "{:?}",
            wall.elapsed()
        );
        assert_eq!(
            clock.wall(Duration::from_secs(30)),
            Duration::from_millis(30)
        );
    }

    #[tokio::test]
    async fn fixed_clock_completes_only_what_is_due() {
        let clock = FixedClock(at("2027-01-01T00:00:00Z"));
        clock.sleep_until(at("2026-12-31T00:00:00Z")).await;
        let later = clock.sleep_until(at("2027-01-01T00:00:01Z"));
        let waited = tokio::time::timeout(Duration::from_millis(20), later).await;
        assert!(
            waited.is_err(),
            "a pinned clock never reaches a later instant"
        );
    }
}
