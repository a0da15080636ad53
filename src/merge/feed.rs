//! The change data feed tidemark writes: it describes the **live** table.
//!
//! A key's tombstone (soft delete) is a `delete` of its last live row, a live version arriving
//! for a tombstoned key is an `insert`, and a tombstone replaced by a newer tombstone is no
//! change at all; no feed row ever carries `_deleted = true`. The copy-on-write path builds its
//! feed this way (`cow::feed`). Runs that go through delta-rs' MERGE (targets with partitions,
//! column mapping or deletion vectors, runs that add columns, the full reload of a target with a
//! feed) get delta-rs' feed, where a tombstone is an update; [`LiveFeed`] rewrites that feed
//! into the same shape when the commit is written, so consumers read one contract whatever path
//! a run took.
//!
//! A commit that has `cdc` actions is read from them alone; one that rewrites files without any
//! is read as every row of the removed files deleted and every row of the added ones inserted.
//! So a commit that changes data but no live row still gets one (empty) change data file.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::kernel::transaction::TransactionError;
use deltalake::{DeltaTable, ObjectStore};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use crate::config::pipeline::DELETED_COLUMN;
use crate::lake::facts::CommitPatch;

/// The feed's `_change_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Insert,
    Delete,
    Preimage,
    Postimage,
}

impl Change {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Change::Insert => "insert",
            Change::Delete => "delete",
            Change::Preimage => "update_preimage",
            Change::Postimage => "update_postimage",
        }
    }

    /// The feed rows of one key whose target row (`target_live`: not a tombstone) is replaced
    /// by a winner (`winner_live`): `(change, from the winner)`.
    pub(crate) fn of_update(target_live: bool, winner_live: bool) -> &'static [(Change, bool)] {
        match (target_live, winner_live) {
            (true, true) => &[(Change::Preimage, false), (Change::Postimage, true)],
            (true, false) => &[(Change::Delete, false)],
            (false, true) => &[(Change::Insert, true)],
            (false, false) => &[],
        }
    }

    /// What a row of delta-rs' feed becomes in the live feed: `change` is its `_change_type`,
    /// `deleted` its own `_deleted`, `partner` the `_deleted` of the other image of the same
    /// key (an update's preimage for its postimage and the reverse). `None`: not in the feed.
    fn live(change: &str, deleted: bool, partner: Option<bool>) -> Option<Option<Change>> {
        let (target_live, winner_live, from_winner) = match (change, partner) {
            ("insert", _) => (false, !deleted, true),
            ("delete", _) => (!deleted, false, false),
            ("update_preimage", Some(post)) => (!deleted, !post, false),
            ("update_postimage", Some(pre)) => (!pre, !deleted, true),
            // An image without its partner, or a type this code does not know: as written.
            _ => return None,
        };
        Some(
            Change::of_update(target_live, winner_live)
                .iter()
                .find(|(_, w)| *w == from_winner)
                .map(|(c, _)| *c),
        )
    }
}

/// The column of a change data file that names the change.
pub(crate) const CHANGE_TYPE: &str = "_change_type";

/// The commit patch that turns delta-rs' feed of a MERGE into the live feed (module docs).
pub(crate) struct LiveFeed {
    /// The key columns' and `_deleted`'s names in the data files (physical names under column
    /// mapping); `deleted` is `None` on a target without tombstones (hard deletes).
    keys: Vec<String>,
    deleted: Option<String>,
    /// The `cdc` lines decided when the commit was first written (a retried commit reuses them).
    decided: tokio::sync::Mutex<Option<Vec<String>>>,
}

impl LiveFeed {
    /// The patch for a MERGE into `table` keyed by `keys`; `None` when the table keeps no feed.
    pub(crate) fn for_table(table: &DeltaTable, keys: &[String]) -> Option<Arc<LiveFeed>> {
        if !crate::lake::datafile::change_data_feed(table) {
            return None;
        }
        let snapshot = table.snapshot().ok()?;
        let schema = snapshot.schema();
        let physical = |name: &str| -> Option<String> {
            let field = schema.field(name)?;
            Some(
                match field.get_config_value(
                    &deltalake::kernel::ColumnMetadataKey::ColumnMappingPhysicalName,
                ) {
                    Some(deltalake::kernel::MetadataValue::String(p)) => p.clone(),
                    _ => name.to_string(),
                },
            )
        };
        Some(Arc::new(LiveFeed {
            keys: keys
                .iter()
                .map(|k| physical(k).unwrap_or(k.clone()))
                .collect(),
            deleted: physical(DELETED_COLUMN),
            decided: tokio::sync::Mutex::new(None),
        }))
    }
}

