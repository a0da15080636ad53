//! One run of a job: take its lease, run its tasks in dependency order — each through the same
//! [`crate::pipeline::run`] that `tidemark run` calls — with retries and timeouts, record every
//! attempt in the ledger, give the lease back.
//!
//! Independent tasks run concurrently; each runs on its job cluster's [`Engine`] (threads,
//! memory pool, spill directory). A task that does not succeed makes its dependants
//! `upstream_failed`. A failed attempt is retried (after `min_retry_interval_millis`, up to
//! `max_retries` times) only when its error is classed retryable, or when it timed out and the
//! task sets `retry_on_timeout`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use super::continuous::Compactor;
use super::lease::{Lease, LeaseStore, HEARTBEAT_INTERVAL};
use super::ledger::{Ledger, LedgerRow, TaskStatus, Trigger};
use super::report::{AttemptReport, JobReport, JobStatus, TaskReport};
use super::JobsError;
use crate::clock::Clock;
use crate::config::bundle::{Job, Task, TaskMode};
use crate::error::{Classify, ErrorClass};
use crate::run::{Engine, RunOptions};

/// What to run.
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub job: Arc<Job>,
    /// The bundle target, recorded in the ledger.
    pub target: String,
    pub trigger: Trigger,
    /// The fire time, for scheduled runs.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// Run every pipeline task as a full reload (`job run --full-reload`).
    pub full_reload: bool,
    /// Continuous runs: after the tasks, while the lease is still held, the tables of the
    /// pipelines that ran are maintained once they gained enough files.
    pub compact: Option<Arc<Compactor>>,
}

/// Runs jobs against one lake: its ledger and its leases.
#[derive(Clone)]
pub struct JobRunner {
    clock: Arc<dyn Clock>,
    ledger: Ledger,
    leases: LeaseStore,
    host: String,
    cancel: watch::Receiver<Option<String>>,
}

impl JobRunner {
    /// A runner for the lake at `lake`. `cancel` stops running attempts when it carries a reason
    /// (the scheduler's grace period ran out).
    pub fn new(
        lake: &str,
        clock: Arc<dyn Clock>,
        cancel: watch::Receiver<Option<String>>,
    ) -> Result<Self, JobsError> {
        Ok(JobRunner {
            clock,
            ledger: Ledger::for_lake(lake),
            leases: LeaseStore::for_lake(lake)?,
            host: super::lease::hostname(),
            cancel,
        })
    }

