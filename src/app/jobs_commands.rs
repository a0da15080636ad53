//! The bundle and job commands: `bundle validate`, `bundle summary`, `job run`, `scheduler`,
//! `runs`.

use std::fmt::Write as _;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{AppError, Output};
use crate::cli::{
    BundleSelect, BundleSummaryArgs, BundleValidateArgs, JobRunArgs, OutputFormat, SchedulerArgs,
};
use crate::clock::Clock;
use crate::config::bundle::{Bundle, Job, Severity};
use crate::config::schedule::local_label;
use crate::config::{BundleError, ConfigError, Diagnostic, Vars};
use crate::error::ErrorClass;
use crate::jobs::continuous::ContinuousJob;
use crate::jobs::{
    BundleExecutor, JobReport, JobRequest, JobRunner, ScheduledJob, Scheduler, Trigger,
};

fn cli_vars(select: &BundleSelect) -> Result<Vars, AppError> {
    Ok(Vars::from_args(&select.vars).map_err(ConfigError::BadVarArg)?)
}

/// Loads the selected bundle; its warnings go to the log.
pub fn load_bundle(select: &BundleSelect) -> Result<Bundle, AppError> {
    let (bundle, warnings) = load_bundle_quietly(select)?;
    for w in &warnings {
        warn!("{w}");
    }
    Ok(bundle)
}

/// Loads the selected bundle; its warnings (`file:line: message`) are the caller's to show, once.
pub fn load_bundle_quietly(select: &BundleSelect) -> Result<(Bundle, Vec<String>), AppError> {
    let vars = cli_vars(select)?;
    let loaded = Bundle::load(&select.bundle, select.target.as_deref(), &vars)?;
    let warnings = loaded.warnings.iter().map(|w| w.located()).collect();
    Ok((loaded.bundle, warnings))
}

/// `tidemark bundle validate`.
/// `bundle.name` from the bundle file when it can be read (with the folder), else the folder.
fn bundle_title(path: &std::path::Path) -> String {
    let file = crate::config::bundle::bundle_file(path);
    let name = std::fs::read_to_string(&file)
        .ok()
        .and_then(|text| serde_yaml::from_str::<serde_yaml::Value>(&text).ok())
        .and_then(|v| v.get("bundle")?.get("name")?.as_str().map(str::to_string));
    match name {
        Some(name) if name == path.display().to_string() => name,
        Some(name) => format!("{name} ({})", path.display()),
        None => path.display().to_string(),
    }
}

pub fn bundle_validate(args: BundleValidateArgs) -> Output {
    let vars = match cli_vars(&args.select) {
        Ok(v) => v,
        Err(e) => {
            return Output {
                stdout: String::new(),
                failure: Some((ErrorClass::Usage, e.to_string())),
            }
        }
    };
    let result = Bundle::load(&args.select.bundle, args.select.target.as_deref(), &vars);
    let (bundle, mut errors, mut warnings) = match result {
        Ok(l) => (Some(l.bundle), Vec::new(), l.warnings),
        Err(BundleError { errors, warnings }) => (None, errors, warnings),
    };
    // One problem found twice (a pipeline file two tasks share) is listed once.
    for list in [&mut errors, &mut warnings] {
        let mut seen = std::collections::HashSet::new();
        list.retain(|d| seen.insert(d.to_string()));
    }
    let stdout = match args.output {
        OutputFormat::Json => {
            serde_json::json!({
                "valid": errors.is_empty(),
                "bundle": bundle.as_ref().map(|b| b.name.clone()),
                "target": bundle.as_ref().map(|b| b.target.clone()),
                "jobs": bundle.as_ref().map(|b| b.jobs.keys().cloned().collect::<Vec<_>>()).unwrap_or_default(),
                "errors": errors,
                "warnings": warnings,
            })
            .to_string()
                + "\n"
        }
        OutputFormat::Text => {
            let mut out = String::new();
            let mut all: Vec<&Diagnostic> = errors.iter().chain(&warnings).collect();
            all.sort_by(|a, b| (&a.file, a.line, a.severity == Severity::Warning).cmp(&(&b.file, b.line, b.severity == Severity::Warning)));
            for d in all {
                let _ = writeln!(out, "{d}");
            }
            let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
            match &bundle {
                Some(b) => {
                    let _ = writeln!(
                        out,
                        "bundle {} (target {}): valid — {} ({}), {}",
                        b.name,
                        b.target,
                        plural(b.jobs.len(), "job"),
                        b.jobs.keys().cloned().collect::<Vec<_>>().join(", "),
                        plural(warnings.len(), "warning")
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "bundle {}: invalid — {}, {}",
                        bundle_title(&args.select.bundle),
                        plural(errors.len(), "error"),
                        plural(warnings.len(), "warning")
                    );
                }
            }
            out
        }
    };
    let failure = (!errors.is_empty()).then(|| {
        (
            ErrorClass::Config,
            format!(
                "fix the {} problem{} listed with file:line, then run `tidemark bundle validate{}` again",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" },
                if args.select.bundle == std::path::Path::new("bundle") {
                    String::new()
                } else {
                    format!(" --bundle {}", args.select.bundle.display())
                }
            ),
        )
    });
    Output { stdout, failure }
}

