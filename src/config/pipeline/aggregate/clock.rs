//! The aggregate's clock settings: `window:` (tumbling windows within each event day) and
//! `watermark:` (finality by the data's own clock), their types and their checks.

use serde::Deserialize;

use super::super::common::Ctx;
use crate::config::ConfigError;

/// `watermark:`: the watermark is the newest event time seen (never moving back) minus
/// `delay`; a window (a day without `window:`) is final once the watermark is at or past its
/// end plus `allowed_lateness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    /// µs.
    pub delay: i64,
    /// µs.
    pub allowed_lateness: i64,
}

/// Tumbling windows of a whole number of minutes that divides a day: each local day is cut
/// into windows counted in elapsed time from its first instant (so an hour window is a local
/// hour, DST days have 23 or 25 of them, and the last window of a day ends at the next day's
/// first instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub minutes: u32,
}

impl Window {
    /// The window's length in microseconds.
    pub fn micros(self) -> i64 {
        i64::from(self.minutes) * 60_000_000
    }

    /// As a person writes it: `5m`, `1h`, `1d`.
    pub fn label(self) -> String {
        match self.minutes {
            1440 => "1d".to_string(),
            m if m % 60 == 0 => format!("{}h", m / 60),
            m => format!("{m}m"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWatermark {
    pub(super) delay: String,
    #[serde(default)]
    pub(super) allowed_lateness: Option<String>,
}

impl Ctx<'_> {
    /// `watermark:`: a delay and an allowed lateness (each a length of time, 0 or more); the
    /// lookback is the other finality rule, so both together are refused.
    pub(super) fn watermark(
        &self,
        raw: &RawWatermark,
        lookback_given: bool,
    ) -> Result<Watermark, ConfigError> {
        if lookback_given {
            return Err(self.invalid(
                "lookback",
                "`recompute.lookback` closes days by the logical date, and `watermark:` closes them by the data's own clock: keep one (with `watermark:`, the days still open are restated each run)",
            ));
        }
        let micros = |key: &str, value: &str| {
            humantime::parse_duration(value.trim())
                .ok()
                .and_then(|d| i64::try_from(d.as_micros()).ok())
                .ok_or_else(|| {
                    self.invalid(
                        key,
                        format!("`watermark.{key}: {value}` is not a length of time; write it like 10m, 30s or 2h"),
                    )
                })
        };
        Ok(Watermark {
            delay: micros("delay", &raw.delay)?,
            allowed_lateness: match &raw.allowed_lateness {
                Some(v) => micros("allowed_lateness", v)?,
                None => 0,
            },
        })
    }

    /// `window:`: a whole number of minutes that divides a day (`1m`, `5m`, `15m`, `1h`, `6h`,
    /// `1d`).
    pub(super) fn window(&self, value: &str) -> Result<Window, ConfigError> {
        let bad = |why: &str| {
            self.invalid(
                "window",
                format!("`window: {value}` {why}; write a length that divides a day, like 1m, 5m, 15m, 1h or 1d"),
            )
        };
        let d =
            humantime::parse_duration(value.trim()).map_err(|_| bad("is not a length of time"))?;
        let secs = d.as_secs();
        if secs % 60 != 0 || d.subsec_nanos() != 0 || secs == 0 {
            return Err(bad("is not a whole number of minutes"));
        }
        let minutes = secs / 60;
        if minutes > 1440 {
            return Err(bad(if value.contains('M') {
                "is longer than a day (`M` is months: minutes are `m`)"
            } else {
                "is longer than a day"
            }));
        }
        if 1440 % minutes != 0 {
            return Err(bad("does not divide a day into equal windows"));
        }
        Ok(Window {
            minutes: minutes as u32,
        })
    }
}
