//! Which deduplicated rows change the target, decided before anything is written.
//!
//! The merge itself would leave stale rows alone too, but it would still read and rewrite the
//! files they touch. Deciding here, from the target's current rows for the slice's keys, means a
//! rerun of the same hour writes nothing at all, and equal-tuple conflicts are resolved by the
//! same content order as the dedup, so incremental runs agree with a full reload.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::error::ArrowError;
use arrow::row::OwnedRow;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::JoinType;
use datafusion::functions_aggregate::expr_fn::{max, min};
use datafusion::logical_expr::lit;
use datafusion::prelude::{ident, SessionContext};
use datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;

use super::dedup::RowEncoders;
use super::layout::Layout;
use super::RunError;
use crate::lake::storage::cast_to;

/// The rows to merge and what they will do.
#[derive(Debug, Default)]
pub struct ChangeSet {
    /// Canonical rows that win over the target (empty: nothing to commit).
    pub rows: Vec<RecordBatch>,
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub unchanged: u64,
    /// Keys where the slice and the target hold different rows with the same tuple.
    pub conflicts: u64,
    /// Largest sequence among the changed rows that stay live (soft: all of them).
    pub max_sequence: Option<i64>,
    /// Sequence of every changed row, µs.
    pub changed_sequences: Vec<i64>,
}

