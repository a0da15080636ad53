//! Comparing a run's rows with the table's: which keys changed, and what the table was built
//! with.

use std::collections::HashSet;

use arrow::array::RecordBatch;
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

/// The table's rows split into those of other keys (kept as they are) and those of the keys
/// being rebuilt (`rebuilt`; `None`: every key), both in `schema`.
pub(super) fn split_held(
    held: &[RecordBatch],
    schema: &arrow::datatypes::SchemaRef,
    keys: &[String],
    rebuilt: Option<&HashSet<String>>,
) -> Result<(RecordBatch, RecordBatch), RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let mut kept = Vec::new();
    let mut before = Vec::new();
    for b in held {
        let b = lake::storage::cast_to(b, schema).map_err(a)?;
        let Some(set) = rebuilt else {
            before.push(b);
            continue;
        };
        let text = fold::key_text(&b, keys).map_err(a)?;
        let mask: arrow::array::BooleanArray = text.iter().map(|k| Some(set.contains(k))).collect();
        before.push(arrow::compute::filter_record_batch(&b, &mask).map_err(a)?);
        let not = arrow::compute::not(&mask).map_err(a)?;
        kept.push(arrow::compute::filter_record_batch(&b, &not).map_err(a)?);
    }
    let kept = arrow::compute::concat_batches(schema, &kept).map_err(a)?;
    let before = arrow::compute::concat_batches(schema, &before).map_err(a)?;
    Ok((kept, before))
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
