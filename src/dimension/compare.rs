//! Comparing a run's rows with the table's: which keys changed, and what the table was built
//! with.

use std::collections::HashSet;

use arrow::array::RecordBatch;
use datafusion::common::JoinType;
use datafusion::logical_expr::{cast, Expr};
use datafusion::prelude::{ident, SessionContext};
use deltalake::DeltaTable;

use super::fold;
use super::infer;
use super::plan::Scope;
use super::run::{Compared, Planned};
use super::Run;
use crate::config::pipeline::dimension::{INFERRED_AT, IS_INFERRED};
use crate::lake;
use crate::lake::datafile::FastPath;
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
/// How many keys' rows differ between `before` and `after`, and the first [`KEYS_LISTED`] of
/// them in key order (for `reconcile`).
pub(super) fn changed_keys(
    before: &RecordBatch,
    after: &RecordBatch,
    keys: &[String],
) -> Result<(u64, Vec<String>), RunError> {
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
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(f.keys()).collect();
    let changed: Vec<&String> = keys
        .into_iter()
        .filter(|k| b.get(*k) != f.get(*k))
        .collect();
    let listed = changed
        .iter()
        .take(KEYS_LISTED)
        .map(|k| k.to_string())
        .collect();
    Ok((changed.len() as u64, listed))
}

/// Changed keys a run keeps by name (the count is exact).
pub const KEYS_LISTED: usize = 100;

impl Run<'_, '_> {
    /// Folds the keys' records into rows, adds placeholders for keys the facts name first, and
    /// compares them with the table's rows of those keys.
    pub(super) async fn compare(
        &mut self,
        plan: &Planned,
        valid: &RecordBatch,
    ) -> Result<Compared, RunError> {
        let d = self.d;
        let rebuilt = rebuilt_keys(&plan.scope, &d.keys)?;
        let all = matches!(plan.scope, Scope::All);
        let partial = self.partial(plan, all)?;
        let held = self.held(plan, partial).await?;
        let inferred = infer::inferred_keys(&held, &d.keys)?;
        // Placeholders the table held for the rebuilt keys (to count those completed now).
        let was_pending: HashSet<String> =
            infer::pending(&held.iter().collect::<Vec<_>>(), &d.keys)?
                .into_iter()
                .map(|(k, _)| k)
                .collect();
        // (a relayout rewrites every held row: compared with nothing, every key changes; the
        // rows it held still count as the rows before)
        let held_rows: usize = held.iter().map(RecordBatch::num_rows).sum();
        let held = if self.relayout { Vec::new() } else { held };
        let before = as_one(&held, &plan.storage_schema)?;
        let others = match (&plan.target, &d.infer) {
            (Some(t), Some(_)) if partial => self.other_keys(t, &rebuilt).await?,
            _ => Vec::new(),
        };
        let mut fresh = self.fold(plan, valid, &inferred, &was_pending)?;
        self.c.num_keys_read = match all {
            true => distinct_keys(valid, &d.keys)?,
            false => rebuilt.len() as u64,
        };
        let mut new_keys: Vec<String> = Vec::new();
        if let Some(infer) = &d.infer {
            new_keys = self
                .placeholders(plan, infer, &others, &mut fresh, &inferred, &was_pending)
                .await?;
        }
        let (changed, listed) = changed_keys(&before, &fresh, &d.keys)?;
        self.c.changed_keys = listed;
        self.count_rows(plan, held_rows, &fresh, partial, changed);
        self.end_phase(Phase::Compare)?;
        Ok(Compared {
            fresh,
            replaced: rebuilt.iter().chain(new_keys.iter()).cloned().collect(),
            partial,
            changed,
        })
    }

    /// Whether the run reads and rewrites only the rebuilt keys' rows (replace-where on the
    /// keys: only the files holding them are written again) rather than every row. (The
    /// fallback's replace-where names one key column: a composite key needs the direct path,
    /// else every key is rebuilt.)
    fn partial(&self, plan: &Planned, all: bool) -> Result<bool, RunError> {
        let d = self.d;
        let direct = match &plan.target {
            Some(t) => FastPath::check(t)
                .map_err(RunError::delta(Phase::Compare, &d.target_uri))?
                .is_some(),
            None => false,
        };
        Ok(!all && !self.relayout && plan.target.is_some() && (direct || d.keys.len() == 1))
    }

    /// The table's rows the run compares with: the rebuilt keys' (partial), none (nothing to
    /// rebuild, or no table), or all.
    async fn held(&self, plan: &Planned, partial: bool) -> Result<Vec<RecordBatch>, RunError> {
        let d = self.d;
        let ctx = &self.a.ctx;
        match (&plan.target, &plan.scope) {
            (Some(t), Scope::Keys(batches, _)) if partial => {
                let wanted = Some(batches.clone());
                held_rows(ctx, t, &d.target_uri, &d.keys, wanted).await
            }
            (Some(_), Scope::Nothing) | (None, _) => Ok(Vec::new()),
            (Some(t), _) => held_rows(ctx, t, &d.target_uri, &d.keys, None).await,
        }
    }

    /// The other keys' rows, for inference: their keys and whether they are placeholders.
    async fn other_keys(
        &self,
        target: &DeltaTable,
        rebuilt: &HashSet<String>,
    ) -> Result<Vec<RecordBatch>, RunError> {
        let d = self.d;
        let mut cols: Vec<Expr> = d.keys.iter().map(ident).collect();
        cols.push(ident(IS_INFERRED));
        cols.push(ident(INFERRED_AT));
        let rows = crate::run::frame(&self.a.ctx, target, &d.target_uri, Phase::Compare)
            .await?
            .select(cols)
            .map_err(RunError::query(Phase::Compare))?
            .collect()
            .await
            .map_err(|e| RunError::TargetRead {
                uri: d.target_uri.clone(),
                source: Box::new(deltalake::DeltaTableError::from(e)),
            })?;
        let mut kept = Vec::new();
        for b in rows {
            let text = fold::key_text(&b, &d.keys).map_err(RunError::arrow(Phase::Compare))?;
            let mask: arrow::array::BooleanArray =
                text.iter().map(|k| Some(!rebuilt.contains(k))).collect();
            kept.push(
                arrow::compute::filter_record_batch(&b, &mask)
                    .map_err(RunError::arrow(Phase::Compare))?,
            );
        }
        Ok(kept)
    }