fn store_err(e: object_store::Error) -> TransactionError {
    TransactionError::from(e)
}

fn parquet_err(path: &str, e: impl std::fmt::Display) -> TransactionError {
    TransactionError::from(object_store::Error::Generic {
        store: "change data feed",
        source: format!("{path}: {e}").into(),
    })
}

fn json_err(e: serde_json::Error) -> TransactionError {
    TransactionError::SerializeLogJson { json_err: e }
}

/// A path of the log (URL-encoded, relative to the table root) as a store path.
fn store_path(path: &str) -> Path {
    Path::from_url_path(path).unwrap_or_else(|_| Path::from(path))
}

/// One `cdc` action of the commit and its rows.
struct CdcFile {
    action: Value,
    path: String,
    schema: SchemaRef,
    batch: RecordBatch,
}

impl CdcFile {
    async fn read(store: &Arc<dyn ObjectStore>, action: Value) -> Result<Self, TransactionError> {
        let path = action["cdc"]["path"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let bytes = store
            .get(&store_path(&path))
            .await
            .map_err(store_err)?
            .bytes()
            .await
            .map_err(store_err)?;
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| parquet_err(&path, e))?;
        let schema = reader.schema().clone();
        let batches = reader
            .build()
            .map_err(|e| parquet_err(&path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| parquet_err(&path, e))?;
        let batch =
            arrow::compute::concat_batches(&schema, &batches).map_err(|e| parquet_err(&path, e))?;
        Ok(CdcFile {
            action,
            path,
            schema,
            batch,
        })
    }

    /// Column `name` as text per row: from the file, or the action's partition value.
    fn text(&self, name: &str) -> Result<Vec<Option<String>>, TransactionError> {
        let n = self.batch.num_rows();
        if let Some(c) = self.batch.column_by_name(name) {
            let c =
                arrow::compute::cast(c, &DataType::Utf8).map_err(|e| parquet_err(&self.path, e))?;
            let c = c.as_string::<i32>();
            return Ok((0..n)
                .map(|i| c.is_valid(i).then(|| c.value(i).to_string()))
                .collect());
        }
        let v = self.action["cdc"]["partitionValues"][name]
            .as_str()
            .map(str::to_string);
        Ok(vec![v; n])
    }

    fn deleted(&self, name: Option<&str>) -> Result<Vec<bool>, TransactionError> {
        let n = self.batch.num_rows();
        let Some(name) = name else {
            return Ok(vec![false; n]);
        };
        if let Some(c) = self.batch.column_by_name(name) {
            if let Some(b) = c.as_boolean_opt() {
                return Ok((0..n).map(|i| b.is_valid(i) && b.value(i)).collect());
            }
        }
        Ok(self
            .text(name)?
            .into_iter()
            .map(|v| v.is_some_and(|v| v.eq_ignore_ascii_case("true")))
            .collect())
    }

    fn keys(&self, keys: &[String]) -> Result<Vec<String>, TransactionError> {
        let mut out = vec![String::new(); self.batch.num_rows()];
        for k in keys {
            for (o, v) in out.iter_mut().zip(self.text(k)?) {
                o.push_str(v.as_deref().unwrap_or("\u{0}"));
                o.push('\u{1f}');
            }
        }
        Ok(out)
    }

    fn types(&self) -> Result<Vec<String>, TransactionError> {
        Ok(self
            .text(CHANGE_TYPE)?
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect())
    }

    /// This file with its rows replaced by `rows` (index, change), written next to it; the old
    /// file is removed. `None` when no row is left.
    async fn rewrite(
        &self,
        store: &Arc<dyn ObjectStore>,
        rows: &[(u32, Change)],
    ) -> Result<Option<Value>, TransactionError> {
        let _ = store.delete(&store_path(&self.path)).await;
        if rows.is_empty() {
            return Ok(None);
        }
        let idx = arrow::array::UInt32Array::from_iter_values(rows.iter().map(|r| r.0));
        let kept = arrow::compute::take_record_batch(&self.batch, &idx)
            .map_err(|e| parquet_err(&self.path, e))?;
        let types: ArrayRef = Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.1.name()),
        ));
        let at = self
            .schema
            .index_of(CHANGE_TYPE)
            .map_err(|e| parquet_err(&self.path, e))?;
        let mut columns = kept.columns().to_vec();
        columns[at] = arrow::compute::cast(&types, self.schema.field(at).data_type())
            .map_err(|e| parquet_err(&self.path, e))?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| parquet_err(&self.path, e))?;
        let dir = self
            .path
            .rsplit_once('/')
            .map(|(d, _)| d)
            .unwrap_or("_change_data");
        put(store, &self.action, dir, &batch).await.map(Some)
    }
}

