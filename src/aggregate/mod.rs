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
//! next run (gold then compares equal, the status does not; a booking the status missed is
//! counted from the adjustments table's log: `repair`).

mod adjust;
pub mod compute;
mod counters;
pub mod days;
mod freeze;
mod late_rows;
mod local_date;
mod lookup;
mod plan;
mod reload;
mod repair;
pub mod status;
mod stream;
mod touched;
mod unplaced;
pub mod watermark;
pub mod window;
pub mod window_status;
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
        let mut tables = vec![
            (Table::Target, self.target_uri.as_str()),
            (Table::Status, &self.status_uri),
            (Table::Adjustments, &self.adjustments_uri),
            (Table::Quarantine, &self.quarantine.uri),
        ];
        tables.extend(self.late_rows.as_deref().map(|u| (Table::LateRows, u)));
        tables
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
        // (with `watermark:` the data's clock is read first: it sets the days' finality)
        let ticked;
        let (spec, source, clock) = match self.watermark {
            None => (self, None, None),
            Some(w) => {
                let (effective, source, clock) = watermark::by_watermark(self, w, a, now).await?;
                ticked = effective;
                (&ticked, Some(source), clock)
            }
        };
        let mut run = Run {
            a,
            p,
            spec,
            opts,
            now,
            c: AggregateCounters::default(),
            keep_unconsumed: false,
            newest_logical: None,
            gold_version: None,
            source_table: None,
            source,
            clock,
            adjustments_seen: None,
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

/// What the plan opened and chose.
struct Opened {
    gold: Option<deltalake::DeltaTable>,
    status_table: Option<deltalake::DeltaTable>,
    adjustments: Option<deltalake::DeltaTable>,
    old_status: BTreeMap<NaiveDate, status::DayStatus>,
    /// Bookings of earlier runs the status does not count yet (see `repair`).
    missed: repair::Missed,
    /// When each closed day closed (from the status table).
    closed: BTreeMap<NaiveDate, i64>,
    logical: NaiveDate,
    /// A bootstrap or full reload: every day restated.
    full: bool,
    /// The source's live rows, with the lookups applied.
    df: datafusion::prelude::DataFrame,
    plan: plan::Plan,
}

/// What the read found: the days' rows as gold would hold them, with their facts, and gold's
/// fingerprints of those days.
struct ReadDays {
    schema: arrow::datatypes::SchemaRef,
    prints: write::Fingerprints,
    held: Option<write::Prints>,
    facts: BTreeMap<NaiveDate, compute::DayFacts>,
    rows: Vec<arrow::array::RecordBatch>,
    /// What final windows of open days owe (see [`freeze`]).
    frozen_booked: Vec<arrow::array::RecordBatch>,
}

/// What the compare decided.
struct Compared {
    changed: BTreeSet<NaiveDate>,
    /// The source rows of final days and windows gold has not counted (`late_rows:`).
    late: Vec<arrow::array::RecordBatch>,
    booked: Vec<arrow::array::RecordBatch>,
    new_status: BTreeMap<NaiveDate, status::DayStatus>,
}

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
    /// The source, when opened before the plan (to read the data's clock).
    source: Option<deltalake::DeltaTable>,
    /// The data's clock (`watermark:`).
    clock: Option<watermark::Ticked>,
    /// The adjustments table's version before this run (`None`: no table yet).
    adjustments_seen: Option<u64>,
}

