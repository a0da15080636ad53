//! One function per command. Each returns what goes to stdout; errors carry their class.
//! The bundle and job commands live in `app/jobs_commands.rs`.

mod changes_command;
mod demo;
mod demo_debezium;
mod every;
mod fit;
mod jobs_commands;
mod lateness_command;
mod reconcile_command;
mod run_command;
mod runs_command;
mod status_command;
mod table_commands;
mod upstream;

pub use run_command::run_command;
pub use table_commands::{history, maintain, restore};

use std::sync::Arc;

use chrono::SecondsFormat;
use comfy_table::Table;

use crate::cli::{
    BundleCommand, Command, EngineArgs, GenerateArgs, HistoryArgs, JobCommand, MaintainArgs,
    OutputFormat, PipelineVars, ReconcileArgs, RestoreArgs,
};
use crate::clock::Clock;
use crate::config::pipeline::resolve_pipeline_path;
use crate::config::pipeline::Spec;
use crate::config::{ConfigError, Pipeline, Vars};
use crate::error::{Classify, ErrorClass};
use crate::generate::{self, GenerateError, GenerateMode, GenerateOptions, GenerateReport};
use crate::lake::classify_delta;
use crate::lake::{self, LakeError};
use crate::reconcile::{self, ReconcileError, ReconcileOptions};
use crate::run::{self, Engine, RunError};

