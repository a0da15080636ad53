//! The day status table (seed 000): one row per event day an aggregate has published — what a
//! dashboard reads to show "provisional": `open` days may still change, `final` ones will not
//! (with `after_close: restate`, a late row can still reopen one, which `restated_after_close`
//! counts).
//!
//! It is small (a row a day) and rewritten whole, in one commit, when any of its rows changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Date32Type, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use super::compute::DayFacts;
use super::days::{days_since_epoch, Days};
use crate::lake;
use crate::run::{Phase, RunError};

/// A day's status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DayStatus {
    pub event_date: NaiveDate,
    /// `open` or `final`.
    pub status: &'static str,
    pub is_final: bool,
    /// Source rows counted that day.
    pub rows: i64,
    /// Output rows (groups) that day.
    pub groups: i64,
    /// The latest arrival among the day's rows (µs).
    #[serde(serialize_with = "ser_micros")]
    pub last_arrival: Option<i64>,
    /// When a run last wrote the day's numbers or status (µs).
    #[serde(serialize_with = "ser_micros")]
    pub last_recomputed: Option<i64>,
    /// The logical date of the run that first labelled the day final.
    pub final_since: Option<NaiveDate>,
    /// When that run ran (µs): rows arriving later are late after close.
    #[serde(serialize_with = "ser_micros")]
    pub closed_at: Option<i64>,
    /// Runs that recomputed the day after it had become final (`after_close: restate`).
    pub restated_after_close: i64,
    /// Runs that booked adjustments for the day after it had become final (`after_close:
    /// adjust`).
    pub adjusted_after_close: i64,
    /// The day's rows that arrived after it was first labelled final (as of the last run that
    /// restated or adjusted it).
    pub late_rows_after_close: i64,
}

fn ser_micros<S: serde::Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
    match v.and_then(DateTime::<Utc>::from_timestamp_micros) {
        Some(t) => s.serialize_str(&crate::report::rfc3339(&t)),
        None => s.serialize_none(),
    }
}

impl DayStatus {
    pub fn is_final(&self) -> bool {
        self.status == "final"
    }
}

/// The status of `days` from this run's facts, given what the table held: a day keeps its
/// `last_recomputed` when nothing about it changed, and its `final_since` once set.
pub fn next(
    old: &BTreeMap<NaiveDate, DayStatus>,
    days: &Days,
    facts: &BTreeMap<NaiveDate, DayFacts>,
    changed_days: &std::collections::BTreeSet<NaiveDate>,
    now: DateTime<Utc>,
) -> BTreeMap<NaiveDate, DayStatus> {
    let mut out = old.clone();
    for day in days.each() {
        let f = facts.get(&day).copied().unwrap_or_default();
        let before = old.get(&day);
        if f.rows == 0 && before.is_none() {
            continue; // never published, still empty
        }
        // (a day an earlier run closed stays closed, whatever the logical date)
        let is_final = days.is_final(day) || before.is_some_and(DayStatus::is_final);
        let final_since = match before.and_then(|b| b.final_since) {
            Some(since) if is_final => Some(since),
            _ if is_final => Some(days.logical),
            _ => None,
        };
        let was_final = before.is_some_and(DayStatus::is_final);
        let closed_at = match before.and_then(|b| b.closed_at.filter(|_| b.final_since.is_some())) {
            Some(t) if is_final => Some(t),
            _ if is_final => Some(now.timestamp_micros()),
            _ => None,
        };
        let mut s = DayStatus {
            event_date: day,
            status: if is_final { "final" } else { "open" },
            is_final,
            closed_at,
            rows: f.rows,
            groups: f.groups,
            last_arrival: f.last_arrival,
            last_recomputed: before.and_then(|b| b.last_recomputed),
            final_since,
            restated_after_close: before.map_or(0, |b| b.restated_after_close)
                + i64::from(was_final && changed_days.contains(&day)),
            adjusted_after_close: before.map_or(0, |b| b.adjusted_after_close),
            late_rows_after_close: if was_final { f.late_rows } else { 0 },
        };
        let same = before.is_some_and(|b| {
            b.status == s.status
                && b.rows == s.rows
                && b.groups == s.groups
                && b.last_arrival == s.last_arrival
                && b.final_since == s.final_since
                && b.closed_at == s.closed_at
                && b.late_rows_after_close == s.late_rows_after_close
        });
        if !same || changed_days.contains(&day) {
            s.last_recomputed = Some(now.timestamp_micros());
        }
        out.insert(day, s);
    }
    out
}

