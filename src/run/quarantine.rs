//! The quarantine table: rejected rows with their reason, each stored once.
//!
//! The overlap means a rejected row is read by several runs. Each row is stored with a content
//! fingerprint (`_row_hash`), and rows whose fingerprint is already there are not written again.

use std::collections::HashSet;

use arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use chrono::{DateTime, Utc};
use datafusion::logical_expr::{lit, when, Expr};
use datafusion::prelude::{ident, SessionContext};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use std::sync::Arc;

use super::{Phase, RunError};
use crate::lake;
use crate::lake::storage::storage_batch;

/// Column the quarantine table adds: why the row was rejected.
pub const REASON_COLUMN: &str = "_quarantine_reason";

/// Whether a row fails any of `rules` (condition, reason), and the reason of the first it
/// fails (what the quarantine's `_quarantine_reason` says).
pub fn rejection(
    rules: &[(Expr, String)],
) -> Result<(Expr, Expr), datafusion::error::DataFusionError> {
    let any = rules
        .iter()
        .map(|(e, _)| e.clone())
        .reduce(Expr::or)
        .unwrap_or_else(|| lit(false));
    let Some(((first, text), rest)) = rules.split_first() else {
        return Ok((any, lit("invalid row")));
    };
    let mut reason = when(first.clone(), lit(text.clone()));
    for (cond, text) in rest {
        reason = reason.when(cond.clone(), lit(text.clone()));
    }
    Ok((any, reason.otherwise(lit("invalid row"))?))
}

/// Fingerprint column of the quarantine table.
pub const ROW_HASH_COLUMN: &str = "_row_hash";

/// What quarantining did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// Rejected rows in this run's read.
    pub rejected: u64,
    /// Of those, rows not yet in the quarantine table.
    pub new: u64,
}

/// The quarantine stage of any kind: stores the rejected rows (each once), then enforces the
/// pipeline's limits against `read` rows. Returns the outcome and the warning to report when
/// rows were rejected within the limits; a limit exceeded is [`RunError::QuarantineLimit`].
#[allow(clippy::too_many_arguments)]
pub async fn stage(
    ctx: &SessionContext,
    spec: &crate::config::Quarantine,
    rejected: Vec<RecordBatch>,
    run_id: &str,
    now: DateTime<Utc>,
    dry_run: bool,
    read: u64,
) -> Result<(Outcome, Option<String>), RunError> {
    let outcome = store(ctx, &spec.uri, rejected, run_id, now, dry_run).await?;
    if outcome.rejected == 0 {
        return Ok((outcome, None));
    }
    let over_rows = spec.max_rows.is_some_and(|m| outcome.rejected > m);
    let over_fraction = spec
        .max_fraction
        .is_some_and(|f| outcome.rejected as f64 / read.max(1) as f64 > f);
    if over_rows || over_fraction {
        let limit = match (spec.max_rows, spec.max_fraction) {
            (Some(r), Some(f)) => format!("max_rows {r}, max_fraction {f}"),
            (Some(r), None) => format!("max_rows {r}"),
            (None, Some(f)) => format!("max_fraction {f}"),
            (None, None) => String::new(),
        };
        return Err(RunError::QuarantineLimit {
            rejected: outcome.rejected,
            read,
            limit,
            uri: spec.uri.clone(),
        });
    }
    let warning = format!(
        "{} failed validation ({} {} in {})",
        crate::report::rows(outcome.rejected),
        outcome.new,
        if dry_run {
            "would be newly quarantined (dry run: nothing written)"
        } else {
            "newly quarantined"
        },
        spec.uri
    );
    Ok((outcome, Some(warning)))
}

/// Stores the rejected rows not already quarantined (unless `dry_run`).
pub async fn store(
    ctx: &SessionContext,
    uri: &str,
    rejected: Vec<RecordBatch>,
    run_id: &str,
    now: DateTime<Utc>,
    dry_run: bool,
) -> Result<Outcome, RunError> {
    let stamp = Stamp {
        run_id,
        now,
        column: "_quarantined_at",
        phase: Phase::Quarantine,
        unhashed: &[REASON_COLUMN],
    };
    store_once(ctx, uri, rejected, stamp, dry_run).await
}

/// How a table of rows stored once marks them: the run, its time (in `column`), and the phase
/// its errors belong to.
pub struct Stamp<'a> {
    pub run_id: &'a str,
    pub now: DateTime<Utc>,
    pub column: &'static str,
    pub phase: Phase,
    /// Columns the fingerprint leaves out (what may differ between two stores of one row).
    pub unhashed: &'a [&'a str],
}