pub(crate) use crate::lake::change_file::{write_change_file, ChangeFileError};

/// Writes `batch` as a change data file under `dir` and returns `template` (a `cdc` action)
/// pointing at it.
async fn put(
    store: &Arc<dyn ObjectStore>,
    template: &Value,
    dir: &str,
    batch: &RecordBatch,
) -> Result<Value, TransactionError> {
    let (path, size) = write_change_file(store, dir, batch.schema(), std::slice::from_ref(batch))
        .await
        .map_err(|e| match e {
            ChangeFileError::Parquet(e) => parquet_err(dir, e),
            ChangeFileError::Store(e) => store_err(e),
        })?;
    let mut action = template.clone();
    action["cdc"]["path"] = Value::from(path);
    action["cdc"]["size"] = Value::from(size);
    action["cdc"]["dataChange"] = Value::from(false);
    Ok(action)
}

/// The schema of an empty change data file for a commit without one: the columns of a data
/// file it adds or removes (as stored: physical names, no partition columns) and `_change_type`.
async fn empty_feed_schema(
    store: &Arc<dyn ObjectStore>,
    data: &Value,
) -> Result<SchemaRef, TransactionError> {
    let path = data["path"].as_str().unwrap_or_default();
    let size = data["size"].as_u64().unwrap_or_default();
    let file = crate::lake::datafile::DataFile::open(store, path, size)
        .await
        .map_err(|e| parquet_err(path, e))?;
    let md = file.meta;
    let mut fields: Vec<Arc<Field>> = md.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(CHANGE_TYPE, DataType::Utf8, true)));
    Ok(Arc::new(Schema::new(fields)))
}

fn changes_data(action: &Value) -> Option<&Value> {
    ["add", "remove"]
        .into_iter()
        .filter_map(|k| action.get(k))
        .find(|a| a["dataChange"].as_bool().unwrap_or(true))
}

