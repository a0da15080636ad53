//! Command-line types only; behaviour lives in [`crate::app`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tidemark: keeps Delta Lake payments tables current every hour.
#[derive(Debug, Parser)]
#[command(name = "tidemark", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level on stderr (default: warn); RUST_LOG (tracing filter syntax) wins when set.
    #[arg(long, global = true, value_enum, conflicts_with = "verbose")]
    pub log_level: Option<LogLevel>,
    /// More log output: -v shows progress (info), -vv debug, -vvv trace.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How much is logged to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl Cli {
    /// Whether the command is the long-running scheduler at the default log level: it then
    /// also says what it schedules and fires (a service that prints nothing until it stops
    /// looks hung).
    pub fn is_quiet_service(&self) -> bool {
        matches!(self.command, Command::Scheduler(_))
            && self.log_level.is_none()
            && self.verbose == 0
    }

    /// `--log-level`, else the level `-v`s ask for, else warnings only.
    pub fn level(&self) -> LogLevel {
        self.log_level.unwrap_or(match self.verbose {
            0 => LogLevel::Warn,
            1 => LogLevel::Info,
            2 => LogLevel::Debug,
            _ => LogLevel::Trace,
        })
    }
}

impl Command {
    /// The `--output` the command was given (Text for commands without one).
    pub fn output(&self) -> OutputFormat {
        match self {
            Command::Run(a) => a.output,
            Command::History(a) => a.output,
            Command::Restore(a) => a.output,
            Command::Generate(a) => a.output,
            Command::Demo(a) => a.output,
            Command::Maintain(a) => a.output,
            Command::Reconcile(a) => a.output,
            Command::Bundle(b) => match &b.command {
                BundleCommand::Validate(a) => a.output,
                BundleCommand::Summary(a) => a.output,
            },
            Command::Job(j) => match &j.command {
                JobCommand::Run(a) => a.output,
            },
            Command::Scheduler(_) => OutputFormat::Text,
            Command::Runs(a) => a.output,
            Command::Lateness(a) => a.output,
            Command::Changes(a) => a.output,
            Command::Status(a) => a.output,
        }
    }
}

/// Whether raw arguments ask for `--output json`, for errors found before they could be
/// parsed (an unknown flag still gets its JSON error object).
pub fn wants_json(args: &[String]) -> bool {
    args.iter().enumerate().any(|(i, a)| {
        a == "--output=json" || (a == "--output" && args.get(i + 1).is_some_and(|v| v == "json"))
    })
}

/// How results are written to stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline once: incremental merge, or a full reload.
    Run(RunArgs),
    /// Show a table's commits, with tidemark's run facts.
    History(HistoryArgs),
    /// Restore a table to an earlier version (a new commit; undo with another restore).
    Restore(RestoreArgs),
    /// Write a synthetic bronze payments change table, or append its next hour.
    Generate(GenerateArgs),
    /// The first command to try: sample data under ./lake, then one run of the
    /// payments_hourly job per call.
    Demo(DemoArgs),
    /// Compact small files, write a checkpoint and vacuum unreferenced files safely.
    Maintain(MaintainArgs),
    /// Compare the target with the newest row per key of its whole source (exit 65 if they differ).
    Reconcile(ReconcileArgs),
    /// Check or describe the bundle (jobs as code under bundle/).
    Bundle(BundleArgs),
    /// Run a bundle job.
    Job(JobArgs),
    /// Fire every UNPAUSED job on its schedule until SIGTERM/SIGINT.
    Scheduler(SchedulerArgs),
    /// Recent job runs from the run ledger, one row per task attempt.
    Runs(RunsArgs),
    /// How late the data really runs: days-late histogram, completeness curve, percentiles,
    /// rows beyond the budget and the overlap, and the lookback a target completeness needs.
    Lateness(LatenessArgs),
    /// What a table's change data feed says changed between two versions: counts per change
    /// type and version, and the keys (a pipeline's target, or a table with the feed on).
    Changes(ChangesArgs),
    /// An aggregate's day status: per event day open or final (since when), rows, the latest
    /// arrival and when it was last recomputed — what a dashboard shows as "provisional".
    Status(StatusArgs),
}

/// Which bundle, which target, and variable overrides.
#[derive(Debug, Args, Clone)]
pub struct BundleSelect {
    /// The bundle directory (holding tidemark.yml), or the bundle file.
    #[arg(long, default_value = "bundle")]
    pub bundle: PathBuf,
    /// The target (default: the one marked `default: true`).
    #[arg(long, short = 't')]
    pub target: Option<String>,
    /// Set a bundle variable (repeatable); wins over `BUNDLE_VAR_<NAME>`, the target and the default.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
}