    /// The ledger this runner writes.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn row(&self, req: &JobRequest, run_id: &str, task: &Task) -> LedgerRow {
        let now = self.clock.now();
        LedgerRow {
            run_id: run_id.to_string(),
            job: req.job.name.clone(),
            target: req.target.clone(),
            task: task.key.clone(),
            attempt: 0,
            trigger: req.trigger.to_string(),
            scheduled_at: req.scheduled_at,
            started_at: now,
            ended_at: now,
            status: TaskStatus::Skipped.to_string(),
            error_class: None,
            error_message: None,
            host: self.host.clone(),
            pipeline: Some(task.pipeline.name.clone()),
            pipeline_run_id: None,
            mode: None,
            source_version: None,
            target_version: None,
            watermark_before: None,
            watermark_after: None,
            num_source_rows_read: None,
            num_inserted: None,
            num_updated: None,
            num_deleted: None,
            num_unchanged: None,
            num_quarantined: None,
            num_deferred: None,
            num_late_rows: None,
            num_conflicts: None,
            num_superseded: None,
            num_duplicates: None,
            num_spill_files: None,
            duration_ms: 0,
            expectations: None,
            kind: None,
            counters: None,
        }
    }

    /// Records that `req` did not run because `reason`, one ledger row per task (attempt 0,
    /// status skipped). Used for fires skipped while the previous run still runs.
    pub async fn record_skip(&self, req: &JobRequest, reason: &str) -> Result<(), JobsError> {
        let run_id = uuid::Uuid::now_v7().to_string();
        let rows: Vec<LedgerRow> = req
            .job
            .tasks
            .iter()
            .map(|t| LedgerRow {
                error_class: Some(ErrorClass::Retryable.to_string()),
                error_message: Some(reason.to_string()),
                ..self.row(req, &run_id, t)
            })
            .collect();
        self.ledger.append(&rows).await
    }

    /// Runs the job once. A job that ran (whatever its tasks did) or was skipped because it was
    /// already running is an `Ok` report; `Err` means the job machinery itself failed.
    pub async fn run(&self, req: &JobRequest) -> Result<JobReport, JobsError> {
        let run_id = uuid::Uuid::now_v7().to_string();
        let started_at = self.clock.now();
        let started = Instant::now();
        let job = &req.job.name;
        let mut report = JobReport {
            run_id: run_id.clone(),
            job: job.clone(),
            target: req.target.clone(),
            trigger: req.trigger,
            scheduled_at: req.scheduled_at,
            started_at,
            ended_at: started_at,
            duration_ms: 0,
            status: JobStatus::Succeeded,
            holder: None,
            tasks: Vec::new(),
            warnings: Vec::new(),
            compactions: Vec::new(),
        };
        let lease = match self.leases.acquire(job, &run_id, started_at).await {
            Ok(lease) => lease,
            Err(JobsError::AlreadyRunning { holder, .. }) => {
                info!(job = %job, holder_run = %holder.run_id, host = %holder.host, pid = holder.pid, "job is already running; this run is skipped");
                let reason = format!("already running: {holder}");
                if let Err(e) = self.record_skip(req, &reason).await {
                    report
                        .warnings
                        .push(format!("the skip was not recorded in the ledger: {e}"));
                }
                report.status = JobStatus::Skipped;
                report.holder = Some(*holder);
                report.tasks = req
                    .job
                    .tasks
                    .iter()
                    .map(|t| TaskReport {
                        task: t.key.clone(),
                        pipeline: t.pipeline.name.clone(),
                        status: TaskStatus::Skipped,
                        reason: Some(reason.clone()),
                        attempts: Vec::new(),
                    })
                    .collect();
                return Ok(report);
            }
            Err(e) => return Err(e),
        };
        info!(job = %job, run_id = %run_id, trigger = %req.trigger, "job run started");
        // Tests widen the window in which the lease is held, or crash while holding it.
        if let Err(e) = crate::failpoint::hit("job.after_lease") {
            let _ = lease.release().await;
            return Err(e.into());
        }

        let (lost_tx, lost_rx) = watch::channel(None::<String>);
        let lease = Arc::new(Mutex::new(Some(lease)));
        let heartbeat = tokio::spawn(heartbeat(lease.clone(), self.clock.clone(), lost_tx));
        let run = Run {
            runner: self,
            req,
            run_id: &run_id,
            deadline: req.job.timeout.map(|t| Instant::now() + t),
            lost: lost_rx,
        };
        let (tasks, warnings) = run.tasks().await;
        report.tasks = tasks;
        report.warnings.extend(warnings);
        self.compact_in_step(req, &mut report).await;
        heartbeat.abort();
        if let Some(lease) = lease.lock().await.take() {
            if let Err(e) = lease.release().await {
                report.warnings.push(format!(
                    "the job's lease was not released (it expires on its own): {e}"
                ));
            }
        }
        report.status = if report
            .tasks
            .iter()
            .all(|t| t.status == TaskStatus::Succeeded)
        {
            JobStatus::Succeeded
        } else if report
            .tasks
            .iter()
            .any(|t| t.status == TaskStatus::Cancelled)
        {
            JobStatus::Cancelled
        } else {
            JobStatus::Failed
        };
        report.ended_at = self.clock.now();
        report.duration_ms = started.elapsed().as_millis() as u64;
        info!(job = %job, run_id = %run_id, status = %report.status, ms = report.duration_ms, "job run finished");
        Ok(report)
    }
}

