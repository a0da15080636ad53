//! Bootstrap and full reload: the whole source, streamed through validation and dedup into one
//! overwrite commit.

use std::sync::Arc;

use datafusion::catalog::streaming::StreamingTable;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::ident;
use deltalake::DeltaTable;
use futures::StreamExt;
use tracing::{info_span, Instrument};

use super::*;

/// The reload's winners, as a plan not yet run, with what its stream counts.
struct Deduped {
    winners: DataFrame,
    sort_plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    counts: Arc<std::sync::Mutex<DedupCounts>>,
    scan_error: dedup::InputError,
}

impl Run<'_, '_> {
    /// plan → read → validate → dedup → write, over the whole source.
    pub(super) async fn full(
        mut self,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        target: Option<DeltaTable>,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<MergeCounters, RunError> {
        if let Some(t) = &target {
            t.update_datafusion_session(&self.a.ctx.state())
                .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        }
        self.end_phase(Phase::Plan)?;
        let (valid, streamed) = self
            .validate_whole(source_provider, roles, seq_type)
            .await?;
        let deduped = self.winners(valid, roles).await?;
        if self.opts.dry_run {
            self.drain(&deduped).await?;
        } else if let Some(t) = target
            .as_ref()
            .filter(|t| crate::lake::datafile::change_data_feed(t))
            .cloned()
        {
            let Deduped {
                winners,
                sort_plan,
                counts,
                scan_error,
            } = deduped;
            let reloaded = self
                .reload_by_merge(t, winners, roles, counts, scan_error, streamed)
                .await;
            log_executed(&sort_plan);
            return reloaded;
        } else {
            self.overwrite(target, &deduped, roles, &streamed).await?;
        }
        log_executed(&deduped.sort_plan);
        self.count_reload(&deduped.counts, roles)?;
        self.report_streamed(streamed);
        Ok(self.finish())
    }

    /// The whole source read and split by validation (rejected rows to the quarantine); `warn`
    /// rules only count: over a whole source that is cheaper inside the write's scan, which
    /// decodes their columns anyway, than in a pass of its own.
    async fn validate_whole(
        &mut self,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<(DataFrame, Option<crate::keyed::expect::Streamed>), RunError> {
        let input = self
            .a
            .ctx
            .read_table(source_provider)
            .map_err(RunError::query(Phase::Read))?;
        let due = validate::due_micros(self.now, self.m.max_future_skew);
        let rules = self.compile_expectations(&input)?;
        let (annotated, guard) =
            tombstones::annotate(&self.a.ctx, input.clone(), self.m, roles, seq_type, true).await?;
        let mut split = validate::split(annotated, roles, seq_type, due, &rules, guard.as_ref())?;
        self.a.summary.num_source_rows_read = match self.source_rows {
            Some(rows) => rows,
            None => input
                .count()
                .await
                .map_err(RunError::scan(Phase::Read, &self.m.source_uri))?
                as u64,
        };
        self.end_phase(Phase::Read)?;
        let warns: Vec<&crate::keyed::expect::Compiled> = rules
            .iter()
            .filter(|r| r.on_fail == crate::keyed::expect::OnFail::Warn)
            .collect();
        self.count_validation(&mut split, roles, &rules, !warns.is_empty())
            .await?;
        let (valid, streamed) = if warns.is_empty() {
            (split.valid.clone(), None)
        } else {
            let (valid, tally) =
                split.valid_tallied(warns.iter().map(|r| r.fails.clone()).collect())?;
            let streamed = crate::keyed::expect::Streamed {
                base: self.c.expectations.clone(),
                names: warns.iter().map(|r| r.name.clone()).collect(),
                tally,
            };
            (valid, Some(streamed))
        };
        self.quarantine(split.rejected).await?;
        self.end_phase(Phase::Validate)?;
        Ok((valid, streamed))
    }

    /// The newest version per key of `valid`: canonical rows, thinned chunk by chunk, sorted
    /// (spilling under a memory limit) and deduplicated as they stream; hard deletes dropped,
    /// columns as the target stores them.
    async fn winners(
        &mut self,
        valid: DataFrame,
        roles: &ColumnRoles,
    ) -> Result<Deduped, RunError> {
        let q = RunError::query;
        let canonical = valid
            .select(roles.canonical_exprs())
            .map_err(q(Phase::Dedup))?;
        let counts: Arc<std::sync::Mutex<DedupCounts>> = Arc::default();
        let scan_error: dedup::InputError = Arc::default();
        // (a key's older versions within a chunk go before the sort: see `thin`; not with
        // partial updates, where an older version may carry what the newest lacks)
        let canonical = if roles.order_sortable() && roles.partial.is_none() {
            self.thinned(canonical, roles, &counts).await?
        } else {
            canonical
        };
        let sorted = canonical
            .sort(roles.dedup_sort())
            .map_err(q(Phase::Dedup))?;
        let task = Arc::new(sorted.task_ctx());
        // (kept to show, with `-vv`, what the scan, thinning and sort did once they are done)
        let sort_plan = sorted
            .create_physical_plan()
            .await
            .map_err(q(Phase::Dedup))?;
        let stream = datafusion::physical_plan::execute_stream(sort_plan.clone(), task)
            .map_err(q(Phase::Dedup))?;
        let partition =
            dedup::DedupPartition::sharing(roles, stream, counts.clone(), scan_error.clone())
                .map_err(RunError::arrow(Phase::Dedup))?;
        let schema = partition.schema().clone();
        let table =
            StreamingTable::try_new(schema, vec![Arc::new(partition)]).map_err(q(Phase::Dedup))?;
        let mut winners = self
            .a
            .ctx
            .read_table(Arc::new(table))
            .map_err(q(Phase::Dedup))?;
        if roles.hard_deletes() {
            winners = winners
                .filter(datafusion::logical_expr::not(ident(
                    crate::config::pipeline::DELETED_COLUMN,
                )))
                .map_err(q(Phase::Dedup))?;
        }
        let out_cols: Vec<Expr> = roles
            .target_columns
            .iter()
            .map(|c| {
                let dt = roles
                    .canonical
                    .field_with_name(c)
                    .map(|f| storage::storage_type(f.data_type()))
                    .unwrap_or(arrow::datatypes::DataType::Null);
                datafusion::logical_expr::cast(ident(c), dt).alias(c)
            })
            .collect();
        Ok(Deduped {
            winners: winners.select(out_cols).map_err(q(Phase::Dedup))?,
            sort_plan,
            counts,
            scan_error,
        })
    }

    /// A dry run: the winners streamed to their end, so every count is complete.
    async fn drain(&mut self, d: &Deduped) -> Result<(), RunError> {
        let q = RunError::query;
        let mut stream = d
            .winners
            .clone()
            .execute_stream()
            .await
            .map_err(q(Phase::Dedup))?;
        while let Some(b) = stream.next().await {
            if let Err(e) = b {
                return Err(match dedup::take_error(&d.scan_error) {
                    Some(source) => RunError::scan(Phase::Read, &self.m.source_uri)(source),
                    None => q(Phase::Dedup)(e),
                });
            }
        }
        self.end_phase(Phase::Dedup)
    }

    /// The winners streamed into one overwrite commit. The counts of a streamed reload are
    /// known only after the write; its commit carries what is known before it, and delta-rs
    /// adds the written row count.
    async fn overwrite(
        &mut self,
        target: Option<DeltaTable>,
        d: &Deduped,
        roles: &ColumnRoles,
        streamed: &Option<crate::keyed::expect::Streamed>,
    ) -> Result<(), RunError> {
        if let Some(t) = &target {
            self.ensure_unchanged(t).await?;
        }
        let props = self.commit_properties();
        let plan = d.winners.clone().into_unoptimized_plan();
        let ctx = self.a.ctx.clone();
        let final_facts = streamed_facts(
            d.counts.clone(),
            roles.hard_deletes(),
            false,
            streamed.clone(),
        );
        let written = write::overwrite(
            &ctx,
            target,
            &self.m.target_uri,
            &self.p.name,
            write::FileShape {
                file_size: self.m.target_file_size,
                row_group_rows: self.m.target_row_group_rows,
                change_data_feed: self.m.change_data_feed,
                deletion_vectors: self.m.target_apply
                    == crate::config::pipeline::Apply::DeletionVectors,
                keys: roles.keys.clone(),
            },
            plan,
            write::OverwriteCommit { props, final_facts },
        )
        .instrument(info_span!("commit"))
        .await;
        // The write streams the source through the dedup; when it failed because the source
        // could not be read, that is the error to report (the stream only carries its text).
        let table = match (written, dedup::take_error(&d.scan_error)) {
            (Err(_), Some(e)) => return Err(RunError::scan(Phase::Read, &self.m.source_uri)(e)),
            (written, _) => written?,
        };
        self.a.summary.target_version = table.version();
        self.end_phase(Phase::Write)?;
        let (added, removed) = last_commit_files(&table).await;
        self.a.summary.num_files_added = added;
        self.a.summary.num_files_removed = removed;
        Ok(())
    }

    /// The counters of a reload, from the dedup's: every winner is new to the rebuilt table —
    /// live rows are inserts, deletes are tombstones (soft) or simply absent (hard).
    fn count_reload(
        &mut self,
        counts: &std::sync::Mutex<DedupCounts>,
        roles: &ColumnRoles,
    ) -> Result<(), RunError> {
        let c = *counts.lock().map_err(|_| RunError::Internal {
            phase: Phase::Dedup,
            message: "the dedup counters were poisoned by a panicked writer thread".into(),
        })?;
        self.c.num_inserted = c.winners - c.deleted_winners;
        (self.c.num_superseded, self.c.num_duplicates) = (c.superseded, c.duplicates);
        self.c.num_conflicts = c.conflicts;
        self.c.num_deleted = c.deleted_winners;
        // (the rebuilt table: every winner but a hard delete; none when nothing was committed)
        if self.a.summary.target_version.is_some() && !self.opts.dry_run {
            self.c.num_rows_written = if roles.hard_deletes() {
                c.winners - c.deleted_winners
            } else {
                c.winners
            };
        }
        self.c.watermark_after = c.watermark(roles.hard_deletes()).and_then(micros_to_time);
        Ok(())
    }

    /// The counts of the rules counted in the stream, now that it has been read.
    fn report_streamed(&mut self, streamed: Option<crate::keyed::expect::Streamed>) {
        if let Some(s) = streamed {
            let outcomes = s.outcomes();
            self.warn_failed(&outcomes);
            self.c.expectations = outcomes;
        }
    }
}

impl Run<'_, '_> {
    /// `canonical`'s partitions, each thinned chunk by chunk (the dropped rows counted into
    /// `counts`).
    async fn thinned(
        &self,
        canonical: DataFrame,
        roles: &ColumnRoles,
        counts: &Arc<std::sync::Mutex<DedupCounts>>,
    ) -> Result<DataFrame, RunError> {
        let q = RunError::query;
        let streams = canonical
            .clone()
            .execute_stream_partitioned()
            .await
            .map_err(q(Phase::Dedup))?;
        // (a plan over no files may have no partition: nothing to thin)
        let Some(schema) = streams.first().map(|s| s.schema()) else {
            return Ok(canonical);
        };
        let limit = match self.a.ctx.runtime_env().memory_pool.memory_limit() {
            datafusion::execution::memory_pool::MemoryLimit::Finite(bytes) => Some(bytes),
            _ => None,
        };
        let chunk = thin::chunk_rows(limit, streams.len());
        let mut parts: Vec<Arc<dyn PartitionStream>> = Vec::with_capacity(streams.len());
        for s in streams {
            parts.push(Arc::new(
                thin::Thinned::new(roles, s, counts.clone(), chunk)
                    .map_err(RunError::arrow(Phase::Dedup))?,
            ));
        }
        let table = StreamingTable::try_new(schema, parts).map_err(q(Phase::Dedup))?;
        self.a
            .ctx
            .read_table(Arc::new(table))
            .map_err(q(Phase::Dedup))
    }
}

/// The reload's scan, thinning and sort as they ran, with DataFusion's metrics per operator
/// (rows, time, spills: what `EXPLAIN ANALYZE` shows), in the debug log (`-vv`).
fn log_executed(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let shown = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
            plan.as_ref(),
        )
        .indent(true)
        .to_string();
        tracing::debug!("the reload's sort, as executed:\n{shown}");
    }
}