/// Appends to the table at `uri` the rows of `rows` it does not hold yet (by a fingerprint of
/// their contents, [`ROW_HASH_COLUMN`]), each with the run's id and time (unless `dry_run`): a
/// rerun that finds the same rows adds none.
pub async fn store_once(
    ctx: &SessionContext,
    uri: &str,
    rejected: Vec<RecordBatch>,
    stamp: Stamp<'_>,
    dry_run: bool,
) -> Result<Outcome, RunError> {
    let phase = stamp.phase;
    let total: usize = rejected.iter().map(RecordBatch::num_rows).sum();
    if total == 0 {
        return Ok(Outcome::default());
    }
    let existing = lake::open_if_exists(uri).await?;
    let known = match &existing {
        Some(t) => known_hashes(ctx, t, phase).await?,
        None => HashSet::new(),
    };
    let mut fresh = Vec::new();
    let mut seen_now = HashSet::new();
    for batch in &rejected {
        let hashes = row_hashes(batch, phase, stamp.unhashed)?;
        let keep: Vec<u32> = hashes
            .iter()
            .enumerate()
            .filter(|(_, h)| !known.contains(*h) && seen_now.insert((*h).clone()))
            .map(|(i, _)| i as u32)
            .collect();
        if keep.is_empty() {
            continue;
        }
        let idx = arrow::array::UInt32Array::from(keep.clone());
        let rows =
            arrow::compute::take_record_batch(batch, &idx).map_err(RunError::arrow(phase))?;
        let kept_hashes: Vec<&str> = keep.iter().map(|i| hashes[*i as usize].as_str()).collect();
        fresh.push(with_bookkeeping(&rows, &kept_hashes, &stamp)?);
    }
    let new: u64 = fresh.iter().map(|b| b.num_rows() as u64).sum();
    if !dry_run && new > 0 {
        let table = lake::or_new(existing, uri)?;
        table
            .write(fresh)
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge)
            .await
            .map_err(RunError::write(phase, uri))?;
    }
    Ok(Outcome {
        rejected: total as u64,
        new,
    })
}

async fn known_hashes(
    ctx: &SessionContext,
    table: &deltalake::DeltaTable,
    phase: Phase,
) -> Result<HashSet<String>, RunError> {
    let q = RunError::query(phase);
    table
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(phase, table.table_url().as_ref()))?;
    let provider = table.table_provider().await.map_err(q)?;
    if provider.schema().field_with_name(ROW_HASH_COLUMN).is_err() {
        return Ok(HashSet::new());
    }
    let batches = ctx
        .read_table(provider)
        .and_then(|df| df.select(vec![ident(ROW_HASH_COLUMN)]))
        .map_err(RunError::query(phase))?
        .collect()
        .await
        .map_err(RunError::query(phase))?;
    let mut out = HashSet::new();
    for b in batches {
        let col =
            arrow::compute::cast(b.column(0), &DataType::Utf8).map_err(RunError::arrow(phase))?;
        if let Some(s) = arrow::array::AsArray::as_string_opt::<i32>(col.as_ref()) {
            out.extend(s.iter().flatten().map(str::to_string));
        }
    }
    Ok(out)
}

/// A stable fingerprint per row: FNV-1a over the rendered values of every source column.
/// Rendering (not Arrow's internal row format) keeps it stable across library versions.
fn row_hashes(
    batch: &RecordBatch,
    phase: Phase,
    unhashed: &[&str],
) -> Result<Vec<String>, RunError> {
    let opts = FormatOptions::default().with_null("\u{0}null");
    let formatters = batch
        .columns()
        .iter()
        .zip(batch.schema().fields())
        .filter(|(_, f)| !unhashed.contains(&f.name().as_str()))
        .map(|(c, _)| ArrayFormatter::try_new(c.as_ref(), &opts))
        .collect::<Result<Vec<_>, _>>()
        .map_err(RunError::arrow(phase))?;
    Ok((0..batch.num_rows())
        .map(|i| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for f in &formatters {
                for b in f.value(i).to_string().bytes().chain(std::iter::once(0x1f)) {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
            }
            format!("{h:016x}")
        })
        .collect())
}

fn with_bookkeeping(
    rows: &RecordBatch,
    hashes: &[&str],
    stamp: &Stamp<'_>,
) -> Result<RecordBatch, RunError> {
    let rows = storage_batch(rows).map_err(RunError::arrow(stamp.phase))?;
    let n = rows.num_rows();
    let mut fields: Vec<Field> = rows
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    fields.push(Field::new("_run_id", DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from(vec![stamp.run_id; n])));
    fields.push(Field::new(
        stamp.column,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        false,
    ));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(vec![stamp.now.timestamp_micros(); n]).with_timezone("UTC"),
    ));
    fields.push(Field::new(ROW_HASH_COLUMN, DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from(hashes.to_vec())));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(RunError::arrow(stamp.phase))
}
