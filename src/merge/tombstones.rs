//! Bounded tombstones (`deletes.retain`).
//!
//! A soft delete keeps a tombstone row so that an older version of the key landing later cannot
//! bring the payment back. Kept forever they grow the table; `maintain` removes those whose
//! sequence is older than `retain` before its clock — and first records each removed key with
//! its delete sequence in a small Delta table beside the target (`deletes.removed_keys`). Every
//! run then joins its source rows with that record: a live version of a removed key at or before
//! its delete sequence is rejected (quarantined as `deleted_key_resurrection`), a delete record
//! at or before it is already applied and skipped. Bounding storage never brings a deleted
//! payment back; a version *newer* than the delete is a real re-creation and is merged.
//!
//! The record is written before the target's tombstones are deleted (two commits, two tables):
//! a crash between them leaves keys recorded whose tombstones still exist, which rejects nothing
//! the tombstones would not have superseded anyway; the next `maintain` deletes them.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, Utc};
use datafusion::common::JoinType;
use datafusion::functions_aggregate::expr_fn::max;
use datafusion::logical_expr::{cast, lit, Expr};
use datafusion::prelude::{ident, DataFrame, SessionContext};
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use crate::config::pipeline::{CdcMerge, DELETED_COLUMN};
use crate::keyed::roles::{timestamp_lit, ColumnRoles};
pub use crate::keyed::validate::{Guard, RESURRECTION};
use crate::lake;
use crate::run::{Phase, RunError};

/// The removed-keys table's column holding the removed tombstone's sequence.
pub const DELETE_SEQUENCE: &str = "_delete_sequence";
/// The removed-keys table's column: when `maintain` removed the tombstone.
pub const REMOVED_AT: &str = "_removed_at";
/// The column a run's source rows carry after [`annotate`]: their key's removed delete sequence.
const REMOVED_SEQ: &str = "__tidemark_removed_seq";

/// Adds to each source row the delete sequence of its key's removed tombstone (null when none),
/// when the pipeline bounds tombstones and some were removed. `history`: the input is the
/// whole source (a full reload, reconcile), where a removed key's versions before its delete
/// are its past, superseded by the delete, and not late arrivals: all are skipped, none
/// counted as a resurrection.
pub async fn annotate(
    ctx: &SessionContext,
    input: DataFrame,
    m: &CdcMerge,
    roles: &ColumnRoles,
    seq_type: &DataType,
    history: bool,
) -> Result<(DataFrame, Option<Guard>), RunError> {
    let Some(uri) = m.deletes.as_ref().and_then(|d| d.removed_keys.as_deref()) else {
        return Ok((input, None));
    };
    let Some(table) = lake::open_if_exists(uri).await? else {
        return Ok((input, None));
    };
    let q = |e| RunError::query(Phase::Validate)(e);
    let recorded = crate::run::frame(ctx, &table, uri, Phase::Validate).await?;
    let source = input.schema().clone();
    let alias = |i: usize| format!("__tidemark_removed_key{i}");
    let mut select: Vec<Expr> = Vec::new();
    for (i, k) in roles.keys.iter().enumerate() {
        let (_, field) = source.qualified_field_with_unqualified_name(k).map_err(q)?;
        select.push(cast(ident(k), field.data_type().clone()).alias(alias(i)));
    }
    select.push(cast(ident(REMOVED_SEQ), seq_type.clone()).alias(REMOVED_SEQ));
    let removed = recorded
        .aggregate(
            roles.keys.iter().map(ident).collect(),
            vec![max(ident(DELETE_SEQUENCE)).alias(REMOVED_SEQ)],
        )
        .and_then(|df| df.select(select))
        .map_err(RunError::scan(Phase::Validate, uri))?;
    let left: Vec<&str> = roles.keys.iter().map(String::as_str).collect();
    let right: Vec<String> = (0..roles.keys.len()).map(alias).collect();
    let right: Vec<&str> = right.iter().map(String::as_str).collect();
    let keep: Vec<Expr> = source
        .fields()
        .iter()
        .map(|f| ident(f.name()))
        .chain(std::iter::once(ident(REMOVED_SEQ)))
        .collect();
    let annotated = input
        .join(removed, JoinType::Left, &left, &right, None)
        .and_then(|df| df.select(keep))
        .map_err(q)?;
    // Never null: rows of keys never removed (or without a sequence) are neither.
    let due = ident(roles.sequence()).lt_eq(ident(REMOVED_SEQ));
    let is_delete = deleted(roles);
    let never_null = |e: Expr| datafusion::functions::expr_fn::coalesce(vec![e, lit(false)]);
    let guard = if history {
        Guard {
            resurrected: lit(false),
            superseded: never_null(due),
            column: REMOVED_SEQ,
        }
    } else {
        Guard {
            resurrected: never_null(
                due.clone()
                    .and(datafusion::logical_expr::not(is_delete.clone())),
            ),
            superseded: never_null(due.and(is_delete)),
            column: REMOVED_SEQ,
        }
    };
    Ok((annotated, Some(guard)))
}

/// Whether a source row is a delete record.
fn deleted(roles: &ColumnRoles) -> Expr {
    match &roles.deletes {
        Some(d) => datafusion::functions::expr_fn::coalesce(vec![
            cast(ident(&d.column), DataType::Utf8)
                .in_list(d.values.iter().map(|v| lit(v.clone())).collect(), false),
            lit(false),
        ]),
        None => lit(false),
    }
}

/// What removing expired tombstones did (or would do).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Expired {
    /// Tombstones older than the horizon (sequence before it).
    pub tombstones: u64,
    /// Of those, keys newly recorded in the removed-keys table (a rerun after a crash finds
    /// them recorded already).
    pub recorded: u64,
    /// The horizon: tombstones with an earlier sequence are removed.
    pub horizon: String,
    pub removed_keys_uri: String,
    /// The target's version with the tombstones deleted.
    pub target_version: Option<u64>,
}