/// The facts of a streamed reload that are known only once every winner was written; the
/// commit (written last) carries them, like the run summary. A reload by MERGE (`by_merge`)
/// learns what it inserted, updated and deleted only after its commit: those stay out (null),
/// and delta-rs' own `operationMetrics` in the same commit hold them.
fn streamed_facts(
    counts: Arc<std::sync::Mutex<DedupCounts>>,
    hard_deletes: bool,
    by_merge: bool,
    streamed: Option<crate::keyed::expect::Streamed>,
) -> lake::facts::FinalFacts {
    Arc::new(move || {
        let c = *counts.lock().ok()?;
        let mut facts = serde_json::Map::new();
        if let Some(s) = &streamed {
            facts.insert(
                "expectations".into(),
                serde_json::to_value(s.outcomes()).unwrap_or_default(),
            );
        }
        if by_merge {
            for k in [
                "num_inserted",
                "num_updated",
                "num_deleted",
                "num_unchanged",
            ] {
                facts.insert(k.into(), serde_json::Value::Null);
            }
        } else {
            facts.insert(
                "num_inserted".into(),
                (c.winners - c.deleted_winners).into(),
            );
            facts.insert("num_deleted".into(), c.deleted_winners.into());
        }
        facts.insert("num_superseded".into(), c.superseded.into());
        facts.insert("num_duplicates".into(), c.duplicates.into());
        facts.insert("num_conflicts".into(), c.conflicts.into());
        facts.insert(
            "watermark_after".into(),
            c.watermark(hard_deletes)
                .and_then(micros_to_time)
                .map(|t| crate::report::rfc3339(&t))
                .into(),
        );
        Some(facts)
    })
}

