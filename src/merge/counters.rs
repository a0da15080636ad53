//! What `cdc_merge` counts, and how its counters read in the summary, the facts and the ledger.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::report::{fmt_time, rfc3339_opt, CounterText, LedgerCounts, RunSummary};

/// What a `cdc_merge` run counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MergeCounters {
    #[serde(serialize_with = "rfc3339_opt")]
    pub watermark_before: Option<DateTime<Utc>>,
    #[serde(serialize_with = "rfc3339_opt")]
    pub watermark_after: Option<DateTime<Utc>>,
    /// Source version the previous committed run read; rows landed after it were read in full.
    pub previous_source_version: Option<i64>,
    pub num_deferred: u64,
    /// Rows dropped because a newer version of the same key won (older versions, losers of
    /// equal-tuple conflicts).
    pub num_superseded: u64,
    /// Rows dropped because they are identical in every column to the key's winner: the same
    /// change delivered again.
    pub num_duplicates: u64,
    pub num_conflicts: u64,
    /// Rows that landed since the previous run with a sequence behind the overlap: the overlap
    /// alone would have missed them. A steady non-zero count means the overlap is too small.
    pub num_late_rows: u64,
    pub num_inserted: u64,
    pub num_updated: u64,
    pub num_deleted: u64,
    pub num_unchanged: u64,
    /// Target files whose key statistics could hold a key of the slice (probed on keys only).
    pub num_files_candidate: u64,
    /// Unchanged rows carried into rewritten files: the price of copy-on-write.
    pub num_rows_copied: u64,
    /// Rows decoded and encoded again (the row groups holding a changed key); the other
    /// copied rows moved as bytes.
    pub num_rows_reencoded: u64,
    /// Rows written into data files (rewritten files and the run's new file): with
    /// copy-on-write, the copied and re-encoded rows too.
    pub num_rows_written: u64,
    /// Old versions marked deleted in deletion vectors (`target.apply: deletion_vectors`).
    pub num_rows_marked_deleted: u64,
    /// Files whose deletion vector grew.
    pub num_files_marked: u64,
    /// True when nothing was left to do because an earlier run already applied this source
    /// version (for example a run whose success response was lost).
    pub already_applied: bool,
    /// Per rule, the rows read that failed it (built-in rules first); empty when the pipeline
    /// declares no expectations.
    pub expectations: Vec<crate::report::ExpectationOutcome>,
}

impl CounterText for MergeCounters {
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)> {
        let c = self;
        let mut rows = vec![
            (
                "source version",
                s.source_version_text(c.previous_source_version.map(|v| v.to_string())),
            ),
            (
                "watermark",
                format!(
                    "{} -> {}",
                    fmt_time(&c.watermark_before),
                    fmt_time(&c.watermark_after)
                ),
            ),
            ("rows read", s.num_source_rows_read.to_string()),
            ("late rows", c.num_late_rows.to_string()),
            ("quarantined", s.quarantined_text()),
            ("deferred (future)", c.num_deferred.to_string()),
            ("superseded versions", c.num_superseded.to_string()),
            ("duplicates (re-delivered)", c.num_duplicates.to_string()),
            ("conflicts", c.num_conflicts.to_string()),
            ("inserted", c.num_inserted.to_string()),
            ("updated", c.num_updated.to_string()),
            ("deleted", c.num_deleted.to_string()),
            ("unchanged", c.num_unchanged.to_string()),
            ("files added/removed", s.files_text()),
        ];
        if !c.expectations.is_empty() {
            rows.push((
                "expectations failed",
                c.expectations
                    .iter()
                    .map(|o| format!("{} {} ({})", o.name, o.failed, o.on_fail))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        rows
    }

    fn no_commit(&self, s: &RunSummary) -> String {
        if self.already_applied {
            format!(
                "source version {} was already applied: no commit",
                s.source_version.unwrap_or_default()
            )
        } else {
            "nothing to change: no commit".to_string()
        }
    }

    fn ledger(&self) -> LedgerCounts {
        let c = self;
        LedgerCounts {
            watermark_before: c.watermark_before,
            watermark_after: c.watermark_after,
            inserted: Some(c.num_inserted),
            updated: Some(c.num_updated),
            deleted: Some(c.num_deleted),
            unchanged: Some(c.num_unchanged),
            deferred: Some(c.num_deferred),
            late_rows: Some(c.num_late_rows),
            conflicts: Some(c.num_conflicts),
            superseded: Some(c.num_superseded),
            duplicates: Some(c.num_duplicates),
            expectations: c.expectations.clone(),
        }
    }
}
