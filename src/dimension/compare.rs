//! Comparing a run's rows with the table's: which keys changed, and what the table was built
//! with.

use std::collections::HashSet;

use arrow::array::RecordBatch;
use datafusion::common::JoinType;
use datafusion::logical_expr::{cast, Expr};
use datafusion::prelude::{ident, SessionContext};
use deltalake::DeltaTable;

use super::fold;
use crate::lake;
use crate::run::{Phase, RunError};

/// The rules the newest commit of `pipeline` to the table was written with (`None`: not known,
/// e.g. written before tidemark recorded them).
pub(super) async fn written_layout(table: &DeltaTable, pipeline: &str) -> Option<String> {
    let entries = lake::read_commits(table, 20).await.ok()?;
    entries
        .iter()
        .filter_map(|e| e.run.as_ref())
        .find(|r| r["pipeline"] == pipeline)
        .and_then(|r| r["layout"].as_str().map(str::to_string))
}

/// The table's rows of the keys in `wanted` (batches of key columns; `None`: every row), read
/// through a semi-join on the key columns (a whole-key-column scan, not a whole-table read).
pub(super) async fn held_rows(
    ctx: &SessionContext,
    table: &DeltaTable,
    uri: &str,
    keys: &[String],
    wanted: Option<Vec<RecordBatch>>,
) -> Result<Vec<RecordBatch>, RunError> {
    let q = |e| RunError::query(Phase::Compare)(e);
    let mut df = crate::run::frame(ctx, table, uri, Phase::Compare).await?;
    if let Some(wanted) = wanted {
        let schema = df.schema().clone();
        let cast_keys: Vec<Expr> = keys
            .iter()
            .map(|k| {
                let t = schema
                    .field_with_unqualified_name(k)
                    .map(|f| f.data_type().clone())
                    .map_err(q)?;
                Ok(cast(ident(k), t).alias(k))
            })
            .collect::<Result<_, RunError>>()?;
        let wanted = match wanted.first() {
            Some(_) => ctx
                .read_batches(wanted)
                .and_then(|w| w.select(cast_keys))
                .map_err(q)?,
            None => return Ok(Vec::new()),
        };
        let cols: Vec<&str> = keys.iter().map(String::as_str).collect();
        df = df
            .join(wanted, JoinType::LeftSemi, &cols, &cols, None)
            .map_err(q)?;
    }
    df.collect().await.map_err(|e| RunError::TargetRead {
        uri: uri.to_string(),
        source: Box::new(deltalake::DeltaTableError::from(e)),
    })
}

/// `held` in `schema`, as one batch.
pub(super) fn as_one(
    held: &[RecordBatch],
    schema: &arrow::datatypes::SchemaRef,
) -> Result<RecordBatch, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let cast = held
        .iter()
        .map(|b| lake::storage::cast_to(b, schema))
        .collect::<Result<Vec<_>, _>>()
        .map_err(a)?;
    arrow::compute::concat_batches(schema, &cast).map_err(a)
}

/// A Delta predicate: the key column is one of `keys` (key text), for a replace-where.
pub(super) fn keys_predicate(
    key: &str,
    data_type: &arrow::datatypes::DataType,
    keys: &[&String],
) -> String {
    let numeric = data_type.is_numeric();
    let list: Vec<String> = keys
        .iter()
        .map(|k| {
            if numeric {
                k.to_string()
            } else {
                format!("'{}'", k.replace('\'', "''"))
            }
        })
        .collect();
    format!("\"{}\" IN ({})", key.replace('"', "\"\""), list.join(", "))
}

/// How many keys have different rows in `before` and `after` (compared as sets of rows).
pub(super) fn changed_keys(
    before: &RecordBatch,
    after: &RecordBatch,
    keys: &[String],
) -> Result<u64, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let rows =
        |b: &RecordBatch| -> Result<std::collections::BTreeMap<String, Vec<Vec<u8>>>, RunError> {
            let text = fold::key_text(b, keys).map_err(a)?;
            let conv = arrow::row::RowConverter::new(
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| arrow::row::SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .map_err(a)?;
            let r = conv.convert_columns(b.columns()).map_err(a)?;
            let mut out: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
            for (i, k) in text.into_iter().enumerate() {
                out.entry(k).or_default().push(r.row(i).as_ref().to_vec());
            }
            for v in out.values_mut() {
                v.sort();
            }
            Ok(out)
        };
    let (b, f) = (rows(before)?, rows(after)?);
    let keys: HashSet<&String> = b.keys().chain(f.keys()).collect();
    Ok(keys.into_iter().filter(|k| b.get(*k) != f.get(*k)).count() as u64)
}