#[derive(Debug, Args)]
pub struct BundleArgs {
    #[command(subcommand)]
    pub command: BundleCommand,
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Load every bundle file and report all problems (with file and line) and warnings.
    Validate(BundleValidateArgs),
    /// Each job: its tasks, compute, and next fire times in its time zone and in UTC.
    Summary(BundleSummaryArgs),
}

#[derive(Debug, Args)]
pub struct BundleValidateArgs {
    #[command(flatten)]
    pub select: BundleSelect,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct BundleSummaryArgs {
    #[command(flatten)]
    pub select: BundleSelect,
    /// Fire times after this instant (RFC 3339; default: now).
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// How many fire times per job.
    #[arg(long, default_value_t = 5)]
    pub count: usize,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct JobArgs {
    #[command(subcommand)]
    pub command: JobCommand,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Run a job's tasks now, in dependency order, with its retries and timeouts.
    Run(JobRunArgs),
}

#[derive(Debug, Args)]
pub struct JobRunArgs {
    /// The job's name under `resources.jobs`.
    pub job: String,
    #[command(flatten)]
    pub select: BundleSelect,
    /// Run every pipeline task as a full reload (recovery).
    #[arg(long)]
    pub full_reload: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub every: EveryArgs,
}

/// Continuous runs: the same run again on a period, until stopped.
#[derive(Debug, Clone, Args)]
pub struct EveryArgs {
    /// Run again every DURATION (e.g. 30s, 5m; at least 1s) until SIGINT/SIGTERM, printing each
    /// run's report as it ends: the first signal lets the current run finish, then exits 0; a
    /// second one stops the run (exit 130/143).
    #[arg(long, value_name = "DURATION", value_parser = parse_every)]
    pub every: Option<std::time::Duration>,
    /// With --every: maintain a pipeline's tables (compaction, checkpoint, vacuum within the
    /// retention, as `tidemark maintain`) once they gained N live files, keeping small files
    /// bounded.
    #[arg(long, value_name = "N", requires = "every", value_parser = clap::value_parser!(u64).range(1..))]
    pub compact_after: Option<u64>,
}

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    #[command(flatten)]
    pub select: BundleSelect,
    /// On SIGTERM/SIGINT, how long running jobs may take to finish before they are cancelled.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub grace_period: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(flatten)]
    pub select: BundleSelect,
    /// Only this job's runs.
    #[arg(long)]
    pub job: Option<String>,
    /// How many rows (task attempts), newest first; at least 1.
    #[arg(long, default_value_t = 20, value_parser = parse_limit)]
    pub limit: usize,
    /// Every column (trigger, fire time, mode, target version) on one line each; the default
    /// table fits 100 columns, wrapping long errors.
    #[arg(long)]
    pub wide: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline YAML path, or the name of a file in the pipelines directory.
    pub pipeline: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// Rebuild the target from the whole source in one overwrite commit.
    #[arg(long)]
    pub full_reload: bool,
    /// Plan and count everything; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// `aggregate` pipelines: the run's logical date (YYYY-MM-DD; default: today in the
    /// pipeline's time zone). Decides the lookback window and which days are final.
    #[arg(long, value_name = "DATE", value_parser = parse_date)]
    pub logical_date: Option<chrono::NaiveDate>,
    /// `aggregate` pipelines: restate the event days from this date (with --to), on purpose.
    #[arg(long = "from", value_name = "DATE", requires = "restate_to", value_parser = parse_date)]
    pub restate_from: Option<chrono::NaiveDate>,
    /// `aggregate` pipelines: ... up to and including this date.
    #[arg(long = "to", value_name = "DATE", requires = "restate_from", value_parser = parse_date)]
    pub restate_to: Option<chrono::NaiveDate>,
    #[command(flatten)]
    pub every: EveryArgs,
}

/// The compute a command's queries run with: the settings a bundle's `job_clusters` declare,
/// for `run`, `reconcile` and `lateness`.
#[derive(Debug, Args, Clone, Default)]
pub struct EngineArgs {
    /// DataFusion partitions (parallelism of scans and sorts); default: the machine's cores.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Memory for queries (e.g. 1536MiB); sorts over it spill to --spill-dir instead of failing.
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Where spill files go (with --memory-limit); default: the OS temporary directory.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
}

/// Where a pipeline's `${var.NAME}` values come from: `--var` first, then the bundle's variables
/// for the selected target (only read when the pipeline needs a value `--var` does not give).
#[derive(Debug, Args, Clone)]
pub struct PipelineVars {
    /// Set a variable used as ${var.NAME} (repeatable); wins over the bundle's.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
    /// The bundle whose variables fill the ones --var does not give (directory or file).
    #[arg(long, default_value = "bundle")]
    pub bundle: PathBuf,
    /// The bundle target whose variables are used (default: the one marked `default: true`).
    #[arg(long, short = 't')]
    pub target: Option<String>,
    /// Where pipeline names are looked up.
    #[arg(long, default_value = "pipelines")]
    pub pipelines_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// A pipeline (its target's history) or a table path/URI.
    pub table: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// How many commits, newest first; at least 1.
    #[arg(long, default_value_t = 20, value_parser = parse_limit)]
    pub limit: usize,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A pipeline (its target is restored) or a table path/URI.
    pub table: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// The version to restore.
    #[arg(long)]
    pub version: u64,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("dest").required(true).multiple(true).args(["out", "landing", "merchants"])))]
