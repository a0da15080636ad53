//! The `cdc_merge` kind: change records (bronze) merged into one row per key (silver).
//!
//! plan → read → validate → dedup → compare → commit. The incremental run reads two things from
//! a source snapshot pinned for the whole run: the rows with `sequence > watermark - overlap`
//! (pushed into the scan, so files whose statistics exclude it are never opened), and every row
//! in the files that landed since the source version the previous run recorded (whatever its
//! sequence: late rows are never lost). A full reload reads the whole source and replaces the
//! target in one commit.

mod changes;
mod cow;
mod horizon;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use chrono::{DateTime, TimeZone, Utc};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{lit, Expr};
use datafusion::prelude::{ident, DataFrame, SessionContext};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::DeltaTable;
use futures::StreamExt;
use tracing::{info, info_span, warn, Instrument};

use crate::config::pipeline::CdcMerge;
use crate::config::Pipeline;
use crate::lake::datafile::FastPath;
use crate::lake::{self, storage, StatsMax, COMMIT_INFO_KEY};
use crate::report::{RunMode, RunSummary};
use crate::run::phase::{self, Phase, Timer};
use crate::run::render::row_count;
use crate::run::roles::{self, ColumnRoles};
use crate::run::{dedup, quarantine, validate, DedupCounts, Deduper, Engine, RunError, RunOptions};

const LATE_COLUMN: &str = "__tidemark_late";

/// One attempt of a `cdc_merge` run (the caller plans again after a lost commit race). On
/// success the target has at most one new commit; on error nothing was committed to it.
pub(crate) async fn run_once(
    p: &Pipeline,
    m: &CdcMerge,
    opts: &RunOptions,
    now: DateTime<Utc>,
    engine: &Engine,
    run_id: String,
) -> Result<RunSummary, RunError> {
    Run::new(p, m, opts, now, engine, run_id).execute().await
}

struct Run<'a> {
    p: &'a Pipeline,
    m: &'a CdcMerge,
    opts: &'a RunOptions,
    now: DateTime<Utc>,
    ctx: SessionContext,
    timer: Timer,
    summary: RunSummary,
    /// Source rows per the log's statistics (a full reload reads them all).
    source_rows: Option<u64>,
    /// The source's table id (`metaData.id`), recorded (as a fingerprint) with the version.
    source_table_id: Option<String>,
    /// Smallest sequence (µs) among the rows this run deferred, recorded so later runs read
    /// them again until they are due.
    deferred_floor: Option<i64>,
    /// Set when the run read whole files behind the slice without knowing which rows landed
    /// since the previous run: late rows are then the changed rows with a sequence up to it.
    late_bound: Option<i64>,
    /// What the target recorded about the source, once read.
    record: Option<lake::SourceRecord>,
}

fn micros_to_time(us: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_micros(us).single()
}

impl<'a> Run<'a> {
    fn new(
        p: &'a Pipeline,
        m: &'a CdcMerge,
        opts: &'a RunOptions,
        now: DateTime<Utc>,
        engine: &Engine,
        run_id: String,
    ) -> Self {
        let summary = RunSummary {
            run_id,
            pipeline: p.name.clone(),
            mode: RunMode::Incremental,
            dry_run: opts.dry_run,
            source_uri: m.source_uri.clone(),
            target_uri: m.target_uri.clone(),
            watermark_before: None,
            watermark_after: None,
            source_version: 0,
            previous_source_version: None,
            target_version: None,
            num_source_rows_read: 0,
            num_quarantined: 0,
            num_quarantined_new: 0,
            num_deferred: 0,
            num_superseded: 0,
            num_duplicates: 0,
            num_conflicts: 0,
            num_late_rows: 0,
            num_inserted: 0,
            num_updated: 0,
            num_deleted: 0,
            num_unchanged: 0,
            num_files_added: 0,
            num_files_removed: 0,
            num_replans: 0,
            num_files_candidate: 0,
            num_rows_copied: 0,
            num_rows_reencoded: 0,
            already_applied: false,
            duration_ms: 0,
            phases_ms: BTreeMap::new(),
            warnings: Vec::new(),
        };
        Run {
            p,
            m,
            opts,
            now,
            ctx: engine.context(),
            timer: Timer::default(),
            summary,
            source_rows: None,
            source_table_id: None,
            deferred_floor: None,
            late_bound: None,
            record: None,
        }
    }