/// A schedule's fire time: computed, never recorded, always on a whole second, shown as such
/// next to its local wall-clock time (`bundle summary`).
fn fire(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn job_json(job: &Job, from: DateTime<Utc>, count: usize) -> serde_json::Value {
    let fires: Vec<serde_json::Value> = job
        .schedule
        .as_ref()
        .map(|s| {
            s.cron
                .upcoming(from, count)
                .into_iter()
                .map(|t| serde_json::json!({"utc": fire(t), "local": local_label(t, s.cron.timezone())}))
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "name": job.name,
        "description": job.description,
        "file": job.file,
        "schedule": job.schedule.as_ref().map(|s| serde_json::json!({
            "quartz_cron_expression": s.cron.expression(),
            "timezone_id": s.cron.timezone().name(),
            "pause_status": s.pause_status,
        })),
        "continuous": job.continuous,
        "catch_up": job.catch_up,
        "max_concurrent_runs": job.max_concurrent_runs,
        "timeout_seconds": job.timeout.map(|t| t.as_secs()),
        "job_clusters": job.clusters,
        "tasks": job.tasks.iter().map(|t| serde_json::json!({
            "task_key": t.key,
            "depends_on": t.depends_on,
            "job_cluster_key": t.cluster,
            "pipeline": t.pipeline.name,
            "pipeline_file": t.pipeline.path,
            "mode": t.mode,
            "max_retries": t.max_retries,
            "min_retry_interval_millis": t.min_retry_interval.as_millis() as u64,
            "retry_on_timeout": t.retry_on_timeout,
            "timeout_seconds": t.timeout.map(|d| d.as_secs()),
        })).collect::<Vec<_>>(),
        "next_fires": fires,
    })
}

/// `tidemark bundle summary`.
pub fn bundle_summary(args: BundleSummaryArgs, clock: &dyn Clock) -> Result<String, AppError> {
    let bundle = load_bundle(&args.select)?;
    let from = match &args.from {
        Some(s) => DateTime::parse_from_rfc3339(s.trim())
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                AppError::Usage(format!(
                    "--from {s:?} is not an RFC 3339 time ({e}); e.g. 2027-03-28T00:00:00Z"
                ))
            })?,
        None => clock.now(),
    };
    if args.output == OutputFormat::Json {
        let v = serde_json::json!({
            "bundle": bundle.name,
            "target": bundle.target,
            "file": bundle.file,
            "from": fire(from),
            "variables": bundle.variables,
            "jobs": bundle.jobs.values().map(|j| job_json(j, from, args.count)).collect::<Vec<_>>(),
        });
        return Ok(v.to_string() + "\n");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "bundle {} — target {} ({})",
        bundle.name,
        bundle.target,
        bundle.file.display()
    );
    let _ = writeln!(out, "variables:");
    for v in &bundle.variables {
        let _ = writeln!(
            out,
            "  {} = {}  [{}]{}",
            v.name,
            v.value.as_deref().unwrap_or("(no value)"),
            v.source.as_deref().unwrap_or("unset"),
            v.description
                .as_deref()
                .map(|d| format!("  {d}"))
                .unwrap_or_default()
        );
    }
    for job in bundle.jobs.values() {
        job_text(&mut out, job, from, args.count);
    }
    Ok(out)
}

