//! `--every`: `tidemark run` and `tidemark job run` again and again on a period, until stopped.
//!
//! Runs start on ticks `start + k·every`; each run's report is printed as soon as it ends (with
//! `--output json`, one JSON object per line). A run longer than the period is followed at once.
//! The first SIGINT/SIGTERM lets the current run finish (its commit, its ledger rows), then the
//! command prints how many runs it made and exits 0; a second one stops the run under way as a
//! single run is stopped (exit 130/143). A run that fails retryably (exit class 75: a commit
//! race, an unreachable store, the job's lease held elsewhere) is reported and the loop goes on;
//! any other failure ends the loop with that run's exit code. After each run the tables of the
//! pipelines that ran are maintained once they gained `--compact-after` files
//! ([`crate::jobs::continuous`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{AppError, Output};
use crate::cli::{JobRunArgs, OutputFormat, PipelineVars, RunArgs};
use crate::clock::Clock;
use crate::config::Pipeline;
use crate::error::{json_failure, Classify, ErrorClass};
use crate::jobs::continuous::{next_tick, Compactor};
use crate::jobs::{JobRequest, JobRunner, Trigger};
use crate::run::{Engine, RunOptions};
use crate::signal::name;

/// Refuses the flags of `run` that make no sense on every tick.
pub(super) fn refuse_run_flags(args: &RunArgs) -> Result<(), AppError> {
    let once = if args.full_reload {
        Some(("--full-reload", "rebuilds the target once"))
    } else if args.dry_run {
        Some((
            "--dry-run",
            "changes nothing, so repeating it shows nothing new",
        ))
    } else if args.logical_date.is_some() {
        Some((
            "--logical-date",
            "pins one day, which a loop would restate every tick",
        ))
    } else if args.restate_from.is_some() {
        Some(("--from/--to", "restate chosen days once"))
    } else {
        None
    };
    match once {
        Some((flag, why)) => Err(AppError::Usage(format!(
            "--every runs the pipeline incrementally on every tick; {flag} {why}: run it once without --every, then start the loop"
        ))),
        None => Ok(()),
    }
}

/// Writes one run's output now (the loop's stdout is a stream, not one report at exit).
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// How a loop ended without an error: stopped by a signal after `runs` runs.
fn stopped(signal: ErrorClass, runs: u64, failed: u64, output: OutputFormat) -> Output {
    let sig = name(signal);
    match output {
        OutputFormat::Json => serde_json::json!({
            "stopped": { "signal": sig, "runs": runs, "failed_runs": failed }
        })
        .to_string() + "\n",
        OutputFormat::Text => format!(
            "stopped by {sig} after {runs} run{}{}: the last run finished; every commit and ledger row is in place\n",
            if runs == 1 { "" } else { "s" },
            match failed {
                0 => String::new(),
                n => format!(" ({n} failed retryably)"),
            }
        ),
    }
    .into()
}

/// The loop itself: `once(tick)` runs one tick; `abort(signal)` stops the run under way.
async fn every(
    every: Duration,
    clock: Arc<dyn Clock>,
    output: OutputFormat,
    abort: impl Fn(ErrorClass),
    mut once: impl FnMut(DateTime<Utc>) -> BoxFuture<'static, Output>,
) -> Output {
    let mut signals = crate::signal::stop_signals();
    let start = clock.now();
    let (mut tick, mut runs, mut failed) = (start, 0u64, 0u64);
    let mut stopping: Option<ErrorClass> = None;
    loop {
        let mut run = once(tick);
        let mut aborted = None;
        let out = loop {
            tokio::select! {
                out = &mut run => break out,
                Some(class) = signals.recv() => match stopping {
                    None => {
                        warn!("{} received: the current run finishes, then the loop stops (send it again to stop the run now)", name(class));
                        stopping = Some(class);
                    }
                    Some(_) => {
                        aborted = Some(class);
                        abort(class);
                    }
                },
            }
        };
        runs += 1;
        if let Some(class) = aborted {
            let message = format!(
                "{} received twice: run {runs} was stopped ({}); rerunning is safe",
                name(class),
                out.failure
                    .map(|f| f.1)
                    .unwrap_or_else(|| "it had finished".into())
            );
            return Output {
                stdout: out.stdout,
                failure: Some((class, message)),
            };
        }
        match out.failure {
            None => emit(&out.stdout),
            Some((class, message)) if class.is_retryable() => {
                failed += 1;
                emit(&match output {
                    OutputFormat::Json => json_failure(&out.stdout, class, &message),
                    OutputFormat::Text => out.stdout,
                });
                warn!(
                    "run {runs} failed (exit {}), the next tick runs again: {message}",
                    class.exit_code()
                );
            }
            Some((class, message)) => {
                let message = format!("run {runs} failed, so the loop stopped: {message}");
                return Output {
                    stdout: out.stdout,
                    failure: Some((class, message)),
                };
            }
        }
        if let Some(signal) = stopping {
            return stopped(signal, runs, failed, output);
        }
        let (next, skipped) = next_tick(start, every, tick, clock.now());
        if skipped > 0 {
            info!(skipped, "the run took longer than --every: {skipped} tick(s) skipped, the next run starts at once");
        }
        tokio::select! {
            biased;
            Some(class) = signals.recv() => return stopped(class, runs, failed, output),
            _ = clock.sleep_until(next) => {}
        }
        tick = next;
    }
}