    /// Records a phase's time; its end is where fault-injection tests stop a run.
    fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.timer.end(phase, self.path())
    }

    /// Which failpoints this run hits: the whole-source path or the incremental one.
    fn path(&self) -> phase::Path {
        match self.summary.mode {
            RunMode::Incremental => phase::Path::Incremental,
            RunMode::Bootstrap | RunMode::FullReload => phase::Path::FullReload,
        }
    }

    fn source_fingerprint(&self) -> Option<i64> {
        self.source_table_id
            .as_deref()
            .map(lake::record::table_fingerprint)
    }

    fn warn(&mut self, message: String) {
        warn!("{message}");
        self.summary.warnings.push(message);
    }

    async fn execute(mut self) -> Result<RunSummary, RunError> {
        // plan
        let (source, target) = async {
            let source = lake::open_required(&self.m.source_uri, "source").await?;
            let target = lake::open_if_exists(&self.m.target_uri).await?;
            Ok::<_, RunError>((source, target))
        }
        .instrument(info_span!("plan"))
        .await?;
        let source_version = source.version().unwrap_or(0);
        self.summary.source_version = source_version;
        let table_id = lake::record::table_id(&source)
            .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        self.source_table_id = Some(table_id);
        source
            .update_datafusion_session(&self.ctx.state())
            .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        let source_provider = source
            .table_provider()
            .await
            .map_err(RunError::query(Phase::Plan))?;
        let source_schema = source_provider.schema();
        let roles = ColumnRoles::new(self.p, self.m, &source_schema)?;
        self.source_rows = lake::row_count_from_stats(&source)
            .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        let seq_type = source_schema
            .field_with_name(roles.sequence())
            .map(|f| f.data_type().clone())
            .map_err(|e| RunError::query(Phase::Plan)(e.into()))?;

        let target = match target {
            Some(t) if self.opts.full_reload || self.has_run_before(&t).await? => Some(t),
            Some(t)
                if t.get_file_uris()
                    .map(|mut f| f.next().is_some())
                    .unwrap_or(false) =>
            {
                Some(t)
            }
            Some(t) => {
                // An empty table tidemark never wrote is bootstrapped like a missing one; keep
                // the handle so the overwrite becomes its next version.
                self.summary.mode = RunMode::Bootstrap;
                return self.full(source_provider, Some(t), &roles, &seq_type).await;
            }
            None => None,
        };
        if let Some(t) = &target {
            t.update_datafusion_session(&self.ctx.state())
                .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        }
        let Some(target) = target else {
            self.summary.mode = RunMode::Bootstrap;
            return self.full(source_provider, None, &roles, &seq_type).await;
        };
        if self.opts.full_reload {
            self.summary.mode = RunMode::FullReload;
            self.summary.watermark_before = self.watermark(&target, &roles).await?;
            return self
                .full(source_provider, Some(target), &roles, &seq_type)
                .await;
        }
        self.summary.mode = RunMode::Incremental;
        self.incremental(source, source_provider, target, &roles, &seq_type)
            .await
    }

    /// Whether a run of this pipeline already committed to `target` (it then records the
    /// source version it read). Such a target stays incremental even while it is empty.
    async fn has_run_before(&mut self, target: &DeltaTable) -> Result<bool, RunError> {
        Ok(self.recorded(target).await?.version.is_some())
    }

    /// What the target's commits recorded about the source (version read, table id, deferred
    /// rows); read once per run.
    async fn recorded(&mut self, target: &DeltaTable) -> Result<lake::SourceRecord, RunError> {
        if let Some(r) = self.record {
            return Ok(r);
        }
        let r = lake::record::read(target, &self.p.app_id())
            .await
            .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        self.record = Some(r);
        Ok(r)
    }

    /// Fails with a (re-plannable) conflict when another writer committed to the target after
    /// this run read it. delta-rs' own conflict check covers the remaining window up to the
    /// commit (a winning commit with this pipeline's app id is always a conflict).
    async fn ensure_unchanged(&self, target: &DeltaTable) -> Result<(), RunError> {
        let Some(planned) = target.version() else {
            return Ok(());
        };
        let latest = target
            .log_store()
            .get_latest_version(planned)
            .await
            .map_err(RunError::delta(Phase::Commit, &self.m.target_uri))?;
        if latest != planned {
            return Err(RunError::Conflict {
                uri: self.m.target_uri.clone(),
                planned,
                found: latest,
            });
        }
        Ok(())
    }

    /// `max(sequence)` of the target: from log statistics, scanning only when some file lacks them.
    async fn watermark(
        &mut self,
        target: &DeltaTable,
        roles: &ColumnRoles,
    ) -> Result<Option<DateTime<Utc>>, RunError> {
        let seq = roles.sequence();
        let stats = lake::max_from_stats(target, seq)
            .map_err(RunError::delta(Phase::Watermark, &self.m.target_uri))?;
        let micros = match stats {
            StatsMax::Max(us) => Some(us),
            StatsMax::Empty => None,
            StatsMax::Missing => {
                self.warn(format!(
                    "some target files have no statistics for `{seq}`; the watermark needed a scan of that column"
                ));
                let provider = target
                    .table_provider()
                    .await
                    .map_err(RunError::query(Phase::Watermark))?;
                let batches = self
                    .ctx
                    .read_table(provider)
                    .and_then(|df| {
                        df.aggregate(
                            vec![],
                            vec![datafusion::functions_aggregate::expr_fn::max(ident(seq))],
                        )
                    })
                    .map_err(RunError::query(Phase::Watermark))?
                    .collect()
                    .await
                    .map_err(RunError::query(Phase::Watermark))?;
                batches
                    .first()
                    .and_then(|b| {
                        arrow::compute::cast(
                            b.column(0),
                            &arrow::datatypes::DataType::Timestamp(
                                arrow::datatypes::TimeUnit::Microsecond,
                                None,
                            ),
                        )
                        .ok()
                    })
                    .and_then(|a| {
                        let a = arrow::array::AsArray::as_primitive::<
                            arrow::datatypes::TimestampMicrosecondType,
                        >(a.as_ref())
                        .clone();
                        arrow::array::Array::is_valid(&a, 0).then(|| a.value(0))
                    })
            }
        };
        Ok(micros.and_then(micros_to_time))
    }

    /// Compares the target's columns with what the pipeline now produces. New source columns
    /// are returned (to be added by the merge) when `on_schema_change: add_new_columns`;
    /// dropped or retyped columns are always errors, because merging would silently lose or
    /// change data.
    fn schema_drift(
        &self,
        target_schema: &arrow::datatypes::Schema,
        roles: &ColumnRoles,
    ) -> Result<Vec<String>, RunError> {
        use crate::config::pipeline::DELETED_COLUMN;
        use crate::config::SchemaChange;
        let drift = |message: String| RunError::SchemaDrift {
            uri: self.m.target_uri.clone(),
            message,
        };
        let produced = |c: &str| roles.target_columns.iter().any(|t| t == c);
        let dropped: Vec<&str> = target_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .filter(|c| !produced(c))
            .collect();
        if !dropped.is_empty() {
            return Err(drift(format!(
                "column(s) {} are in the target but the pipeline no longer produces them (dropped from the source, or newly excluded); tidemark never drops target columns on its own: restore them upstream, or rebuild with `--full-reload` if the change is intended",
                dropped.join(", ")
            )));
        }
        let mut retyped = Vec::new();
        let mut added = Vec::new();
        for c in &roles.target_columns {
            let want = roles
                .canonical
                .field_with_name(c)
                .map(|f| storage::storage_type(f.data_type()))
                .map_err(|e| RunError::arrow(Phase::Plan)(e))?;
            match target_schema.field_with_name(c) {
                Ok(f) => {
                    let have = storage::storage_type(f.data_type());
                    if have != want {
                        retyped.push(format!(
                            "`{c}` is {have} in the target but {want} in the source"
                        ));
                    }
                }
                Err(_) if c == DELETED_COLUMN => {
                    return Err(drift(format!(
                        "the pipeline now writes soft-delete tombstones but the target has no `{DELETED_COLUMN}` column; rebuild with `--full-reload`"
                    )));
                }
                Err(_) => added.push(c.clone()),
            }
        }
        if !retyped.is_empty() {
            return Err(drift(format!(
                "column type changed: {}; nothing was written. Cast the column back upstream, or rebuild with `--full-reload` if the new type is intended",
                retyped.join("; ")
            )));
        }
        if !added.is_empty() && self.m.on_schema_change == SchemaChange::Fail {
            return Err(drift(format!(
                "the source has new column(s) {} that the target lacks; set `on_schema_change: add_new_columns` in {} to add them, list them in `columns.exclude`, or rebuild with `--full-reload`",
                added.join(", "),
                self.p.path.display()
            )));
        }
        Ok(added)
    }

    async fn incremental(
        mut self,
        source: DeltaTable,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        target: DeltaTable,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<RunSummary, RunError> {
        let q = RunError::query;
        let target_provider = target.table_provider().await.map_err(q(Phase::Plan))?;
        let new_columns = self.schema_drift(&target_provider.schema(), roles)?;
        if !new_columns.is_empty() {
            self.warn(format!(
                "adding new source column(s) {} to the target (on_schema_change: add_new_columns)",
                new_columns.join(", ")
            ));
        }
        let record = self.recorded(&target).await?;
        let previous = record.version;
        self.summary.previous_source_version = previous;
        let target_max = self.watermark(&target, roles).await?;
        let read = horizon::plan(horizon::Inputs {
            p: self.p,
            m: self.m,
            source: &source,
            source_version: self.summary.source_version,
            source_table_id: self.source_table_id.as_deref().unwrap_or_default(),
            record,
            watermark: target_max,
            now: self.now,
        })
        .await?;
        for w in read.warnings {
            self.warn(w);
        }
        let watermark = read.watermark;
        self.summary.watermark_before = watermark;
        let seq = roles.sequence();
        let lo = read.lo;
        if read.late_is_approximate {
            self.late_bound = lo;
        }
        info!(watermark = ?watermark, lo = ?lo, previous_source_version = ?previous, source_version = self.summary.source_version, "planned incremental run");
        self.end_phase(Phase::Plan)?;

        // read: the overlap slice, plus every row landed since the previous run behind it.
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
                .ctx
                .read_table(source_provider.clone())
                .and_then(|df| df.filter(ident(seq).gt(roles::timestamp_lit(seq_type, lo)))),
            None => self.ctx.read_table(source_provider.clone()),
        }
        .and_then(|df| df.with_column(LATE_COLUMN, lit(false)))
        .map_err(q(Phase::Read))?;
        let landed_provider = match read.landed {
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
        let landed = match landed_provider {
            Some(provider) => Some(
                self.ctx
                    .read_table(provider)
                    .and_then(|df| df.filter(behind(lo)))
                    .and_then(|df| df.with_column(LATE_COLUMN, lit(true)))
                    .map_err(q(Phase::Read))?,
            ),
            None => None,
        };
        let input = match landed {
            Some(l) => slice.union(l).map_err(q(Phase::Read))?,
            None => slice,
        };
        let batches = input
            .collect()
            .instrument(info_span!("read"))
            .await
            .map_err(RunError::scan(Phase::Read, &self.m.source_uri))?;
        self.summary.num_source_rows_read = row_count(&batches);
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
        let input = self.ctx.read_table(Arc::new(mem)).map_err(q(Phase::Read))?;
        self.end_phase(Phase::Read)?;

        // validate
        let due = validate::due_micros(self.now, self.m.max_future_skew);
        let split = validate::split(input, roles, seq_type, due)?;
        self.summary.num_late_rows = split
            .valid
            .clone()
            .filter(ident(LATE_COLUMN))
            .map_err(q(Phase::Validate))?
            .count()
            .await
            .map_err(q(Phase::Validate))? as u64;
        let rejected = split
            .rejected
            .drop_columns(&[LATE_COLUMN])
            .map_err(q(Phase::Validate))?;
        self.quarantine(rejected).await?;
        let (deferred, floor) = validate::deferred_summary(split.deferred, roles)
            .await
            .map_err(q(Phase::Validate))?;
        self.summary.num_deferred = deferred;
        self.deferred_floor = floor;
        self.end_phase(Phase::Validate)?;

        // dedup
        let sorted = split
            .valid
            .select(roles.canonical_exprs())
            .and_then(|df| df.sort(roles.dedup_sort()))
            .map_err(q(Phase::Dedup))?;
        let mut stream = sorted.execute_stream().await.map_err(q(Phase::Dedup))?;
        let mut deduper = Deduper::new(roles).map_err(RunError::arrow(Phase::Dedup))?;
        let mut winners = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(q(Phase::Dedup))?;
            let batch = storage::cast_to(&batch, &roles.canonical)
                .map_err(RunError::arrow(Phase::Dedup))?;
            winners.push(
                deduper
                    .push(&batch)
                    .map_err(RunError::arrow(Phase::Dedup))?,
            );
        }
        winners.extend(deduper.finish().map_err(RunError::arrow(Phase::Dedup))?);
        let counts = deduper.counts();
        (self.summary.num_superseded, self.summary.num_duplicates) =
            (counts.superseded, counts.duplicates);
        self.summary.num_conflicts = counts.conflicts;
        let winners = arrow::compute::concat_batches(&roles.canonical, &winners)
            .map_err(RunError::arrow(Phase::Dedup))?;
        self.end_phase(Phase::Dedup)?;

        // What the target really holds, not the clamped planning watermark.
        let before = target_max.map(|w| w.timestamp_micros());
        let fast = if new_columns.is_empty() {
            FastPath::check(&target).map_err(RunError::delta(Phase::Compare, &self.m.target_uri))?
        } else {
            None
        };
        if let Some(fast) = fast {
            self.apply_copy_on_write(target, &fast, roles, &winners, &deduper, previous, before)
                .await?;
        } else {
            self.apply_with_merge(target, roles, &winners, &deduper, previous, before)
                .await?;
        }
        Ok(self.finish())
    }

    fn record_outcome(
        &mut self,
        counts: [u64; 5],
        max_sequence: Option<i64>,
        changed_sequences: &[i64],
        before: Option<i64>,
        previous: Option<i64>,
    ) {
        let [inserted, updated, deleted, unchanged, conflicts] = counts;
        if let Some(lo) = self.late_bound {
            // Every landed row was flagged late (log gap, recreated source): count those that
            // changed something and that the slice could not have found.
            self.summary.num_late_rows =
                changed_sequences.iter().filter(|s| **s <= lo).count() as u64;
        }
        self.summary.num_conflicts += conflicts;
        self.summary.num_inserted = inserted;
        self.summary.num_updated = updated;
        self.summary.num_deleted = deleted;
        self.summary.num_unchanged = unchanged;
        self.summary.watermark_after = before.max(max_sequence).and_then(micros_to_time);
        self.summary.already_applied = inserted + updated + deleted == 0
            && previous == Some(self.summary.source_version as i64);
    }

    /// The normal path: only files holding a changed key are rewritten, and in them only the
    /// row groups holding one are re-encoded.
    #[allow(clippy::too_many_arguments)]
    async fn apply_copy_on_write(
        &mut self,
        target: DeltaTable,
        fast: &FastPath,
        roles: &ColumnRoles,
        winners: &RecordBatch,
        deduper: &Deduper,
        previous: Option<i64>,
        before: Option<i64>,
    ) -> Result<(), RunError> {
        let applied = cow::apply(
            &cow::Target {
                table: &target,
                uri: &self.m.target_uri,
                fast,
                row_group_rows: self.m.target_row_group_rows,
                parallelism: self.ctx.state().config().target_partitions(),
            },
            roles,
            winners,
            deduper.conflict_keys(),
            self.opts.dry_run,
        )
        .instrument(info_span!("apply"))
        .await?;
        self.record_outcome(
            [
                applied.inserted,
                applied.updated,
                applied.deleted,
                applied.unchanged,
                applied.conflicts,
            ],
            applied.max_sequence,
            &applied.changed_sequences,
            before,
            previous,
        );
        self.summary.num_files_candidate = applied.files_candidate;
        self.summary.num_rows_copied = applied.rows_copied;
        self.summary.num_rows_reencoded = applied.rows_reencoded;
        self.end_phase(Phase::Compare)?;
        if applied.is_empty() || self.opts.dry_run {
            return Ok(());
        }
        crate::failpoint::hit(&phase::Path::Incremental.before(Phase::Commit))?;
        self.ensure_unchanged(&target).await?;
        self.summary.num_files_added = applied.files_added;
        self.summary.num_files_removed = applied.files_removed;
        let props = self.commit_properties();
        let version = cow::commit(&target, &self.m.target_uri, applied, props)
            .instrument(info_span!("commit"))
            .await?;
        self.summary.target_version = Some(version);
        self.end_phase(Phase::Commit)
    }

    /// Schema evolution (`on_schema_change: add_new_columns`) goes through delta-rs' MERGE,
    /// which adds the new columns to the table metadata in the same commit.
    async fn apply_with_merge(
        &mut self,
        target: DeltaTable,
        roles: &ColumnRoles,
        winners: &RecordBatch,
        deduper: &Deduper,
        previous: Option<i64>,
        before: Option<i64>,
    ) -> Result<(), RunError> {
        let cs = changes::detect(
            &self.ctx,
            &target,
            &self.m.target_uri,
            roles,
            winners,
            deduper.conflict_keys(),
        )
        .await?;
        self.record_outcome(
            [
                cs.inserted,
                cs.updated,
                cs.deleted,
                cs.unchanged,
                cs.conflicts,
            ],
            cs.max_sequence,
            &cs.changed_sequences,
            before,
            previous,
        );
        self.end_phase(Phase::Compare)?;
        if cs.is_empty() || self.opts.dry_run {
            return Ok(());
        }
        crate::failpoint::hit(&phase::Path::Incremental.before(Phase::Commit))?;
        self.ensure_unchanged(&target).await?;
        let props = self.commit_properties();
        let (table, metrics) = write::merge(
            &self.ctx,
            target,
            &self.m.target_uri,
            roles,
            cs.rows,
            props,
            true,
        )
        .instrument(info_span!("commit"))
        .await?;
        self.summary.target_version = table.version();
        self.summary.num_files_added = metrics.num_target_files_added as u64;
        self.summary.num_files_removed = metrics.num_target_files_removed as u64;
        self.end_phase(Phase::Commit)
    }

    async fn full(
        mut self,
        source_provider: Arc<dyn datafusion::catalog::TableProvider>,
        target: Option<DeltaTable>,
        roles: &ColumnRoles,
        seq_type: &arrow::datatypes::DataType,
    ) -> Result<RunSummary, RunError> {
        let q = RunError::query;
        if let Some(t) = &target {
            t.update_datafusion_session(&self.ctx.state())
                .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        }
        self.end_phase(Phase::Plan)?;
        let input = self
            .ctx
            .read_table(source_provider)
            .map_err(q(Phase::Read))?;
        let due = validate::due_micros(self.now, self.m.max_future_skew);
        let split = validate::split(input.clone(), roles, seq_type, due)?;
        self.summary.num_source_rows_read = match self.source_rows {
            Some(rows) => rows,
            None => input
                .count()
                .await
                .map_err(RunError::scan(Phase::Read, &self.m.source_uri))?
                as u64,
        };
        self.end_phase(Phase::Read)?;
        self.quarantine(split.rejected).await?;
        let (deferred, floor) = validate::deferred_summary(split.deferred, roles)
            .await
            .map_err(RunError::scan(Phase::Validate, &self.m.source_uri))?;
        self.summary.num_deferred = deferred;
        self.deferred_floor = floor;
        self.end_phase(Phase::Validate)?;

        let sorted = split
            .valid
            .select(roles.canonical_exprs())
            .and_then(|df| df.sort(roles.dedup_sort()))
            .map_err(q(Phase::Dedup))?;
        let stream = sorted.execute_stream().await.map_err(q(Phase::Dedup))?;
        let partition =
            dedup::DedupPartition::new(roles, stream).map_err(RunError::arrow(Phase::Dedup))?;
        let counts = partition.counts();
        let scan_error = partition.input_error();
        let table = StreamingTable::try_new(partition.schema_ref(), vec![Arc::new(partition)])
            .map_err(q(Phase::Dedup))?;
        let mut winners = self
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
        let winners = winners.select(out_cols).map_err(q(Phase::Dedup))?;

        if self.opts.dry_run {
            let mut stream = winners.execute_stream().await.map_err(q(Phase::Dedup))?;
            while let Some(b) = stream.next().await {
                if let Err(e) = b {
                    return Err(match dedup::take_error(&scan_error) {
                        Some(source) => RunError::scan(Phase::Read, &self.m.source_uri)(source),
                        None => q(Phase::Dedup)(e),
                    });
                }
            }
            self.end_phase(Phase::Dedup)?;
        } else {
            // The counts of a streamed reload are known only after the write; its commit
            // carries what is known before it, and delta-rs adds the written row count.
            if let Some(t) = &target {
                self.ensure_unchanged(t).await?;
            }
            let props = self.commit_properties();
            let plan = winners.into_unoptimized_plan();
            let ctx = self.ctx.clone();
            let final_facts = streamed_facts(counts.clone(), roles.hard_deletes());
            let written = write::overwrite(
                &ctx,
                target,
                &self.m.target_uri,
                &self.p.name,
                write::FileShape {
                    file_size: self.m.target_file_size,
                    row_group_rows: self.m.target_row_group_rows,
                },
                plan,
                write::OverwriteCommit { props, final_facts },
            )
            .instrument(info_span!("commit"))
            .await;
            // The write streams the source through the dedup; when it failed because the source
            // could not be read, that is the error to report (the stream only carries its text).
            let table = match (written, dedup::take_error(&scan_error)) {
                (Err(_), Some(e)) => {
                    return Err(RunError::scan(Phase::Read, &self.m.source_uri)(e))
                }
                (written, _) => written?,
            };
            self.summary.target_version = table.version();
            self.end_phase(Phase::Write)?;
            let (added, removed) = last_commit_files(&table).await;
            self.summary.num_files_added = added;
            self.summary.num_files_removed = removed;
        }
        let c = *counts.lock().map_err(|_| RunError::Arrow {
            phase: Phase::Dedup,
            source: arrow::error::ArrowError::ComputeError("dedup counters poisoned".into()),
        })?;
        // Every winner is new to the rebuilt table: live rows are inserts, deletes are tombstones
        // (soft) or simply absent (hard).
        self.summary.num_inserted = c.winners - c.deleted_winners;
        (self.summary.num_superseded, self.summary.num_duplicates) = (c.superseded, c.duplicates);
        self.summary.num_conflicts = c.conflicts;
        self.summary.num_deleted = c.deleted_winners;
        self.summary.watermark_after = c.watermark(roles.hard_deletes()).and_then(micros_to_time);
        Ok(self.finish())
    }

    async fn quarantine(&mut self, rejected: DataFrame) -> Result<(), RunError> {
        let batches: Vec<RecordBatch> = rejected
            .collect()
            .await
            .map_err(RunError::scan(Phase::Validate, &self.m.source_uri))?;
        let outcome = quarantine::store(
            &self.ctx,
            &self.m.quarantine.uri,
            batches,
            &self.summary.run_id,
            self.now,
            self.opts.dry_run,
        )
        .await?;
        self.summary.num_quarantined = outcome.rejected;
        self.summary.num_quarantined_new = outcome.new;
        if outcome.rejected == 0 {
            return Ok(());
        }
        let read = self.summary.num_source_rows_read.max(1);
        let q = &self.m.quarantine;
        let over_rows = q.max_rows.is_some_and(|m| outcome.rejected > m);
        let over_fraction = q
            .max_fraction
            .is_some_and(|f| outcome.rejected as f64 / read as f64 > f);
        if over_rows || over_fraction {
            let limit = match (q.max_rows, q.max_fraction) {
                (Some(r), Some(f)) => format!("max_rows {r}, max_fraction {f}"),
                (Some(r), None) => format!("max_rows {r}"),
                (None, Some(f)) => format!("max_fraction {f}"),
                (None, None) => String::new(),
            };
            return Err(RunError::QuarantineLimit {
                rejected: outcome.rejected,
                read: self.summary.num_source_rows_read,
                limit,
                uri: q.uri.clone(),
            });
        }
        self.warn(format!(
            "{} rows failed validation ({} newly quarantined in {})",
            outcome.rejected, outcome.new, self.m.quarantine.uri
        ));
        Ok(())
    }

    /// Commit metadata and the application transaction recording the source version read.
    fn commit_properties(&self) -> CommitProperties {
        let s = &self.summary;
        let facts = serde_json::json!({
            "run_id": s.run_id,
            "pipeline": s.pipeline,
            "mode": s.mode,
            "watermark_before": s.watermark_before.map(|t| crate::report::rfc3339(&t)),
            "watermark_after": s.watermark_after.map(|t| crate::report::rfc3339(&t)),
            "source_version": s.source_version,
            "previous_source_version": s.previous_source_version,
            "num_source_rows_read": s.num_source_rows_read,
            "num_quarantined": s.num_quarantined,
            "num_deferred": s.num_deferred,
            "num_late_rows": s.num_late_rows,
            "num_inserted": s.num_inserted,
            "num_updated": s.num_updated,
            "num_deleted": s.num_deleted,
            "num_conflicts": s.num_conflicts,
            "num_superseded": s.num_superseded,
            "num_duplicates": s.num_duplicates,
            "source_table_id": self.source_table_id,
            "deferred_floor": self.deferred_floor.and_then(micros_to_time).map(|t| crate::report::rfc3339(&t)),
        });
        let record = lake::SourceRecord {
            version: Some(s.source_version as i64),
            table: self.source_fingerprint(),
            deferred_floor: self.deferred_floor,
        };
        CommitProperties::default()
            .with_metadata([(COMMIT_INFO_KEY.to_string(), facts)])
            .with_application_transactions(lake::record::transactions(&self.p.app_id(), &record))
    }

    fn finish(mut self) -> RunSummary {
        self.summary.duration_ms = self.timer.elapsed_ms();
        self.summary.phases_ms = std::mem::take(&mut self.timer).into_ms();
        info!(
            mode = %self.summary.mode,
            target_version = ?self.summary.target_version,
            inserted = self.summary.num_inserted,
            updated = self.summary.num_updated,
            deleted = self.summary.num_deleted,
            late = self.summary.num_late_rows,
            "run finished"
        );
        self.summary
    }
}

/// The facts of a streamed reload that are known only once every winner was written; the
/// commit (written last) carries them, like the run summary.
fn streamed_facts(
    counts: Arc<std::sync::Mutex<DedupCounts>>,
    hard_deletes: bool,
) -> lake::facts::FinalFacts {
    Arc::new(move || {
        let c = *counts.lock().ok()?;
        let mut facts = serde_json::Map::new();
        facts.insert(
            "num_inserted".into(),
            (c.winners - c.deleted_winners).into(),
        );
        facts.insert("num_deleted".into(), c.deleted_winners.into());
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
