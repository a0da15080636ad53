//! The run ledger: a Delta table at `<lake>/_tidemark/runs`, one row per task attempt.
//!
//! Every attempt is appended as soon as it ends — successes, failures, retries, timeouts, tasks
//! skipped because an upstream task failed, and fires skipped because the job was already
//! running — so the ledger is the audit trail, what `tidemark runs` prints, and where the
//! scheduler finds the last fire it handled after a restart. Any Delta reader can query it.

use std::collections::BTreeMap;

use chrono::serde::{ts_microseconds, ts_microseconds_option};
use chrono::{DateTime, Utc};
use datafusion::functions_aggregate::expr_fn::max;
use datafusion::logical_expr::{col, lit};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use serde::{Deserialize, Serialize};

mod columns;
pub use columns::schema;
use columns::{from_batch, to_batch};

use super::error::READ_BACK;
use super::JobsError;
use crate::lake;
use crate::report::RunSummary;
use crate::run::Engine;

/// What started an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The scheduler, on time.
    Schedule,
    /// `tidemark job run` (or the demo).
    Manual,
    /// A retry of a failed attempt.
    Retry,
    /// The scheduler, for the latest fire it missed while it was down.
    CatchUp,
    /// A tick of a continuous job (`continuous:` in the bundle, or `job run --every`).
    Continuous,
}

impl Trigger {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Retry => "retry",
            Trigger::CatchUp => "catch_up",
            Trigger::Continuous => "continuous",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt (or a task that never got one) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Succeeded,
    Failed,
    /// Not run: the job was already running, or the job ran out of time before it started.
    Skipped,
    TimedOut,
    /// Not run: a task it depends on did not succeed.
    UpstreamFailed,
    /// Stopped from outside while it ran (SIGINT/SIGTERM to `job run`, the scheduler's grace
    /// period running out). Its commit, if it had landed, landed whole; rerunning is safe.
    Cancelled,
}

impl TaskStatus {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Skipped => "skipped",
            TaskStatus::TimedOut => "timed_out",
            TaskStatus::UpstreamFailed => "upstream_failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the ledger; its fields are the table's columns, in order (see `columns`). Times
/// serialize as RFC 3339 (what `tidemark runs --output json` prints) and deserialize from the
/// table's timestamp column (microseconds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LedgerRow {
    /// The job run (all attempts of all tasks of one run share it).
    pub run_id: String,
    pub job: String,
    /// The bundle target the run used.
    pub target: String,
    pub task: String,
    /// 1 for the first attempt; 0 for a task that was never attempted.
    pub attempt: i32,
    pub trigger: String,
    /// The fire time for scheduled runs; null for manual ones.
    #[serde(serialize_with = "crate::report::rfc3339_opt")]
    #[serde(default, deserialize_with = "ts_microseconds_option::deserialize")]
    pub scheduled_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "crate::report::ser_time")]
    #[serde(deserialize_with = "ts_microseconds::deserialize")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::report::ser_time")]
    #[serde(deserialize_with = "ts_microseconds::deserialize")]
    pub ended_at: DateTime<Utc>,
    pub status: String,
    pub error_class: Option<String>,
    pub error_message: Option<String>,
    pub host: String,
    pub pipeline: Option<String>,
    /// The pipeline run's own id (also in the target's Delta commit).
    pub pipeline_run_id: Option<String>,
    pub mode: Option<String>,
    pub source_version: Option<i64>,
    pub target_version: Option<i64>,
    #[serde(serialize_with = "crate::report::rfc3339_opt")]
    #[serde(default, deserialize_with = "ts_microseconds_option::deserialize")]
    pub watermark_before: Option<DateTime<Utc>>,
    #[serde(serialize_with = "crate::report::rfc3339_opt")]
    #[serde(default, deserialize_with = "ts_microseconds_option::deserialize")]
    pub watermark_after: Option<DateTime<Utc>>,
    pub num_source_rows_read: Option<i64>,
    pub num_inserted: Option<i64>,
    pub num_updated: Option<i64>,
    pub num_deleted: Option<i64>,
    pub num_unchanged: Option<i64>,
    pub num_quarantined: Option<i64>,
    pub num_deferred: Option<i64>,
    pub num_late_rows: Option<i64>,
    pub num_conflicts: Option<i64>,
    /// Older versions replaced by a newer one of the same key (null in rows written before
    /// the column existed).
    pub num_superseded: Option<i64>,
    /// Identical rows delivered again.
    pub num_duplicates: Option<i64>,
    /// Spill files the attempt's queries wrote (memory limit reached).
    pub num_spill_files: Option<i64>,
    pub duration_ms: i64,
    /// Per expectation, the rows that failed it, as JSON (`[{name, on_fail, failed}]`); null
    /// without expectations (and in rows written before the column existed).
    pub expectations: Option<String>,
    /// The pipeline's kind (null in rows written before the column existed, and for tasks
    /// never attempted).
    pub kind: Option<String>,
    /// Everything the kind counted, as the run summary's JSON has it: the columns above keep
    /// the counts every kind shares, this one the kind's own (null as for `kind`).
    pub counters: Option<String>,
}

