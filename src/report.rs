//! The run summary: what a run read, rejected, changed and committed.
//!
//! People get a short aligned text; machines get one JSON object on stdout. Logs never go to
//! stdout, so `--output json` can be piped straight into `jq` or a ledger.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::pipeline::Kind;

/// How a run treated the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// The target was missing or empty: built from the whole source.
    Bootstrap,
    /// The normal hourly run: only the slice behind the watermark and the newly landed rows.
    Incremental,
    /// Rebuilt from the whole source on request, in one overwrite commit.
    FullReload,
}

impl std::fmt::Display for RunMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunMode::Bootstrap => "bootstrap",
            RunMode::Incremental => "incremental",
            RunMode::FullReload => "full_reload",
        })
    }
}

/// Everything a run did, as counted while doing it: a header every kind fills, then the
/// kind's own counters (flattened: the JSON is one flat object).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub pipeline: String,
    /// The pipeline's kind (`cdc_merge`).
    pub kind: Kind,
    pub mode: RunMode,
    pub dry_run: bool,
    pub source_uri: String,
    pub target_uri: String,
    /// Source table version this run read (pinned for the whole run); null for an ingest,
    /// which reads landing files.
    pub source_version: Option<u64>,
    /// Target version this run committed; null when nothing was committed.
    pub target_version: Option<u64>,
    pub num_source_rows_read: u64,
    /// Rows rejected by validation in this run's read (each stored in the quarantine table once).
    pub num_quarantined: u64,
    /// Of those, rows not already in the quarantine table (written by this run).
    pub num_quarantined_new: u64,
    pub num_files_added: u64,
    pub num_files_removed: u64,
    /// Times the run lost a commit race to another writer and planned again.
    pub num_replans: u32,
    pub duration_ms: u64,
    /// Milliseconds per phase, in the order they ran.
    pub phases_ms: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    /// What this kind counts.
    #[serde(flatten)]
    pub counters: Counters,
}

/// Each kind's counters. A new kind adds a variant; the header and the other kinds' counters
/// stay as they are.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Counters {
    Merge(MergeCounters),
    Ingest(IngestCounters),
    Aggregate(AggregateCounters),
    Dimension(DimensionCounters),
}

/// What a `dimension` run counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DimensionCounters {
    /// The source version the previous run read (the rows landed since it name the keys).
    pub previous_source_version: Option<u64>,
    /// Business keys whose rows landed since then (all keys on a full reload): rebuilt.
    pub num_keys_read: u64,
    /// Of those, keys whose rows in the table changed.
    pub num_keys_changed: u64,
    /// Versions (SCD2) or rows (SCD1) of the changed keys before and after the run.
    pub num_rows_before: u64,
    pub num_rows_after: u64,
    /// Change records folded into the existing version in place (a change to untracked
    /// columns only, SCD2).
    pub num_updated_in_place: u64,
    /// Rows of the whole table after the run.
    pub num_rows_total: u64,
    /// Inferred members (`infer_from`): placeholders written by this run for keys the facts
    /// name first, placeholders completed by their first record, placeholders still pending,
    /// and of those the ones older than `alert_after`.
    pub num_inferred_new: u64,
    pub num_inferred_completed: u64,
    pub num_inferred_pending: u64,
    pub num_inferred_overdue: u64,
    /// Rows marked deleted in deletion vectors (`target.apply: deletion_vectors`): the rebuilt
    /// keys' rows replaced, none of the other rows of their files written.
    pub num_rows_marked_deleted: u64,
    /// Files whose deletion vector grew.
    pub num_files_marked: u64,
}

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
}

/// What an `ingest` run counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestCounters {
    /// The run's `_ingested_at` (one per run, milliseconds).
    #[serde(serialize_with = "rfc3339_opt")]
    pub ingested_at: Option<DateTime<Utc>>,
    /// Landing files matching the glob.
    pub num_files_listed: u64,
    /// Files this run read and recorded.
    pub num_files_ingested: u64,
    /// Files already ingested, unchanged: not read again.
    pub num_files_skipped: u64,
    /// Files ingested before that changed since (re-ingested with `on_file_change: reingest`).
    pub num_files_changed: u64,
    /// New files left for the next run by `max_files_per_run` / `max_bytes_per_run`, or still
    /// being written.
    pub num_files_pending: u64,
    /// New files byte-identical to files already ingested: recorded, their rows not appended.
    pub num_files_duplicate: u64,
    pub num_bytes_read: u64,
    /// Rows appended to bronze (records read minus those quarantined).
    pub num_rows_written: u64,
    /// Rows with fields kept in `_rescued_data`.
    pub num_rescued: u64,
    /// Columns this run added to bronze (`on_schema_change: add_new_columns`).
    pub columns_added: Vec<String>,
}

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
    pub expectations: Vec<crate::run::expect::Outcome>,
}