impl Run<'_, '_> {
    fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.a.end_phase(phase)
    }

    /// plan → read → compare → write; a bootstrap or full reload restates every day.
    async fn execute(&mut self) -> Result<(), RunError> {
        let o = self.plan().await?;
        if o.full {
            self.quarantine_unplaced(&o.df, true).await?;
            return self.restate_all(o).await;
        }
        let read = self.read_days(&o).await?;
        self.quarantine_unplaced(&o.df, false).await?;
        let compared = self.compare_days(&o, &read).await?;
        if self.opts.dry_run {
            return self.store_late_rows(compared.late).await;
        }
        self.write_days(o, read, compared).await
    }

    /// Opens the source (pinned), gold, its status and adjustments, checks the pipeline's
    /// columns, lookups and definition against them, and picks the days.
    async fn plan(&mut self) -> Result<Opened, RunError> {
        let spec = self.spec;
        let source = match self.source.take() {
            Some(s) => s,
            None => lake::open_required(&spec.source_uri, "source").await?,
        };
        self.a.summary.source_version = source.version();
        let gold = lake::open_if_exists(&spec.target_uri).await?;
        let status_table = lake::open_if_exists(&spec.status_uri).await?;
        let adjustments = lake::open_if_exists(&spec.adjustments_uri).await?;
        let old_status = status::read(&self.a.ctx, status_table.as_ref(), &spec.status_uri).await?;
        let logical = match &self.clock {
            Some(t) => t.logical,
            None => days::logical_date(spec, self.opts.logical_date, self.now),
        };
        self.count_clock();
        // A bootstrap always commits the status table after gold: gold without it is a
        // bootstrap killed between the two, which runs again (an incremental run would write
        // the status of its window only, never of the days the bootstrap closed).
        let bootstrapped = gold.is_some() && status_table.is_some();
        let full = self.opts.full_reload || !bootstrapped;
        self.gold_version = gold.as_ref().and_then(|g| g.version());
        self.a.mode_for(bootstrapped);
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
            // (the columns, filters and `where` first: a misspelt column is that, not a
            // definition change to rebuild for; planning the aggregate reads nothing)
            let logical_day = days::Days::only(spec, logical, None, []);
            compute::grouped(
                compute::Source {
                    p: self.p,
                    spec,
                    df: df.clone(),
                    closed: &BTreeMap::new(),
                    final_before: None,
                },
                Some(&logical_day),
                logical,
            )?;
            self.a.check_definition(g, &spec.target_uri).await?;
        }
        let mut plan = self
            .plan_days(&source, status_table.as_ref(), &old_status, logical, full)
            .await?;
        let missed = self
            .missed_bookings(status_table.as_ref(), adjustments.as_ref())
            .await?;
        repair::widen(&mut plan, &missed);
        self.adjustments_seen = adjustments.as_ref().and_then(|t| t.version());
        self.c.logical_date = Some(logical);
        self.end_phase(Phase::Plan)?;
        Ok(Opened {
            gold,
            status_table,
            adjustments,
            closed: status::closes(&old_status, spec.time_zone),
            old_status,
            missed,
            logical,
            full,
            df,
            plan,
        })
    }

    /// The days' groups from the source's live rows, and gold's rows of those days read back
    /// and fingerprinted at the same time (the compare needs both).
    async fn read_days(&mut self, o: &Opened) -> Result<ReadDays, RunError> {
        let spec = self.spec;
        let mut read = o.plan.days.clone();
        read.set.extend(o.plan.adjust.iter().copied());
        let grouped = compute::grouped(
            compute::Source {
                p: self.p,
                spec,
                df: o.df.clone(),
                closed: &o.closed,
                final_before: self.clock.and_then(|t| t.windows_final_before),
            },
            Some(&read),
            o.plan.days.open_from,
        )?;
        let schema = compute::gold_schema(&grouped);
        if let Some(g) = &o.gold {
            let rerun = format!(
                "tidemark run {}{}",
                self.p.path.display(),
                self.opts.var_args
            );
            write::check_schema(g, &schema, &spec.target_uri, &rerun)?;
        }
        let prints = write::Fingerprints::new(schema.clone());
        let gold_days = async {
            let Some(g) = &o.gold else {
                return Ok(None);
            };
            let held = write::read_days(&self.a.ctx, g, &spec.target_uri, &o.plan.days).await?;
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
        let frozen = self.freeze_windows(o, rows).await?;
        self.end_phase(Phase::Read)?;
        Ok(ReadDays {
            schema,
            prints,
            held,
            facts,
            rows: frozen.rows,
            frozen_booked: frozen.booked,
        })
    }

    /// Which days gold does not hold exactly so, what final days owe (adjustments), and the
    /// day status after the run.
    async fn compare_days(&mut self, o: &Opened, r: &ReadDays) -> Result<Compared, RunError> {
        let span = o.plan.days.clone();
        let changed: BTreeSet<NaiveDate> = match &r.held {
            Some(held) => held.changed(&r.prints.of(&r.rows)?, &o.plan.days.set),
            // (no gold: a bootstrap, which `restate_all` ran)
            None => span.each().collect(),
        };
        let mut booked = self
            .adjustments_due(
                &o.plan,
                &o.closed,
                &r.rows,
                o.gold.as_ref(),
                o.adjustments.as_ref(),
            )
            .await?;
        booked.extend(r.frozen_booked.iter().cloned());
        self.count(&span, &changed, &o.old_status, &r.rows, &booked);
        let mut new_status = status::next(&o.old_status, &span, &r.facts, &changed, self.now);
        let run_id = &self.a.summary.run_id;
        let runs = repair::runs_by_day(&o.missed, status::days_of(&booked), run_id);
        status::adjusted(&mut new_status, &runs, &r.facts, o.logical, self.now);
        self.count_status(&o.old_status, &new_status);
        let late = self.late_rows(o).await?;
        self.end_phase(Phase::Compare)?;
        Ok(Compared {
            changed,
            late,
            booked,
            new_status,
        })
    }

    /// The late rows, adjustments, then gold's changed days in one commit, then the status
    /// table (in that order, a crash anywhere converges on the rerun: each compares first).
    async fn write_days(&mut self, o: Opened, r: ReadDays, c: Compared) -> Result<(), RunError> {
        let spec = self.spec;
        if spec.late_rows.is_some() {
            self.store_late_rows(c.late).await?;
            self.a.failpoint(Point::Committed(Table::LateRows))?;
        }
        if !c.booked.is_empty() {
            self.c.adjustments_version = adjust::book(
                o.adjustments,
                &spec.adjustments_uri,
                c.booked,
                self.commit_properties(),
            )
            .await?;
        }
        self.a.failpoint(Point::Committed(Table::Adjustments))?;
        if let (false, Some(gold)) = (c.changed.is_empty(), o.gold) {
            let version = write::replace_days(
                gold,
                &spec.target_uri,
                write::rows_of(&r.rows, &c.changed)?,
                &r.schema,
                &c.changed,
                self.commit_properties(),
            )
            .await?;
            self.a.summary.target_version = version;
        }
        self.a.failpoint(Point::Committed(Table::Target))?;
        self.commit_status(o.status_table, &o.old_status, &c.new_status, false)
            .await?;
        self.end_phase(Phase::Write)
    }

    /// The data's clock in the summary and facts (`watermark:`).
    fn count_clock(&mut self) {
        let Some(t) = self.clock else {
            return;
        };
        let text = |v: Option<i64>| v.and_then(|v| watermark::text(v, t.instants));
        self.c.event_time_seen = text(t.clock.seen);
        self.c.watermark = text(t.clock.watermark(t.watermark));
        self.c.final_before = text(t.clock.final_before);
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
        // (and the adjustments' version whose bookings it counts)
        let seen = self.c.adjustments_version.or(self.adjustments_seen);
        let accounted = repair::accounted_transaction(&self.p.app_id(), seen);
        self.c.status_version = status::write(
            table,
            &self.spec.status_uri,
            &self.p.name,
            new,
            self.commit_properties_with(vec![accounted]),
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
        self.commit_properties_with(Vec::new())
    }

    /// [`Run::commit_properties`] with `more` transactions.
    fn commit_properties_with(
        &self,
        more: Vec<deltalake::kernel::Transaction>,
    ) -> deltalake::kernel::transaction::CommitProperties {
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
        let seen = self
            .clock
            .and_then(|t| t.clock.seen)
            .map(|s| watermark::transaction(&app, s));
        self.a.commit_properties(
            &self.c,
            serde_json::Map::new(),
            &record,
            newest.into_iter().chain(seen).chain(more).collect(),
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

/// Every day's groups recomputed from `source` as a full reload computes them (lookups
/// applied; not written): what gold plus its adjustments must equal, for `tidemark
/// reconcile`. `closed`: when each closed day closed (see [`status::closes`]).
pub async fn recompute(
    ctx: &SessionContext,
    p: &Pipeline,
    spec: &Aggregate,
    source: &deltalake::DeltaTable,
    closed: &BTreeMap<NaiveDate, i64>,
) -> Result<datafusion::prelude::DataFrame, RunError> {
    source
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(Phase::Reconcile, &spec.source_uri))?;
    let df = crate::run::frame(ctx, source, &spec.source_uri, Phase::Reconcile).await?;
    let df = lookup::apply(ctx, p, spec, df).await?;
    // (which days are open is the status table's to say: the recompute's own label is unused)
    let far = NaiveDate::from_ymd_opt(9999, 12, 31).unwrap_or(NaiveDate::MAX);
    compute::grouped(
        compute::Source {
            p,
            spec,
            df,
            closed,
            final_before: None,
        },
        None,
        far,
    )
}

/// The newest logical date any run of `p` recorded in `tables` (its gold, status and
/// adjustments): the days after it are not published yet. For `tidemark reconcile`.
pub async fn newest_logical_date(
    p: &Pipeline,
    tables: &[&deltalake::DeltaTable],
) -> Option<NaiveDate> {
    let mut newest = None;
    for t in tables {
        let d = plan::newest_logical(t, &p.app_id()).await.ok().flatten();
        newest = newest.max(d);
    }
    newest
}
