use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, Schema, TimeUnit, TimestampMicrosecondType};
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

/// The live files of a table as `add_actions_table(true)` flattens them (`path`, `size_bytes`,
/// `num_records`, `min.<col>`, `max.<col>`, `null_count.<col>`), and per file the rows its
/// deletion vector marks deleted (0 without one).
///
/// delta-rs 1.1 cannot flatten the `deletion_vector` column when some files have a DV and others
/// do not (or none does, in a table with the feature): the struct's non-nullable fields then hold
/// nulls ("Column 'deletion_vector.storageType' is declared as non-nullable but contains null
/// values"). So the table is read nested and the DV struct taken apart here.
pub struct LiveFiles {
    pub files: RecordBatch,
    pub deleted_rows: Vec<u64>,
}

/// Reads [`LiveFiles`] from the log (no data file is opened).
pub fn live_files(table: &DeltaTable) -> Result<LiveFiles, DeltaTableError> {
    let nested = table.snapshot()?.add_actions_table(false)?;
    let schema = nested.schema();
    let mut deleted_rows = vec![0u64; nested.num_rows()];
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in schema.fields().iter().zip(nested.columns()) {
        if field.name() != "deletion_vector" {
            fields.push(field.clone());
            columns.push(column.clone());
            continue;
        }
        let Some(dv) = column.as_struct_opt() else {
            continue;
        };
        if let Some(cardinality) = dv.column_by_name("cardinality") {
            let cardinality = arrow::compute::cast(cardinality, &DataType::Int64)?;
            let cardinality = cardinality.as_primitive::<Int64Type>();
            for (i, slot) in deleted_rows.iter_mut().enumerate() {
                if dv.is_valid(i) && cardinality.is_valid(i) {
                    *slot = cardinality.value(i).max(0) as u64;
                }
            }
        }
    }
    let flat = Schema::new_with_metadata(fields, schema.metadata().clone());
    let files = RecordBatch::try_new(Arc::new(flat), columns)?.normalize(".", None)?;
    Ok(LiveFiles {
        files,
        deleted_rows,
    })
}

/// Reads `max(column)` from the `add` actions' statistics: its cost follows the number of files,
/// never the number of rows. A file with a deletion vector keeps the statistics of all its rows,
/// deleted ones included, so the result is then an upper bound of the live rows' maximum; for
/// the watermark that only narrows the overlap slice, and the rows that landed since the
/// previous run are read whatever their sequence.
pub fn max_from_stats(table: &DeltaTable, column: &str) -> Result<StatsMax, DeltaTableError> {
    max_in(&live_files(table)?.files, column)
}

