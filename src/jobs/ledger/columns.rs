//! The ledger row as Arrow columns and back: the table's schema, in column order.

use super::*;

pub(super) const STRINGS: &[&str] = &[
    "run_id", "job", "target", "task", "trigger", "status", "host",
];
pub(super) const OPT_STRINGS: &[&str] = &[
    "error_class",
    "error_message",
    "pipeline",
    "pipeline_run_id",
    "mode",
    "expectations",
    "kind",
    "counters",
];
pub(super) const TIMES: &[&str] = &["started_at", "ended_at"];
pub(super) const OPT_TIMES: &[&str] = &["scheduled_at", "watermark_before", "watermark_after"];
pub(super) const OPT_INTS: &[&str] = &[
    "source_version",
    "target_version",
    "num_source_rows_read",
    "num_inserted",
    "num_updated",
    "num_deleted",
    "num_unchanged",
    "num_quarantined",
    "num_deferred",
    "num_late_rows",
    "num_conflicts",
    "num_superseded",
    "num_duplicates",
    "num_spill_files",
];

pub(super) fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The ledger table's schema, in column order.
pub fn schema() -> Arc<Schema> {
    let mut fields = vec![];
    let order = [
        "run_id",
        "job",
        "target",
        "task",
        "attempt",
        "trigger",
        "scheduled_at",
        "started_at",
        "ended_at",
        "status",
        "error_class",
        "error_message",
        "host",
        "pipeline",
        "pipeline_run_id",
        "mode",
        "source_version",
        "target_version",
        "watermark_before",
        "watermark_after",
        "num_source_rows_read",
        "num_inserted",
        "num_updated",
        "num_deleted",
        "num_unchanged",
        "num_quarantined",
        "num_deferred",
        "num_late_rows",
        "num_conflicts",
        "num_superseded",
        "num_duplicates",
        "num_spill_files",
        "duration_ms",
        "expectations",
        "kind",
        "counters",
    ];
    for name in order {
        let (dt, nullable) = if STRINGS.contains(&name) {
            (DataType::Utf8, false)
        } else if OPT_STRINGS.contains(&name) {
            (DataType::Utf8, true)
        } else if TIMES.contains(&name) {
            (ts_type(), false)
        } else if OPT_TIMES.contains(&name) {
            (ts_type(), true)
        } else if OPT_INTS.contains(&name) {
            (DataType::Int64, true)
        } else if name == "attempt" {
            (DataType::Int32, false)
        } else {
            (DataType::Int64, false)
        };
        fields.push(Field::new(name, dt, nullable));
    }
    Arc::new(Schema::new(fields))
}

pub(super) fn string_of(r: &LedgerRow, name: &str) -> Option<String> {
    match name {
        "run_id" => Some(r.run_id.clone()),
        "job" => Some(r.job.clone()),
        "target" => Some(r.target.clone()),
        "task" => Some(r.task.clone()),
        "trigger" => Some(r.trigger.clone()),
        "status" => Some(r.status.clone()),
        "host" => Some(r.host.clone()),
        "error_class" => r.error_class.clone(),
        "error_message" => r.error_message.clone(),
        "pipeline" => r.pipeline.clone(),
        "pipeline_run_id" => r.pipeline_run_id.clone(),
        "mode" => r.mode.clone(),
        "expectations" => r.expectations.clone(),
        "kind" => r.kind.clone(),
        "counters" => r.counters.clone(),
        _ => None,
    }
}

pub(super) fn time_of(r: &LedgerRow, name: &str) -> Option<DateTime<Utc>> {
    match name {
        "started_at" => Some(r.started_at),
        "ended_at" => Some(r.ended_at),
        "scheduled_at" => r.scheduled_at,
        "watermark_before" => r.watermark_before,
        "watermark_after" => r.watermark_after,
        _ => None,
    }
}

pub(super) fn int_of(r: &LedgerRow, name: &str) -> Option<i64> {
    match name {
        "source_version" => r.source_version,
        "target_version" => r.target_version,
        "num_source_rows_read" => r.num_source_rows_read,
        "num_inserted" => r.num_inserted,
        "num_updated" => r.num_updated,
        "num_deleted" => r.num_deleted,
        "num_unchanged" => r.num_unchanged,
        "num_quarantined" => r.num_quarantined,
        "num_deferred" => r.num_deferred,
        "num_late_rows" => r.num_late_rows,
        "num_conflicts" => r.num_conflicts,
        "num_superseded" => r.num_superseded,
        "num_duplicates" => r.num_duplicates,
        "num_spill_files" => r.num_spill_files,
        "duration_ms" => Some(r.duration_ms),
        _ => None,
    }
}