impl JobRunner {
    /// Continuous runs: maintains the tables of the pipelines whose tasks succeeded, once they
    /// gained enough files (under the lease, so no run of the job writes meanwhile). Not after a
    /// cancelled run: the process is stopping.
    async fn compact_in_step(&self, req: &JobRequest, report: &mut JobReport) {
        let Some(compactor) = &req.compact else {
            return;
        };
        if self.cancel.borrow().is_some() {
            return;
        }
        let ran: Vec<&crate::config::Pipeline> = req
            .job
            .tasks
            .iter()
            .filter(|t| {
                let done = |r: &&TaskReport| r.task == t.key && r.status == TaskStatus::Succeeded;
                report.tasks.iter().any(|r| done(&r))
            })
            .map(|t| &t.pipeline)
            .collect();
        let (done, warnings) = compactor.after_run(&ran, self.clock.now()).await;
        report.compactions = done;
        report.warnings.extend(warnings);
    }
}

/// Renews the lease until aborted; reports a lost lease (taken over after this process stalled
/// past its expiry) through `lost`, which stops the running attempts.
async fn heartbeat(
    lease: Arc<Mutex<Option<Lease>>>,
    clock: Arc<dyn Clock>,
    lost: watch::Sender<Option<String>>,
) {
    loop {
        tokio::time::sleep(clock.wall(HEARTBEAT_INTERVAL)).await;
        let mut guard = lease.lock().await;
        let Some(l) = guard.as_mut() else { return };
        match l.heartbeat(clock.now()).await {
            Ok(Ok(())) => {}
            Ok(Err(taken)) => {
                let by = taken
                    .by
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "another run".to_string());
                warn!("the job's lease was taken over ({by}); stopping");
                let _ = lost.send(Some(format!("the job's lease was taken over: {by}")));
                guard.take();
                return;
            }
            Err(e) => warn!("lease heartbeat failed (retrying): {e}"),
        }
    }
}