impl LiveFeed {
    /// The commit's new `cdc` lines (see the module docs).
    async fn decide(
        &self,
        store: &Arc<dyn ObjectStore>,
        cdc: Vec<Value>,
        data_changed: Option<Value>,
    ) -> Result<Vec<Value>, TransactionError> {
        let mut files = Vec::with_capacity(cdc.len());
        for action in cdc {
            files.push(CdcFile::read(store, action).await?);
        }
        // Each key's images: the `_deleted` of its preimage and of its postimage.
        let mut images: HashMap<String, (Option<bool>, Option<bool>)> = HashMap::new();
        let mut per_file = Vec::with_capacity(files.len());
        for f in &files {
            let (keys, deleted, types) = (
                f.keys(&self.keys)?,
                f.deleted(self.deleted.as_deref())?,
                f.types()?,
            );
            for ((k, d), t) in keys.iter().zip(&deleted).zip(&types) {
                let e = images.entry(k.clone()).or_default();
                match t.as_str() {
                    "update_preimage" => e.0 = Some(*d),
                    "update_postimage" => e.1 = Some(*d),
                    _ => {}
                }
            }
            per_file.push((keys, deleted, types));
        }
        let mut out = Vec::new();
        let mut schema = None;
        for (f, (keys, deleted, types)) in files.iter().zip(per_file) {
            schema.get_or_insert_with(|| f.schema.clone());
            let mut rows: Vec<(u32, Change)> = Vec::with_capacity(types.len());
            let mut same = true;
            for (i, ((k, d), t)) in keys.iter().zip(deleted).zip(&types).enumerate() {
                let partner = images.get(k).and_then(|(pre, post)| match t.as_str() {
                    "update_preimage" => *post,
                    _ => *pre,
                });
                match Change::live(t, d, partner) {
                    // Rows this code does not rule on stay as written.
                    None => {
                        let kept = [
                            Change::Insert,
                            Change::Delete,
                            Change::Preimage,
                            Change::Postimage,
                        ]
                        .into_iter()
                        .find(|c| c.name() == t);
                        match kept {
                            Some(c) => rows.push((i as u32, c)),
                            None => {
                                return Err(parquet_err(
                                    &f.path,
                                    format!("unknown _change_type {t:?}"),
                                ))
                            }
                        }
                    }
                    Some(Some(c)) => {
                        same &= c.name() == t;
                        rows.push((i as u32, c));
                    }
                    Some(None) => same = false,
                }
            }
            if same {
                out.push(f.action.clone());
            } else if let Some(a) = f.rewrite(store, &rows).await? {
                out.push(a);
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        let Some(data) = data_changed else {
            return Ok(out);
        };
        // Data changed but no live row: one empty file says so.
        let schema = match schema {
            Some(s) => s,
            None => empty_feed_schema(store, &data).await?,
        };
        let template = serde_json::json!({"cdc": {
            "partitionValues": data.get("partitionValues").cloned().unwrap_or_else(|| serde_json::json!({})),
        }});
        let dir = data["path"]
            .as_str()
            .and_then(|p| p.rsplit_once('/'))
            .map(|(d, _)| format!("_change_data/{d}"))
            .unwrap_or_else(|| "_change_data".to_string());
        Ok(vec![
            put(store, &template, &dir, &RecordBatch::new_empty(schema)).await?,
        ])
    }
}

#[async_trait::async_trait]
impl CommitPatch for LiveFeed {
    async fn patch(
        &self,
        store: &Arc<dyn ObjectStore>,
        lines: Vec<String>,
    ) -> Result<Vec<String>, TransactionError> {
        let mut others = Vec::with_capacity(lines.len());
        let mut cdc = Vec::new();
        let mut data_changed = None;
        for line in lines {
            let action: Value = serde_json::from_str(&line).map_err(json_err)?;
            if action.get("cdc").is_some() {
                cdc.push(action);
                continue;
            }
            if data_changed.is_none() {
                data_changed = changes_data(&action).cloned();
            }
            others.push(line);
        }
        let mut decided = self.decided.lock().await;
        if decided.is_none() {
            if cdc.is_empty() && data_changed.is_none() {
                return Ok(others);
            }
            // A target without tombstones: delta-rs' rows are right as they are.
            let actions = if self.deleted.is_none() && !cdc.is_empty() {
                cdc
            } else {
                self.decide(store, cdc, data_changed).await?
            };
            *decided = Some(
                actions
                    .iter()
                    .map(serde_json::to_string)
                    .collect::<Result<_, _>>()
                    .map_err(json_err)?,
            );
        }
        others.extend(decided.iter().flatten().cloned());
        Ok(others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_rs_rows_become_the_live_feed() {
        use Change::*;
        // A tombstone replacing a live row: its preimage is the delete, its postimage goes.
        assert_eq!(
            Change::live("update_preimage", false, Some(true)),
            Some(Some(Delete))
        );
        assert_eq!(
            Change::live("update_postimage", true, Some(false)),
            Some(None)
        );
        // A live row replacing a tombstone: an insert.
        assert_eq!(
            Change::live("update_preimage", true, Some(false)),
            Some(None)
        );
        assert_eq!(
            Change::live("update_postimage", false, Some(true)),
            Some(Some(Insert))
        );
        // Tombstone over tombstone: nothing.
        assert_eq!(
            Change::live("update_preimage", true, Some(true)),
            Some(None)
        );
        assert_eq!(
            Change::live("update_postimage", true, Some(true)),
            Some(None)
        );
        // Live over live: the update as written.
        assert_eq!(
            Change::live("update_preimage", false, Some(false)),
            Some(Some(Preimage))
        );
        assert_eq!(
            Change::live("update_postimage", false, Some(false)),
            Some(Some(Postimage))
        );
        // A tombstone inserted or deleted is no live change; live ones are.
        assert_eq!(Change::live("insert", true, None), Some(None));
        assert_eq!(Change::live("insert", false, None), Some(Some(Insert)));
        assert_eq!(Change::live("delete", true, None), Some(None));
        assert_eq!(Change::live("delete", false, None), Some(Some(Delete)));
        // An image without its partner stays as written.
        assert_eq!(Change::live("update_preimage", false, None), None);
    }
}