/// A job in `bundle summary`'s text: its schedule, compute, tasks and next fires.
fn job_text(out: &mut String, job: &crate::config::bundle::Job, from: DateTime<Utc>, count: usize) {
    let _ = writeln!(
        out,
        "\njob {}{}",
        job.name,
        job.description
            .as_deref()
            .map(|d| format!(" — {d}"))
            .unwrap_or_default()
    );
    match &job.schedule {
        Some(s) => {
            let _ = writeln!(
                out,
                "  schedule: \"{}\" in {} ({}), catch_up {}, max_concurrent_runs {}",
                s.cron.expression(),
                s.cron.timezone().name(),
                serde_json::to_value(s.pause_status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                serde_json::to_value(job.catch_up)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                job.max_concurrent_runs
            );
        }
        None => match &job.continuous {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "  continuous: every {} ({}), back to back under the job's lease; compaction in step after {} new files per table",
                    humantime::format_duration(c.every),
                    serde_json::to_value(c.pause_status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    c.compact_after
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  schedule: none (runs only with `tidemark job run {}`)",
                    job.name
                );
            }
        },
    }
    if let Some(t) = job.timeout {
        let _ = writeln!(out, "  timeout: {} s", t.as_secs());
    }
    for (key, c) in &job.clusters {
        let _ = writeln!(
            out,
            "  compute {key}: {} worker threads, memory limit {}, spill to {}",
            c.worker_threads
                .map(|n| n.to_string())
                .unwrap_or_else(|| "all".to_string()),
            c.memory_limit
                .map(crate::report::size)
                .unwrap_or_else(|| "none".to_string()),
            c.spill_directory
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "the OS temp directory".to_string())
        );
    }
    for t in &job.tasks {
        let deps = if t.depends_on.is_empty() {
            String::new()
        } else {
            format!(" after {}", t.depends_on.join(", "))
        };
        let _ = writeln!(
            out,
            "  task {}{deps}: pipeline {} ({}), {}, on {}; retries {} (every {} ms{}), timeout {}",
            t.key,
            t.pipeline.name,
            t.pipeline.path.display(),
            serde_json::to_value(t.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            t.cluster.as_deref().unwrap_or("the default engine"),
            t.max_retries,
            t.min_retry_interval.as_millis(),
            if t.retry_on_timeout {
                ", also on timeout"
            } else {
                ""
            },
            t.timeout
                .map(|d| format!("{} s", d.as_secs()))
                .unwrap_or_else(|| "none".to_string())
        );
    }
    if let Some(s) = &job.schedule {
        let fires = s.cron.upcoming(from, count);
        let _ = writeln!(out, "  next {} fires after {}:", fires.len(), fire(from));
        for f in fires {
            let _ = writeln!(
                out,
                "    {:<28} {}",
                local_label(f, s.cron.timezone()),
                fire(f)
            );
        }
    }
}