pub struct GenerateArgs {
    /// Bronze table path or URI: write the rows straight into a Delta table.
    #[arg(long)]
    pub out: Option<String>,
    /// A local folder: deliver the rows as landing files instead (JSON lines for the event
    /// stream, CSV for the partner's day-late file), for a `kind: ingest` pipeline to read.
    #[arg(long, conflicts_with = "out")]
    pub landing: Option<std::path::PathBuf>,
    /// Payments created over --days (the rate continues for --next-hour).
    #[arg(long, default_value_t = 20_000)]
    pub payments: u64,
    #[arg(long, default_value_t = 30)]
    pub days: u32,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// UTC date of day 0 (YYYY-MM-DD).
    #[arg(long, default_value = "2024-01-01")]
    pub start: chrono::NaiveDate,
    /// Also write the merchants' change records (a dimension's CDC feed: first records, segment
    /// moves, renames, closures; some merchants recorded days after their first payments) to
    /// this Delta table: those landed by the end of --days (with --next-hour: those landed in
    /// the next hour(s) after the newest one it holds).
    #[arg(long)]
    pub merchants: Option<String>,
    /// Append the next hour(s) of arrivals to an existing generated table (or landing folder).
    #[arg(long)]
    pub next_hour: bool,
    /// With --next-hour: how many hours to append.
    #[arg(long, default_value_t = 1, requires = "next_hour")]
    pub hours: u32,
    /// With --landing: the shape of the files. `files`: the event stream as JSON lines and the
    /// partner's day-late CSV; `debezium`: every change as the Debezium event a PostgreSQL
    /// connector sends (`cdc/<hour>.json`, decimals as strings, an unchanged TOASTed note as
    /// `__debezium_unavailable_value`). A later --next-hour keeps the folder's shape.
    #[arg(long, value_enum, default_value_t = crate::generate::Feed::Files, requires = "landing")]
    pub feed: crate::generate::Feed,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct MaintainArgs {
    /// A pipeline (its target table is maintained) or a table path/URI.
    pub table: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// Vacuum files unreferenced for longer than this (e.g. 168h, 30days); at least the
    /// table's delta.deletedFileRetentionDuration (7 days by default), which is the default.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention: Option<std::time::Duration>,
    /// Skip compaction (checkpoint and vacuum only).
    #[arg(long)]
    pub no_compact: bool,
    /// Report what would be compacted and vacuumed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where runs spill (their `--spill-dir` / `spill_directory`): spill directories left there
    /// by processes of this host that no longer exist are removed. Default: the OS temp directory.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Folder for the demo's tables (sets the bundle variable `lake`; default: the `local`
    /// target's ./lake).
    #[arg(long)]
    pub lake: Option<PathBuf>,
    /// The bundle whose `payments_hourly` job the demo runs (default: ./bundle, else the
    /// bundle of the tidemark checkout this binary was built from).
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    /// The feed: `files` (the event stream as JSON lines and the partner's CSV, into the
    /// `payments_hourly` job) or `debezium` (the same payments as a PostgreSQL connector's
    /// Debezium events, into the `payments_debezium_hourly` job: its own bronze, silver, gold).
    #[arg(long, value_enum, default_value_t = crate::generate::Feed::Files)]
    pub feed: crate::generate::Feed,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Pipeline YAML path, or the name of a file in the pipelines directory.
    pub pipeline: String,
    #[command(flatten)]
    pub from: PipelineVars,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// How many differing keys to list (all are counted).
    #[arg(long, default_value_t = crate::reconcile::DEFAULT_LIMIT)]
    pub limit: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Args)]
