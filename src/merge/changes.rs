//! Which deduplicated rows change the target, decided before anything is written.
//!
//! The merge itself would leave stale rows alone too, but it would still read and rewrite the
//! files they touch. Deciding here, from the target's current rows for the slice's keys, means a
//! rerun of the same hour writes nothing at all, and equal-tuple conflicts are resolved by the
//! same content order as the dedup, so incremental runs agree with a full reload.

use std::collections::{HashMap, HashSet};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::row::OwnedRow;

use datafusion::common::JoinType;
use datafusion::functions_aggregate::expr_fn::{max, min};
use datafusion::logical_expr::lit;
use datafusion::prelude::{ident, SessionContext};
use datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;

use super::decide::{self, Verdict};
use super::MergeError;
use crate::keyed::dedup::RowEncoders;
use crate::keyed::roles::ColumnRoles;
use crate::lake::storage::cast_to;
use crate::run::render::render_key;
use crate::run::{Phase, RunError};

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
    roles: &ColumnRoles,
    winners: &RecordBatch,
    already_conflicting: &HashSet<Box<[u8]>>,
) -> Result<ChangeSet, RunError> {
    let enc = RowEncoders::new(roles).map_err(RunError::arrow(Phase::Compare))?;
    let existing = target_rows(ctx, target, target_uri, roles, winners, &enc).await?;
    let e = enc
        .encode(winners)
        .map_err(RunError::arrow(Phase::Compare))?;
    let mut cs = ChangeSet::default();
    let mut keep: Vec<u32> = Vec::new();
    let hard = roles.hard_deletes();
    for i in 0..winners.num_rows() {
        let deleted = e.is_deleted(i);
        let verdict = match existing.get(e.keys.row(i).as_ref()) {
            None => decide::absent(deleted, hard),
            Some(t) => {
                let (verdict, conflict) = decide::matched(
                    e.tuples.row(i).cmp(&t.tuple.row()),
                    e.contents.row(i).cmp(&t.content.row()),
                    deleted,
                    t.deleted,
                    already_conflicting.contains(e.keys.row(i).as_ref()),
                    roles.partial.is_some(),
                );
                cs.conflicts += u64::from(conflict);
                verdict
            }
        };
        match verdict {
            Verdict::Insert => cs.inserted += 1,
            Verdict::Delete => cs.deleted += 1,
            Verdict::Update => cs.updated += 1,
            Verdict::Unchanged => cs.unchanged += 1,
        }
        if verdict.changes() {
            keep.push(i as u32);
            cs.changed_sequences.extend(e.sequence_micros(i));
            if decide::stays(deleted, hard) {
                cs.max_sequence = cs.max_sequence.max(e.sequence_micros(i));
            }
        }
    }
    if !keep.is_empty() {
        let idx = UInt32Array::from(keep);
        cs.rows.push(
            arrow::compute::take_record_batch(winners, &idx)
                .map_err(RunError::arrow(Phase::Compare))?,
        );
    }
    Ok(cs)
}

/// The target's rows whose keys are among `rows`' (canonical rows), as canonical rows. Files
/// are pruned by the first key column's range; only matching keys come back.
pub async fn matching_rows(
    ctx: &SessionContext,
    target: &DeltaTable,
    roles: &ColumnRoles,
    rows: &RecordBatch,
) -> Result<Vec<RecordBatch>, RunError> {
    let q = RunError::query;
    if rows.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let key_names: Vec<String> = roles.keys.iter().map(|k| format!("__slice_{k}")).collect();
    let key_cols: Vec<_> = roles
        .keys
        .iter()
        .zip(&key_names)
        .map(|(k, alias)| ident(k).alias(alias))
        .collect();
    let slice_keys = ctx
        .read_batch(rows.clone())
        .and_then(|df| df.select(key_cols))
        .map_err(q(Phase::Compare))?;
    let first = &roles.keys[0];
    let first_alias = &key_names[0];
    let bounds = slice_keys
        .clone()
        .aggregate(
            vec![],
            vec![min(ident(first_alias)), max(ident(first_alias))],
        )
        .map_err(q(Phase::Compare))?
        .collect()
        .await
        .map_err(q(Phase::Compare))?;
    let (lo, hi) = match bounds.first() {
        Some(b) if b.num_rows() == 1 => (
            ScalarValue::try_from_array(b.column(0), 0).map_err(q(Phase::Compare))?,
            ScalarValue::try_from_array(b.column(1), 0).map_err(q(Phase::Compare))?,
        ),
        _ => return Ok(Vec::new()),
    };
    let provider = target.table_provider().await.map_err(q(Phase::Compare))?;
    let columns = roles.target_exprs_for(&provider.schema());
    let left: Vec<&str> = roles.keys.iter().map(String::as_str).collect();
    let right: Vec<&str> = key_names.iter().map(String::as_str).collect();
    let batches = ctx
        .read_table(provider)
        .and_then(|df| df.filter(ident(first).between(lit(lo), lit(hi))))
        .and_then(|df| df.join(slice_keys, JoinType::LeftSemi, &left, &right, None))
        .and_then(|df| df.select(columns))
        .map_err(q(Phase::Compare))?
        .collect()
        .await
        .map_err(q(Phase::Compare))?;
    Ok(batches)
}

/// The target's rows whose keys are among the winners', as canonical rows by encoded key.
/// Files are pruned by the first key column's range; only matching keys come back.
async fn target_rows(
    ctx: &SessionContext,
    target: &DeltaTable,
    target_uri: &str,
    roles: &ColumnRoles,
    winners: &RecordBatch,
    enc: &RowEncoders,
) -> Result<HashMap<Box<[u8]>, TargetRow>, RunError> {
    let mut out = HashMap::new();
    let batches = matching_rows(ctx, target, roles, winners).await?;
    let mut duplicates = 0u64;
    let mut first_duplicate = None;
    for batch in batches {
        let batch = cast_to(&batch, &roles.canonical).map_err(RunError::arrow(Phase::Compare))?;
        let e = enc
            .encode(&batch)
            .map_err(RunError::arrow(Phase::Compare))?;
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
                    first_duplicate = Some(render_key(&batch, &roles.keys, i));
                }
            }
        }
    }
    if duplicates > 0 {
        return Err(MergeError::DuplicateTargetKeys {
            uri: target_uri.to_string(),
            count: duplicates,
            first: first_duplicate.unwrap_or_default(),
        }
        .into());
    }
    Ok(out)
}