/// Runs `job` of `bundle` once (manual trigger) and renders its report.
pub async fn run_job(
    bundle: &Bundle,
    job: &str,
    full_reload: bool,
    output: OutputFormat,
    clock: Arc<dyn Clock>,
    bundle_warnings: Vec<String>,
) -> Result<Output, AppError> {
    let job = bundle.job(job).map_err(AppError::Usage)?;
    // SIGINT/SIGTERM cancel the running attempts; the runner still writes their ledger rows
    // (status `cancelled`) and releases the lease, then the command exits 130/143.
    let (cancel, cancel_rx) = watch::channel(None);
    let (got_signal, signal_rx) = watch::channel(None::<ErrorClass>);
    let signals = tokio::spawn(async move {
        let class = crate::signal::stop_signal().await;
        let _ = got_signal.send(Some(class));
        let _ = cancel.send(Some(format!(
            "{} received: `job run` was stopped",
            crate::signal::name(class)
        )));
    });
    let runner = JobRunner::new(&bundle.lake(), clock, cancel_rx)?;
    let report = runner
        .run(&JobRequest {
            job: Arc::new(job.clone()),
            target: bundle.target.clone(),
            trigger: Trigger::Manual,
            scheduled_at: None,
            full_reload,
            compact: None,
        })
        .await;
    signals.abort();
    let signal = *signal_rx.borrow();
    let report = match (report, signal) {
        (Ok(report), _) => report,
        (Err(e), Some(class)) => {
            return Ok(Output {
                stdout: String::new(),
                failure: Some((
                    class,
                    format!(
                        "{} received: `job run` stopped ({e})",
                        crate::signal::name(class)
                    ),
                )),
            })
        }
        (Err(e), None) => return Err(e.into()),
    };
    let mut report = report;
    report.warnings.splice(0..0, bundle_warnings);
    Ok(job_output(report, output, signal))
}

/// A job run's report as `--output` asks, with the class and message of its failure (as the
/// signal that stopped it says, if one did).
pub(super) fn job_output(
    report: JobReport,
    output: OutputFormat,
    signal: Option<ErrorClass>,
) -> Output {
    // Each warning once: in the text report, or on stderr beside the JSON.
    let stdout = match output {
        OutputFormat::Json => {
            for w in report.all_warnings() {
                warn!("{w}");
            }
            report.to_json() + "\n"
        }
        OutputFormat::Text => report.to_text(),
    };
    let failure = report.failure_class().map(|class| {
        let message = report.failure_message().unwrap_or_default();
        match signal {
            // A stopped job exits as the signal says, whatever its tasks did before.
            Some(sig) => (sig, format!("{} received: {message}; the lease was released and every attempt is in the ledger; rerunning is safe", crate::signal::name(sig))),
            None => (class, message),
        }
    });
    Output { stdout, failure }
}

/// `tidemark job run`.
pub async fn job_run(args: JobRunArgs, clock: Arc<dyn Clock>) -> Result<Output, AppError> {
    if let Some(every) = args.every.every {
        return super::every::job_every(args, every, clock).await;
    }
    let (bundle, warnings) = load_bundle_quietly(&args.select)?;
    run_job(
        &bundle,
        &args.job,
        args.full_reload,
        args.output,
        clock,
        warnings,
    )
    .await
}

/// `tidemark scheduler`.
pub async fn scheduler(args: SchedulerArgs, clock: Arc<dyn Clock>) -> Result<String, AppError> {
    let bundle = load_bundle(&args.select)?;
    let jobs = ScheduledJob::from_bundle(&bundle);
    let continuous = ContinuousJob::from_bundle(&bundle);
    let executor = Arc::new(BundleExecutor::new(&bundle, clock.clone())?);
    let (stop, stop_rx) = watch::channel(false);
    let signals = tokio::spawn(async move {
        crate::signal::stop_signal().await;
        let _ = stop.send(true);
    });
    info!(
        bundle = %bundle.name,
        target = %bundle.target,
        jobs = %jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(","),
        continuous = %continuous.iter().map(|j| j.name.as_str()).collect::<Vec<_>>().join(","),
        "scheduler started"
    );
    let report = Scheduler::new(jobs, clock, executor, args.grace_period)
        .with_continuous(continuous)
        .run(stop_rx)
        .await?;
    signals.abort();
    Ok(format!(
        "scheduler stopped: {} fires, {} catch-up runs, {} skipped (still running), {} missed{}{}\n",
        report.fires,
        report.catch_ups,
        report.skipped,
        report.missed,
        match report.continuous_runs {
            0 => String::new(),
            n => format!(", {n} continuous runs"),
        },
        if report.cancelled_at_shutdown {
            "; running jobs were cancelled when the grace period ran out"
        } else {
            ""
        }
    ))
}
