//! What an `ingest` counts, and how its counters read in the summary, the facts and the ledger.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::report::{fmt_time, rfc3339_opt, CounterText, LedgerCounts, RunSummary};

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
    /// A dry-run full reload only: bronze's rows of the files it would replace that differ from
    /// what the files give now (counted each way), and the first such files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_rows_differing: Option<u64>,
    #[serde(skip)]
    pub files_differing: Vec<String>,
    /// A Kafka ingest's counts (its landing-file counters stay 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaCounters>,
}

/// What a Kafka ingest counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KafkaCounters {
    pub topic: String,
    pub num_partitions: u64,
    /// Records fetched (rows, quarantined values and tombstones).
    pub num_records_read: u64,
    /// Records with a null value (or a Debezium tombstone): no row.
    pub num_tombstones: u64,
    /// Records below the high watermarks seen at the start, left for the next run by
    /// `max_records_per_run` / `max_bytes_per_run`.
    pub num_records_pending: u64,
    /// Records deleted from the topic before they were read (`on_data_loss: continue`).
    pub num_records_lost: u64,
}

impl CounterText for IngestCounters {
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)> {
        let c = self;
        if let Some(k) = &c.kafka {
            return kafka_lines(c, k, s);
        }
        let mut rows = vec![
            ("landing", s.source_uri.clone()),
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
        if c.num_files_ingested > 0 || s.target_version.is_some() {
            rows.extend([
                ("ingested at", fmt_time(&c.ingested_at)),
                ("bytes read", c.num_bytes_read.to_string()),
                ("records read", s.num_source_rows_read.to_string()),
                ("quarantined", s.quarantined_text()),
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
        if s.target_version.is_some() {
            rows.push(("files added/removed", s.files_text()));
        }
        rows
    }

    fn no_commit(&self, _s: &RunSummary) -> String {
        match self.kafka {
            Some(_) => "no new Kafka records: no commit".to_string(),
            None => "no new landing files: no commit".to_string(),
        }
    }

    /// Rows appended are the ingest's inserts.
    fn ledger(&self) -> LedgerCounts {
        LedgerCounts {
            inserted: Some(self.num_rows_written),
            updated: Some(0),
            deleted: Some(0),
            ..LedgerCounts::default()
        }
    }
}

/// A Kafka ingest's lines of the summary.
fn kafka_lines(
    c: &IngestCounters,
    k: &KafkaCounters,
    s: &RunSummary,
) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("kafka", s.source_uri.clone()),
        (
            "records",
            format!(
                "{} read from {} partition(s): {} tombstone(s), {} left for the next run",
                k.num_records_read, k.num_partitions, k.num_tombstones, k.num_records_pending
            ),
        ),
    ];
    if k.num_records_lost > 0 {
        rows.push((
            "records lost",
            format!("{} (deleted before they were read)", k.num_records_lost),
        ));
    }
    if s.target_version.is_some() || k.num_records_read > 0 {
        rows.extend([
            ("ingested at", fmt_time(&c.ingested_at)),
            ("bytes read", c.num_bytes_read.to_string()),
            ("quarantined", s.quarantined_text()),
            ("rows written", c.num_rows_written.to_string()),
        ]);
    }
    if !c.columns_added.is_empty() {
        rows.push(("columns added", c.columns_added.join(", ")));
    }
    rows
}
