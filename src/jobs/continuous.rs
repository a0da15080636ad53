//! Continuous runs: a job (`continuous:` in the bundle, `job run --every`) or a pipeline
//! (`run --every`) run again and again on a fixed period, and its tables' small files kept in
//! step.
//!
//! - Ticks are `start + k·every`. A run longer than the period starts the next one at once (the
//!   ticks it passed over are logged, never queued), so runs go back to back, never two at once.
//! - Each frequent commit adds files; readers open every live file. After a run, a pipeline
//!   whose tables (its target and companion tables) gained `compact_after` live files since they
//!   were last maintained is maintained as `tidemark maintain` does it (compaction, checkpoint,
//!   vacuum within the retention): the live file count stays below its compacted size plus
//!   `compact_after` plus what one run adds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{watch, Mutex};
use tracing::info;

use super::ledger::Trigger;
use super::scheduler::{Executor, Fire};
use crate::clock::Clock;
use crate::config::Pipeline;
use crate::pipeline::maintain::{self, Tables};

pub use crate::config::bundle::DEFAULT_COMPACT_AFTER;

/// The tick the next run starts at, after the run of tick `previous` ended at `now`, and how
/// many ticks passed while it ran (0 when it ended within its period). A run that outlasted its
/// period is followed at once, at the latest tick already due.
pub fn next_tick(
    start: DateTime<Utc>,
    every: Duration,
    previous: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, u64) {
    let period_us = i64::try_from(every.as_micros()).unwrap_or(i64::MAX).max(1);
    let due = previous + chrono::TimeDelta::microseconds(period_us);
    if now <= due {
        return (due, 0);
    }
    let periods =
        |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(i64::MAX).max(0) / period_us;
    let since_start = periods(now - start);
    let latest = start + chrono::TimeDelta::microseconds(since_start.saturating_mul(period_us));
    let latest = latest.max(due);
    (latest, periods(latest - due) as u64)
}

/// What maintaining one pipeline's tables in step did.
#[derive(Debug, Clone, Serialize)]
pub struct Compaction {
    pub pipeline: String,
    pub tables: Vec<CompactedTable>,
}

/// One table of a [`Compaction`].
#[derive(Debug, Clone, Serialize)]
pub struct CompactedTable {
    pub table: String,
    pub files_before: usize,
    pub files_after: usize,
}

impl Compaction {
    /// One line for a run's text report.
    pub fn to_text(&self) -> String {
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|t| format!("{} {} -> {} files", t.table, t.files_before, t.files_after))
            .collect();
        format!(
            "compacted in step: pipeline {}: {}",
            self.pipeline,
            tables.join(", ")
        )
    }
}

/// Keeps the live file count of the tables continuous runs write bounded: remembers each
/// table's count when it was last maintained (or first seen), and maintains a pipeline's
/// tables once one of them gained `after` files since.
#[derive(Debug)]
pub struct Compactor {
    after: u64,
    baselines: Mutex<BTreeMap<String, usize>>,
}

impl Compactor {
    /// A compactor that maintains a pipeline after its tables gained `after` files (at least 1).
    pub fn new(after: u64) -> Self {
        Compactor {
            after: after.max(1),
            baselines: Mutex::new(BTreeMap::new()),
        }
    }

    /// After a run of `pipelines`: maintains those whose tables grew by `after` files. Returns
    /// what it did, and warnings (maintenance that failed: the next run tries again).
    pub async fn after_run(
        &self,
        pipelines: &[&Pipeline],
        now: DateTime<Utc>,
    ) -> (Vec<Compaction>, Vec<String>) {
        let mut done = Vec::new();
        let mut warnings = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for p in pipelines {
            if !seen.insert(p.target_uri().to_string()) {
                continue;
            }
            match self.pipeline(p, now).await {
                Ok(Some(c)) => done.push(c),
                Ok(None) => {}
                Err(e) => warnings.push(format!(
                    "compaction in step of pipeline `{}` failed (the next run tries again): {e}",
                    p.name
                )),
            }
        }
        (done, warnings)
    }

