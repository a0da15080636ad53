//! The bundle: jobs as code, in the shape of Databricks Asset Bundles.
//!
//! `bundle/tidemark.yml` names the bundle, the resource files to `include`, the `variables` and
//! the `targets`; each included file holds `resources.jobs.<job>` with its `schedule`,
//! `job_clusters` (the compute this engine honours), `tasks` and retry settings. Loading reads
//! every file, resolves variables (`--var`, then `BUNDLE_VAR_<name>`, then the target, then the
//! default), loads each task's pipeline file, and collects *every* problem with its file and line
//! before giving up, so `tidemark bundle validate` can show them all at once.

mod build;
pub mod compute;
mod job;
mod raw;
mod source;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use compute::{Compute, MAX_MEMORY_LIMIT, MAX_WORKER_THREADS, MIN_MEMORY_LIMIT};
pub use source::normalize;

use super::{Pipeline, Vars};
use crate::config::schedule::QuartzSchedule;
use crate::error::{Classify, ErrorClass};

/// The file a bundle directory must contain.
pub const BUNDLE_FILE: &str = "tidemark.yml";

/// The variable every bundle must resolve: the lake root holding the run ledger and leases.
pub const LAKE_VARIABLE: &str = "lake";

/// Whether a schedule fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PauseStatus {
    /// The scheduler fires the job (the default, as in Databricks).
    #[default]
    Unpaused,
    /// The schedule is kept but never fires; `tidemark job run` still works.
    Paused,
}

/// What the scheduler does with fires it missed while it was not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Run the latest missed fire once, as soon as the scheduler starts (the default).
    #[default]
    Latest,
    /// Forget missed fires; wait for the next one.
    None,
}

/// How a pipeline task runs its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMode {
    /// The hourly incremental merge.
    #[default]
    Incremental,
    /// Rebuild the target from the whole source (the recovery path).
    FullReload,
}

/// A validated bundle for one target: everything `job run` and the scheduler need.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// `bundle.name`.
    pub name: String,
    /// The bundle file (`.../tidemark.yml`), for messages.
    pub file: PathBuf,
    /// The selected target.
    pub target: String,
    /// Resolved variables (also used to load every pipeline file).
    pub vars: Vars,
    /// Each declared variable, its value and where the value came from.
    pub variables: Vec<Variable>,
    /// Jobs by name.
    pub jobs: BTreeMap<String, Job>,
}

/// One declared variable after resolution.
#[derive(Debug, Clone, Serialize)]
pub struct Variable {
    pub name: String,
    pub description: Option<String>,
    pub value: Option<String>,
    /// `--var`, `BUNDLE_VAR_<name>`, `target <name>` or `default`.
    pub source: Option<String>,
}

/// A job: its schedule, compute and tasks.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub description: Option<String>,
    /// The resource file that defines it, and the line of its name.
    pub file: PathBuf,
    pub line: usize,
    /// None: the job only runs when asked (`tidemark job run`), or is continuous.
    pub schedule: Option<Schedule>,
    /// Instead of a schedule: the scheduler runs the job back to back on a period.
    pub continuous: Option<Continuous>,
    /// Always 1: a job's pipelines are the single writer of their targets.
    pub max_concurrent_runs: u32,
    /// The whole job's time budget; None means none.
    pub timeout: Option<Duration>,
    pub catch_up: CatchUp,
    /// Compute by `job_cluster_key`.
    pub clusters: BTreeMap<String, Compute>,
    /// Tasks in an order where every task comes after the tasks it depends on.
    pub tasks: Vec<Task>,
}

/// When a job fires.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub cron: QuartzSchedule,
    pub pause_status: PauseStatus,
}

/// Default `continuous.compact_after` (and `--compact-after`): live files a pipeline's table may
/// gain in continuous runs before it is maintained.
pub const DEFAULT_COMPACT_AFTER: u64 = 64;