impl LedgerRow {
    /// Copies a pipeline run's counts and versions into the row.
    pub fn with_summary(mut self, s: &RunSummary) -> Self {
        let n = |v: u64| Some(i64::try_from(v).unwrap_or(i64::MAX));
        self.pipeline_run_id = Some(s.run_id.clone());
        self.mode = Some(s.mode.to_string());
        self.source_version = s.source_version.and_then(n);
        self.target_version = s.target_version.and_then(n);
        self.num_source_rows_read = n(s.num_source_rows_read);
        self.num_quarantined = n(s.num_quarantined);
        self.kind = Some(s.kind.as_str().to_string());
        self.counters = serde_json::to_string(&s.counters).ok();
        let c = s.counters.inner().ledger();
        let m = |v: Option<u64>| v.and_then(n);
        self.watermark_before = c.watermark_before;
        self.watermark_after = c.watermark_after;
        self.num_inserted = m(c.inserted);
        self.num_updated = m(c.updated);
        self.num_deleted = m(c.deleted);
        self.num_unchanged = m(c.unchanged);
        self.num_deferred = m(c.deferred);
        self.num_late_rows = m(c.late_rows);
        self.num_conflicts = m(c.conflicts);
        self.num_superseded = m(c.superseded);
        self.num_duplicates = m(c.duplicates);
        if !c.expectations.is_empty() {
            self.expectations = serde_json::to_string(&c.expectations).ok();
        }
        self
    }
}

/// The run ledger of one lake.
#[derive(Debug, Clone)]
pub struct Ledger {
    uri: String,
}

impl Ledger {
    /// The ledger at `<lake>/_tidemark/runs`.
    pub fn for_lake(lake: &str) -> Self {
        Ledger {
            uri: format!("{}/_tidemark/runs", lake.trim_end_matches('/')),
        }
    }

