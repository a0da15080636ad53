use std::collections::BTreeMap;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMicrosecondType};
use deltalake::kernel::{Action, Add};
use deltalake::{DeltaTable, DeltaTableError};

use super::COMMIT_INFO_KEY;

/// What the log's per-file statistics say about the largest value of a timestamp column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsMax {
    /// No file holds a non-null value: the table is empty (or the column is all null).
    Empty,
    /// The largest value, in microseconds since the epoch. Delta's JSON statistics are truncated
    /// to milliseconds, so this is a lower bound of the true maximum, up to 999 µs low.
    Max(i64),
    /// Some file has values but no statistics for the column: a data scan is needed.
    Missing,
}

/// Reads `max(column)` from the `add` actions' statistics: its cost follows the number of files,
/// never the number of rows.
pub fn max_from_stats(table: &DeltaTable, column: &str) -> Result<StatsMax, DeltaTableError> {
    let adds = table.snapshot()?.add_actions_table(true)?;
    if adds.num_rows() == 0 {
        return Ok(StatsMax::Empty);
    }
    let Some(max_col) = adds.column_by_name(&format!("max.{column}")) else {
        return Ok(StatsMax::Missing);
    };
    let max_col = arrow::compute::cast(max_col, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let max_col = max_col.as_primitive::<TimestampMicrosecondType>();
    let records = int_column(&adds, "num_records")?;
    let nulls = int_column(&adds, &format!("null_count.{column}"))?;
    let mut best: Option<i64> = None;
    for i in 0..adds.num_rows() {
        if max_col.is_valid(i) {
            let v = max_col.value(i);
            best = Some(best.map_or(v, |b| b.max(v)));
            continue;
        }
        let all_null = match (&records, &nulls) {
            (Some(r), Some(n)) => r.is_valid(i) && n.is_valid(i) && r.value(i) == n.value(i),
            _ => false,
        };
        let empty = records
            .as_ref()
            .is_some_and(|r| r.is_valid(i) && r.value(i) == 0);
        if !(all_null || empty) {
            return Ok(StatsMax::Missing);
        }
    }
    Ok(best.map_or(StatsMax::Empty, StatsMax::Max))
}

fn int_column(
    batch: &arrow::record_batch::RecordBatch,
    name: &str,
) -> Result<Option<arrow::array::PrimitiveArray<Int64Type>>, DeltaTableError> {
    match batch.column_by_name(name) {
        Some(c) => {
            let c = arrow::compute::cast(c, &DataType::Int64)?;
            Ok(Some(c.as_primitive::<Int64Type>().clone()))
        }
        None => Ok(None),
    }
}

/// Total rows of a table from the `numRecords` statistics of its files; `None` when a file
/// lacks them (then only a scan can tell).
pub fn row_count_from_stats(table: &DeltaTable) -> Result<Option<u64>, DeltaTableError> {
    let adds = table.snapshot()?.add_actions_table(true)?;
    let Some(records) = int_column(&adds, "num_records")? else {
        return Ok(None);
    };
    if records.null_count() > 0 {
        return Ok(None);
    }
    Ok(Some(
        records.values().iter().map(|v| (*v).max(0) as u64).sum(),
    ))
}

/// Data files added to a table by a range of commits.
#[derive(Debug, Clone, Default)]
pub struct AddedFiles {
    /// Every `add` action of the commits read, data changes and rewrites alike: a compaction
    /// rewrites rows that may have landed in the range, so its output must be read too.
    pub adds: Vec<Add>,
    /// False when some commit file of the range is gone (log cleanup): the caller must then
    /// fall back to a wider read to stay correct.
    pub complete: bool,
    /// Commits of the range that took rows away (`remove` with `dataChange = true`: DELETE,
    /// UPDATE, MERGE, overwrite, RESTORE by another writer). Rows already merged from the removed
    /// files cannot be taken back by an incremental run.
    pub rewrites: Vec<Rewrite>,
}

/// A commit that removed data files as a data change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub version: u64,
    /// `commitInfo.operation` (`DELETE`, `RESTORE`, `WRITE`, ...), when the commit says.
    pub operation: Option<String>,
    pub files_removed: u64,
}

/// The `add` actions of commits `from_exclusive + 1 ..= to_inclusive`, read from the commit
/// files themselves (a few small JSON files per hour), not from a snapshot replay.
pub async fn files_added_between(
    table: &DeltaTable,
    from_exclusive: u64,
    to_inclusive: u64,
) -> Result<AddedFiles, DeltaTableError> {
    let store = table.log_store();
    let mut out = AddedFiles {
        adds: Vec::new(),
        complete: true,
        rewrites: Vec::new(),
    };
    for version in (from_exclusive + 1)..=to_inclusive {
        let Some(bytes) = store.read_commit_entry(version).await? else {
            out.complete = false;
            return Ok(out);
        };
        let mut operation = None;
        let mut removed = 0;
        for action in deltalake::logstore::get_actions(version, &bytes)? {
            match action {
                Action::Add(add) => out.adds.push(add),
                Action::Remove(r) if r.data_change => removed += 1,
                Action::CommitInfo(ci) => operation = ci.operation,
                _ => {}
            }
        }
        if removed > 0 {
            out.rewrites.push(Rewrite {
                version,
                operation,
                files_removed: removed,
            });
        }
    }
    Ok(out)
}

/// One commit of a table as `history` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitEntry {
    pub version: u64,
    /// Commit time, milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    pub operation: Option<String>,
    pub files_added: u64,
    pub files_removed: u64,
    /// delta-rs' `operationMetrics` (row and file counts of the operation).
    pub operation_metrics: Option<serde_json::Value>,
    /// tidemark's own run facts, when tidemark made the commit.
    pub run: Option<serde_json::Value>,
}

/// The newest `limit` commits, newest first, read from the commit files (so each entry carries
/// its real version number).
pub async fn read_commits(
    table: &DeltaTable,
    limit: usize,
) -> Result<Vec<CommitEntry>, DeltaTableError> {
    let Some(latest) = table.version() else {
        return Ok(Vec::new());
    };
    let store = table.log_store();
    let mut out = Vec::new();
    let mut next = Some(latest);
    while let Some(version) = next.filter(|_| out.len() < limit) {
        let Some(bytes) = store.read_commit_entry(version).await? else {
            break; // older commits were cleaned up
        };
        let mut entry = CommitEntry {
            version,
            timestamp_ms: None,
            operation: None,
            files_added: 0,
            files_removed: 0,
            operation_metrics: None,
            run: None,
        };
        for action in deltalake::logstore::get_actions(version, &bytes)? {
            match action {
                Action::Add(_) => entry.files_added += 1,
                Action::Remove(_) => entry.files_removed += 1,
                Action::CommitInfo(ci) => {
                    entry.timestamp_ms = ci.timestamp.or(ci.in_commit_timestamp);
                    entry.operation = ci.operation.clone();
                    let mut info: BTreeMap<String, serde_json::Value> =
                        ci.info.into_iter().collect();
                    entry.operation_metrics = info.remove("operationMetrics");
                    entry.run = info.remove(COMMIT_INFO_KEY);
                }
                _ => {}
            }
        }
        out.push(entry);
        next = version.checked_sub(1);
    }
    Ok(out)
}
