//! The `aggregate` kind: a gold table of measures per event day and group, restated by whole
//! days (seeds 000 and 001: "late data is a small backfill that happens every day").
//!
//! plan → read → compare → write. The plan opens the source (pinned at its current version),
//! gold and its day status table, and picks the days: the lookback window of the logical date,
//! widened back to the oldest day an earlier run left open (so a day that turns final gets its
//! last restatement and its label), or `--from/--to`, or every day (`--full-reload`). The read
//! aggregates the source's live rows of those days (statistics on the event column prune the
//! rest). The compare checks, day by day, whether gold already holds exactly those rows. The
//! write replaces the days in one commit (Delta replace-where on the `event_date` partitions:
//! readers never see half a day), then rewrites the status table if any of its rows changed.
//! A rerun with nothing new commits nothing; a crash between the two commits is repaired by the
//! next run (gold then compares equal, the status does not).

mod adjust;
pub mod compute;
mod counters;
pub mod days;
mod local_date;
mod lookup;
mod plan;
pub mod status;
mod stream;
mod touched;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use chrono::{DateTime, NaiveDate, Utc};
use datafusion::prelude::SessionContext;
use tracing::info;

use crate::config::pipeline::aggregate::{AfterClose, EVENT_DATE};
use crate::config::pipeline::{Aggregate, Kind};
use crate::config::Pipeline;
use crate::lake;
use crate::run::definition::Definition;
use crate::run::{Attempt, Engine, Phase, Point, RunError, RunKind, RunOptions, Table};
pub use counters::AggregateCounters;
use days::Days;

impl RunKind for Aggregate {
    const KIND: Kind = Kind::Aggregate;
    type Counters = AggregateCounters;

    fn uris(&self) -> (&str, &str) {
        (&self.source_uri, &self.target_uri)
    }

    fn tables(&self) -> Vec<(Table, &str)> {
        vec![
            (Table::Target, &self.target_uri),
            (Table::Status, &self.status_uri),
            (Table::Adjustments, &self.adjustments_uri),
        ]
    }

    fn definition(&self) -> Definition {
        plan::definition(self)
    }

    fn context(&self, engine: &Engine) -> SessionContext {
        context(engine, self)
    }

    /// On success gold and its status table have at most one new commit each; on error
    /// nothing was committed to gold.
    async fn execute(&self, a: &mut Attempt<'_>) -> Result<AggregateCounters, RunError> {
        let (p, opts, now) = (a.p, a.opts, a.now);
        let mut run = Run {
            a,
            p,
            spec: self,
            opts,
            now,
            c: AggregateCounters::default(),
            keep_unconsumed: false,
            newest_logical: None,
            gold_version: None,
            source_table: None,
        };
        run.execute().await?;
        info!(
            days = run.c.num_days_recomputed,
            changed = run.c.num_days_changed,
            "aggregate finished"
        );
        Ok(run.c)
    }
}

/// The run's session. Its reads are bounded by ranges of the event column, which Parquet
/// bloom filters cannot answer (they answer equality): unless a `where` may ask one, they are
/// not read (a tidemark silver keeps them on its keys; reading them cost an 18-day run ~40 ms).
fn context(engine: &Engine, spec: &Aggregate) -> SessionContext {
    let ctx = engine.context();
    if spec.where_sql.is_none() {
        let state = ctx.state_ref();
        let mut state = state.write();
        state
            .config_mut()
            .options_mut()
            .execution
            .parquet
            .bloom_filter_on_read = false;
    }
    ctx
}

/// Days per aggregate of a full restatement: a month of groups in one hash table at a time.
const FULL_CHUNK_DAYS: i64 = 31;

struct Run<'r, 'a> {
    a: &'r mut Attempt<'a>,
    p: &'a Pipeline,
    spec: &'r Aggregate,
    opts: &'a RunOptions,
    now: DateTime<Utc>,
    c: AggregateCounters,
    /// The fingerprint of the source's table id, recorded with the version read.
    source_table: Option<i64>,
    /// The run leaves some source changes for a later run: its commits record the source
    /// version the last run read, not the one it read.
    keep_unconsumed: bool,
    /// The newest logical date of any run so far, this one included (recorded in its commits).
    newest_logical: Option<NaiveDate>,
    /// Gold's version before this run (`None`: no gold yet).
    gold_version: Option<u64>,
}