    /// The keys' records folded into the table's rows (in its storage types), counting the
    /// in-place updates and the placeholders completed.
    fn fold(
        &mut self,
        plan: &Planned,
        valid: &RecordBatch,
        inferred: &std::collections::HashMap<String, i64>,
        was_pending: &HashSet<String>,
    ) -> Result<RecordBatch, RunError> {
        let arrow = RunError::arrow(Phase::Compare);
        let (fresh, folded) = fold::fold(valid, &plan.layout, &plan.out_schema, inferred)
            .map_err(RunError::arrow(Phase::Compare))?;
        let fresh = lake::storage::storage_batch(&fresh)
            .and_then(|b| lake::storage::cast_to(&b, &plan.storage_schema))
            .map_err(arrow)?;
        self.c.num_updated_in_place = folded.updated_in_place;
        self.c.num_inferred_completed = match was_pending.is_empty() {
            true => 0,
            false => fold::key_text(&fresh, &self.d.keys)
                .map_err(RunError::arrow(Phase::Compare))?
                .into_iter()
                .filter(|k| was_pending.contains(k))
                .collect::<HashSet<_>>()
                .len() as u64,
        };
        Ok(fresh)
    }

    /// Adds placeholder rows for the keys the facts name that no row holds yet (to `fresh`),
    /// counts the pending and overdue ones, and returns the new placeholders' keys.
    async fn placeholders(
        &mut self,
        plan: &Planned,
        infer: &crate::config::pipeline::dimension::Infer,
        others: &[RecordBatch],
        fresh: &mut RecordBatch,
        inferred: &std::collections::HashMap<String, i64>,
        was_pending: &HashSet<String>,
    ) -> Result<Vec<String>, RunError> {
        let d = self.d;
        let (layout, out_schema, storage_schema) =
            (&plan.layout, &plan.out_schema, &plan.storage_schema);
        let mut rows: Vec<&RecordBatch> = others.iter().collect();
        rows.push(fresh);
        let (new, newest_arrival) = self.infer(infer, &plan.df, &rows, inferred).await?;
        let rows =
            fold::placeholders(&new, layout, out_schema, &infer.placeholder).map_err(|col| {
                self.p.error_at(
                    "placeholder",
                    format!(
                        "`placeholder.{col}` is not a value column `{col}` can hold (its type: {})",
                        out_schema
                            .field_with_name(&col)
                            .map(|f| f.data_type().to_string())
                            .unwrap_or_default()
                    ),
                )
            })?;
        let rows = lake::storage::storage_batch(&rows)
            .and_then(|b| lake::storage::cast_to(&b, storage_schema))
            .map_err(RunError::arrow(Phase::Compare))?;
        // (a placeholder the table already held is not new: a reload writes it again)
        self.c.num_inferred_new =
            new.iter().filter(|(k, _)| !was_pending.contains(k)).count() as u64;
        *fresh = arrow::compute::concat_batches(storage_schema, [&*fresh, &rows])
            .map_err(RunError::arrow(Phase::Compare))?;
        let mut rows: Vec<&RecordBatch> = others.iter().collect();
        rows.push(fresh);
        let pending = infer::pending(&rows, &d.keys)?;
        let overdue = infer::check(self.p, infer, &pending, self.now, newest_arrival)?;
        self.c.num_inferred_pending = overdue.pending;
        self.c.num_inferred_overdue = overdue.overdue;
        if let Some(w) = overdue.warning {
            self.warn(w);
        }
        Ok(new.into_iter().map(|(k, _)| k).collect())
    }

    /// The row counts before and after (of the whole table, from its statistics, when only some
    /// keys' rows were read).
    fn count_rows(
        &mut self,
        plan: &Planned,
        held_rows: usize,
        fresh: &RecordBatch,
        partial: bool,
        changed: u64,
    ) {
        self.c.num_keys_changed = changed;
        self.c.num_rows_before = held_rows as u64;
        self.c.num_rows_after = fresh.num_rows() as u64;
        self.c.num_rows_total = if partial {
            let total = plan
                .target
                .as_ref()
                .and_then(|t| lake::row_count_from_stats(t).ok().flatten())
                .unwrap_or_default();
            (total + fresh.num_rows() as u64).saturating_sub(held_rows as u64)
        } else {
            fresh.num_rows() as u64
        };
    }
}

/// The keys a run rebuilds, as text (none for a whole rebuild: every key is).
fn rebuilt_keys(scope: &Scope, keys: &[String]) -> Result<HashSet<String>, RunError> {
    let mut set = HashSet::new();
    if let Scope::Keys(batches, _) = scope {
        for b in batches {
            set.extend(fold::key_text(b, keys).map_err(RunError::arrow(Phase::Compare))?);
        }
    }
    Ok(set)
}

/// How many distinct keys the rows hold.
fn distinct_keys(rows: &RecordBatch, keys: &[String]) -> Result<u64, RunError> {
    Ok(fold::key_text(rows, keys)
        .map_err(RunError::arrow(Phase::Compare))?
        .into_iter()
        .collect::<HashSet<_>>()
        .len() as u64)
}