/// `tidemark run PIPELINE --every`.
pub(super) struct PipelineLoop {
    pub pipeline: Arc<Pipeline>,
    pub engine: Engine,
    pub opts: RunOptions,
    pub from: PipelineVars,
    pub compact_after: u64,
}

impl PipelineLoop {
    /// Runs the pipeline on every tick until stopped.
    pub async fn start(
        self,
        period: Duration,
        output: OutputFormat,
        clock: Arc<dyn Clock>,
    ) -> Output {
        let (abort_tx, abort_rx) = watch::channel(None::<ErrorClass>);
        let compactor = Arc::new(Compactor::new(self.compact_after));
        let this = Arc::new(self);
        let on_tick = clock.clone();
        let once = move |_tick| -> BoxFuture<'static, Output> {
            let (this, clock, compactor) = (this.clone(), on_tick.clone(), compactor.clone());
            let mut abort = abort_rx.clone();
            Box::pin(async move {
                let stop = async move {
                    let got = abort.wait_for(Option::is_some).await.map(|c| *c);
                    match got {
                        Ok(class) => class.unwrap_or(ErrorClass::Interrupted),
                        Err(_) => std::future::pending().await,
                    }
                };
                let p = &this.pipeline;
                let run = super::run_command::run_once(
                    p,
                    this.opts.clone(),
                    &this.engine,
                    clock.clone(),
                    &this.from,
                    stop,
                )
                .await;
                let summary = match run {
                    Ok(s) => s,
                    Err(e) => {
                        return Output {
                            stdout: String::new(),
                            failure: Some((e.class(), e.to_string())),
                        }
                    }
                };
                let (done, warnings) = compactor.after_run(&[p.as_ref()], clock.now()).await;
                for w in &warnings {
                    warn!("{w}");
                }
                let text = super::run_command::render(&summary, output);
                with_compactions(text, &done, output).into()
            })
        };
        every(
            period,
            clock,
            output,
            move |class| {
                let _ = abort_tx.send(Some(class));
            },
            once,
        )
        .await
    }
}

/// A run's report with what compaction in step did: a line each, or a `compactions` field.
fn with_compactions(
    text: String,
    done: &[crate::jobs::continuous::Compaction],
    output: OutputFormat,
) -> String {
    if done.is_empty() {
        return text;
    }
    match output {
        OutputFormat::Json => match serde_json::from_str::<serde_json::Value>(text.trim()) {
            Ok(serde_json::Value::Object(mut obj)) => {
                obj.insert(
                    "compactions".into(),
                    serde_json::to_value(done).unwrap_or_default(),
                );
                serde_json::Value::Object(obj).to_string() + "\n"
            }
            _ => text,
        },
        OutputFormat::Text => {
            let lines: String = done.iter().map(|c| c.to_text() + "\n").collect();
            text + &lines
        }
    }
}

/// `tidemark job run JOB --every`: each tick is one run of the job through its runner (its
/// lease, its ledger rows with trigger `continuous`), so two loops of one job never overlap —
/// the one that finds the lease held records its tick as skipped and tries the next.
pub(super) async fn job_every(
    args: JobRunArgs,
    period: Duration,
    clock: Arc<dyn Clock>,
) -> Result<Output, AppError> {
    if args.full_reload {
        return Err(AppError::Usage("--every runs the job incrementally on every tick; --full-reload rebuilds its targets once: run it once without --every, then start the loop".into()));
    }
    let (bundle, warnings) = super::jobs_commands::load_bundle_quietly(&args.select)?;
    for w in &warnings {
        warn!("{w}");
    }
    let job = Arc::new(bundle.job(&args.job).map_err(AppError::Usage)?.clone());
    let (cancel, cancel_rx) = watch::channel(None);
    let runner = JobRunner::new(&bundle.lake(), clock.clone(), cancel_rx)?;
    let compactor = Arc::new(Compactor::new(
        args.every
            .compact_after
            .unwrap_or(crate::config::bundle::DEFAULT_COMPACT_AFTER),
    ));
    let (target, output) = (bundle.target.clone(), args.output);
    let once = move |tick| -> BoxFuture<'static, Output> {
        let runner = runner.clone();
        let req = JobRequest {
            job: job.clone(),
            target: target.clone(),
            trigger: Trigger::Continuous,
            scheduled_at: Some(tick),
            full_reload: false,
            compact: Some(compactor.clone()),
        };
        Box::pin(async move {
            match runner.run(&req).await {
                Ok(report) => super::jobs_commands::job_output(report, output, None),
                Err(e) => Output {
                    stdout: String::new(),
                    failure: Some((e.class(), e.to_string())),
                },
            }
        })
    };
    let abort = move |class| {
        let _ = cancel.send(Some(format!(
            "{} received twice: `job run --every` was stopped",
            name(class)
        )));
    };
    Ok(every(period, clock, output, abort, once).await)
}