impl ChangeSet {
    /// Number of rows that will be merged.
    pub fn len(&self) -> usize {
        self.rows.iter().map(RecordBatch::num_rows).sum()
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct TargetRow {
    tuple: OwnedRow,
    content: OwnedRow,
    deleted: bool,
}

/// Compares `winners` (one canonical row per key) with the target's rows for the same keys.
pub async fn detect(
    ctx: &SessionContext,
    target: &DeltaTable,
    target_uri: &str,
    layout: &Layout,
    winners: &RecordBatch,
    already_conflicting: &HashSet<Box<[u8]>>,
) -> Result<ChangeSet, RunError> {
    let enc = RowEncoders::new(layout).map_err(RunError::arrow("compare"))?;
    let existing = target_rows(ctx, target, target_uri, layout, winners, &enc).await?;
    let e = enc.encode(winners).map_err(RunError::arrow("compare"))?;
    let mut cs = ChangeSet::default();
    let mut keep: Vec<u32> = Vec::new();
    let hard = layout.hard_deletes();
    for i in 0..winners.num_rows() {
        let deleted = e.is_deleted(i);
        let apply = match existing.get(e.keys.row(i).as_ref()) {
            None if deleted && hard => false,
            None => {
                if deleted {
                    cs.deleted += 1;
                } else {
                    cs.inserted += 1;
                }
                true
            }
            Some(t) => {
                let tuple_cmp = e.tuples.row(i).cmp(&t.tuple.row());
                let content_differs = e.contents.row(i) != t.content.row();
                if tuple_cmp == Ordering::Equal
                    && content_differs
                    && !already_conflicting.contains(e.keys.row(i).as_ref())
                {
                    cs.conflicts += 1;
                }
                let newer = tuple_cmp.then_with(|| e.contents.row(i).cmp(&t.content.row()))
                    == Ordering::Greater;
                if newer {
                    match (deleted, t.deleted) {
                        (true, false) => cs.deleted += 1,
                        _ => cs.updated += 1,
                    }
                }
                newer
            }
        };
        if apply {
            keep.push(i as u32);
            cs.changed_sequences.extend(e.sequence_micros(i));
            if !(deleted && hard) {
                cs.max_sequence = cs.max_sequence.max(e.sequence_micros(i));
            }
        } else {
            cs.unchanged += 1;
        }
    }
    if !keep.is_empty() {
        let idx = UInt32Array::from(keep);
        cs.rows.push(
            arrow::compute::take_record_batch(winners, &idx).map_err(RunError::arrow("compare"))?,
        );
    }
    Ok(cs)
}

/// The target's rows whose keys are among the winners', as canonical rows by encoded key.
/// Files are pruned by the first key column's range; only matching keys come back.
async fn target_rows(
    ctx: &SessionContext,
    target: &DeltaTable,
    target_uri: &str,
    layout: &Layout,
    winners: &RecordBatch,
    enc: &RowEncoders,
) -> Result<HashMap<Box<[u8]>, TargetRow>, RunError> {
    let q = RunError::query;
    let mut out = HashMap::new();
    if winners.num_rows() == 0 {
        return Ok(out);
    }
    let key_names: Vec<String> = layout.keys.iter().map(|k| format!("__slice_{k}")).collect();
    let key_cols: Vec<_> = layout
        .keys
        .iter()
        .zip(&key_names)
        .map(|(k, alias)| ident(k).alias(alias))
        .collect();
    let slice_keys = ctx
        .read_batch(winners.clone())
        .and_then(|df| df.select(key_cols))
        .map_err(q("compare"))?;
    let first = &layout.keys[0];
    let first_alias = &key_names[0];
    let bounds = slice_keys
        .clone()
        .aggregate(
            vec![],
            vec![min(ident(first_alias)), max(ident(first_alias))],
        )
        .map_err(q("compare"))?
        .collect()
        .await
        .map_err(q("compare"))?;
    let (lo, hi) = match bounds.first() {
        Some(b) if b.num_rows() == 1 => (
            ScalarValue::try_from_array(b.column(0), 0).map_err(q("compare"))?,
            ScalarValue::try_from_array(b.column(1), 0).map_err(q("compare"))?,
        ),
        _ => return Ok(out),
    };

    let provider = target.table_provider().await.map_err(q("compare"))?;
    let columns = layout.target_exprs_for(&provider.schema());
    let left: Vec<&str> = layout.keys.iter().map(String::as_str).collect();
    let right: Vec<&str> = key_names.iter().map(String::as_str).collect();
    let batches = ctx
        .read_table(provider)
        .and_then(|df| df.filter(ident(first).between(lit(lo), lit(hi))))
        .and_then(|df| df.join(slice_keys, JoinType::LeftSemi, &left, &right, None))
        .and_then(|df| df.select(columns))
        .map_err(q("compare"))?
        .collect()
        .await
        .map_err(q("compare"))?;
    let mut duplicates = 0u64;
    let mut first_duplicate = None;
    for batch in batches {
        let batch = cast_to(&batch, &layout.canonical).map_err(RunError::arrow("compare"))?;
        let e = enc.encode(&batch).map_err(RunError::arrow("compare"))?;
        for i in 0..batch.num_rows() {
            let key: Box<[u8]> = e.keys.row(i).as_ref().into();
            let row = TargetRow {
                tuple: e.tuples.row(i).owned(),
                content: e.contents.row(i).owned(),
                deleted: e.is_deleted(i),
            };
            if out.insert(key, row).is_some() {
                duplicates += 1;
                if first_duplicate.is_none() {
                    first_duplicate = Some(render_key(&batch, &layout.keys, i));
                }
            }
        }
    }
    if duplicates > 0 {
        return Err(RunError::DuplicateTargetKeys {
            uri: target_uri.to_string(),
            count: duplicates,
            first: first_duplicate.unwrap_or_default(),
        });
    }
    Ok(out)
}

/// A value as people read it in messages and reports: `None` for null, long values cut (a
/// 1 MB payload is still reported, not printed).
pub(crate) fn render_value(col: &dyn Array, row: usize) -> Result<Option<String>, ArrowError> {
    const MAX: usize = 120;
    if col.is_null(row) {
        return Ok(None);
    }
    let f = ArrayFormatter::try_new(col, &FormatOptions::default())?;
    let s = f.value(row).to_string();
    let chars = s.chars().count();
    Ok(Some(if chars > MAX {
        format!(
            "{}… ({chars} characters)",
            s.chars().take(MAX).collect::<String>()
        )
    } else {
        s
    }))
}

/// `k1="v1", k2=null` for the key columns of a row. Values are quoted and escaped, so control
/// characters, RTL marks and trailing spaces in a key show in the message.
pub(crate) fn render_key(batch: &RecordBatch, keys: &[String], row: usize) -> String {
    keys.iter()
        .map(|k| {
            let v = batch
                .column_by_name(k)
                .and_then(|c| render_value(c.as_ref(), row).ok().flatten())
                .map_or_else(|| "null".to_string(), |v| format!("{v:?}"));
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows in a set of batches.
pub fn row_count(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}