/// Counts the runs that booked adjustments for (closed) days, `runs` of them per day (this run,
/// and earlier ones the status did not count yet), with the days' facts as this run read them.
pub fn adjusted(
    rows: &mut BTreeMap<NaiveDate, DayStatus>,
    runs: &BTreeMap<NaiveDate, i64>,
    facts: &BTreeMap<NaiveDate, DayFacts>,
    logical: NaiveDate,
    now: DateTime<Utc>,
) {
    let at = Some(now.timestamp_micros());
    for (&d, &n) in runs {
        let f = facts.get(&d).copied().unwrap_or_default();
        // (a closed day never published before, or older than max_lookback: its row starts here)
        let s = rows.entry(d).or_insert_with(|| DayStatus {
            event_date: d,
            status: "final",
            is_final: true,
            rows: f.rows,
            groups: f.groups,
            last_arrival: f.last_arrival,
            last_recomputed: at,
            final_since: Some(logical),
            closed_at: at,
            restated_after_close: 0,
            adjusted_after_close: 0,
            late_rows_after_close: 0,
        });
        s.adjusted_after_close += n;
        s.last_recomputed = at;
        s.rows = f.rows;
        s.groups = f.groups;
        s.last_arrival = f.last_arrival;
        s.late_rows_after_close = f.late_rows;
    }
}

/// When each closed day closed: the time of the run that first labelled it final (for rows
/// written before that was recorded: the start, in `tz`, of its `final_since` day).
pub fn closes(
    rows: &BTreeMap<NaiveDate, DayStatus>,
    tz: chrono_tz::Tz,
) -> BTreeMap<NaiveDate, i64> {
    rows.values()
        .filter_map(|s| {
            let since = s.final_since?;
            let at = match s.closed_at {
                Some(t) => t,
                None => since
                    .and_hms_opt(0, 0, 0)?
                    .and_local_timezone(tz)
                    .earliest()?
                    .timestamp_micros(),
            };
            Some((s.event_date, at))
        })
        .collect()
}

/// The `event_date` of every row of `batches`.
pub fn days_of(batches: &[RecordBatch]) -> Vec<NaiveDate> {
    let mut out = Vec::new();
    for b in batches {
        let Some(c) = b.column_by_name("event_date") else {
            continue;
        };
        let Ok(c) = arrow::compute::cast(c, &DataType::Date32) else {
            continue;
        };
        let c = c.as_primitive::<Date32Type>();
        out.extend((0..c.len()).filter_map(|i| c.value_as_date(i)));
    }
    out
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new("aggregate", DataType::Utf8, false),
        Field::new("event_date", DataType::Date32, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("is_final", DataType::Boolean, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("groups", DataType::Int64, false),
        Field::new("last_arrival", ts.clone(), true),
        Field::new("last_recomputed", ts, true),
        Field::new("final_since", DataType::Date32, true),
        Field::new("closed_at", ts_type(), true),
        Field::new("restated_after_close", DataType::Int64, false),
        Field::new("adjusted_after_close", DataType::Int64, false),
        Field::new("late_rows_after_close", DataType::Int64, false),
    ]))
}

