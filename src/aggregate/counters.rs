//! What an `aggregate` counts, and how its counters read in the summary, the facts and the ledger.

use serde::Serialize;

use crate::report::{CounterText, LedgerCounts, RunSummary};

/// What an `aggregate` run counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AggregateCounters {
    /// The run's logical date (given, or today in the pipeline's time zone).
    pub logical_date: Option<chrono::NaiveDate>,
    /// The event days recomputed (inclusive).
    pub days_from: Option<chrono::NaiveDate>,
    pub days_to: Option<chrono::NaiveDate>,
    pub num_days_recomputed: u64,
    /// Days whose published rows changed (replaced in gold's commit).
    pub num_days_changed: u64,
    /// Of those, days that were already final (`after_close: restate`).
    pub num_days_restated_after_close: u64,
    /// Days labelled final for the first time by this run.
    pub num_days_final_now: u64,
    /// Days the status table shows open after this run.
    pub num_days_open: u64,
    /// Gold rows written (all rows of the changed days' range).
    pub num_rows_written: u64,
    /// The status table's version this run committed (null when unchanged).
    pub status_version: Option<u64>,
    /// The source version the previous run read (the changes since it are "touched").
    pub previous_source_version: Option<u64>,
    /// Event days holding rows the source changed since then.
    pub num_days_touched: u64,
    /// Final days the source changed that are older than `max_lookback` (not restated).
    pub num_days_beyond_max_lookback: u64,
    /// Final days that got adjustments (`after_close: adjust`), and the rows booked.
    pub num_days_adjusted: u64,
    pub num_adjustment_rows: u64,
    /// The adjustments table's version this run committed.
    pub adjustments_version: Option<u64>,
    /// With `late_rows:`: the source rows of final days and windows gold had not counted, and
    /// of those, the rows not stored by an earlier run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_late_rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_late_rows_new: Option<u64>,
    /// With `watermark:`: the newest event time seen (RFC 3339), the watermark (that minus
    /// `delay`), and the end at or before which windows are final (minus `allowed_lateness`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_time_seen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_before: Option<String>,
}

impl CounterText for AggregateCounters {
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)> {
        let c = self;
        let day = |d: Option<chrono::NaiveDate>| d.map_or("-".into(), |d| d.to_string());
        let mut lines = vec![
            (
                "source version",
                s.source_version.map_or("-".into(), |v| v.to_string()),
            ),
            ("logical date", day(c.logical_date)),
            (
                "days recomputed",
                match (c.days_from, c.days_to) {
                    (Some(a), Some(b)) => format!("{} ({a} .. {b})", c.num_days_recomputed),
                    _ => c.num_days_recomputed.to_string(),
                },
            ),
            ("rows read", s.num_source_rows_read.to_string()),
            (
                "days changed",
                format!(
                    "{} ({} already final, restated)",
                    c.num_days_changed, c.num_days_restated_after_close
                ),
            ),
            ("rows written", c.num_rows_written.to_string()),
            (
                "days final now",
                format!("{} (open: {})", c.num_days_final_now, c.num_days_open),
            ),
            (
                "days touched",
                format!(
                    "{} since source version {} ({} final beyond max_lookback)",
                    c.num_days_touched,
                    c.previous_source_version
                        .map_or("-".into(), |v| v.to_string()),
                    c.num_days_beyond_max_lookback
                ),
            ),
            (
                "adjustments",
                format!(
                    "{} row(s) for {} closed day(s)",
                    c.num_adjustment_rows, c.num_days_adjusted
                ),
            ),
            (
                "status version",
                c.status_version.map_or("-".into(), |v| v.to_string()),
            ),
        ];
        if let (Some(n), Some(new)) = (c.num_late_rows, c.num_late_rows_new) {
            let stored = if s.dry_run {
                "would be stored"
            } else {
                "stored now"
            };
            lines.push((
                "late rows",
                format!("{n} not counted by gold's final rows ({new} {stored})"),
            ));
        }
        if let Some(w) = &c.watermark {
            lines.insert(
                2,
                (
                    "watermark",
                    format!(
                        "{w} (newest event {}; final up to {})",
                        c.event_time_seen.as_deref().unwrap_or("-"),
                        c.final_before.as_deref().unwrap_or("-")
                    ),
                ),
            );
        }
        lines
    }

    fn no_commit(&self, _s: &RunSummary) -> String {
        let c = self;
        if c.adjustments_version.is_none() && c.status_version.is_none() {
            return "the days are published as recomputed: no commit".to_string();
        }
        let mut parts = Vec::new();
        if let Some(v) = c.adjustments_version {
            parts.push(format!("adjustments version {v}"));
        }
        if let Some(v) = c.status_version {
            parts.push(format!("day status version {v}"));
        }
        format!("gold unchanged; committed {}", parts.join(" and "))
    }

    /// The rows of the days it replaced are an aggregate's writes.
    fn ledger(&self) -> LedgerCounts {
        LedgerCounts {
            inserted: Some(self.num_rows_written),
            ..LedgerCounts::default()
        }
    }
}