/// Completes with the reason once `rx` carries one; never completes otherwise.
async fn cancelled(mut rx: watch::Receiver<Option<String>>) -> String {
    loop {
        if let Some(reason) = rx.borrow_and_update().clone() {
            return reason;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// How long a cancelled attempt gets to unwind before the job run goes on without it.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// How one attempt ended.
enum Outcome {
    Succeeded(Box<crate::report::RunSummary>),
    Failed(ErrorClass, String),
    TimedOut(String),
    /// Stopped through the runner's cancel channel (a signal, the scheduler's shutdown).
    Cancelled(String),
}

/// The state of one job run while its tasks execute.
struct Run<'a> {
    runner: &'a JobRunner,
    req: &'a JobRequest,
    run_id: &'a str,
    deadline: Option<Instant>,
    lost: watch::Receiver<Option<String>>,
}

impl Run<'_> {
    /// Runs every task; returns their reports in the job's task order, and warnings.
    async fn tasks(&self) -> (Vec<TaskReport>, Vec<String>) {
        let job = &self.req.job;
        let mut engines: BTreeMap<String, Result<Engine, String>> = BTreeMap::new();
        for (key, compute) in &job.clusters {
            if job.tasks.iter().any(|t| t.cluster.as_deref() == Some(key)) {
                engines.insert(
                    key.clone(),
                    Engine::new(compute).map_err(|e| format!("job cluster `{key}`: {e}")),
                );
            }
        }
        let default_engine = Engine::default();
        let mut status: BTreeMap<String, TaskStatus> = BTreeMap::new();
        let mut reports: BTreeMap<String, TaskReport> = BTreeMap::new();
        let mut warnings = Vec::new();
        let mut pending: Vec<&Task> = job.tasks.iter().collect();
        let mut running = FuturesUnordered::new();
        loop {
            let mut i = 0;
            while i < pending.len() {
                let t = pending[i];
                let deps: Vec<Option<TaskStatus>> = t
                    .depends_on
                    .iter()
                    .map(|d| status.get(d).copied())
                    .collect();
                let blocked_by = t
                    .depends_on
                    .iter()
                    .zip(&deps)
                    .find(|(_, s)| matches!(s, Some(s) if *s != TaskStatus::Succeeded))
                    .map(|(d, _)| d.clone());
                let ready = deps.iter().all(|s| *s == Some(TaskStatus::Succeeded));
                let not_run = match (&blocked_by, ready) {
                    (Some(d), _) => Some((
                        TaskStatus::UpstreamFailed,
                        format!("task `{d}` did not succeed"),
                    )),
                    (None, true) if self.deadline.is_some_and(|d| Instant::now() >= d) => Some((
                        TaskStatus::Skipped,
                        "the job's timeout_seconds ran out before it started".to_string(),
                    )),
                    _ => None,
                };
                if let Some((st, reason)) = not_run {
                    let row = LedgerRow {
                        status: st.to_string(),
                        error_message: Some(reason.clone()),
                        ..self.runner.row(self.req, self.run_id, t)
                    };
                    if let Err(e) = self.runner.ledger.append(&[row]).await {
                        warnings.push(format!("ledger row for task `{}` not written: {e}", t.key));
                    }
                    status.insert(t.key.clone(), st);
                    reports.insert(
                        t.key.clone(),
                        TaskReport {
                            task: t.key.clone(),
                            pipeline: t.pipeline.name.clone(),
                            status: st,
                            reason: Some(reason),
                            attempts: Vec::new(),
                        },
                    );
                    pending.remove(i);
                } else if ready {
                    let engine = match &t.cluster {
                        Some(c) => engines
                            .get(c)
                            .cloned()
                            .unwrap_or_else(|| Err(format!("job cluster `{c}` is not defined"))),
                        None => Ok(default_engine.clone()),
                    };
                    running.push(self.task(t, engine));
                    pending.remove(i);
                } else {
                    i += 1;
                }
            }
            match running.next().await {
                Some((report, mut w)) => {
                    warnings.append(&mut w);
                    status.insert(report.task.clone(), report.status);
                    reports.insert(report.task.clone(), report);
                }
                None => break,
            }
        }
        // Every attempt ended: their spill files go, also those of an attempt that failed,
        // was cancelled or panicked (and whose clone of the engine may still be unwinding).
        for engine in engines.values().flatten() {
            engine.remove_spill_dir();
        }
        let ordered = job
            .tasks
            .iter()
            .filter_map(|t| reports.remove(&t.key))
            .collect();
        (ordered, warnings)
    }

    /// Runs one task with its retries; returns its report and warnings.
    async fn task(&self, task: &Task, engine: Result<Engine, String>) -> (TaskReport, Vec<String>) {
        let mut report = TaskReport {
            task: task.key.clone(),
            pipeline: task.pipeline.name.clone(),
            status: TaskStatus::Failed,
            reason: None,
            attempts: Vec::new(),
        };
        let mut warnings = Vec::new();
        let opts = RunOptions {
            full_reload: self.req.full_reload || task.mode == TaskMode::FullReload,
            ..RunOptions::default()
        };
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let trigger = if attempt == 1 {
                self.req.trigger
            } else {
                Trigger::Retry
            };
            let started_at = self.runner.clock.now();
            let started = Instant::now();
            let (outcome, spill_files) = match &engine {
                Ok(engine) => self.attempt(task, &opts, engine).await,
                Err(e) => (Outcome::Failed(ErrorClass::Io, e.clone()), 0),
            };
            let ended_at = self.runner.clock.now();
            let duration_ms = started.elapsed().as_millis() as u64;
            let mut row = LedgerRow {
                attempt: attempt as i32,
                trigger: trigger.to_string(),
                started_at,
                ended_at,
                duration_ms: duration_ms as i64,
                num_spill_files: Some(spill_files as i64),
                ..self.runner.row(self.req, self.run_id, task)
            };
            let mut a = AttemptReport {
                attempt,
                trigger,
                started_at,
                ended_at,
                duration_ms,
                status: TaskStatus::Succeeded,
                error_class: None,
                error: None,
                spill_files,
                summary: None,
            };
            let retryable = match outcome {
                Outcome::Succeeded(summary) => {
                    row = row.with_summary(&summary);
                    a.summary = Some(*summary);
                    false
                }
                Outcome::Failed(class, message) => {
                    a.status = TaskStatus::Failed;
                    a.error_class = Some(class);
                    a.error = Some(message);
                    class.is_retryable()
                }
                Outcome::TimedOut(message) => {
                    a.status = TaskStatus::TimedOut;
                    a.error_class = Some(ErrorClass::Retryable);
                    a.error = Some(message);
                    task.retry_on_timeout
                }
                Outcome::Cancelled(message) => {
                    a.status = TaskStatus::Cancelled;
                    a.error_class = Some(ErrorClass::Retryable);
                    a.error = Some(message);
                    false
                }
            };
            row.status = a.status.to_string();
            row.error_class = a.error_class.map(|c| c.to_string());
            row.error_message = a.error.clone();
            info!(job = %self.req.job.name, task = %task.key, attempt, trigger = %trigger, status = %a.status, error = a.error.as_deref().unwrap_or(""), "task attempt finished");
            if let Err(e) = self.runner.ledger.append(&[row]).await {
                tracing::debug!("ledger row not written: {e}");
                warnings.push(format!(
                    "ledger row for task `{}` attempt {attempt} not written: {e}",
                    task.key
                ));
            }
            report.status = a.status;
            report.attempts.push(a);
            let out_of_time = self.deadline.is_some_and(|d| Instant::now() >= d);
            if report.status == TaskStatus::Succeeded
                || !retryable
                || attempt > task.max_retries
                || out_of_time
            {
                return (report, warnings);
            }
            info!(task = %task.key, wait_ms = task.min_retry_interval.as_millis() as u64, "retrying");
            let stop = tokio::select! {
                _ = tokio::time::sleep(task.min_retry_interval) => false,
                _ = cancelled(self.runner.cancel.clone()) => true,
                _ = cancelled(self.lost.clone()) => true,
            };
            if stop {
                return (report, warnings);
            }
        }
    }

    /// One attempt on the task's engine, bounded by the task's and the job's time limits.
    async fn attempt(&self, task: &Task, opts: &RunOptions, engine: &Engine) -> (Outcome, u64) {
        let spill_before = engine.spill_files();
        let pipeline = Arc::new(task.pipeline.clone());
        let clock = self.runner.clock.clone();
        let opts = opts.clone();
        let on_engine = engine.clone();
        let mut handle = engine.spawn(async move {
            crate::pipeline::run(&pipeline, &opts, clock.as_ref(), &on_engine).await
        });
        let job_left = self
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        let (limit, job_limited) = match (task.timeout, job_left) {
            (Some(t), Some(j)) if j < t => (Some(j), true),
            (None, Some(j)) => (Some(j), true),
            (t, _) => (t, false),
        };
        let outcome = tokio::select! {
            joined = &mut handle => match joined {
                Ok(Ok(summary)) => Outcome::Succeeded(Box::new(summary)),
                Ok(Err(e)) => Outcome::Failed(e.class(), e.to_string()),
                Err(e) => Outcome::Failed(ErrorClass::Internal, format!("the task stopped unexpectedly: {e}")),
            },
            _ = sleep_opt(limit) => {
                handle.abort();
                let secs = limit.map(|l| l.as_secs_f64()).unwrap_or_default();
                Outcome::TimedOut(if job_limited {
                    format!("the job's timeout_seconds ran out after {secs:.0} s; nothing was committed by this attempt unless its commit had already landed")
                } else {
                    format!("timed out after {secs:.0} s (task timeout_seconds); nothing was committed by this attempt unless its commit had already landed")
                })
            },
            reason = cancelled(self.runner.cancel.clone()) => {
                handle.abort();
                // Let the attempt's destructors run (its spill files, its session) when it
                // yields; one blocked in a system call is left to the process's exit.
                let _ = tokio::time::timeout(ABORT_GRACE, &mut handle).await;
                Outcome::Cancelled(format!("cancelled: {reason}; a Delta commit is atomic, so this attempt's commit landed whole or not at all (`tidemark history` shows which)"))
            },
            reason = cancelled(self.lost.clone()) => {
                handle.abort();
                Outcome::Failed(ErrorClass::Retryable, format!("cancelled: {reason}"))
            },
        };
        (outcome, engine.spill_files().saturating_sub(spill_before))
    }
}