fn to_batch(name: &str, rows: &BTreeMap<NaiveDate, DayStatus>) -> Result<RecordBatch, RunError> {
    let v: Vec<&DayStatus> = rows.values().collect();
    let ts = |f: &dyn Fn(&DayStatus) -> Option<i64>| {
        Arc::new(
            TimestampMicrosecondArray::from(v.iter().map(|s| f(s)).collect::<Vec<_>>())
                .with_timezone("UTC"),
        ) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![name; v.len()])),
        Arc::new(Date32Array::from(
            v.iter()
                .map(|s| days_since_epoch(s.event_date))
                .collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            v.iter().map(|s| s.status).collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            v.iter().map(|s| s.is_final()).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            v.iter().map(|s| s.rows).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            v.iter().map(|s| s.groups).collect::<Vec<_>>(),
        )),
        ts(&|s| s.last_arrival),
        ts(&|s| s.last_recomputed),
        Arc::new(Date32Array::from(
            v.iter()
                .map(|s| s.final_since.map(days_since_epoch))
                .collect::<Vec<_>>(),
        )),
        ts(&|s| s.closed_at),
        Arc::new(Int64Array::from(
            v.iter().map(|s| s.restated_after_close).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            v.iter().map(|s| s.adjusted_after_close).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            v.iter()
                .map(|s| s.late_rows_after_close)
                .collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(schema(), columns).map_err(RunError::arrow(Phase::Write))
}

/// The status table's rows, by day (empty when it does not exist yet).
pub async fn read(
    ctx: &SessionContext,
    table: Option<&DeltaTable>,
    uri: &str,
) -> Result<BTreeMap<NaiveDate, DayStatus>, RunError> {
    let Some(table) = table else {
        return Ok(BTreeMap::new());
    };
    let batches = crate::run::frame(ctx, table, uri, Phase::Plan)
        .await?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Plan, uri))?;
    let mut out = BTreeMap::new();
    let bad = |what: &str| RunError::Internal {
        phase: Phase::Plan,
        message: format!("the day status table {uri} has no usable `{what}` column"),
    };
    for b in &batches {
        let get = |name: &str| b.column_by_name(name).ok_or_else(|| bad(name));
        let cast = |name: &str, t: &DataType| -> Result<ArrayRef, RunError> {
            arrow::compute::cast(get(name)?, t).map_err(|_| bad(name))
        };
        let micros = |name: &str| -> Result<ArrayRef, RunError> {
            let c = cast(name, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            arrow::compute::cast(&c, &DataType::Int64).map_err(|_| bad(name))
        };
        let day = cast("event_date", &DataType::Date32)?;
        let day = day.as_primitive::<Date32Type>();
        let status = cast("status", &DataType::Utf8)?;
        let status = status.as_string::<i32>();
        let rows = cast("rows", &DataType::Int64)?;
        let groups = cast("groups", &DataType::Int64)?;
        let restated = cast("restated_after_close", &DataType::Int64)?;
        // (counters a table written by an earlier version lacks: zero)
        let counter = |name: &str| -> Result<ArrayRef, RunError> {
            match b.column_by_name(name) {
                Some(_) => cast(name, &DataType::Int64),
                None => Ok(Arc::new(Int64Array::from(vec![0i64; b.num_rows()])) as ArrayRef),
            }
        };
        let adjusted = counter("adjusted_after_close")?;
        let late = counter("late_rows_after_close")?;
        let arrival = micros("last_arrival")?;
        let recomputed = micros("last_recomputed")?;
        let closed_at = match b.column_by_name("closed_at") {
            Some(_) => Some(micros("closed_at")?),
            None => None,
        };
        let since = cast("final_since", &DataType::Date32)?;
        let since = since.as_primitive::<Date32Type>();
        let int = |a: &ArrayRef, i: usize| {
            let a = a.as_primitive::<Int64Type>();
            a.is_valid(i).then(|| a.value(i))
        };
        for i in 0..b.num_rows() {
            let Some(d) = day.value_as_date(i) else {
                continue;
            };
            out.insert(
                d,
                DayStatus {
                    event_date: d,
                    status: if status.value(i) == "final" {
                        "final"
                    } else {
                        "open"
                    },
                    is_final: status.value(i) == "final",
                    closed_at: closed_at.as_ref().and_then(|c| int(c, i)),
                    rows: int(&rows, i).unwrap_or(0),
                    groups: int(&groups, i).unwrap_or(0),
                    last_arrival: int(&arrival, i),
                    last_recomputed: int(&recomputed, i),
                    final_since: since.is_valid(i).then(|| since.value_as_date(i)).flatten(),
                    restated_after_close: int(&restated, i).unwrap_or(0),
                    adjusted_after_close: int(&adjusted, i).unwrap_or(0),
                    late_rows_after_close: int(&late, i).unwrap_or(0),
                },
            );
        }
    }
    Ok(out)
}

/// Replaces the status table with `rows` in one commit (creating it on the first run).
pub async fn write(
    table: Option<DeltaTable>,
    uri: &str,
    name: &str,
    rows: &BTreeMap<NaiveDate, DayStatus>,
    props: CommitProperties,
) -> Result<Option<u64>, RunError> {
    let batch = to_batch(name, rows)?;
    let table = lake::or_new(table, uri)?;
    let written = table
        .write(vec![batch])
        .with_save_mode(SaveMode::Overwrite)
        // (a table written by an earlier version may lack the newer counters)
        .with_schema_mode(deltalake::operations::write::SchemaMode::Overwrite)
        .with_commit_properties(crate::lake::no_blind_retry(props))
        .await
        .map_err(RunError::write(Phase::Write, uri))?;
    Ok(written.version())
}
