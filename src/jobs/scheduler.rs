//! The scheduler: decides *when* each unpaused job runs; the [`Executor`] decides how.
//!
//! - Each job fires at its Quartz schedule's instants in its `timezone_id` (DST rule in
//!   [`crate::config::schedule`]).
//! - At start it reads, per job, the last fire time the ledger recorded. If a fire was missed
//!   while the scheduler was down, `catch_up: latest` (the default) runs the latest missed fire
//!   once, as soon as it starts; `catch_up: none` only logs it. The same applies when the process
//!   wakes up more than [`MISFIRE_THRESHOLD`] late (a suspended machine, a stopped process).
//! - `max_concurrent_runs` is 1: a fire while the job's previous run still runs is skipped,
//!   logged, and recorded in the ledger (status `skipped`). A run of the same job by another
//!   process is caught by the job's lease and recorded the same way.
//! - On shutdown (SIGTERM/SIGINT) it takes no new fire, waits up to the grace period for the
//!   running jobs to finish, then asks them to stop.
//!
//! Time comes from a [`Clock`], so tests drive it through days of fires in milliseconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::continuous::{run_continuous, Compactor, ContinuousJob};
use super::ledger::Trigger;
use super::report::JobStatus;
use super::runner::{JobRequest, JobRunner};
use super::JobsError;
use crate::clock::Clock;
use crate::config::bundle::{Bundle, CatchUp, Job, PauseStatus};
use crate::config::schedule::{local_label, QuartzSchedule};

/// A fire handled later than this (the process was stalled or suspended) is a missed fire and
/// follows the job's `catch_up` policy.
pub const MISFIRE_THRESHOLD: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// How long shutdown waits for cancelled jobs to record their attempts after the grace period.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// One decision of the scheduler: run `job` for the fire at `scheduled_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fire {
    pub job: String,
    pub scheduled_at: DateTime<Utc>,
    pub trigger: Trigger,
}

/// What the scheduler asks for; the real one runs jobs through [`JobRunner`] and the ledger.
pub trait Executor: Send + Sync {
    /// The last fire time handled per job (from the ledger), for catch-up after downtime.
    fn last_handled(&self) -> BoxFuture<'_, Result<BTreeMap<String, DateTime<Utc>>, JobsError>>;
    /// Runs the job for `fire` until it ends.
    fn run(&self, fire: Fire) -> BoxFuture<'static, ()>;
    /// Records that `fire` was skipped because the job's previous run still runs.
    fn skip(&self, fire: Fire, reason: String) -> BoxFuture<'static, ()>;
    /// Asks every running job to stop now (the shutdown grace period ran out).
    fn cancel_all(&self, reason: &str);
}

impl ContinuousJob {
    /// The bundle's jobs with an UNPAUSED `continuous:` block.
    pub fn from_bundle(bundle: &Bundle) -> Vec<ContinuousJob> {
        bundle
            .jobs
            .values()
            .filter_map(|j| {
                let c = j.continuous.as_ref()?;
                (c.pause_status == PauseStatus::Unpaused).then(|| ContinuousJob {
                    name: j.name.clone(),
                    every: c.every,
                })
            })
            .collect()
    }
}

/// A job the scheduler fires.
#[derive(Debug, Clone)]
pub struct ScheduledJob {
    pub name: String,
    pub schedule: QuartzSchedule,
    pub catch_up: CatchUp,
}

impl ScheduledJob {
    /// The bundle's jobs that have an UNPAUSED schedule.
    pub fn from_bundle(bundle: &Bundle) -> Vec<ScheduledJob> {
        bundle
            .jobs
            .values()
            .filter_map(|j| {
                let s = j.schedule.as_ref()?;
                (s.pause_status == PauseStatus::Unpaused).then(|| ScheduledJob {
                    name: j.name.clone(),
                    schedule: s.cron.clone(),
                    catch_up: j.catch_up,
                })
            })
            .collect()
    }
}