impl RunSummary {
    /// A run's header before it did anything: every count zero, no commit yet, the kind's
    /// counters empty.
    pub fn new(
        run_id: String,
        pipeline: &str,
        kind: Kind,
        dry_run: bool,
        (source_uri, target_uri): (&str, &str),
        counters: Counters,
    ) -> Self {
        RunSummary {
            run_id,
            pipeline: pipeline.to_string(),
            kind,
            mode: RunMode::Incremental,
            dry_run,
            source_uri: source_uri.to_string(),
            target_uri: target_uri.to_string(),
            source_version: None,
            target_version: None,
            num_source_rows_read: 0,
            num_quarantined: 0,
            num_quarantined_new: 0,
            num_files_added: 0,
            num_files_removed: 0,
            num_replans: 0,
            duration_ms: 0,
            phases_ms: BTreeMap::new(),
            warnings: Vec::new(),
            counters,
        }
    }

    /// The merge's counters, when this was a `cdc_merge` run.
    pub fn merge(&self) -> Option<&MergeCounters> {
        match &self.counters {
            Counters::Merge(c) => Some(c),
            Counters::Ingest(_) | Counters::Aggregate(_) | Counters::Dimension(_) => None,
        }
    }
}

pub use crate::clock::{rfc3339, rfc3339_ms};

/// Serializes a time as [`rfc3339`].
pub fn ser_time<S: serde::Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(t))
}

/// Serializes an optional time as [`rfc3339`] or null.
pub fn rfc3339_opt<S: serde::Serializer>(
    t: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(t)),
        None => s.serialize_none(),
    }
}

fn fmt_time(t: &Option<DateTime<Utc>>) -> String {
    t.map(|t| rfc3339(&t)).unwrap_or_else(|| "-".to_string())
}