/// [`max_from_stats`] over files already read.
fn max_in(adds: &RecordBatch, column: &str) -> Result<StatsMax, DeltaTableError> {
    if adds.num_rows() == 0 {
        return Ok(StatsMax::Empty);
    }
    let Some(max_col) = adds.column_by_name(&format!("max.{column}")) else {
        return Ok(StatsMax::Missing);
    };
    let max_col = arrow::compute::cast(max_col, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let max_col = max_col.as_primitive::<TimestampMicrosecondType>();
    let records = int_column(adds, "num_records")?;
    let nulls = int_column(adds, &format!("null_count.{column}"))?;
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

/// Slack added to a timestamp maximum read from statistics before it is trusted as an upper
/// bound: Delta truncates them to milliseconds; a second also covers a writer that truncates
/// further, and costs nothing (it only matters for rows within a second of a run's future skew).
const STATS_MAX_SLACK_MICROS: i64 = 1_000_000;

/// What the log's statistics prove about validation's built-in rules, without a scan: when no
/// file counts a null in any of `not_null` (the keys and the sequence), the largest value the
/// timestamp column `sequence` can hold (µs, an upper bound; `i64::MIN` for a table without
/// rows). `None` when a file lacks those statistics or counts a null: only a scan can tell.
/// A file with a deletion vector keeps the statistics of its deleted rows too, so the proof
/// covers more rows than are live.
pub fn valid_until(
    live: &LiveFiles,
    not_null: &[&str],
    sequence: &str,
) -> Result<Option<i64>, DeltaTableError> {
    let files = &live.files;
    for column in not_null {
        let Some(nulls) = int_column(files, &format!("null_count.{column}"))? else {
            if files.num_rows() == 0 {
                continue;
            }
            return Ok(None);
        };
        if nulls.null_count() > 0 || nulls.values().iter().any(|n| *n != 0) {
            return Ok(None);
        }
    }
    Ok(match max_in(files, sequence)? {
        StatsMax::Empty => Some(i64::MIN),
        StatsMax::Max(m) => Some(m.saturating_add(STATS_MAX_SLACK_MICROS)),
        StatsMax::Missing => None,
    })
}

fn int_column(
    batch: &RecordBatch,
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

/// Live rows of a table from the `numRecords` statistics of its files, minus the rows their
/// deletion vectors delete; `None` when a file lacks them (then only a scan can tell).
pub fn row_count_from_stats(table: &DeltaTable) -> Result<Option<u64>, DeltaTableError> {
    row_count(&live_files(table)?)
}

/// [`row_count_from_stats`] over files already read.
pub fn row_count(live: &LiveFiles) -> Result<Option<u64>, DeltaTableError> {
    let Some(records) = int_column(&live.files, "num_records")? else {
        return Ok(None);
    };
    if records.null_count() > 0 {
        return Ok(None);
    }
    Ok(Some(
        records
            .values()
            .iter()
            .zip(&live.deleted_rows)
            .map(|(v, deleted)| ((*v).max(0) as u64).saturating_sub(*deleted))
            .sum(),
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
    /// UPDATE, MERGE, overwrite, RESTORE by another writer) from files that existed before the
    /// range. Rows already merged from those files cannot be taken back by an incremental run.
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
    let mut out = AddedFiles {
        adds: Vec::new(),
        complete: true,
        rewrites: Vec::new(),
    };
    // Files whose rows all landed within the range: removing one of them (a DELETE of rows that
    // landed since `from_exclusive`, e.g. a deletion vector on a new file) takes away nothing a
    // reader of `from_exclusive` has seen, so it is not a rewrite. A compaction's output is such
    // a file only when every file it rewrote was: once it carries rows from before the range, a
    // later DELETE of it takes away rows the target has merged.
    let mut added_in_range = std::collections::HashSet::new();
    for version in (from_exclusive + 1)..=to_inclusive {
        let Some(actions) = commit_actions(table, version).await? else {
            out.complete = false;
            return Ok(out);
        };
        let mut operation = None;
        let mut removed = 0;
        let mut carries_older_rows = false;
        let mut adds = Vec::new();
        for action in actions {
            match action {
                Action::Add(add) => adds.push(add),
                Action::Remove(r) if !added_in_range.contains(&r.path) => {
                    carries_older_rows = true;
                    if r.data_change {
                        removed += 1
                    }
                }
                Action::CommitInfo(ci) => operation = ci.operation,
                _ => {}
            }
        }
        if carries_older_rows {
            for add in &adds {
                added_in_range.remove(&add.path);
            }
        } else {
            added_in_range.extend(adds.iter().map(|a| a.path.clone()));
        }
        out.adds.extend(adds);
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

/// The actions of `table`'s commit `version`, read from its commit file; `None` once log
/// cleanup removed it.
pub async fn commit_actions(
    table: &DeltaTable,
    version: u64,
) -> Result<Option<Vec<Action>>, DeltaTableError> {
    match table.log_store().read_commit_entry(version).await? {
        Some(bytes) => Ok(Some(deltalake::logstore::get_actions(version, &bytes)?)),
        None => Ok(None),
    }
}

/// One commit of a table as `history` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitEntry {
    pub version: u64,
    /// Commit time, milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// The same instant in RFC 3339 (UTC, `Z`, microseconds).
    pub time: Option<String>,
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
    read_commits_until(table, limit, |_| false).await
}

/// [`read_commits`], stopping after the first commit `found` holds for (the last entry): a walk
/// back to a known commit reads only the commits after it.
pub async fn read_commits_until(
    table: &DeltaTable,
    limit: usize,
    found: impl Fn(&CommitEntry) -> bool,
) -> Result<Vec<CommitEntry>, DeltaTableError> {
    let Some(latest) = table.version() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut next = Some(latest);
    while let Some(version) = next.filter(|_| out.len() < limit) {
        let Some(actions) = commit_actions(table, version).await? else {
            break; // older commits were cleaned up
        };
        let mut entry = CommitEntry {
            version,
            timestamp_ms: None,
            time: None,
            operation: None,
            files_added: 0,
            files_removed: 0,
            operation_metrics: None,
            run: None,
        };
        // A file removed and added again in one commit only got a new deletion vector: it
        // is neither added nor removed.
        let added: std::collections::HashSet<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Add(a) => Some(a.path.clone()),
                _ => None,
            })
            .collect();
        let marked: std::collections::HashSet<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Remove(r) if added.contains(&r.path) => Some(r.path.clone()),
                _ => None,
            })
            .collect();
        for action in actions {
            match action {
                Action::Add(a) if marked.contains(&a.path) => {}
                Action::Remove(r) if marked.contains(&r.path) => {}
                Action::Add(_) => entry.files_added += 1,
                Action::Remove(_) => entry.files_removed += 1,
                Action::CommitInfo(ci) => {
                    entry.timestamp_ms = ci.timestamp.or(ci.in_commit_timestamp);
                    entry.time = entry.timestamp_ms.and_then(crate::clock::rfc3339_ms);
                    entry.operation = ci.operation.clone();
                    let mut info: BTreeMap<String, serde_json::Value> =
                        ci.info.into_iter().collect();
                    entry.operation_metrics = info.remove("operationMetrics");
                    entry.run = info.remove(COMMIT_INFO_KEY);
                }
                _ => {}
            }
        }
        let stop = found(&entry);
        out.push(entry);
        next = version.checked_sub(1).filter(|_| !stop);
    }
    Ok(out)
}

/// `props` for a commit after `snapshot` that deletes expired log files only when it writes a
/// checkpoint. delta-rs lists the whole log after every commit to look for them; Delta
/// clients clean the log when they checkpoint, which is when such a commit lets delta-rs do it
/// (and `maintain`, after its checkpoint). On an object store that listing is a request or
/// more per run.
pub fn cleanup_at_checkpoints(
    props: deltalake::kernel::transaction::CommitProperties,
    snapshot: &deltalake::table::state::DeltaTableState,
) -> deltalake::kernel::transaction::CommitProperties {
    use deltalake::table::config::TablePropertiesExt;
    let next = snapshot.version() + 1;
    if next.is_multiple_of(snapshot.table_config().checkpoint_interval().get()) {
        props
    } else {
        props.with_cleanup_expired_logs(Some(false))
    }
}

/// `props` for a commit that creates a table or overwrites one (its removes planned from the
/// snapshot it read): a lost commit race fails instead of being retried. delta-rs retries a
/// table creation that lost to another writer as a plain commit on top of the winner (version
/// 1 with no removes: two concurrent bootstraps left every row twice), and an overwrite's
/// removes are not checked against files a concurrent commit added. Failing, the run plans
/// again from the new snapshot (`run::run`), where the winner's commit is seen.
pub fn no_blind_retry(
    props: deltalake::kernel::transaction::CommitProperties,
) -> deltalake::kernel::transaction::CommitProperties {
    props.with_max_retries(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{RecordBatch, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    const T: i64 = 1_700_000_000_123_456;

    async fn table(
        dir: &std::path::Path,
        ids: Vec<Option<&str>>,
        ts: Vec<Option<i64>>,
    ) -> DeltaTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(TimestampMicrosecondArray::from(ts).with_timezone("UTC")),
            ],
        )
        .unwrap();
        crate::lake::datafile::tests::one_file_table(dir, b, 1024).await
    }

    async fn until(ids: Vec<Option<&str>>, ts: Vec<Option<i64>>, not_null: &[&str]) -> Option<i64> {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), ids, ts).await;
        valid_until(&live_files(&t).unwrap(), not_null, "ts").unwrap()
    }

    #[tokio::test]
    async fn statistics_prove_no_null_and_bound_the_sequence_from_above() {
        let bound = until(
            vec![Some("a"), Some("b")],
            vec![Some(T - 5), Some(T)],
            &["id", "ts"],
        )
        .await
        .expect("provable");
        assert!(bound >= T, "an upper bound: {bound} < {T}");
        assert!(bound <= T + 1_000_000, "{bound}");
    }

    #[tokio::test]
    async fn a_counted_null_or_a_missing_statistic_proves_nothing() {
        let null_key = until(vec![Some("a"), None], vec![Some(T), Some(T)], &["id", "ts"]).await;
        assert_eq!(null_key, None);
        let null_seq = until(
            vec![Some("a"), Some("b")],
            vec![Some(T), None],
            &["id", "ts"],
        )
        .await;
        assert_eq!(null_seq, None);
        let unknown = until(vec![Some("a")], vec![Some(T)], &["id", "no_such_column"]).await;
        assert_eq!(
            unknown, None,
            "no statistics for a column: only a scan can tell"
        );
    }
}