impl Run<'_, '_> {
    fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.a.end_phase(phase)
    }

    async fn execute(&mut self) -> Result<(), RunError> {
        let spec = self.spec;
        // plan
        let source = lake::open_required(&spec.source_uri, "source").await?;
        self.a.summary.source_version = source.version();
        let gold = lake::open_if_exists(&spec.target_uri).await?;
        let status_table = lake::open_if_exists(&spec.status_uri).await?;
        let adjustments = lake::open_if_exists(&spec.adjustments_uri).await?;
        let old_status = status::read(&self.a.ctx, status_table.as_ref(), &spec.status_uri).await?;
        let logical = days::logical_date(spec, self.opts.logical_date, self.now);
        let full = self.opts.full_reload || gold.is_none();
        self.gold_version = gold.as_ref().and_then(|g| g.version());
        self.a.mode_for(gold.is_some());
        self.source_table = Some(lake::record::table_fingerprint(
            &lake::record::table_id(&source)
                .map_err(RunError::delta(Phase::Plan, &spec.source_uri))?,
        ));
        // (the source's store first: the plan reads its change data feed)
        source
            .update_datafusion_session(&self.a.ctx.state())
            .map_err(RunError::delta(Phase::Plan, &spec.source_uri))?;
        // The pipeline's columns and lookups are checked against the tables first, then its
        // definition against gold's: a refused run warns about nothing it would have done.
        let df = crate::run::frame(&self.a.ctx, &source, &spec.source_uri, Phase::Read).await?;
        let df = lookup::apply(&self.a.ctx, self.p, spec, df).await?;
        if let (false, Some(g)) = (full, &gold) {
            self.a.check_definition(g, &spec.target_uri).await?;
        }
        let plan = self
            .plan_days(&source, status_table.as_ref(), &old_status, logical, full)
            .await?;
        self.c.logical_date = Some(logical);
        self.end_phase(Phase::Plan)?;

        // read: the days' groups from the source's live rows
        if full {
            return self
                .restate_all(
                    df,
                    gold,
                    status_table,
                    &old_status,
                    logical,
                    plan.days.open_from,
                )
                .await;
        }
        let mut read = plan.days.clone();
        read.set.extend(plan.adjust.iter().copied());
        let closed = status::closes(&old_status, spec.time_zone);
        let grouped = compute::grouped(
            compute::Source {
                p: self.p,
                spec,
                df,
                closed: &closed,
            },
            Some(&read),
            plan.days.open_from,
        )?;
        let schema = compute::gold_schema(&grouped);
        if let Some(g) = &gold {
            let rerun = format!(
                "tidemark run {}{}",
                self.p.path.display(),
                self.opts.var_args
            );
            write::check_schema(g, &schema, &spec.target_uri, &rerun)?;
        }
        // Gold's rows of the days are read back and fingerprinted at the same time (the
        // compare needs both).
        let prints = write::Fingerprints::new(schema.clone());
        let gold_days = async {
            let Some(g) = &gold else {
                return Ok(None);
            };
            let held = write::read_days(&self.a.ctx, g, &spec.target_uri, &plan.days).await?;
            let prints = prints.clone();
            tokio::task::spawn_blocking(move || prints.of(&held))
                .await
                .map_err(|e| RunError::Internal {
                    phase: Phase::Compare,
                    message: format!("fingerprinting gold's days: {e}"),
                })?
                .map(Some)
        };
        let (batches, held) = tokio::join!(grouped.collect(), gold_days);
        let batches = batches.map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
        let held = held?;
        let facts = compute::day_facts(&batches)?;
        let rows = compute::without_helpers(&batches)?;
        self.a.summary.num_source_rows_read = facts.values().map(|f| f.rows.max(0) as u64).sum();
        self.end_phase(Phase::Read)?;

        // compare: which days gold does not hold exactly so; what final days owe
        let span = plan.days.clone();
        let changed: BTreeSet<NaiveDate> = match &held {
            Some(held) => held.changed(&prints.of(&rows)?, &plan.days.set),
            // (no gold: a bootstrap, which `restate_all` ran)
            None => span.each().collect(),
        };
        let booked = self
            .adjustments_due(&plan, &closed, &rows, gold.as_ref(), adjustments.as_ref())
            .await?;
        self.count(&span, &changed, &old_status, &rows, &booked);
        let mut new_status = status::next(&old_status, &span, &facts, &changed, self.now);
        status::adjusted(&mut new_status, &booked, &facts, logical, self.now);
        self.count_status(&old_status, &new_status);
        self.end_phase(Phase::Compare)?;
        if self.opts.dry_run {
            return Ok(());
        }

        // write: adjustments, then gold's changed days in one commit, then the status table
        // (in that order, a crash anywhere converges on the rerun: each compares first)
        if !booked.is_empty() {
            self.c.adjustments_version = adjust::book(
                adjustments,
                &spec.adjustments_uri,
                booked,
                self.commit_properties(),
            )
            .await?;
        }
        self.a.failpoint(Point::Committed(Table::Adjustments))?;
        if let (false, Some(gold)) = (changed.is_empty(), gold) {
            let version = write::replace_days(
                gold,
                &spec.target_uri,
                write::rows_of(&rows, &changed)?,
                &schema,
                &changed,
                self.commit_properties(),
            )
            .await?;
            self.a.summary.target_version = version;
        }
        self.a.failpoint(Point::Committed(Table::Target))?;
        self.commit_status(status_table, &old_status, &new_status, false)
            .await?;
        self.end_phase(Phase::Write)?;
        Ok(())
    }

    /// A bootstrap or full reload: every day, streamed from the aggregate into gold's one
    /// overwrite commit (the day facts for the status table noted on the way).
    async fn restate_all(
        &mut self,
        df: datafusion::prelude::DataFrame,
        gold: Option<deltalake::DeltaTable>,
        status_table: Option<deltalake::DeltaTable>,
        old_status: &BTreeMap<NaiveDate, status::DayStatus>,
        logical: NaiveDate,
        open_from: NaiveDate,
    ) -> Result<(), RunError> {
        let spec = self.spec;
        let q = |e| RunError::query(Phase::Read)(e);
        let closed = status::closes(old_status, spec.time_zone);
        let source = |df: datafusion::prelude::DataFrame| compute::Source {
            p: self.p,
            spec,
            df,
            closed: &closed,
        };
        // The days in chunks, one aggregate after the other (the source is clustered by time
        // when it is a tidemark silver: each chunk's files are pruned by their statistics).
        let mut chunks = Vec::new();
        if let Some((first, last)) = compute::day_bounds(source(df.clone())).await? {
            let mut from = first;
            while from <= last {
                let to = (from + chrono::Duration::days(FULL_CHUNK_DAYS - 1)).min(last);
                let days = Days::range(spec, logical, from, to);
                chunks.push(compute::grouped(
                    source(df.clone()),
                    Some(&days),
                    open_from,
                )?);
                from = to + chrono::Duration::days(1);
            }
        }
        let grouped = compute::grouped(
            source(df),
            Some(&Days::only(spec, logical, None, [])),
            open_from,
        )?;
        let schema = compute::gold_schema(&grouped);
        let with_helper: arrow::datatypes::SchemaRef =
            Arc::new(grouped.schema().as_arrow().clone());
        let input: datafusion::execution::SendableRecordBatchStream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                with_helper,
                futures::stream::iter(chunks)
                    .then(|df| df.execute_stream())
                    .try_flatten(),
            ),
        );
        let observed = Arc::new(stream::Observed::new(schema.clone(), input));
        let seen = observed.seen();
        if self.opts.dry_run {
            let mut s = datafusion::physical_plan::streaming::PartitionStream::execute(
                observed.as_ref(),
                self.a.ctx.task_ctx(),
            );
            while let Some(b) = s.next().await {
                b.map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
            }
        } else {
            let table = datafusion::catalog::streaming::StreamingTable::try_new(
                observed.schema_ref(),
                vec![observed],
            )
            .map_err(q)?;
            let plan = self
                .a
                .ctx
                .read_table(Arc::new(table))
                .map_err(q)?
                .into_unoptimized_plan();
            let facts_seen = seen.clone();
            let facts: lake::facts::FinalFacts = Arc::new(move || {
                let days = facts_seen.lock().ok()?;
                let mut m = serde_json::Map::new();
                m.insert("num_days_changed".into(), days.len().into());
                m.insert(
                    "num_rows_written".into(),
                    days.values().map(|f| f.groups).sum::<i64>().into(),
                );
                Some(m)
            });
            self.a.summary.target_version = write::overwrite_all(
                &self.a.ctx,
                gold,
                &spec.target_uri,
                &self.p.name,
                plan,
                facts,
                self.commit_properties(),
            )
            .await?;
        }
        // Under `after_close: adjust` the closed days now hold everything booked for them: the
        // adjustments are folded in, and cleared (after gold's commit; an interrupted reload is
        // run again).
        if !self.opts.dry_run && self.spec.after_close == AfterClose::Adjust {
            if let Some(t) = lake::open_if_exists(&spec.adjustments_uri).await? {
                if lake::row_count_from_stats(&t).ok().flatten().unwrap_or(1) > 0 {
                    let (t, _) = t
                        .delete()
                        .with_commit_properties(self.commit_properties())
                        .await
                        .map_err(RunError::write(Phase::Write, &spec.adjustments_uri))?;
                    self.c.adjustments_version = t.version();
                    self.warn(format!(
                        "the closed days were rebuilt from the source, so the adjustments booked for them are now in gold: {} was cleared",
                        spec.adjustments_uri
                    ));
                }
            }
        }
        let facts = seen.lock().map(|d| d.clone()).unwrap_or_default();
        self.a.summary.num_source_rows_read = facts.values().map(|f| f.rows.max(0) as u64).sum();
        let first = facts.keys().next().copied().unwrap_or(logical);
        let last = facts
            .keys()
            .next_back()
            .copied()
            .unwrap_or(logical)
            .max(logical);
        let span = Days::range(spec, logical, first.min(last), last);
        let changed: BTreeSet<NaiveDate> = facts.keys().copied().collect();
        self.c.days_from = span.first();
        self.c.days_to = span.last();
        self.c.num_days_recomputed = span.count();
        self.c.num_days_changed = changed.len() as u64;
        self.c.num_rows_written = facts.values().map(|f| f.groups.max(0) as u64).sum();
        // Days gold held that the source no longer has are gone from gold too.
        let mut new_status = status::next(old_status, &span, &facts, &changed, self.now);
        new_status.retain(|d, _| facts.contains_key(d));
        // A reload rebuilds every day on purpose: not "restated after close" each.
        for (d, s) in new_status.iter_mut() {
            s.restated_after_close = old_status.get(d).map_or(0, |o| o.restated_after_close);
        }
        self.count_status(old_status, &new_status);
        self.end_phase(Phase::Write)?;
        // (always: the status table records what the reload read — a recreated source's new
        // table id included — and the next run reads that record)
        self.commit_status(status_table, old_status, &new_status, true)
            .await
    }

    /// The summary's counts of the new day status: days final for the first time, days open.
    fn count_status(
        &mut self,
        old: &BTreeMap<NaiveDate, status::DayStatus>,
        new: &BTreeMap<NaiveDate, status::DayStatus>,
    ) {
        self.c.num_days_final_now = new
            .values()
            .filter(|s| s.is_final() && !old.get(&s.event_date).is_some_and(|o| o.is_final()))
            .count() as u64;
        self.c.num_days_open = new.values().filter(|s| !s.is_final()).count() as u64;
    }

    /// Commits the new day status when it differs from the old, or `always` (never in a dry
    /// run).
    async fn commit_status(
        &mut self,
        table: Option<deltalake::DeltaTable>,
        old: &BTreeMap<NaiveDate, status::DayStatus>,
        new: &BTreeMap<NaiveDate, status::DayStatus>,
        always: bool,
    ) -> Result<(), RunError> {
        if self.opts.dry_run || (new == old && !always) {
            return Ok(());
        }
        self.c.status_version = status::write(
            table,
            &self.spec.status_uri,
            &self.p.name,
            new,
            self.commit_properties(),
        )
        .await?;
        Ok(())
    }

    fn warn(&mut self, message: String) {
        self.a.warn(message);
    }

    /// The summary's counts of what the compare decided.
    fn count(
        &mut self,
        span: &Days,
        changed: &BTreeSet<NaiveDate>,
        old_status: &BTreeMap<NaiveDate, status::DayStatus>,
        rows: &[arrow::array::RecordBatch],
        booked: &[arrow::array::RecordBatch],
    ) {
        self.c.days_from = span.first();
        self.c.days_to = span.last();
        self.c.num_days_recomputed = span.count();
        self.c.num_days_changed = changed.len() as u64;
        self.c.num_days_restated_after_close = changed
            .iter()
            .filter(|d| old_status.get(d).is_some_and(status::DayStatus::is_final))
            .count() as u64;
        self.c.num_days_adjusted = {
            let days: BTreeSet<NaiveDate> = status::days_of(booked).into_iter().collect();
            days.len() as u64
        };
        self.c.num_adjustment_rows = booked.iter().map(|b| b.num_rows() as u64).sum();
        self.c.num_rows_written = if changed.is_empty() {
            0
        } else {
            write::rows_of(rows, changed)
                .map(|b| b.iter().map(|b| b.num_rows() as u64).sum())
                .unwrap_or(0)
        };
    }

    /// The run's facts in each commit, what it read of the source (version and table), its
    /// definition, and the newest logical date of its runs.
    fn commit_properties(&self) -> deltalake::kernel::transaction::CommitProperties {
        let recorded = match self.opts.restate_from.is_some() || self.keep_unconsumed {
            true => self.c.previous_source_version,
            false => self.a.summary.source_version,
        };
        let record = lake::SourceRecord {
            version: recorded.map(|v| v as i64),
            table: self.source_table,
            deferred_floor: None,
        };
        let app = self.p.app_id();
        let newest = self
            .newest_logical
            .map(|d| plan::newest_logical_transaction(&app, d));
        self.a.commit_properties(
            &self.c,
            serde_json::Map::new(),
            &record,
            newest.into_iter().collect(),
        )
    }
}

/// The status table of `spec`, by day (for `tidemark status`).
pub async fn day_status(
    spec: &Aggregate,
) -> Result<BTreeMap<NaiveDate, status::DayStatus>, RunError> {
    let table = lake::open_if_exists(&spec.status_uri).await?;
    if table.is_none() {
        // (gold missing too: a wrong path, or the pipeline never ran)
        lake::open_required(&spec.target_uri, "target").await?;
    }
    status::read(&lake::session::context(), table.as_ref(), &spec.status_uri).await
}