impl RunSummary {
    /// The summary as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The summary for people: a headline and aligned counts.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let already_applied = self.merge().is_some_and(|c| c.already_applied);
        let outcome = match (self.dry_run, self.target_version) {
            (true, _) => "dry run: nothing written".to_string(),
            (false, Some(v)) => format!("committed target version {v}"),
            (false, None) if already_applied => format!(
                "source version {} was already applied: no commit",
                self.source_version.unwrap_or_default()
            ),
            (false, None) if matches!(self.counters, Counters::Ingest(_)) => {
                "no new landing files: no commit".to_string()
            }
            (false, None) => match &self.counters {
                Counters::Aggregate(c)
                    if c.adjustments_version.is_some() || c.status_version.is_some() =>
                {
                    let mut parts = Vec::new();
                    if let Some(v) = c.adjustments_version {
                        parts.push(format!("adjustments version {v}"));
                    }
                    if let Some(v) = c.status_version {
                        parts.push(format!("day status version {v}"));
                    }
                    format!("gold unchanged; committed {}", parts.join(" and "))
                }
                Counters::Aggregate(_) => {
                    "the days are published as recomputed: no commit".to_string()
                }
                _ => "nothing to change: no commit".to_string(),
            },
        };
        let _ = writeln!(
            out,
            "{} {} run {} — {} ({} ms)",
            self.pipeline, self.mode, self.run_id, outcome, self.duration_ms
        );
        let quarantined = format!(
            "{} ({} new)",
            self.num_quarantined, self.num_quarantined_new
        );
        let files = format!("{}/{}", self.num_files_added, self.num_files_removed);
        let rows: Vec<(&str, String)> = match &self.counters {
            Counters::Merge(c) => vec![
                (
                    "source version",
                    format!(
                        "{} (previous run read {})",
                        self.source_version.unwrap_or_default(),
                        c.previous_source_version
                            .map_or("-".to_string(), |v| v.to_string())
                    ),
                ),
                (
                    "watermark",
                    format!(
                        "{} -> {}",
                        fmt_time(&c.watermark_before),
                        fmt_time(&c.watermark_after)
                    ),
                ),
                ("rows read", self.num_source_rows_read.to_string()),
                ("late rows", c.num_late_rows.to_string()),
                ("quarantined", quarantined),
                ("deferred (future)", c.num_deferred.to_string()),
                ("superseded versions", c.num_superseded.to_string()),
                ("duplicates (re-delivered)", c.num_duplicates.to_string()),
                ("conflicts", c.num_conflicts.to_string()),
                ("inserted", c.num_inserted.to_string()),
                ("updated", c.num_updated.to_string()),
                ("deleted", c.num_deleted.to_string()),
                ("unchanged", c.num_unchanged.to_string()),
                ("files added/removed", files),
            ]
            .into_iter()
            .chain((!c.expectations.is_empty()).then(|| {
                (
                    "expectations failed",
                    c.expectations
                        .iter()
                        .map(|o| format!("{} {} ({})", o.name, o.failed, o.on_fail))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            }))
            .collect(),
            Counters::Aggregate(c) => {
                let day = |d: Option<chrono::NaiveDate>| d.map_or("-".into(), |d| d.to_string());
                vec![
                    (
                        "source version",
                        self.source_version.map_or("-".into(), |v| v.to_string()),
                    ),
                    ("logical date", day(c.logical_date)),
                    (
                        "days recomputed",
                        match (c.days_from, c.days_to) {
                            (Some(a), Some(b)) => {
                                format!("{} ({a} .. {b})", c.num_days_recomputed)
                            }
                            _ => c.num_days_recomputed.to_string(),
                        },
                    ),
                    ("rows read", self.num_source_rows_read.to_string()),
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
                ]
            }
            Counters::Dimension(c) => vec![
                (
                    "source version",
                    format!(
                        "{} (previous run read {})",
                        self.source_version.unwrap_or_default(),
                        c.previous_source_version
                            .map_or("-".to_string(), |v| v.to_string())
                    ),
                ),
                ("rows read", self.num_source_rows_read.to_string()),
                ("quarantined", quarantined),
                (
                    "keys",
                    format!("{} read, {} changed", c.num_keys_read, c.num_keys_changed),
                ),
                (
                    "their rows",
                    format!("{} -> {}", c.num_rows_before, c.num_rows_after),
                ),
                ("updated in place", c.num_updated_in_place.to_string()),
                (
                    "inferred members",
                    format!(
                        "{} new, {} completed, {} pending ({} past alert_after)",
                        c.num_inferred_new,
                        c.num_inferred_completed,
                        c.num_inferred_pending,
                        c.num_inferred_overdue
                    ),
                ),
                ("table rows", c.num_rows_total.to_string()),
                ("files added/removed", files),
            ],
            Counters::Ingest(c) => {
                let mut rows = vec![
                    ("landing", self.source_uri.clone()),
                    (
                        "landing files",
                        format!(
                            "{} listed: {} ingested, {} already ingested, {} left for the next run",
                            c.num_files_listed,
                            c.num_files_ingested,
                            c.num_files_skipped,
                            c.num_files_pending
                        ),
                    ),
                ];
                if c.num_files_ingested > 0 || self.target_version.is_some() {
                    rows.extend([
                        ("ingested at", fmt_time(&c.ingested_at)),
                        ("bytes read", c.num_bytes_read.to_string()),
                        ("records read", self.num_source_rows_read.to_string()),
                        ("quarantined", quarantined),
                        ("rows written", c.num_rows_written.to_string()),
                    ]);
                }
                if c.num_files_duplicate > 0 {
                    rows.push(("re-delivered copies", c.num_files_duplicate.to_string()));
                }
                if c.num_files_changed > 0 {
                    rows.push(("changed files", c.num_files_changed.to_string()));
                }
                if c.num_rescued > 0 {
                    rows.push(("rescued", c.num_rescued.to_string()));
                }
                if !c.columns_added.is_empty() {
                    rows.push(("columns added", c.columns_added.join(", ")));
                }
                if self.target_version.is_some() {
                    rows.push(("files added/removed", files));
                }
                rows
            }
        };
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        if !self.phases_ms.is_empty() {
            // In the order a run executes them; a phase not named there comes last.
            let rank = |k: &str| {
                crate::run::Phase::TIMED
                    .iter()
                    .position(|p| p.as_str() == k)
                    .unwrap_or(usize::MAX)
            };
            let mut phases: Vec<(&String, &u64)> = self.phases_ms.iter().collect();
            phases.sort_by_key(|(k, _)| rank(k));
            let phases: Vec<String> = phases
                .into_iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "  {:<width$}  {}", "phases (ms)", phases.join(", "));
        }
        for w in &self.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
        out
    }
}

/// A byte count as people read it: `512MiB` when a unit divides it, else `1.2MiB (1234567
/// bytes)` — never a bare count of bytes in a message.
pub fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (u, n) in UNITS {
        if bytes >= n && bytes.is_multiple_of(n) {
            return format!("{}{u}", bytes / n);
        }
    }
    match UNITS.iter().find(|(_, n)| bytes >= *n) {
        Some((u, n)) => format!("{:.1}{u} ({bytes} bytes)", bytes as f64 / *n as f64),
        None => format!("{bytes}B"),
    }
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn sizes_read_as_units() {
        assert_eq!(super::size(512 << 20), "512MiB");
        assert_eq!(super::size(1_234_567), "1.2MiB (1234567 bytes)");
        assert_eq!(super::size(900), "900B");
    }
}