/// Any failure of a command.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Lake(#[from] LakeError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Maintain(#[from] lake::MaintainError),
    #[error(transparent)]
    /// (boxed: a report that differs carries its rendered text)
    Reconcile(Box<ReconcileError>),
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Jobs(#[from] crate::jobs::JobsError),
    #[error(transparent)]
    Bundle(#[from] crate::config::BundleError),
    #[error(transparent)]
    Lateness(#[from] crate::lateness::LatenessError),
    /// SIGINT or SIGTERM stopped the command.
    #[error("{} received: the run was stopped and its spill files removed; nothing was committed unless its commit had already landed (a Delta commit lands whole or not at all: `tidemark history` shows which). Rerunning is safe", crate::signal::name(*signal))]
    Stopped { signal: ErrorClass },
    /// SIGINT or SIGTERM stopped a command that has no run to clean up.
    #[error("{} received: `tidemark {command}` was stopped. {after}", crate::signal::name(*signal))]
    Interrupted {
        signal: ErrorClass,
        command: &'static str,
        after: &'static str,
    },
    #[error("{action} {uri}: {source}")]
    Delta {
        action: &'static str,
        uri: String,
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
}

impl From<crate::pipeline::maintain::Error> for AppError {
    fn from(e: crate::pipeline::maintain::Error) -> Self {
        use crate::pipeline::maintain::Error;
        match e {
            Error::Lake(e) => AppError::Lake(e),
            Error::Run(e) => AppError::Run(e),
            Error::Maintain(e) => AppError::Maintain(e),
        }
    }
}

impl From<ReconcileError> for AppError {
    fn from(e: ReconcileError) -> Self {
        AppError::Reconcile(Box::new(e))
    }
}

impl Classify for AppError {
    fn class(&self) -> ErrorClass {
        match self {
            AppError::Config(e) => e.class(),
            AppError::Lake(e) => e.class(),
            AppError::Run(e) => e.class(),
            AppError::Generate(e) => e.class(),
            AppError::Usage(_) => ErrorClass::Usage,
            AppError::Maintain(e) => e.class(),
            AppError::Jobs(e) => e.class(),
            AppError::Bundle(e) => e.class(),
            AppError::Lateness(e) => e.class(),
            AppError::Delta { source, .. } => classify_delta(source),
            AppError::Reconcile(e) => e.class(),
            AppError::Stopped { signal } | AppError::Interrupted { signal, .. } => *signal,
        }
    }
}

impl AppError {
    /// Output that belongs on stdout although the command failed (the report of a
    /// reconciliation that found differences).
    pub fn stdout(&self) -> Option<&str> {
        match self {
            AppError::Reconcile(e) => e.stdout(),
            _ => None,
        }
    }
}

/// What a command produced: its stdout, and — for a command that ran but did not succeed (a
/// job with a failed task, an invalid bundle) — the class deciding the exit code and a message
/// for stderr. Such commands still print their full report.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub stdout: String,
    pub failure: Option<(ErrorClass, String)>,
}

impl From<String> for Output {
    fn from(stdout: String) -> Self {
        Output {
            stdout,
            failure: None,
        }
    }
}

/// Runs one command.
pub async fn dispatch(command: Command, clock: Arc<dyn Clock>) -> Result<Output, AppError> {
    use jobs_commands as j;
    Ok(match command {
        Command::Run(args) => run_command(args, clock).await?,
        Command::History(args) => stoppable("history", READ_ONLY, history(args)).await?.into(),
        Command::Restore(args) => stoppable("restore", RESTORE, restore(args)).await?.into(),
        Command::Generate(args) => stoppable("generate", GENERATE, generate_command(args))
            .await?
            .into(),
        Command::Demo(args) => demo::demo(args, clock).await?,
        Command::Maintain(args) => stoppable("maintain", MAINTAIN, maintain(args, clock.as_ref()))
            .await?
            .into(),
        Command::Reconcile(args) => stoppable(
            "reconcile",
            READ_ONLY,
            reconcile_command::reconcile_command(args, clock.as_ref()),
        )
        .await?
        .into(),
        Command::Bundle(b) => match b.command {
            BundleCommand::Validate(args) => j::bundle_validate(args),
            BundleCommand::Summary(args) => j::bundle_summary(args, clock.as_ref())?.into(),
        },
        Command::Job(job) => match job.command {
            JobCommand::Run(args) => j::job_run(args, clock).await?,
        },
        Command::Scheduler(args) => j::scheduler(args, clock).await?.into(),
        Command::Runs(args) => stoppable("runs", READ_ONLY, runs_command::runs(args))
            .await?
            .into(),
        Command::Lateness(args) => {
            stoppable("lateness", LATENESS, lateness_command::lateness(args))
                .await?
                .into()
        }
        Command::Changes(args) => stoppable("changes", READ_ONLY, changes_command::changes(args))
            .await?
            .into(),
        Command::Status(args) => stoppable("status", READ_ONLY, status_command::status(args))
            .await?
            .into(),
    })
}

const READ_ONLY: &str = "It only reads, so nothing was changed; rerun it";
const LATENESS: &str =
    "Nothing was changed (a --plot file is written whole or not at all); rerun it";
const GENERATE: &str = "The table it was writing is unfinished: rerun the same command, which replaces an interrupted generation and starts over";
const MAINTAIN: &str = "Each of its commits (tombstone removal, compaction) landed whole or not at all, and a vacuum only deletes files no version needs: `tidemark history` shows what landed; rerun it to finish";
const RESTORE: &str = "Each table's restore commit landed whole or not at all; `tidemark history` shows which did. Rerun the same restore to finish (a table already at the version is restored again, with the same rows)";

/// Runs a command that has no run of its own to stop: SIGINT or SIGTERM ends it with exit
/// 130/143 and its message (with `--output json`, its one JSON object), not the default death.
async fn stoppable<T, E: Into<AppError>>(
    command: &'static str,
    after: &'static str,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, AppError> {
    // (biased: the signals are listened to before the work starts)
    tokio::select! {
        biased;
        signal = crate::signal::stop_signal() => Err(AppError::Interrupted { signal, command, after }),
        done = work => done.map_err(Into::into),
    }
}

/// The file of pipeline `name`: a path, a file of `--pipelines-dir`, else a pipeline of the
/// bundle's jobs named so (by its `name:` or its file's name) — so a name the demo printed works
/// from any directory given `--bundle`.
pub(crate) fn pipeline_path(
    name: &str,
    from: &PipelineVars,
) -> Result<std::path::PathBuf, ConfigError> {
    let not_found = match resolve_pipeline_path(name, &from.pipelines_dir) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    if !crate::config::bundle::bundle_file(&from.bundle).is_file() {
        return Err(not_found);
    }
    let Ok(loaded) =
        crate::config::bundle::Bundle::load(&from.bundle, from.target.as_deref(), &Vars::new())
    else {
        return Err(not_found);
    };
    let tasks = || loaded.bundle.jobs.values().flat_map(|j| j.tasks.iter());
    let stem = |p: &std::path::Path| p.file_stem().and_then(|s| s.to_str()).map(str::to_string);
    let mut found: Vec<std::path::PathBuf> = tasks()
        .filter(|t| t.pipeline.name == name || stem(&t.pipeline.path).as_deref() == Some(name))
        .map(|t| t.pipeline.path.clone())
        .collect();
    found.sort();
    found.dedup();
    if let [one] = found.as_slice() {
        return Ok(one.clone());
    }
    // Not there either: name the bundle's pipelines too, and the nearest one.
    let mut names: Vec<String> = tasks().filter_map(|t| stem(&t.pipeline.path)).collect();
    names.sort();
    names.dedup();
    match not_found {
        ConfigError::PipelineNotFound {
            name,
            tried,
            mut choices,
        } if !names.is_empty() => {
            choices.near =
                crate::config::nearest(&name, names.iter().map(String::as_str)).map(str::to_string);
            choices.in_bundle = names
                .into_iter()
                .filter(|m| !choices.available.contains(m))
                .collect();
            Err(ConfigError::PipelineNotFound {
                name,
                tried,
                choices,
            })
        }
        other => Err(other),
    }
}

/// What a TABLE argument names: a pipeline's file (`Some`), or a table location (`None`) — or,
/// for a name close to a pipeline's, the error that says which pipeline it probably meant.
pub(crate) fn pipeline_or_table(
    name: &str,
    from: &PipelineVars,
) -> Result<Option<std::path::PathBuf>, AppError> {
    match pipeline_path(name, from) {
        Ok(path) => Ok(Some(path)),
        Err(e) => match near_pipeline(name, &e) {
            Some(near) => Err(near),
            None => Ok(None),
        },
    }
}

/// For a TABLE argument that names no pipeline (`not_found`, from [`pipeline_path`]) and is no
/// path that exists, but is close to a pipeline's name (no path separator, no URI scheme): the
/// "table not found" error it leads to, naming the pipeline it probably meant — still a missing
/// table (66), as for any other path.
fn near_pipeline(name: &str, not_found: &ConfigError) -> Option<AppError> {
    if name.contains('/') || name.contains("://") || std::path::Path::new(name).exists() {
        return None;
    }
    let ConfigError::PipelineNotFound { choices, .. } = not_found else {
        return None;
    };
    let names = choices.available.iter().chain(&choices.in_bundle);
    let near = crate::config::nearest(name, names.map(String::as_str))?;
    Some(AppError::Lake(crate::lake::LakeError::NotFound {
        role: "table",
        uri: name.to_string(),
        reason: format!(
            "no Delta table (no _delta_log) at that location, and no pipeline named `{name}` (did you mean the pipeline `{near}`?)"
        ),
    }))
}

/// Loads pipeline `name` (a path, or a file of `--pipelines-dir`, or of the bundle's jobs) with its `${var.NAME}` values
/// from `--var`, then from the bundle's variables for the selected target when the pipeline
/// needs one that `--var` does not give — so `tidemark run payments` works where
/// `tidemark job run` does. A `--var` the pipeline never references is refused.
fn load_pipeline(name: &str, from: &PipelineVars) -> Result<Pipeline, AppError> {
    let cli = Vars::from_args(&from.vars).map_err(ConfigError::BadVarArg)?;
    let path = pipeline_path(name, from)?;
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let missing = crate::config::vars::referenced(&text)
        .into_iter()
        .any(|r| cli.get(&r).is_none());
    let bundle_file = crate::config::bundle::bundle_file(&from.bundle);
    let vars = if (missing || from.target.is_some()) && bundle_file.is_file() {
        let loaded = crate::config::bundle::Bundle::load(
            &from.bundle,
            from.target.as_deref(),
            &Vars::new(),
        )?;
        let mut vars = loaded.bundle.vars;
        for n in cli.names() {
            if let Some(v) = cli.get(n) {
                vars.set(n, v);
            }
        }
        vars
    } else if let Some(t) = &from.target {
        return Err(AppError::Usage(format!(
            "--target {t} selects a bundle target, but there is no bundle at {}; pass --bundle DIR (the folder holding tidemark.yml)",
            from.bundle.display()
        )));
    } else {
        cli.clone()
    };
    let p = Pipeline::load(&path, &vars)?;
    p.check_vars_used(cli.names())?;
    Ok(p)
}

/// The table a command names: a pipeline's target when `name` is a pipeline, else `name`.
fn table_or_pipeline_target(name: &str, from: &PipelineVars) -> Result<String, AppError> {
    match pipeline_or_table(name, from)? {
        Some(_) => Ok(load_pipeline(name, from)?.target_uri().to_string()),
        None => Ok(name.to_string()),
    }
}

/// The lake root where the run ledger lives: `--var lake=`, else the bundle's `lake` for the
/// selected target. `what` names the command or flag in the message when there is neither.
pub(crate) fn ledger_lake(
    vars: &[String],
    bundle: &std::path::Path,
    target: Option<&str>,
    what: &str,
) -> Result<String, AppError> {
    let cli = crate::config::Vars::from_args(vars).map_err(ConfigError::BadVarArg)?;
    if let Some(lake) = cli.get("lake") {
        return Ok(cli.locate(lake));
    }
    if !crate::config::bundle::bundle_file(bundle).is_file() {
        return Err(AppError::Usage(format!(
            "{what} needs the lake holding the run ledger (_tidemark/runs): pass --var lake=DIR, or --bundle DIR (no bundle at {})",
            bundle.display()
        )));
    }
    let loaded = crate::config::bundle::Bundle::load(bundle, target, &cli)?;
    Ok(loaded.bundle.lake())
}

/// The compute a command was given on its command line (`--threads`, `--memory-limit`,
/// `--spill-dir`: the same settings a bundle's `job_clusters` declare, checked by the same rules).
pub(crate) fn engine_of(args: &EngineArgs) -> Result<Engine, AppError> {
    use crate::config::bundle::MAX_WORKER_THREADS;
    if args.threads.is_none() && args.memory_limit.is_none() && args.spill_dir.is_none() {
        return Ok(Engine::default());
    }
    if let Some(n) = args.threads {
        if n == 0 || n > MAX_WORKER_THREADS {
            return Err(AppError::Usage(format!(
                "--threads {n} is out of range; use 1 to {MAX_WORKER_THREADS}"
            )));
        }
    }
    // (the rule a bundle's `memory_limit:` follows, quoted as the flag)
    let memory_limit = match &args.memory_limit {
        Some(text) => Some(
            crate::config::bundle::compute::memory(
                &format!("`--memory-limit {}`", text.trim()),
                text,
            )
            .map_err(AppError::Usage)?,
        ),
        None => None,
    };
    let compute = crate::config::bundle::Compute {
        worker_threads: args.threads,
        memory_limit,
        spill_directory: args.spill_dir.clone(),
    };
    Engine::new(&compute).map_err(|e| AppError::Usage(e.to_string()))
}

/// `--var` arguments as they can be pasted into a shell: ` --var lake=/x` (values quoted when
/// they hold anything but plain path characters).
pub(crate) fn shell_var_args(vars: &[String]) -> String {
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:@,+".contains(c))
    };
    vars.iter()
        .map(|v| {
            if plain(v) {
                format!(" --var {v}")
            } else {
                format!(" --var '{}'", v.replace('\'', "'\\''"))
            }
        })
        .collect()
}

pub(crate) fn render_generate(report: &GenerateReport, output: OutputFormat) -> String {
    match output {
        OutputFormat::Json => serde_json::to_string(report).unwrap_or_default() + "\n",
        OutputFormat::Text => format!(
            "{} {}: {} rows ({} payments, {} deletes), table version {}, arrivals up to {}\n",
            report.mode,
            report.table,
            report.rows,
            report.distinct_payments,
            report.deletes,
            report.version,
            report.frontier.to_rfc3339_opts(SecondsFormat::Secs, true)
        ),
    }
}

pub(crate) fn render_landing(report: &generate::LandingReport, output: OutputFormat) -> String {
    match output {
        OutputFormat::Json => serde_json::to_string(report).unwrap_or_default() + "\n",
        OutputFormat::Text => format!(
            "landing {}: {} files, {} records{}, arrivals up to {}\n",
            report.landing,
            report.files,
            report.rows,
            match report.partner_rows {
                0 => String::new(),
                n => format!(" ({n} in partner files, a day or more late)"),
            },
            report.frontier.to_rfc3339_opts(SecondsFormat::Secs, true)
        ),
    }
}

/// `tidemark generate`.
pub async fn generate_command(args: GenerateArgs) -> Result<String, AppError> {
    let merchants = match &args.merchants {
        Some(uri) => Some((uri.clone(), generate_merchants(&args, uri).await?)),
        None => None,
    };
    let said = |(uri, n): &(String, u64)| match args.output {
        OutputFormat::Json => serde_json::json!({"merchants": {"table": uri, "records": n}}),
        OutputFormat::Text => serde_json::Value::String(format!(
            "merchants: {n} change record(s) written to {uri}\n"
        )),
    };
    if args.out.is_none() && args.landing.is_none() {
        return match merchants.as_ref().map(said) {
            Some(serde_json::Value::String(t)) => Ok(t),
            Some(v) => Ok(format!("{v}\n")),
            None => Err(AppError::Usage(
                "say where to write: --out <bronze table>, --landing <folder>, and/or --merchants <table>".into(),
            )),
        };
    }
    let text = generate_payments(&args).await?;
    Ok(match merchants.as_ref().map(said) {
        None => text,
        Some(serde_json::Value::String(m)) => text + &m,
        Some(serde_json::Value::Object(m)) => {
            // One JSON object: the payments' report with the merchants' beside it.
            match serde_json::from_str::<serde_json::Value>(text.trim()) {
                Ok(serde_json::Value::Object(mut report)) => {
                    report.extend(m);
                    format!("{}\n", serde_json::Value::Object(report))
                }
                _ => text,
            }
        }
        Some(_) => text,
    })
}

/// `--merchants`: the world's merchants feed, landed by the end of `--days` (a new table), or
/// the next hour(s) after the newest record the table holds (`--next-hour`).
async fn generate_merchants(args: &GenerateArgs, uri: &str) -> Result<u64, AppError> {
    let all = generate::merchants::records(args.seed, args.start, args.days);
    let start = generate::merchants::start_of(args.start);
    let hour = 3_600_000_000i64;
    let existing = lake::open_if_exists(uri).await?;
    let (after, until) = match (&existing, args.next_hour) {
        (Some(t), true) => {
            let newest = match lake::max_from_stats(t, "_ingested_at") {
                Ok(lake::StatsMax::Max(us)) => us,
                _ => start + i64::from(args.days) * 24 * hour,
            };
            (Some(newest), newest + i64::from(args.hours) * hour)
        }
        (None, true) => {
            return Err(AppError::Usage(format!(
                "--next-hour appends to the merchants table {uri}, which does not exist; generate it first without --next-hour"
            )))
        }
        (Some(_), false) => {
            return Err(AppError::Usage(format!(
                "{uri} already is a Delta table; remove it first, or use --next-hour to append to it"
            )))
        }
        (None, false) => (None, start + i64::from(args.days) * 24 * hour),
    };
    Ok(generate::merchants::land(uri, &all, after, until).await?)
}

async fn generate_payments(args: &GenerateArgs) -> Result<String, AppError> {
    if let Some(dir) = &args.landing {
        let report = if args.next_hour {
            generate::landing_next(dir, args.hours)?
        } else {
            generate::landing_full(
                dir,
                args.feed,
                &GenerateOptions {
                    out: String::new(),
                    payments: args.payments,
                    days: args.days,
                    seed: args.seed,
                    start: args.start,
                    mode: GenerateMode::Full,
                },
            )?
        };
        return Ok(render_landing(&report, args.output));
    }
    let out = args.out.clone().unwrap_or_default();
    let report = if args.next_hour {
        generate::next_hours(&out, args.hours).await?
    } else {
        generate::generate(&GenerateOptions {
            out,
            payments: args.payments,
            days: args.days,
            seed: args.seed,
            start: args.start,
            mode: GenerateMode::Full,
        })
        .await?
    };
    Ok(render_generate(&report, args.output))
}
