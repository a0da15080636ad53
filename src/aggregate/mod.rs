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

pub mod compute;
pub mod days;
pub mod status;
mod write;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDate, Utc};
use datafusion::prelude::SessionContext;
use tracing::{info, info_span, Instrument};

use crate::config::pipeline::{Aggregate, Kind};
use crate::config::Pipeline;
use crate::lake;
use crate::report::{AggregateCounters, Counters, RunMode, RunSummary};
use crate::run::phase::{self, Phase, Timer};
use crate::run::{Engine, RunError, RunOptions};
use days::Days;

/// One attempt of an `aggregate` run. On success gold and its status table have at most one
/// new commit each; on error nothing was committed to gold.
pub(crate) async fn run_once(
    p: &Pipeline,
    spec: &Aggregate,
    opts: &RunOptions,
    now: DateTime<Utc>,
    engine: &Engine,
    run_id: String,
) -> Result<RunSummary, RunError> {
    let summary = RunSummary::new(
        run_id,
        &p.name,
        Kind::Aggregate,
        opts.dry_run,
        (&spec.source_uri, &spec.target_uri),
        Counters::Aggregate(AggregateCounters::default()),
    );
    let mut run = Run {
        p,
        spec,
        opts,
        now,
        ctx: engine.context(),
        timer: Timer::default(),
        summary,
        c: AggregateCounters::default(),
    };
    run.execute().instrument(info_span!("aggregate")).await?;
    Ok(run.finish())
}

struct Run<'a> {
    p: &'a Pipeline,
    spec: &'a Aggregate,
    opts: &'a RunOptions,
    now: DateTime<Utc>,
    ctx: SessionContext,
    timer: Timer,
    summary: RunSummary,
    c: AggregateCounters,
}