/// A continuous job's period and compaction in step (`continuous:`).
#[derive(Debug, Clone, Serialize)]
pub struct Continuous {
    #[serde(serialize_with = "secs")]
    pub every: Duration,
    pub compact_after: u64,
    pub pause_status: PauseStatus,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

/// One task of a job: a pipeline run with its retry and timeout policy.
#[derive(Debug, Clone)]
pub struct Task {
    pub key: String,
    pub depends_on: Vec<String>,
    /// `job_cluster_key`; None runs on the default engine (all cores, no memory limit).
    pub cluster: Option<String>,
    pub pipeline: Pipeline,
    pub mode: TaskMode,
    /// Retries after the first attempt, for errors classed retryable (and timeouts when
    /// `retry_on_timeout`).
    pub max_retries: u32,
    pub min_retry_interval: Duration,
    pub retry_on_timeout: bool,
    pub timeout: Option<Duration>,
}

/// How serious a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in a bundle, located in its file when it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: Option<PathBuf>,
    pub line: Option<usize>,
    pub message: String,
}

impl Diagnostic {
    /// An error at `file:line`.
    pub fn error(file: &Path, line: usize, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            file: Some(file.to_path_buf()),
            line: Some(line),
            message: message.into(),
        }
    }

    /// A warning at `file:line`.
    pub fn warning(file: &Path, line: usize, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(file, line, message)
        }
    }

    /// An error with no place in a file (a command-line problem).
    pub fn general(message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            file: None,
            line: None,
            message: message.into(),
        }
    }
}

impl Diagnostic {
    /// `file:line: message`, without the severity (for a list that already says it).
    pub fn located(&self) -> String {
        match &self.file {
            Some(file) => format!(
                "{}:{}: {}",
                file.display(),
                self.line.unwrap_or(1),
                self.message
            ),
            None => self.message.clone(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}:{}: ", file.display(), self.line.unwrap_or(1))?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)
    }
}

/// A bundle that did not load: every error found, and the warnings.
#[derive(Debug, Clone)]
pub struct BundleError {
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "the bundle has {n} error{}; fix {} (`tidemark bundle validate` lists them again):",
            if n == 1 { "" } else { "s" },
            if n == 1 { "it" } else { "them" }
        )?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BundleError {}

impl Classify for BundleError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Config
    }
}

/// A bundle that loaded, with the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub bundle: Bundle,
    pub warnings: Vec<Diagnostic>,
}

/// The bundle file that `--bundle PATH` names: `PATH/tidemark.yml` for a directory, else PATH.
pub fn bundle_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(BUNDLE_FILE)
    } else {
        path.to_path_buf()
    }
}

impl Bundle {
    /// Loads and validates the bundle at `path` (a directory holding `tidemark.yml`, or the
    /// file itself) for `target` (the one marked `default: true` when None). `cli_vars` are the
    /// `--var` values; `BUNDLE_VAR_<name>` is read from the environment.
    pub fn load(path: &Path, target: Option<&str>, cli_vars: &Vars) -> Result<Loaded, BundleError> {
        build::load(path, target, cli_vars, &|name| std::env::var(name).ok())
    }

    /// The lake root (`${var.lake}`): the run ledger and the leases live under it. A relative
    /// path is the bundle root's.
    pub fn lake(&self) -> String {
        // `load` refuses a bundle without a value for it.
        self.vars
            .locate(self.vars.get(LAKE_VARIABLE).unwrap_or("."))
    }

    /// The job named `name`, or an error listing the jobs there are.
    pub fn job(&self, name: &str) -> Result<&Job, String> {
        self.jobs.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.jobs.keys().map(String::as_str).collect();
            let hint = super::location::nearest(name, names.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            format!(
                "no job named `{name}` in bundle {}{hint}; the jobs are: {}",
                self.file.display(),
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            )
        })
    }
}

#[cfg(test)]
mod tests;