pub struct ChangesArgs {
    /// A pipeline (its target) or a table path/URI.
    pub table: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// The first version to read the feed of.
    #[arg(long)]
    pub from_version: u64,
    /// The last version (default: the latest).
    #[arg(long)]
    pub to_version: Option<u64>,
    /// Key columns to list (default: a cdc_merge pipeline's `keys`; none for a table URI).
    #[arg(long = "key", value_name = "COLUMN")]
    pub keys: Vec<String>,
    /// Keys listed per change type.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// An aggregate pipeline (path, or name in the pipelines directory).
    pub pipeline: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// Days listed, newest first (JSON lists every day).
    #[arg(long, default_value_t = 14, value_parser = parse_limit)]
    pub days: usize,
    /// With `window:`: windows listed (of the open days and the newest), newest first; default
    /// 24 (JSON lists them all).
    #[arg(long, value_parser = parse_limit)]
    pub windows: Option<usize>,
    /// Every column (groups, when each day was last recomputed) at full width; the default
    /// table fits 100 columns.
    #[arg(long)]
    pub wide: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct LatenessArgs {
    /// A pipeline (its source, the bronze table) or a table path/URI.
    pub table: String,
    #[command(flatten)]
    pub from: PipelineVars,
    /// When each event happened (default: the pipeline's `sequence_by`; required for a table URI).
    #[arg(long, value_name = "COLUMN")]
    pub event_time: Option<String>,
    /// When each row landed in the table.
    #[arg(long, value_name = "COLUMN", default_value = "_ingested_at")]
    pub arrival: String,
    /// The histogram's unit: calendar days late, or elapsed hours/minutes late.
    #[arg(long, value_enum, default_value_t = crate::lateness::Unit::Days)]
    pub unit: crate::lateness::Unit,
    /// The settled window: event times in [now-FROM, now-TO) (default 120d..30d, narrowed with a
    /// note when the table is younger).
    #[arg(long, value_name = "FROM..TO", value_parser = crate::lateness::parse_settled)]
    pub settled: Option<crate::lateness::Settled>,
    /// Measure as of this time (RFC 3339; default: the table's latest arrival).
    #[arg(long, value_name = "TIME", value_parser = crate::lateness::parse_now)]
    pub now: Option<chrono::DateTime<chrono::Utc>>,
    /// The lateness budget: rows with arrival > event + budget are counted.
    #[arg(long, value_name = "DURATION", default_value = "3d", value_parser = crate::lateness::parse_duration)]
    pub budget: std::time::Duration,
    /// The completeness the recommended lookback must reach (of settled rows).
    #[arg(long = "target-completeness", visible_alias = "goal", value_name = "PERCENT", default_value = "99.9%", value_parser = crate::lateness::parse_percent)]
    pub target_completeness: f64,
    /// The same profile per value of this column, the tail's owners first.
    #[arg(long, value_name = "COLUMN")]
    pub by: Option<String>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Also draw the completeness curve into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Instead of profiling the table: the run ledger's late rows per day for the pipeline.
    #[arg(long, conflicts_with_all = ["plot", "by"])]
    pub runs: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `--limit` of `history` and `runs`: a listing of zero rows is never what was meant, so 0 is
/// refused (exit 64) instead of being read as "all" or silently raised to 1.
/// A calendar date, `YYYY-MM-DD`.
fn parse_date(text: &str) -> Result<chrono::NaiveDate, String> {
    chrono::NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").map_err(|e| {
        format!("{text:?} is not a date ({e}); write it as YYYY-MM-DD, e.g. 2024-01-31")
    })
}

fn parse_limit(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("the limit must be at least 1 (it is how many rows to show)".into()),
        // Any larger limit shows every row; the query engine takes limits as signed integers.
        Ok(n) => Ok(n.min(u32::MAX as usize)),
        Err(_) => Err(format!(
            "{text:?} is not a whole number; pass how many rows to show, at least 1"
        )),
    }
}

/// `--every`: a humantime duration of at least a second.
fn parse_every(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("{e}; e.g. 30s, 5m, 1h"))?;
    if d < std::time::Duration::from_secs(1) {
        return Err("the period must be at least 1s".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_limit_means_every_row_and_zero_is_refused() {
        assert_eq!(
            super::parse_limit("18446744073709551615"),
            Ok(u32::MAX as usize)
        );
        assert_eq!(super::parse_limit("20"), Ok(20));
        assert!(super::parse_limit("0").is_err());
        assert!(super::parse_limit("-1").is_err());
    }
}