impl Run<'_> {
    fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        let path = match self.summary.mode {
            RunMode::Incremental => phase::Path::Incremental,
            RunMode::Bootstrap | RunMode::FullReload => phase::Path::FullReload,
        };
        self.timer.end(phase, path)
    }

    async fn execute(&mut self) -> Result<(), RunError> {
        let spec = self.spec;
        // plan
        let source = lake::open_required(&spec.source_uri, "source").await?;
        self.summary.source_version = source.version();
        let gold = lake::open_if_exists(&spec.target_uri).await?;
        let status_table = lake::open_if_exists(&spec.status_uri).await?;
        let old_status = status::read(&self.ctx, status_table.as_ref(), &spec.status_uri).await?;
        let logical = days::logical_date(spec, self.opts.logical_date, self.now);
        let full = self.opts.full_reload || gold.is_none();
        self.summary.mode = match (gold.is_some(), self.opts.full_reload) {
            (false, _) => RunMode::Bootstrap,
            (true, true) => RunMode::FullReload,
            (true, false) => RunMode::Incremental,
        };
        let window = match (self.opts.restate_from, self.opts.restate_to) {
            (Some(from), Some(to)) => Days::range(spec, logical, from, to),
            _ => {
                let oldest_open = old_status
                    .values()
                    .find(|s| !s.is_final() && s.event_date <= logical)
                    .map(|s| s.event_date);
                Days::window(spec, logical, oldest_open)
            }
        };
        let days = (!full).then_some(window);
        self.c.logical_date = Some(logical);
        source
            .update_datafusion_session(&self.ctx.state())
            .map_err(RunError::delta(Phase::Plan, &spec.source_uri))?;
        if let Some(g) = &gold {
            g.update_datafusion_session(&self.ctx.state())
                .map_err(RunError::delta(Phase::Plan, &spec.target_uri))?;
        }
        self.end_phase(Phase::Plan)?;

        // read: the days' groups from the source's live rows
        let provider = source
            .table_provider()
            .await
            .map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
        let df = self
            .ctx
            .read_table(provider)
            .map_err(RunError::query(Phase::Read))?;
        let grouped = compute::grouped(
            compute::Source {
                p: self.p,
                spec,
                df,
            },
            days.as_ref(),
            window.open_from,
        )?;
        let schema = compute::gold_schema(&grouped);
        let batches = grouped
            .collect()
            .await
            .map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
        let facts = compute::day_facts(&batches)?;
        let rows = compute::without_helpers(&batches)?;
        self.summary.num_source_rows_read = facts.values().map(|f| f.rows.max(0) as u64).sum();
        self.end_phase(Phase::Read)?;

        // compare: which days gold does not hold exactly so
        let span = match &days {
            Some(d) => *d,
            None => {
                let first = facts.keys().next().copied().unwrap_or(logical);
                let last = facts
                    .keys()
                    .next_back()
                    .copied()
                    .unwrap_or(logical)
                    .max(logical);
                Days::range(spec, logical, first.min(last), last)
            }
        };
        let changed: BTreeSet<NaiveDate> = match (&gold, &days) {
            (Some(g), Some(d)) => {
                write::check_schema(g, &schema, &spec.target_uri)?;
                let held = write::read_days(&self.ctx, g, &spec.target_uri, d).await?;
                write::changed_days(&held, &rows, &schema)?
            }
            // A bootstrap or full reload writes every day.
            _ => span.each().collect(),
        };
        self.c.days_from = Some(span.from);
        self.c.days_to = Some(span.to);
        self.c.num_days_recomputed = span.count();
        self.c.num_days_changed = changed.len() as u64;
        self.c.num_days_restated_after_close = changed
            .iter()
            .filter(|d| old_status.get(d).is_some_and(status::DayStatus::is_final))
            .count() as u64;
        self.c.num_rows_written = if changed.is_empty() {
            0
        } else {
            rows.iter().map(|b| b.num_rows() as u64).sum()
        };
        let new_status = status::next(&old_status, &span, &facts, &changed, self.now);
        self.c.num_days_final_now = new_status
            .values()
            .filter(|s| {
                s.is_final() && !old_status.get(&s.event_date).is_some_and(|o| o.is_final())
            })
            .count() as u64;
        self.c.num_days_open = new_status.values().filter(|s| !s.is_final()).count() as u64;
        self.end_phase(Phase::Compare)?;
        if self.opts.dry_run {
            return Ok(());
        }

        // write: gold's days in one commit, then the status table
        if !changed.is_empty() {
            let version = write::replace_days(
                gold,
                &spec.target_uri,
                &self.p.name,
                rows,
                &schema,
                days.as_ref(),
                self.commit_properties(),
            )
            .await?;
            self.summary.target_version = version;
        }
        if new_status != old_status {
            self.c.status_version = status::write(
                status_table,
                &spec.status_uri,
                &self.p.name,
                &new_status,
                self.commit_properties(),
            )
            .await?;
        }
        self.end_phase(Phase::Write)?;
        Ok(())
    }

    /// The run's facts in each commit, and the source version read (the pipeline's `txn`).
    fn commit_properties(&self) -> deltalake::kernel::transaction::CommitProperties {
        let (s, c) = (&self.summary, &self.c);
        let facts = serde_json::json!({
            "run_id": s.run_id,
            "pipeline": s.pipeline,
            "mode": s.mode,
            "source_version": s.source_version,
            "logical_date": c.logical_date.map(|d| d.to_string()),
            "days_from": c.days_from.map(|d| d.to_string()),
            "days_to": c.days_to.map(|d| d.to_string()),
            "num_days_recomputed": c.num_days_recomputed,
            "num_days_changed": c.num_days_changed,
            "num_days_restated_after_close": c.num_days_restated_after_close,
            "num_rows_written": c.num_rows_written,
        });
        let mut props = deltalake::kernel::transaction::CommitProperties::default()
            .with_metadata([(lake::COMMIT_INFO_KEY.to_string(), facts)]);
        if let Some(v) = s.source_version {
            props = props.with_application_transaction(deltalake::kernel::Transaction::new(
                self.p.app_id(),
                v as i64,
            ));
        }
        props
    }

    fn finish(&mut self) -> RunSummary {
        self.summary.duration_ms = self.timer.elapsed_ms();
        self.summary.phases_ms = std::mem::take(&mut self.timer).into_ms();
        info!(
            mode = %self.summary.mode,
            target_version = ?self.summary.target_version,
            days = self.c.num_days_recomputed,
            changed = self.c.num_days_changed,
            "aggregate finished"
        );
        let mut summary = self.summary.clone();
        summary.counters = Counters::Aggregate(std::mem::take(&mut self.c));
        summary
    }
}

/// The status table of `spec`, by day (for `tidemark status`).
pub async fn day_status(
    spec: &Aggregate,
) -> Result<BTreeMap<NaiveDate, status::DayStatus>, RunError> {
    let table = lake::open_if_exists(&spec.status_uri).await?;
    status::read(&SessionContext::new(), table.as_ref(), &spec.status_uri).await
}
