//! The bundle files exactly as written: serde mirrors with `deny_unknown_fields`, so a typo is
//! an error with a line number, never a silent default. Key names are Databricks Asset Bundles'
//! wherever the meaning is the same.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `bundle/tidemark.yml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoot {
    pub bundle: RawBundleInfo,
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub variables: BTreeMap<String, RawVariable>,
    #[serde(default)]
    pub targets: BTreeMap<String, RawTarget>,
    pub resources: Option<RawResources>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBundleInfo {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVariable {
    pub description: Option<String>,
    pub default: Option<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub variables: BTreeMap<String, Scalar>,
}

/// A resource file named by `include`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResourceFile {
    pub resources: RawResources,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResources {
    #[serde(default)]
    pub jobs: BTreeMap<String, RawJob>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJob {
    pub description: Option<String>,
    pub schedule: Option<RawSchedule>,
    /// Instead of `schedule`: run back to back on a period (Databricks' `continuous`, with
    /// tidemark's `every` and `compact_after`).
    pub continuous: Option<RawContinuous>,
    pub max_concurrent_runs: Option<i64>,
    pub timeout_seconds: Option<u64>,
    /// tidemark's own key (Databricks has none): what to do with fires missed while the
    /// scheduler was down.
    pub catch_up: Option<super::CatchUp>,
    #[serde(default)]
    pub job_clusters: Vec<RawJobCluster>,
    pub tasks: Vec<RawTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchedule {
    pub quartz_cron_expression: String,
    pub timezone_id: String,
    #[serde(default)]
    pub pause_status: super::PauseStatus,
    /// The schedule's behaviour in the DST hours is known and wanted: no warning.
    #[serde(default)]
    pub dst_acknowledged: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawContinuous {
    /// The period (humantime: `30s`, `5m`).
    pub every: Scalar,
    /// Live files a pipeline's table may gain before it is maintained.
    pub compact_after: Option<Scalar>,
    #[serde(default)]
    pub pause_status: super::PauseStatus,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJobCluster {
    pub job_cluster_key: String,
    pub new_cluster: RawCompute,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompute {
    pub worker_threads: Option<Scalar>,
    pub memory_limit: Option<Scalar>,
    pub spill_directory: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTask {
    pub task_key: String,
    #[serde(default)]
    pub depends_on: Vec<RawDependency>,
    pub job_cluster_key: Option<String>,
    pub pipeline_task: RawPipelineTask,
    pub max_retries: Option<i64>,
    pub min_retry_interval_millis: Option<u64>,
    pub retry_on_timeout: Option<bool>,
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDependency {
    pub task_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPipelineTask {
    pub pipeline: String,
    #[serde(default)]
    pub mode: super::TaskMode,
}

/// A YAML scalar where the bundle accepts both a number and a string (so `${var.x}` works
/// where a number is expected).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Str(s) => f.write_str(s),
        }
    }
}