    /// Where the ledger table lives.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    fn delta(&self) -> impl FnOnce(deltalake::DeltaTableError) -> JobsError + '_ {
        |source| JobsError::Ledger {
            uri: self.uri.clone(),
            source: Box::new(source),
        }
    }

    fn rows(&self, direction: &'static str, e: serde_arrow::Error) -> JobsError {
        JobsError::LedgerRows {
            uri: self.uri.clone(),
            direction,
            source: Box::new(e),
        }
    }

    fn query(&self) -> impl FnOnce(datafusion::error::DataFusionError) -> JobsError + '_ {
        |source| JobsError::LedgerQuery {
            uri: self.uri.clone(),
            source: Box::new(source),
        }
    }

    /// Appends rows in one commit, creating the table on the first write.
    pub async fn append(&self, rows: &[LedgerRow]) -> Result<(), JobsError> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = to_batch(rows).map_err(|e| self.rows("convert to", e))?;
        // Two processes may both find no table and both create it: the loser retries once
        // against the table the winner made.
        let mut last_error = None;
        for _ in 0..2 {
            let table = match lake::open_if_exists(&self.uri).await? {
                Some(t) => t,
                None => deltalake::DeltaTableBuilder::from_url(lake::create_url(&self.uri)?)
                    .and_then(|b| b.build())
                    .map_err(self.delta())?,
            };
            match table
                .write(vec![batch.clone()])
                .with_save_mode(SaveMode::Append)
                .with_schema_mode(SchemaMode::Merge)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last_error = Some(e),
            }
        }
        Err(self.delta()(last_error.unwrap_or_else(|| {
            deltalake::DeltaTableError::Generic("ledger append failed".to_string())
        })))
    }

    async fn frame(&self) -> Result<Option<datafusion::prelude::DataFrame>, JobsError> {
        let Some(table) = lake::open_if_exists(&self.uri).await? else {
            return Ok(None);
        };
        let ctx = Engine::default().context();
        table
            .update_datafusion_session(&ctx.state())
            .map_err(self.delta())?;
        let provider = table.table_provider().await.map_err(self.query())?;
        Ok(Some(ctx.read_table(provider).map_err(self.query())?))
    }

    /// The newest `limit` rows (of `job` when given), newest first.
    pub async fn recent(
        &self,
        job: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LedgerRow>, JobsError> {
        let Some(df) = self.frame().await? else {
            return Ok(Vec::new());
        };
        let df = match job {
            Some(j) => df.filter(col("job").eq(lit(j))).map_err(self.query())?,
            None => df,
        };
        let mut order = vec![
            col("started_at").sort(false, false),
            col("run_id").sort(false, false),
        ];
        // a job run's tasks in the order they ran (their run ids are time-ordered), also on a
        // simulated clock that gives them one start time (a ledger from before the column: by
        // task name)
        if df
            .schema()
            .has_column_with_unqualified_name("pipeline_run_id")
        {
            order.push(col("pipeline_run_id").sort(false, false));
        }
        order.extend([
            col("task").sort(true, false),
            col("attempt").sort(false, false),
        ]);
        let batches = df
            .sort(order)
            .and_then(|df| df.limit(0, Some(limit)))
            .map_err(self.query())?
            .collect()
            .await
            .map_err(self.query())?;
        let mut rows = Vec::new();
        for b in &batches {
            rows.extend(from_batch(b).map_err(|e| self.rows(READ_BACK, e))?);
        }
        Ok(rows)
    }

    /// The last fire time each job's runs recorded (scheduled, caught up, retried or skipped).
    pub async fn last_scheduled(&self) -> Result<BTreeMap<String, DateTime<Utc>>, JobsError> {
        let Some(df) = self.frame().await? else {
            return Ok(BTreeMap::new());
        };
        let batches = df
            .filter(col("scheduled_at").is_not_null())
            .and_then(|df| {
                df.aggregate(
                    vec![col("job")],
                    vec![max(col("scheduled_at")).alias("last")],
                )
            })
            .map_err(self.query())?
            .collect()
            .await
            .map_err(self.query())?;
        /// One row of the query above.
        #[derive(Deserialize)]
        struct LastFire {
            job: String,
            #[serde(deserialize_with = "ts_microseconds::deserialize")]
            last: DateTime<Utc>,
        }
        let mut out = BTreeMap::new();
        for b in &batches {
            let fires: Vec<LastFire> =
                serde_arrow::from_record_batch(b).map_err(|e| self.rows(READ_BACK, e))?;
            out.extend(fires.into_iter().map(|f| (f.job, f.last)));
        }
        Ok(out)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn row(job: &str, attempt: i32, started: i64, scheduled: Option<i64>) -> LedgerRow {
        let t = |s: i64| Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap();
        LedgerRow {
            run_id: format!("r-{job}-{started}"),
            job: job.to_string(),
            target: "local".into(),
            task: "t".into(),
            attempt,
            trigger: Trigger::Schedule.to_string(),
            scheduled_at: scheduled.map(t),
            started_at: t(started),
            ended_at: t(started + 1),
            status: TaskStatus::Succeeded.to_string(),
            error_class: None,
            error_message: None,
            host: "h".into(),
            pipeline: Some("p".into()),
            pipeline_run_id: None,
            mode: None,
            source_version: Some(3),
            target_version: None,
            watermark_before: None,
            watermark_after: None,
            num_source_rows_read: Some(10),
            num_inserted: None,
            num_updated: None,
            num_deleted: None,
            num_unchanged: None,
            num_quarantined: None,
            num_deferred: None,
            num_late_rows: None,
            num_conflicts: None,
            num_superseded: None,
            num_duplicates: None,
            num_spill_files: Some(0),
            duration_ms: 1000,
            expectations: None,
            kind: None,
            counters: None,
        }
    }

    #[tokio::test]
    async fn appends_reads_back_and_finds_the_last_fire_per_job() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::for_lake(&dir.path().to_string_lossy());
        assert!(ledger.recent(None, 10).await.unwrap().is_empty());
        assert!(ledger.last_scheduled().await.unwrap().is_empty());
        let rows = [
            row("a", 1, 0, Some(0)),
            row("a", 1, 100, Some(100)),
            row("b", 1, 50, None),
        ];
        ledger.append(&rows[..2]).await.unwrap();
        ledger.append(&rows[2..]).await.unwrap();
        let recent = ledger.recent(None, 10).await.unwrap();
        assert_eq!(
            recent,
            vec![rows[1].clone(), rows[2].clone(), rows[0].clone()]
        );
        assert_eq!(
            ledger.recent(Some("b"), 10).await.unwrap(),
            vec![rows[2].clone()]
        );
        assert_eq!(ledger.recent(None, 1).await.unwrap().len(), 1);
        let last = ledger.last_scheduled().await.unwrap();
        assert_eq!(last.get("a"), rows[1].scheduled_at.as_ref());
        assert_eq!(last.get("b"), None);
    }

    #[tokio::test]
    async fn a_row_with_every_optional_column_empty_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::for_lake(&dir.path().to_string_lossy());
        let mut r = row("a", 0, 0, None);
        r.pipeline = None;
        r.source_version = None;
        r.num_source_rows_read = None;
        r.num_spill_files = None;
        let mut full = row("a", 2, 10, Some(10));
        full.watermark_before = full.scheduled_at;
        full.watermark_after = Some(full.ended_at);
        full.counters = Some(r#"{"inserted":3}"#.into());
        full.kind = Some("cdc_merge".into());
        ledger.append(&[r.clone(), full.clone()]).await.unwrap();
        assert_eq!(ledger.recent(None, 10).await.unwrap(), vec![full, r]);
    }

    /// A ledger written before the newer columns existed: its rows read them back as null, and
    /// the next append adds the columns.
    #[tokio::test]
    async fn a_ledger_from_before_the_newer_columns_still_reads_and_grows() {
        use arrow::array::{
            ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
        };
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::for_lake(&dir.path().to_string_lossy());
        let old = row("old", 1, 0, Some(0));
        let s = |v: &str| Arc::new(StringArray::from(vec![v])) as ArrayRef;
        let t = |v: DateTime<Utc>| {
            Arc::new(
                TimestampMicrosecondArray::from(vec![v.timestamp_micros()]).with_timezone("UTC"),
            ) as ArrayRef
        };
        let batch = RecordBatch::try_from_iter([
            ("run_id", s(&old.run_id)),
            ("job", s(&old.job)),
            ("target", s(&old.target)),
            ("task", s(&old.task)),
            ("attempt", Arc::new(Int32Array::from(vec![1])) as ArrayRef),
            ("trigger", s(&old.trigger)),
            ("scheduled_at", t(old.scheduled_at.unwrap())),
            ("started_at", t(old.started_at)),
            ("ended_at", t(old.ended_at)),
            ("status", s(&old.status)),
            ("host", s(&old.host)),
            ("pipeline", s("p")),
            (
                "source_version",
                Arc::new(Int64Array::from(vec![3])) as ArrayRef,
            ),
            ("num_source_rows_read", Arc::new(Int64Array::from(vec![10]))),
            ("num_spill_files", Arc::new(Int64Array::from(vec![0]))),
            ("duration_ms", Arc::new(Int64Array::from(vec![1000]))),
        ])
        .unwrap();
        let table = deltalake::DeltaTableBuilder::from_url(lake::create_url(ledger.uri()).unwrap())
            .unwrap()
            .build()
            .unwrap();
        table.write(vec![batch]).await.unwrap();
        assert_eq!(ledger.recent(None, 10).await.unwrap(), vec![old.clone()]);
        let mut new = row("new", 1, 100, Some(100));
        new.kind = Some("ingest".into());
        new.num_superseded = Some(2);
        ledger.append(std::slice::from_ref(&new)).await.unwrap();
        assert_eq!(ledger.recent(None, 10).await.unwrap(), vec![new, old]);
        assert_eq!(ledger.last_scheduled().await.unwrap().len(), 2);
    }
}