    async fn pipeline(
        &self,
        p: &Pipeline,
        now: DateTime<Utc>,
    ) -> Result<Option<Compaction>, maintain::Error> {
        let tables = Tables::of(p);
        let before = counts(&tables).await?;
        let grown = {
            let mut baselines = self.baselines.lock().await;
            let mut grown = false;
            for (uri, n) in &before {
                let base = baselines.entry(uri.clone()).or_insert(*n);
                // (someone else compacted it: count from there)
                *base = (*base).min(*n);
                grown |= (*n - *base) as u64 >= self.after;
            }
            grown
        };
        if !grown {
            return Ok(None);
        }
        info!(pipeline = %p.name, compact_after = self.after, "compacting in step: the pipeline's tables gained enough files");
        let options = maintain::Options {
            compact: true,
            retention: None,
            dry_run: false,
        };
        maintain::maintain(&tables, options, now).await?;
        let after = counts(&tables).await?;
        let mut baselines = self.baselines.lock().await;
        let mut compacted = Vec::new();
        for (uri, n) in &after {
            baselines.insert(uri.clone(), *n);
            compacted.push(CompactedTable {
                table: uri.clone(),
                files_before: before.get(uri).copied().unwrap_or(*n),
                files_after: *n,
            });
        }
        Ok(Some(Compaction {
            pipeline: p.name.clone(),
            tables: compacted,
        }))
    }
}

/// The live file count of each of `tables` that exists.
async fn counts(tables: &Tables) -> Result<BTreeMap<String, usize>, maintain::Error> {
    let mut out = BTreeMap::new();
    for uri in tables.uris() {
        if let Some(t) = crate::lake::open_if_exists(uri).await? {
            let n = t
                .snapshot()
                .map(|s| s.log_data().num_files())
                .map_err(|e| crate::lake::MaintainError::Delta(Box::new(e)))?;
            out.insert(uri.to_string(), n);
        }
    }
    Ok(out)
}

/// A job the scheduler runs back to back (`continuous:`).
#[derive(Debug, Clone)]
pub struct ContinuousJob {
    pub name: String,
    pub every: Duration,
}

/// Runs `job` on its period until `stop` turns true; the run under way then finishes (the
/// scheduler's grace period bounds it). Counts its runs in `runs`.
pub async fn run_continuous(
    job: ContinuousJob,
    clock: Arc<dyn Clock>,
    executor: Arc<dyn Executor>,
    stop: watch::Receiver<bool>,
    runs: Arc<AtomicU64>,
) {
    let start = clock.now();
    let mut tick = start;
    info!(job = %job.name, every = %humantime::format_duration(job.every), "continuous job started");
    loop {
        executor
            .run(Fire {
                job: job.name.clone(),
                scheduled_at: tick,
                trigger: Trigger::Continuous,
            })
            .await;
        runs.fetch_add(1, Ordering::Relaxed);
        let (next, skipped) = next_tick(start, job.every, tick, clock.now());
        if skipped > 0 {
            info!(job = %job.name, skipped, "the run took longer than its period: ticks were skipped, the next run starts at once");
        }
        tokio::select! {
            biased;
            _ = super::scheduler::stop_requested(stop.clone()) => break,
            _ = clock.sleep_until(next) => {}
        }
        tick = next;
    }
    info!(job = %job.name, runs = runs.load(Ordering::Relaxed), "continuous job stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn ticks_stay_on_the_grid_and_an_overrun_starts_the_next_at_once() {
        let every = Duration::from_secs(30);
        // ended within its period: the next tick
        assert_eq!(next_tick(at(0), every, at(0), at(5)), (at(30), 0));
        // ended exactly on the next tick
        assert_eq!(next_tick(at(0), every, at(30), at(60)), (at(60), 0));
        // ran 100 s from tick 30: ticks 60, 90 passed, 120 is already due -> 120 at once, 2 skipped
        assert_eq!(next_tick(at(0), every, at(30), at(130)), (at(120), 2));
        // ran 40 s from tick 0: tick 30 passed and is run at once, none skipped
        assert_eq!(next_tick(at(0), every, at(0), at(40)), (at(30), 0));
    }
}