/// Files added and removed by the table's latest commit (from its log entry).
async fn last_commit_files(table: &DeltaTable) -> (u64, u64) {
    match lake::read_commits(table, 1).await {
        Ok(entries) => entries
            .first()
            .map(|e| (e.files_added, e.files_removed))
            .unwrap_or((0, 0)),
        Err(_) => (0, 0),
    }
}

impl Run<'_, '_> {
    /// A full reload of a target that keeps a change data feed: one MERGE of every winner
    /// (`write::merge_all`), so the feed holds the difference, not every row.
    async fn reload_by_merge(
        mut self,
        target: DeltaTable,
        winners: DataFrame,
        roles: &ColumnRoles,
        counts: Arc<std::sync::Mutex<DedupCounts>>,
        scan_error: dedup::InputError,
        streamed: Option<crate::keyed::expect::Streamed>,
    ) -> Result<MergeCounters, RunError> {
        self.ensure_unchanged(&target).await?;
        let planned = target.version();
        let props = self.commit_properties();
        let facts = streamed_facts(counts.clone(), roles.hard_deletes(), true, streamed.clone());
        let target = lake::facts::with_final_facts(target, facts);
        let ctx = self.a.ctx.clone();
        let written = write::merge_all(&ctx, target, &self.m.target_uri, roles, winners, props)
            .instrument(info_span!("commit"))
            .await;
        let (table, metrics) = match (written, dedup::take_error(&scan_error)) {
            (Err(_), Some(e)) => return Err(RunError::scan(Phase::Read, &self.m.source_uri)(e)),
            (written, _) => written?,
        };
        // A reload that changes no row commits nothing (delta-rs skips the empty MERGE).
        self.a.summary.target_version = table.version().filter(|v| Some(*v) != planned);
        self.end_phase(Phase::Write)?;
        self.a.summary.num_files_added = metrics.num_target_files_added as u64;
        self.a.summary.num_files_removed = metrics.num_target_files_removed as u64;
        let c = *counts.lock().map_err(|_| RunError::Internal {
            phase: Phase::Dedup,
            message: "the dedup counters were poisoned by a panicked writer thread".into(),
        })?;
        self.c.num_inserted = metrics.num_target_rows_inserted as u64;
        self.c.num_updated = metrics.num_target_rows_updated as u64;
        self.c.num_deleted = metrics.num_target_rows_deleted as u64;
        self.c.num_unchanged = metrics.num_target_rows_copied as u64;
        self.c.num_rows_written = (metrics.num_target_rows_inserted
            + metrics.num_target_rows_updated
            + metrics.num_target_rows_copied) as u64;
        (self.c.num_superseded, self.c.num_duplicates) = (c.superseded, c.duplicates);
        self.c.num_conflicts = c.conflicts;
        self.c.watermark_after = c.watermark(roles.hard_deletes()).and_then(micros_to_time);
        self.report_streamed(streamed);
        Ok(self.finish())
    }
}
