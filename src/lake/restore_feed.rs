//! The change data feed of a restore. A Delta restore adds back version N's files (with the
//! deletion vectors they had then) and removes the others; a feed reader without `cdc` actions
//! reads such a commit from its data files, and delta-rs' reader cannot read files with deletion
//! vectors spread over several row groups that way (it panics). So a restore of a table that
//! keeps a feed writes one change data file: the live rows the restore takes away (`delete`) and
//! brings back (`insert`) — an `update_preimage`/`update_postimage` pair for a key it changes,
//! when the keys are known. Like tidemark's own feed it describes the live table: tombstones
//! (`_deleted = true`) are not rows.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::logical_expr::{col, lit};
use datafusion::prelude::{DataFrame, SessionContext};
use deltalake::kernel::transaction::TransactionError;
use deltalake::{DeltaTable, DeltaTableError, ObjectStore};
use serde_json::{json, Value};

use super::change_file::{write_change_file, ChangeFileError};
use super::facts::CommitPatch;

const CHANGE_TYPE: &str = "_change_type";
const DELETED: &str = "_deleted";

/// The rows a restore of `current` to `restored` changes, in the feed's shape; `None` when the
/// table keeps no feed, or is partitioned (its change files would go per partition: not written,
/// its feed is read from the data files).
pub async fn changes(
    current: &DeltaTable,
    restored: &DeltaTable,
    keys: &[String],
) -> Result<Option<Vec<RecordBatch>>, DeltaTableError> {
    if !super::datafile::change_data_feed(current)
        || !current
            .snapshot()?
            .metadata()
            .partition_columns()
            .is_empty()
    {
        return Ok(None);
    }
    let ctx = super::session::context();
    let (now, then) = (live(&ctx, current).await?, live(&ctx, restored).await?);
    let q = |e: datafusion::error::DataFusionError| DeltaTableError::Generic(e.to_string());
    let gone = now.clone().except(then.clone()).map_err(q)?;
    let back = then.except(now).map_err(q)?;
    let k: Vec<&str> = keys.iter().map(String::as_str).collect();
    let by_key = |a: &DataFrame, b: &DataFrame, how| a.clone().join(b.clone(), how, &k, &k, None);
    use datafusion::common::JoinType::{LeftAnti, LeftSemi};
    let parts: Vec<(DataFrame, &str)> = if keys.is_empty() {
        vec![(gone, "delete"), (back, "insert")]
    } else {
        vec![
            (
                by_key(&gone, &back, LeftSemi).map_err(q)?,
                "update_preimage",
            ),
            (
                by_key(&back, &gone, LeftSemi).map_err(q)?,
                "update_postimage",
            ),
            (by_key(&gone, &back, LeftAnti).map_err(q)?, "delete"),
            (by_key(&back, &gone, LeftAnti).map_err(q)?, "insert"),
        ]
    };
    let mut out = Vec::new();
    for (df, change) in parts {
        let batches = df
            .with_column(CHANGE_TYPE, lit(change))
            .map_err(q)?
            .collect()
            .await
            .map_err(q)?;
        out.extend(batches.into_iter().filter(|b| b.num_rows() > 0));
    }
    Ok(Some(out))
}

/// The live rows of `table` (tombstones left out).
async fn live(ctx: &SessionContext, table: &DeltaTable) -> Result<DataFrame, DeltaTableError> {
    let provider = table.table_provider().await?;
    let df = ctx
        .read_table(provider)
        .map_err(|e| DeltaTableError::Generic(e.to_string()))?;
    if df.schema().field_with_unqualified_name(DELETED).is_ok() {
        return df
            .filter(col(DELETED).is_not_true())
            .map_err(|e| DeltaTableError::Generic(e.to_string()));
    }
    Ok(df)
}

/// The commit patch adding the restore's change data file (written once; a retried commit
/// reuses it).
pub struct RestoreFeed {
    rows: Vec<RecordBatch>,
    schema: arrow::datatypes::SchemaRef,
    written: tokio::sync::Mutex<Option<String>>,
}

impl RestoreFeed {
    pub fn new(rows: Vec<RecordBatch>, schema: arrow::datatypes::SchemaRef) -> Arc<Self> {
        Arc::new(RestoreFeed {
            rows,
            schema,
            written: tokio::sync::Mutex::new(None),
        })
    }
}

#[async_trait::async_trait]
impl CommitPatch for RestoreFeed {
    async fn patch(
        &self,
        store: &Arc<dyn ObjectStore>,
        mut lines: Vec<String>,
    ) -> Result<Vec<String>, TransactionError> {
        let mut written = self.written.lock().await;
        if written.is_none() {
            let (path, size) =
                write_change_file(store, "_change_data", self.schema.clone(), &self.rows)
                    .await
                    .map_err(|e| match e {
                        ChangeFileError::Store(e) => TransactionError::from(e),
                        ChangeFileError::Parquet(e) => {
                            TransactionError::from(object_store::Error::Generic {
                                store: "change data feed",
                                source: Box::new(e),
                            })
                        }
                    })?;
            let action: Value = json!({"cdc": {"path": path, "partitionValues": {}, "size": size, "dataChange": false}});
            *written = Some(action.to_string());
        }
        lines.extend(written.clone());
        Ok(lines)
    }
}
