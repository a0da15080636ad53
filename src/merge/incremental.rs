//! The hourly run: read the overlap slice and the rows landed since the previous run, validate,
//! keep the newest version per key, compare with the target and commit what changed.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{lit, Expr};
use datafusion::prelude::ident;
use deltalake::DeltaTable;
use futures::StreamExt;
use tracing::{info, info_span, Instrument};

use super::*;

/// What planning decided, for the phases after it.
struct Planned {
    read: horizon::ReadPlan,
    /// Source columns the target lacks (added by this run's commit).
    new_columns: Vec<String>,
    /// The source version the previous run recorded.
    previous: Option<i64>,
    /// What the target really holds, not the clamped planning watermark.
    target_max: Option<DateTime<Utc>>,
}

impl Run<'_, '_> {
    /// The hourly run, phase by phase: each step's output is the next one's input.
    pub(super) async fn incremental(
        mut self,
        source: DeltaTable,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        target: DeltaTable,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<MergeCounters, RunError> {
        let planned = self.plan_read(&source, &target, roles).await?;
        self.end_phase(Phase::Plan)?;
        let (input, complete) = self
            .read(&source, source_provider, planned.read, roles, seq_type)
            .await?;
        self.end_phase(Phase::Read)?;
        let valid = self.validate(input, roles, seq_type).await?;
        self.end_phase(Phase::Validate)?;
        let (winners, deduper) = self.dedup(valid, roles).await?;
        let winners = self
            .fill_from_target(&target, roles, winners, deduper.open_keys(), &complete)
            .await?;
        self.end_phase(Phase::Dedup)?;
        let fast = if planned.new_columns.is_empty() {
            FastPath::check(&target).map_err(RunError::delta(Phase::Compare, &self.m.target_uri))?
        } else {
            None
        };
        let before = planned.target_max.map(|w| w.timestamp_micros());
        let previous = planned.previous;
        if let Some(fast) = fast {
            self.commit_by_rewrite(target, &fast, roles, &winners, &deduper, previous, before)
                .await?;
        } else {
            self.commit_with_merge(target, roles, &winners, &deduper, previous, before)
                .await?;
        }
        Ok(self.finish())
    }

    /// Plan: the schema still fits, what the target recorded, its watermark, and what to read.
    async fn plan_read(
        &mut self,
        source: &DeltaTable,
        target: &DeltaTable,
        roles: &ColumnRoles,
    ) -> Result<Planned, RunError> {
        let target_provider = target
            .table_provider()
            .await
            .map_err(RunError::query(Phase::Plan))?;
        let new_columns = self.schema_drift(&target_provider.schema(), roles)?;
        if !new_columns.is_empty() {
            self.warn(format!(
                "adding new source column(s) {} to the target (on_schema_change: add_new_columns)",
                new_columns.join(", ")
            ));
        }
        let record = self.recorded(target).await?;
        let previous = record.version;
        self.c.previous_source_version = previous;
        let target_max = self.watermark(target, roles).await?;
        let mut read = horizon::plan(horizon::Inputs {
            p: self.p,
            m: self.m,
            source,
            source_version: self.a.summary.source_version.unwrap_or_default(),
            source_table_id: self.source_table_id.as_deref().unwrap_or_default(),
            record,
            watermark: target_max,
            now: self.now,
        })
        .await?;
        for w in std::mem::take(&mut read.warnings) {
            self.warn(w);
        }
        self.c.watermark_before = read.watermark;
        if read.late_is_approximate {
            self.late_bound = read.lo;
        }
        info!(watermark = ?read.watermark, lo = ?read.lo, previous_source_version = ?previous, source_version = self.a.summary.source_version, "planned incremental run");
        Ok(Planned {
            read,
            new_columns,
            previous,
            target_max,
        })
    }

    /// Read: the overlap slice, plus every row landed since the previous run behind it (flagged
    /// late), collected once so validation and dedup do not read the source again. With partial
    /// updates, also the whole history of the keys with a late row ([`partial`]).
    async fn read(
        &mut self,
        source: &DeltaTable,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        plan: horizon::ReadPlan,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<(DataFrame, partial::Complete), RunError> {
        let q = RunError::query;
        let seq = roles.sequence();
        let lo = plan.lo;
        let behind = |lo: Option<i64>| -> Expr {
            match lo {
                Some(lo) => ident(seq)
                    .lt_eq(roles::timestamp_lit(seq_type, lo))
                    .or(ident(seq).is_null()),
                None => lit(true),
            }
        };
        let slice = match lo {
            Some(lo) => self
                .a
                .ctx
                .read_table(source_provider.clone())
                .and_then(|df| df.filter(ident(seq).gt(roles::timestamp_lit(seq_type, lo)))),
            None => self.a.ctx.read_table(source_provider.clone()),
        }
        .and_then(|df| df.with_column(LATE_COLUMN, lit(false)))
        .map_err(q(Phase::Read))?;
        let mut complete = match (&plan.landed, lo) {
            (_, None) | (horizon::Landed::WholeSource, _) => partial::Complete::All,
            _ => partial::Complete::None,
        };
        let landed_adds = match &plan.landed {
            horizon::Landed::Files(adds) if roles.partial.is_some() => Some(adds.clone()),
            _ => None,
        };
        let landed_provider = match plan.landed {
            horizon::Landed::Nothing => None,
            horizon::Landed::WholeSource => Some(source_provider.clone()),
            horizon::Landed::Files(adds) => Some(
                source
                    .table_provider()
                    .with_file_selection(
                        deltalake::delta_datafusion::FileSelection::from_adds(adds)
                            .with_missing_file_policy(
                                deltalake::delta_datafusion::MissingSelectedFilePolicy::Ignore,
                            ),
                    )
                    .await
                    .map_err(q(Phase::Read))?,
            ),
        };
        let input = match landed_provider {
            Some(provider) => {
                let landed = self
                    .a
                    .ctx
                    .read_table(provider)
                    .and_then(|df| df.filter(behind(lo)))
                    .and_then(|df| df.with_column(LATE_COLUMN, lit(true)))
                    .map_err(q(Phase::Read))?;
                slice.union(landed).map_err(q(Phase::Read))?
            }
            None => slice,
        };
        let input = match landed_adds {
            Some(adds) => {
                let (input, keys) = self
                    .read_histories(input, source, &adds, behind(lo), roles)
                    .await?;
                complete = keys;
                input
            }
            None => input,
        };
        let batches = input
            .collect()
            .instrument(info_span!("read"))
            .await
            .map_err(RunError::scan(Phase::Read, &self.m.source_uri))?;
        self.a.summary.num_source_rows_read = row_count(&batches);
        let schema = batches.first().map(|b| b.schema()).unwrap_or_else(|| {
            let mut fields: Vec<arrow::datatypes::Field> = source_provider
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(arrow::datatypes::Field::new(
                LATE_COLUMN,
                arrow::datatypes::DataType::Boolean,
                false,
            ));
            Arc::new(arrow::datatypes::Schema::new(fields))
        });
        let mem = MemTable::try_new(schema, vec![batches]).map_err(q(Phase::Read))?;
        let input = self
            .a
            .ctx
            .read_table(Arc::new(mem))
            .map_err(q(Phase::Read))?;
        Ok((input, complete))
    }

    /// Validate: counts the late rows, quarantines the rejected, records the deferred; returns
    /// the valid rows.
    async fn validate(
        &mut self,
        input: DataFrame,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<DataFrame, RunError> {
        let q = RunError::query;
        let due = validate::due_micros(self.now, self.m.max_future_skew);
        let rules = self.compile_expectations(&input)?;
        let (input, guard) =
            tombstones::annotate(&self.a.ctx, input, self.m, roles, seq_type, false).await?;
        let mut split = validate::split(input, roles, seq_type, due, &rules, guard.as_ref())?;
        self.c.num_late_rows = split
            .valid
            .clone()
            .filter(ident(LATE_COLUMN))
            .map_err(q(Phase::Validate))?
            .count()
            .await
            .map_err(q(Phase::Validate))? as u64;
        self.count_validation(&mut split, roles, &rules, false)
            .await?;
        let rejected = split
            .rejected
            .drop_columns(&[LATE_COLUMN])
            .map_err(q(Phase::Validate))?;
        self.quarantine(rejected).await?;
        Ok(split.valid)
    }

    /// Dedup: the newest version per key, in the canonical schema, and the deduper that knows
    /// which keys had equal-tuple conflicts.
    async fn dedup(
        &mut self,
        valid: DataFrame,
        roles: &ColumnRoles,
    ) -> Result<(RecordBatch, Deduper), RunError> {
        let q = RunError::query;
        let a = RunError::arrow;
        let sorted = valid
            .select(roles.canonical_exprs())
            .and_then(|df| df.sort(roles.dedup_sort()))
            .map_err(q(Phase::Dedup))?;
        let mut stream = sorted.execute_stream().await.map_err(q(Phase::Dedup))?;
        let mut deduper = Deduper::new(roles).map_err(a(Phase::Dedup))?;
        let mut winners = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(q(Phase::Dedup))?;
            let batch = storage::cast_to(&batch, &roles.canonical).map_err(a(Phase::Dedup))?;
            winners.push(deduper.push(&batch).map_err(a(Phase::Dedup))?);
        }
        winners.extend(deduper.finish().map_err(a(Phase::Dedup))?);
        let counts = deduper.counts();
        (self.c.num_superseded, self.c.num_duplicates) = (counts.superseded, counts.duplicates);
        self.c.num_conflicts = counts.conflicts;
        let winners =
            arrow::compute::concat_batches(&roles.canonical, &winners).map_err(a(Phase::Dedup))?;
        Ok((winners, deduper))
    }

    pub(super) fn record_outcome(
        &mut self,
        counts: Counts,
        max_sequence: Option<i64>,
        changed_sequences: &[i64],
        before: Option<i64>,
        previous: Option<i64>,
    ) {
        if let Some(lo) = self.late_bound {
            // Every landed row was flagged late (log gap, recreated source): count those that
            // changed something and that the slice could not have found.
            self.c.num_late_rows = changed_sequences.iter().filter(|s| **s <= lo).count() as u64;
        }
        self.c.num_conflicts += counts.conflicts;
        self.c.num_inserted = counts.inserted;
        self.c.num_updated = counts.updated;
        self.c.num_deleted = counts.deleted;
        self.c.num_unchanged = counts.unchanged;
        self.c.watermark_after = before.max(max_sequence).and_then(micros_to_time);
        self.c.already_applied = !counts.changes_anything()
            && previous == self.a.summary.source_version.map(|v| v as i64);
    }

    /// The normal path: only files holding a changed key are rewritten, and in them only the
    /// row groups holding one are re-encoded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_by_rewrite(
        &mut self,
        target: DeltaTable,
        fast: &FastPath,
        roles: &ColumnRoles,
        winners: &RecordBatch,
        deduper: &Deduper,
        previous: Option<i64>,
        before: Option<i64>,
    ) -> Result<(), RunError> {
        let rewrite = cow::rewrite(
            &cow::Target {
                table: &target,
                uri: &self.m.target_uri,
                fast,
                row_group_rows: self.m.target_row_group_rows,
                parallelism: self.a.ctx.state().config().target_partitions(),
                apply: self.m.target_apply,
            },
            roles,
            winners,
            deduper.conflict_keys(),
            self.opts.dry_run,
        )
        .instrument(info_span!("rewrite"))
        .await?;
        self.record_outcome(
            Counts {
                inserted: rewrite.inserted,
                updated: rewrite.updated,
                deleted: rewrite.deleted,
                unchanged: rewrite.unchanged,
                conflicts: rewrite.conflicts,
            },
            rewrite.max_sequence,
            &rewrite.changed_sequences,
            before,
            previous,
        );
        self.c.num_files_candidate = rewrite.files_candidate;
        self.c.num_rows_copied = rewrite.rows_copied;
        self.c.num_rows_reencoded = rewrite.rows_reencoded;
        self.c.num_rows_written = rewrite.rows_written;
        self.c.num_rows_marked_deleted = rewrite.rows_marked;
        self.c.num_files_marked = rewrite.files_marked;
        self.end_phase(Phase::Compare)?;
        if rewrite.is_empty() || self.opts.dry_run {
            return Ok(());
        }
        self.a.failpoint(crate::run::Point::Before(Phase::Commit))?;
        self.ensure_unchanged(&target).await?;
        self.a.summary.num_files_added = rewrite.files_added;
        self.a.summary.num_files_removed = rewrite.files_removed;
        let props = self.commit_properties();
        let version = cow::commit(&target, &self.m.target_uri, rewrite, props)
            .instrument(info_span!("commit"))
            .await?;
        self.a.summary.target_version = Some(version);
        self.end_phase(Phase::Commit)
    }

    /// Schema evolution (`on_schema_change: add_new_columns`) goes through delta-rs' MERGE,
    /// which adds the new columns to the table metadata in the same commit.
    pub(super) async fn commit_with_merge(
        &mut self,
        target: DeltaTable,
        roles: &ColumnRoles,
        winners: &RecordBatch,
        deduper: &Deduper,
        previous: Option<i64>,
        before: Option<i64>,
    ) -> Result<(), RunError> {
        let cs = changes::detect(
            &self.a.ctx,
            &target,
            &self.m.target_uri,
            roles,
            winners,
            deduper.conflict_keys(),
        )
        .await?;
        self.record_outcome(
            Counts {
                inserted: cs.inserted,
                updated: cs.updated,
                deleted: cs.deleted,
                unchanged: cs.unchanged,
                conflicts: cs.conflicts,
            },
            cs.max_sequence,
            &cs.changed_sequences,
            before,
            previous,
        );
        self.end_phase(Phase::Compare)?;
        if cs.is_empty() || self.opts.dry_run {
            return Ok(());
        }
        self.a.failpoint(crate::run::Point::Before(Phase::Commit))?;
        self.ensure_unchanged(&target).await?;
        let props = self.commit_properties();
        let (table, metrics) = write::merge(
            &self.a.ctx,
            target,
            &self.m.target_uri,
            roles,
            cs.rows,
            props,
            true,
        )
        .instrument(info_span!("commit"))
        .await?;
        self.a.summary.target_version = table.version();
        self.a.summary.num_files_added = metrics.num_target_files_added as u64;
        self.a.summary.num_files_removed = metrics.num_target_files_removed as u64;
        self.end_phase(Phase::Commit)
    }
}