/// What a scheduler did until it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerReport {
    /// Runs started on time.
    pub fires: u64,
    /// Runs started for a missed fire (`catch_up: latest`).
    pub catch_ups: u64,
    /// Fires skipped because the job's previous run still ran.
    pub skipped: u64,
    /// Missed fires not run (`catch_up: none`, or older than the latest missed one).
    pub missed: u64,
    /// Whether running jobs had to be cancelled at shutdown.
    pub cancelled_at_shutdown: bool,
    /// Runs of continuous jobs.
    pub continuous_runs: u64,
}

struct JobState {
    job: ScheduledJob,
    next: Option<DateTime<Utc>>,
    running: Option<(DateTime<Utc>, JoinHandle<()>)>,
}

/// The long-running scheduler.
pub struct Scheduler {
    jobs: Vec<ScheduledJob>,
    continuous: Vec<ContinuousJob>,
    clock: Arc<dyn Clock>,
    executor: Arc<dyn Executor>,
    grace: Duration,
}

fn utc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Completes when `rx` turns true (never when its sender is gone).
pub(super) async fn stop_requested(mut rx: watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Scheduler {
    /// A scheduler for `jobs`; `grace` bounds how long shutdown waits for running jobs.
    pub fn new(
        jobs: Vec<ScheduledJob>,
        clock: Arc<dyn Clock>,
        executor: Arc<dyn Executor>,
        grace: Duration,
    ) -> Self {
        Scheduler {
            jobs,
            continuous: Vec::new(),
            clock,
            executor,
            grace,
        }
    }

    /// Also runs `jobs` back to back, each on its period, until shutdown.
    pub fn with_continuous(mut self, jobs: Vec<ContinuousJob>) -> Self {
        self.continuous = jobs;
        self
    }

    /// Fires jobs until `shutdown` turns true, then drains and returns what it did.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<SchedulerReport, JobsError> {
        let mut report = SchedulerReport::default();
        let mut side_tasks: Vec<JoinHandle<()>> = Vec::new();
        let continuous_runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for job in &self.continuous {
            side_tasks.push(tokio::spawn(run_continuous(
                job.clone(),
                self.clock.clone(),
                self.executor.clone(),
                shutdown.clone(),
                continuous_runs.clone(),
            )));
        }
        let last = self.executor.last_handled().await?;
        let now = self.clock.now();
        let mut states: Vec<JobState> = Vec::new();
        for job in &self.jobs {
            states.push(self.start(job, now, &last, &mut report));
        }
        if states.is_empty() && self.continuous.is_empty() {
            info!("no job with an UNPAUSED schedule; waiting for a stop signal");
        }
        loop {
            let wake = states.iter().filter_map(|s| s.next).min();
            let sleep = async {
                match wake {
                    Some(t) => self.clock.sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop_requested(shutdown.clone()) => break,
                _ = sleep => {}
            }
            let now = self.clock.now();
            for state in states.iter_mut() {
                self.fire_if_due(state, now, &mut report, &mut side_tasks);
            }
        }
        let mut report = self.drain(states, side_tasks, report).await?;
        report.continuous_runs = continuous_runs.load(std::sync::atomic::Ordering::Relaxed);
        Ok(report)
    }

    /// A job's state at start: its next fire, and the latest fire missed while the scheduler
    /// was down run now (`catch_up: latest`) or counted as missed.
    fn start(
        &self,
        job: &ScheduledJob,
        now: DateTime<Utc>,
        last: &std::collections::BTreeMap<String, DateTime<Utc>>,
        report: &mut SchedulerReport,
    ) -> JobState {
        let mut state = JobState {
            job: job.clone(),
            next: job.schedule.next_after(now),
            running: None,
        };
        let missed = job
            .schedule
            .latest_at_or_before(now)
            .filter(|f| last.get(&job.name).is_some_and(|l| f > l));
        if let Some(fire) = missed {
            let since = last.get(&job.name).copied().unwrap_or(fire);
            let count = count_fires(&job.schedule, since, fire);
            match job.catch_up {
                CatchUp::Latest => {
                    info!(job = %job.name, scheduled_at = %utc(fire), missed = count, "catching up: running the latest fire missed while the scheduler was down");
                    report.missed += count.saturating_sub(1);
                    report.catch_ups += 1;
                    self.launch(&mut state, fire, Trigger::CatchUp);
                }
                CatchUp::None => {
                    info!(job = %job.name, latest_missed = %utc(fire), missed = count, "fires missed while the scheduler was down are not run (catch_up: none)");
                    report.missed += count;
                }
            }
        }
        if let Some(next) = state.next {
            info!(job = %job.name, next = %utc(next), local = %local_label(next, job.schedule.timezone()), "scheduled");
        }
        state
    }

    /// Handles a job's due fire, if it has one: only the latest of several passed over, run on
    /// time or caught up (or counted as missed), skipped and recorded while the previous run
    /// still runs.
    fn fire_if_due(
        &self,
        state: &mut JobState,
        now: DateTime<Utc>,
        report: &mut SchedulerReport,
        side_tasks: &mut Vec<JoinHandle<()>>,
    ) {
        let Some(due) = state.next.filter(|n| *n <= now) else {
            return;
        };
        let schedule = state.job.schedule.clone();
        let latest = schedule
            .latest_at_or_before(now)
            .filter(|l| *l >= due)
            .unwrap_or(due);
        state.next = schedule.next_after(now);
        let passed_over = count_fires(&schedule, due, latest);
        if passed_over > 0 {
            warn!(job = %state.job.name, first = %utc(due), latest = %utc(latest), missed = passed_over, "fires passed while the scheduler was stalled; only the latest is considered");
            report.missed += passed_over;
        }
        let trigger = if now - latest <= MISFIRE_THRESHOLD {
            Trigger::Schedule
        } else if state.job.catch_up == CatchUp::Latest {
            Trigger::CatchUp
        } else {
            warn!(job = %state.job.name, scheduled_at = %utc(latest), "fire handled too late and not run (catch_up: none)");
            report.missed += 1;
            return;
        };
        if let Some((previous, handle)) = &state.running {
            if !handle.is_finished() {
                let reason = format!(
                    "the previous run (fire {}) is still running; max_concurrent_runs is 1",
                    utc(*previous)
                );
                warn!(job = %state.job.name, scheduled_at = %utc(latest), previous_fire = %utc(*previous), "fire skipped: the previous run of the job is still running");
                report.skipped += 1;
                let fire = Fire {
                    job: state.job.name.clone(),
                    scheduled_at: latest,
                    trigger,
                };
                side_tasks.push(tokio::spawn(self.executor.skip(fire, reason)));
                return;
            }
        }
        match trigger {
            Trigger::CatchUp => report.catch_ups += 1,
            _ => report.fires += 1,
        }
        self.launch(state, latest, trigger);
    }

    /// Waits for the running jobs (and recorded skips) up to the grace period, then cancels them.
    async fn drain(
        &self,
        states: Vec<JobState>,
        mut side_tasks: Vec<JoinHandle<()>>,
        mut report: SchedulerReport,
    ) -> Result<SchedulerReport, JobsError> {
        let running: Vec<JoinHandle<()>> = states
            .into_iter()
            .filter_map(|s| s.running.map(|(_, h)| h))
            .filter(|h| !h.is_finished())
            .collect();
        info!(
            running = running.len(),
            grace_s = self.grace.as_secs(),
            "stopping: no new fires; waiting for running jobs"
        );
        let mut all = running;
        all.append(&mut side_tasks);
        let mut all = futures::future::join_all(all);
        if tokio::time::timeout(self.grace, &mut all).await.is_err() {
            warn!("the grace period ran out; cancelling the running jobs");
            report.cancelled_at_shutdown = true;
            self.executor
                .cancel_all("the scheduler is shutting down and its grace period ran out");
            if tokio::time::timeout(CANCEL_WAIT, &mut all).await.is_err() {
                error!("running jobs did not stop after cancellation; exiting anyway (their leases expire on their own)");
            }
        }
        info!(
            fires = report.fires,
            catch_ups = report.catch_ups,
            skipped = report.skipped,
            missed = report.missed,
            "scheduler stopped"
        );
        Ok(report)
    }

    fn launch(&self, state: &mut JobState, fire: DateTime<Utc>, trigger: Trigger) {
        info!(job = %state.job.name, scheduled_at = %utc(fire), local = %local_label(fire, state.job.schedule.timezone()), trigger = %trigger, "firing");
        let handle = tokio::spawn(self.executor.run(Fire {
            job: state.job.name.clone(),
            scheduled_at: fire,
            trigger,
        }));
        state.running = Some((fire, handle));
    }
}

/// Fires in `(after, until]`, counted (bounded, for log messages and the report).
fn count_fires(schedule: &QuartzSchedule, after: DateTime<Utc>, until: DateTime<Utc>) -> u64 {
    let mut n = 0;
    let mut cursor = after;
    while let Some(next) = schedule.next_after(cursor).filter(|t| *t <= until) {
        n += 1;
        cursor = next;
        if n >= 100_000 {
            break;
        }
    }
    n
}

/// The executor the `scheduler` command uses: each fire is a job run of the bundle.
pub struct BundleExecutor {
    jobs: BTreeMap<String, Arc<Job>>,
    /// Per continuous job: its tables' compaction in step.
    compactors: BTreeMap<String, Arc<Compactor>>,
    target: String,
    runner: JobRunner,
    cancel: watch::Sender<Option<String>>,
}

impl BundleExecutor {
    /// An executor for `bundle`'s jobs on its lake.
    pub fn new(bundle: &Bundle, clock: Arc<dyn Clock>) -> Result<Self, JobsError> {
        let (cancel, cancel_rx) = watch::channel(None);
        Ok(BundleExecutor {
            jobs: bundle
                .jobs
                .iter()
                .map(|(k, j)| (k.clone(), Arc::new(j.clone())))
                .collect(),
            compactors: bundle
                .jobs
                .iter()
                .filter_map(|(k, j)| {
                    let c = j.continuous.as_ref()?;
                    Some((k.clone(), Arc::new(Compactor::new(c.compact_after))))
                })
                .collect(),
            target: bundle.target.clone(),
            runner: JobRunner::new(&bundle.lake(), clock, cancel_rx)?,
            cancel,
        })
    }

    fn request(&self, fire: &Fire) -> Option<JobRequest> {
        Some(JobRequest {
            job: self.jobs.get(&fire.job)?.clone(),
            target: self.target.clone(),
            trigger: fire.trigger,
            scheduled_at: Some(fire.scheduled_at),
            full_reload: false,
            compact: self.compactors.get(&fire.job).cloned(),
        })
    }
}

impl Executor for BundleExecutor {
    fn last_handled(&self) -> BoxFuture<'_, Result<BTreeMap<String, DateTime<Utc>>, JobsError>> {
        Box::pin(self.runner.ledger().last_scheduled())
    }

    fn run(&self, fire: Fire) -> BoxFuture<'static, ()> {
        let runner = self.runner.clone();
        let req = self.request(&fire);
        Box::pin(async move {
            let Some(req) = req else {
                error!(job = %fire.job, "no such job in the bundle");
                return;
            };
            match runner.run(&req).await {
                Ok(report) => {
                    // a scheduled run has no reader of its report: its warnings are logged
                    for w in report.all_warnings() {
                        warn!(job = %fire.job, run_id = %report.run_id, "{w}");
                    }
                    match report.status {
                        JobStatus::Succeeded => {
                            info!(job = %fire.job, run_id = %report.run_id, "job succeeded")
                        }
                        _ => {
                            warn!(job = %fire.job, run_id = %report.run_id, "{}", report.failure_message().unwrap_or_default())
                        }
                    }
                }
                Err(e) => {
                    error!(job = %fire.job, scheduled_at = %utc(fire.scheduled_at), "the job could not run: {e}")
                }
            }
        })
    }

    fn skip(&self, fire: Fire, reason: String) -> BoxFuture<'static, ()> {
        let runner = self.runner.clone();
        let req = self.request(&fire);
        Box::pin(async move {
            if let Some(req) = req {
                if let Err(e) = runner.record_skip(&req, &reason).await {
                    error!(job = %fire.job, "the skipped fire could not be recorded in the ledger: {e}");
                }
            }
        })
    }

    fn cancel_all(&self, reason: &str) {
        let _ = self.cancel.send(Some(reason.to_string()));
    }
}