/// Removes the target's tombstones whose sequence is before `now - retain`, recording their keys
/// and delete sequences first. `None` when the pipeline does not bound tombstones.
pub async fn expire(
    ctx: &SessionContext,
    target: DeltaTable,
    m: &CdcMerge,
    now: DateTime<Utc>,
    dry_run: bool,
) -> Result<Option<Expired>, RunError> {
    let Some((retain, uri)) = m
        .deletes
        .as_ref()
        .and_then(|d| Some((d.retain?, d.removed_keys.clone()?)))
    else {
        return Ok(None);
    };
    let turi = &m.target_uri;
    let horizon = now - chrono::Duration::from_std(retain).unwrap_or(chrono::Duration::MAX);
    let rows = crate::run::frame(ctx, &target, turi, Phase::Plan).await?;
    let seq = &m.sequence_by;
    let seq_type = rows
        .schema()
        .qualified_field_with_unqualified_name(seq)
        .map(|(_, f)| f.data_type().clone())
        .map_err(RunError::query(Phase::Plan))?;
    let expired_when = ident(DELETED_COLUMN)
        .eq(lit(true))
        .and(ident(seq).lt(timestamp_lit(&seq_type, horizon.timestamp_micros())));
    let mut columns: Vec<Expr> = m.keys.iter().map(ident).collect();
    columns.push(ident(seq).alias(DELETE_SEQUENCE));
    let scan = |e| RunError::scan(Phase::Read, turi)(e);
    let expired: Vec<RecordBatch> = rows
        .filter(expired_when.clone())
        .and_then(|df| df.select(columns))
        .map_err(scan)?
        .collect()
        .await
        .map_err(scan)?;
    let tombstones: u64 = expired.iter().map(|b| b.num_rows() as u64).sum();
    let mut out = Expired {
        tombstones,
        horizon: crate::report::rfc3339(&horizon),
        removed_keys_uri: uri.clone(),
        ..Expired::default()
    };
    if tombstones == 0 {
        return Ok(Some(out));
    }
    // Record first: keys already recorded with this sequence (a rerun) are not added twice.
    let fresh = unrecorded(ctx, &uri, expired, &m.keys).await?;
    out.recorded = fresh.iter().map(|b| b.num_rows() as u64).sum();
    if dry_run {
        return Ok(Some(out));
    }
    if out.recorded > 0 {
        let stamped = stamp(fresh, now)?;
        let table = lake::or_new(lake::open_if_exists(&uri).await?, &uri)?;
        table
            .write(stamped)
            .with_save_mode(SaveMode::Append)
            .await
            .map_err(RunError::write(Phase::Write, &uri))?;
    }
    let predicate = expired_when;
    // Tombstones are no live rows: their removal feeds no row (`super::feed`).
    let (table, _) = super::write::live_feed(target, &m.keys)
        .delete()
        .with_predicate(predicate)
        .await
        .map_err(RunError::write(Phase::Commit, turi))?;
    out.target_version = table.version();
    Ok(Some(out))
}

/// The rows of `expired` whose (key, delete sequence) the removed-keys table does not hold yet.
async fn unrecorded(
    ctx: &SessionContext,
    uri: &str,
    expired: Vec<RecordBatch>,
    keys: &[String],
) -> Result<Vec<RecordBatch>, RunError> {
    let Some(table) = lake::open_if_exists(uri).await? else {
        return Ok(expired);
    };
    let q = |e| RunError::query(Phase::Plan)(e);
    let recorded = crate::run::frame(ctx, &table, uri, Phase::Plan).await?;
    let Some(schema) = expired.first().map(|b| b.schema()) else {
        return Ok(expired);
    };
    let mine = ctx.read_batches(expired).map_err(q)?;
    let on: Vec<String> = keys
        .iter()
        .cloned()
        .chain(std::iter::once(DELETE_SEQUENCE.to_string()))
        .collect();
    let theirs_names: Vec<String> = (0..on.len())
        .map(|i| format!("__tidemark_recorded{i}"))
        .collect();
    let theirs = recorded
        .select(
            on.iter()
                .zip(&theirs_names)
                .map(|(c, a)| {
                    let dt = schema
                        .field_with_name(c)
                        .map(|f| f.data_type().clone())
                        .unwrap_or(DataType::Null);
                    cast(ident(c), dt).alias(a)
                })
                .collect::<Vec<Expr>>(),
        )
        .map_err(RunError::scan(Phase::Plan, uri))?;
    let left: Vec<&str> = on.iter().map(String::as_str).collect();
    let right: Vec<&str> = theirs_names.iter().map(String::as_str).collect();
    mine.join(theirs, JoinType::LeftAnti, &left, &right, None)
        .map_err(q)?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Plan, uri))
}

/// Adds `_removed_at` (this maintenance's clock) to the rows to record.
fn stamp(batches: Vec<RecordBatch>, now: DateTime<Utc>) -> Result<Vec<RecordBatch>, RunError> {
    let a = RunError::arrow(Phase::Write);
    batches
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            let mut fields: Vec<Arc<Field>> = b.schema().fields().iter().cloned().collect();
            fields.push(Arc::new(Field::new(
                REMOVED_AT,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            )));
            let mut columns: Vec<ArrayRef> = b.columns().to_vec();
            columns.push(Arc::new(
                TimestampMicrosecondArray::from(vec![now.timestamp_micros(); b.num_rows()])
                    .with_timezone("UTC"),
            ));
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        })
        .collect::<Result<_, _>>()
        .map_err(a)
}