pub(super) fn to_batch(rows: &[LedgerRow]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let schema = schema();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            let name = f.name().as_str();
            match f.data_type() {
                DataType::Utf8 => Arc::new(StringArray::from(
                    rows.iter().map(|r| string_of(r, name)).collect::<Vec<_>>(),
                )),
                DataType::Int32 => Arc::new(Int32Array::from(
                    rows.iter().map(|r| r.attempt).collect::<Vec<_>>(),
                )),
                DataType::Int64 => Arc::new(Int64Array::from(
                    rows.iter().map(|r| int_of(r, name)).collect::<Vec<_>>(),
                )),
                _ => Arc::new(
                    TimestampMicrosecondArray::from(
                        rows.iter()
                            .map(|r| time_of(r, name).map(|t| t.timestamp_micros()))
                            .collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ),
            }
        })
        .collect();
    RecordBatch::try_new(schema, columns)
}

pub(super) fn strings(
    b: &RecordBatch,
    name: &str,
) -> Result<Vec<Option<String>>, arrow::error::ArrowError> {
    let Some(c) = b.column_by_name(name) else {
        return Ok(vec![None; b.num_rows()]);
    };
    let c = arrow::compute::cast(c, &DataType::Utf8)?;
    Ok(c.as_string::<i32>()
        .iter()
        .map(|v| v.map(str::to_string))
        .collect())
}

pub(super) fn times(
    b: &RecordBatch,
    name: &str,
) -> Result<Vec<Option<DateTime<Utc>>>, arrow::error::ArrowError> {
    let Some(c) = b.column_by_name(name) else {
        return Ok(vec![None; b.num_rows()]);
    };
    let c = arrow::compute::cast(c, &ts_type())?;
    let c = c.as_primitive::<TimestampMicrosecondType>();
    Ok((0..c.len())
        .map(|i| {
            c.is_valid(i)
                .then(|| Utc.timestamp_micros(c.value(i)).single())
                .flatten()
        })
        .collect())
}

pub(super) fn ints(
    b: &RecordBatch,
    name: &str,
) -> Result<Vec<Option<i64>>, arrow::error::ArrowError> {
    let Some(c) = b.column_by_name(name) else {
        return Ok(vec![None; b.num_rows()]);
    };
    let c = arrow::compute::cast(c, &DataType::Int64)?;
    let c = c.as_primitive::<Int64Type>();
    Ok((0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i)))
        .collect())
}

pub(super) fn from_batch(b: &RecordBatch) -> Result<Vec<LedgerRow>, arrow::error::ArrowError> {
    let mut s: BTreeMap<&str, Vec<Option<String>>> = BTreeMap::new();
    for name in STRINGS.iter().chain(OPT_STRINGS) {
        s.insert(name, strings(b, name)?);
    }
    let mut t: BTreeMap<&str, Vec<Option<DateTime<Utc>>>> = BTreeMap::new();
    for name in TIMES.iter().chain(OPT_TIMES) {
        t.insert(name, times(b, name)?);
    }
    let mut n: BTreeMap<&str, Vec<Option<i64>>> = BTreeMap::new();
    for name in OPT_INTS.iter().chain(&["duration_ms"]) {
        n.insert(name, ints(b, name)?);
    }
    let attempts = match b.column_by_name("attempt") {
        Some(c) => {
            let c = arrow::compute::cast(c, &DataType::Int32)?;
            let c = c.as_primitive::<Int32Type>();
            (0..c.len())
                .map(|i| if c.is_valid(i) { c.value(i) } else { 0 })
                .collect()
        }
        None => vec![0; b.num_rows()],
    };
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    Ok((0..b.num_rows())
        .map(|i| {
            let st = |k: &str| s.get(k).and_then(|v| v[i].clone());
            let tm = |k: &str| t.get(k).and_then(|v| v[i]);
            let it = |k: &str| n.get(k).and_then(|v| v[i]);
            LedgerRow {
                run_id: st("run_id").unwrap_or_default(),
                job: st("job").unwrap_or_default(),
                target: st("target").unwrap_or_default(),
                task: st("task").unwrap_or_default(),
                attempt: attempts[i],
                trigger: st("trigger").unwrap_or_default(),
                scheduled_at: tm("scheduled_at"),
                started_at: tm("started_at").unwrap_or(epoch),
                ended_at: tm("ended_at").unwrap_or(epoch),
                status: st("status").unwrap_or_default(),
                error_class: st("error_class"),
                error_message: st("error_message"),
                host: st("host").unwrap_or_default(),
                pipeline: st("pipeline"),
                pipeline_run_id: st("pipeline_run_id"),
                mode: st("mode"),
                source_version: it("source_version"),
                target_version: it("target_version"),
                watermark_before: tm("watermark_before"),
                watermark_after: tm("watermark_after"),
                num_source_rows_read: it("num_source_rows_read"),
                num_inserted: it("num_inserted"),
                num_updated: it("num_updated"),
                num_deleted: it("num_deleted"),
                num_unchanged: it("num_unchanged"),
                num_quarantined: it("num_quarantined"),
                num_deferred: it("num_deferred"),
                num_late_rows: it("num_late_rows"),
                num_conflicts: it("num_conflicts"),
                num_superseded: it("num_superseded"),
                num_duplicates: it("num_duplicates"),
                num_spill_files: it("num_spill_files"),
                duration_ms: it("duration_ms").unwrap_or(0),
                expectations: st("expectations"),
                kind: st("kind"),
                counters: st("counters"),
            }
        })
        .collect())
}
