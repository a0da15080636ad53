//! Pipeline files: one pipeline per YAML file in `pipelines/`, of one [`Kind`].
//!
//! `raw.rs` holds the file as written (one struct per kind), `build.rs` the checks that turn it
//! into the validated [`Pipeline`]: a header every kind shares (name, file) and a [`Spec`] per
//! kind.

pub mod aggregate;
mod build;
mod common;
pub mod dimension;
pub mod expect;
pub mod ingest;
mod raw;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::config::size::{parse_bytes, parse_size};
pub use aggregate::Aggregate;
pub use dimension::Dimension;
pub use ingest::Ingest;
pub use raw::Kind;

use super::location::line_of_key;
use super::{ConfigError, PipelineChoices, Vars};

/// Default for `max_future_skew`: how far past the run's start a sequence value may lie before
/// the row is deferred instead of merged.
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);

/// Default `delta.targetFileSize` for targets tidemark creates. An hourly run rewrites every file
/// holding a changed key (row groups without one are copied as bytes), so a touched file costs
/// its size: 2 MiB halved the bytes and the time of a 10M-payment hour against 8 MiB, while the
/// file count stays in the hundreds (README, "Target layout"). On an object store it was also the
/// best of 2–128 MiB in both apply modes (BENCHMARKS.md, "The file size on object storage").
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 2 * 1024 * 1024;

/// Rows per row group when a pipeline does not say (`target.row_group_rows`): small enough that
/// re-encoding the row group around one late refund costs little, large enough that scans and
/// compression do not suffer (measured in BENCHMARKS.md).
pub const DEFAULT_ROW_GROUP_ROWS: usize = 4096;

/// How a delete record is applied to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteMode {
    /// Keep a tombstone row (`_deleted = true`) so an older version arriving later cannot
    /// resurrect the key.
    #[default]
    Soft,
    /// Remove the row. A version older than the delete that lands afterwards brings the key
    /// back: only use this when the source never delivers that late.
    Hard,
}

/// How an hourly run applies a changed key held in an old target file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Apply {
    /// Write the file again: its untouched row groups copied as bytes, the row groups holding
    /// a changed key re-encoded. Readers need nothing beyond plain Delta.
    #[default]
    CopyOnWrite,
    /// Mark the old row deleted in the file's deletion vector and write the new version into
    /// the run's new file: no unchanged row is written. Upgrades the table to the
    /// `deletionVectors` feature (reader 3 / writer 7); `maintain` purges files whose deleted
    /// share grows.
    DeletionVectors,
}

/// What an incremental run does when the source has columns the target lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaChange {
    /// Stop with a clear error naming the new columns (nothing is written).
    #[default]
    Fail,
    /// Add the new columns to the target (nullable) in the run's own commit. Dropped or
    /// retyped columns are still errors: they would silently lose or change data.
    AddNewColumns,
}

/// What an incremental run does when the source is no longer the table the target was built
/// from (deleted and recreated at the same location, or replaced: a new Delta table id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceRecreate {
    /// Refuse (exit 65) and say to rebuild with `--full-reload`: the new table's versions say
    /// nothing about what the target has seen.
    #[default]
    Fail,
    /// Merge every row of the new table into the target incrementally (newest wins per key, as
    /// always). Keys that only the old table had stay in the target: use this when the new
    /// table re-delivers the old one's history (a migration), not when it replaces it.
    ReadAll,
}

/// Which source rows mean "this key was deleted".
#[derive(Debug, Clone, PartialEq)]
pub struct Deletes {
    pub column: String,
    pub values: Vec<String>,
    pub mode: DeleteMode,
    /// `deletes.retain`: tombstones whose sequence is older than this (before `maintain`'s
    /// clock) are removed by `maintain`, their keys recorded in `removed_keys`.
    pub retain: Option<Duration>,
    /// The table of removed tombstones (keys and delete sequence): set, to the given URI or
    /// `<target>_removed_keys`, exactly when `retain` is.
    pub removed_keys: Option<String>,
}

/// Where rejected rows go and how many are tolerated before the run fails.
#[derive(Debug, Clone, PartialEq)]
pub struct Quarantine {
    pub uri: String,
    pub max_rows: Option<u64>,
    pub max_fraction: Option<f64>,
}

/// What `tidemark reconcile` aggregates, so a finance team can compare totals they recognise
/// (per event day and currency) and not only row-by-row differences.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileSpec {
    /// Timestamp or date column whose UTC date is the "event day" of a row (default: the
    /// sequence column).
    pub day: String,
    /// Columns whose values split each day into groups (e.g. currency).
    pub group_by: Vec<String>,
    /// Numeric columns summed per day and group (e.g. amount_cents).
    pub sum: Vec<String>,
    /// Columns whose values are counted per day and group (e.g. status).
    pub count_by: Vec<String>,
}

/// A validated `cdc_merge` pipeline: everything a merge run needs to know, with defaults
/// applied.
#[derive(Debug, Clone)]
pub struct CdcMerge {
    pub source_uri: String,
    /// `source.on_recreate`: what to do when the source's table id changed.
    pub source_on_recreate: SourceRecreate,
    pub target_uri: String,
    pub target_file_size: u64,
    /// Rows per Parquet row group in the target's files: the unit an hourly run re-encodes
    /// around a changed row (every other row group of a rewritten file is copied as bytes).
    pub target_row_group_rows: usize,
    /// `target.apply`: how an hourly run applies a change to a key held in an old file.
    pub target_apply: Apply,
    /// `target.change_data_feed`: the target keeps a Delta change data feed
    /// (`delta.enableChangeDataFeed`), set when tidemark creates it or on the next run.
    pub change_data_feed: bool,
    pub keys: Vec<String>,
    pub sequence_by: String,
    pub tie_breakers: Vec<String>,
    pub overlap: Duration,
    pub max_future_skew: Duration,
    pub deletes: Option<Deletes>,
    pub exclude: Vec<String>,
    pub quarantine: Quarantine,
    pub on_schema_change: SchemaChange,
    /// What `tidemark reconcile` reports per day and group.
    pub reconcile: ReconcileSpec,
    /// Row-level rules over source rows (`expectations:`), in file order.
    pub expectations: Vec<expect::Expectation>,
}

impl CdcMerge {
    /// The columns that order versions of a key: the sequence, then the tie-breakers.
    pub fn order_columns(&self) -> Vec<String> {
        std::iter::once(self.sequence_by.clone())
            .chain(self.tie_breakers.iter().cloned())
            .collect()
    }

    /// Whether the target carries the `_deleted` tombstone column.
    pub fn soft_deletes(&self) -> bool {
        matches!(
            self.deletes,
            Some(Deletes {
                mode: DeleteMode::Soft,
                ..
            })
        )
    }
}

/// What a pipeline does, by kind: the one place a new kind is added (with its raw struct in
/// `raw.rs`, its checks in `build.rs` and its run in its own module).
#[derive(Debug, Clone)]
// One per pipeline, loaded once per run: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Spec {
    CdcMerge(CdcMerge),
    Ingest(Ingest),
    Aggregate(Aggregate),
    Dimension(Dimension),
}

/// A validated pipeline: the header every kind shares and what this kind does.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub name: String,
    /// The file it came from, for error messages.
    pub path: PathBuf,
    pub spec: Spec,
    text: String,
}

/// Name of the column soft deletes add to the target.
pub const DELETED_COLUMN: &str = "_deleted";

impl Pipeline {
    /// Reads, substitutes and validates a pipeline file.
    pub fn load(path: &Path, vars: &Vars) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::InvalidData {
                ConfigError::NotUtf8 {
                    path: path.to_path_buf(),
                }
            } else {
                ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        Self::parse(path, &text, vars)
    }

    /// Parses pipeline text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str, vars: &Vars) -> Result<Self, ConfigError> {
        common::Ctx { path, text }.pipeline(vars)
    }

    /// An error located at `key` in this pipeline's file.
    pub fn error_at(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            line: line_of_key(&self.text, key),
            message: message.into(),
        }
    }

    /// Whether `fragment` is written in this pipeline's file.
    pub fn mentions(&self, fragment: &str) -> bool {
        self.text.contains(fragment)
    }

    /// An error located at the line where `fragment` is written in this pipeline's file.
    pub fn error_at_text(&self, fragment: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            line: super::location::line_of_text(&self.text, fragment),
            message: message.into(),
        }
    }

    /// Refuses `--var` values the pipeline file never references (a typo would otherwise be
    /// ignored and the file's own default, if any, used silently).
    pub fn check_vars_used<'a>(
        &self,
        given: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        let referenced = super::vars::referenced(&self.text);
        for name in given {
            if referenced.contains(name) {
                continue;
            }
            let near = super::location::nearest(name, referenced.iter().map(String::as_str));
            let hint = match (near, referenced.is_empty()) {
                (Some(n), _) => format!(" (did you mean `{n}`?)"),
                (None, true) => " (it references no variables)".to_string(),
                (None, false) => format!(
                    " (it references {})",
                    referenced
                        .iter()
                        .map(|r| format!("`{r}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            return Err(ConfigError::UnusedVar {
                name: name.to_string(),
                path: self.path.clone(),
                hint,
            });
        }
        Ok(())
    }

    /// The Delta application-transaction id under which runs record the source version read.
    pub fn app_id(&self) -> String {
        format!("tidemark/{}", self.name)
    }

    /// The kind of this pipeline.
    pub fn kind(&self) -> Kind {
        match &self.spec {
            Spec::CdcMerge(_) => Kind::CdcMerge,
            Spec::Ingest(_) => Kind::Ingest,
            Spec::Aggregate(_) => Kind::Aggregate,
            Spec::Dimension(_) => Kind::Dimension,
        }
    }

    /// The table this pipeline writes (what `history`, `restore` and `maintain` act on).
    pub fn target_uri(&self) -> &str {
        match &self.spec {
            Spec::CdcMerge(m) => &m.target_uri,
            Spec::Ingest(i) => &i.target_uri,
            Spec::Aggregate(a) => &a.target_uri,
            Spec::Dimension(d) => &d.target_uri,
        }
    }

    /// What this pipeline reads: a table, or a landing location for `ingest`.
    pub fn source_uri(&self) -> &str {
        match &self.spec {
            Spec::CdcMerge(m) => &m.source_uri,
            Spec::Ingest(i) => &i.landing_uri,
            Spec::Aggregate(a) => &a.source_uri,
            Spec::Dimension(d) => &d.source_uri,
        }
    }

    /// The merge's settings when this is a `cdc_merge` pipeline, else an error for `command`
    /// naming the kind it has.
    pub fn cdc_merge(&self, command: &str) -> Result<&CdcMerge, ConfigError> {
        match &self.spec {
            Spec::CdcMerge(m) => Ok(m),
            _ => Err(self.wrong_kind(format!(
                "`tidemark {command}` works on cdc_merge pipelines; `{}` is {}",
                self.name,
                self.kind()
            ))),
        }
    }

    /// A command's refusal of this pipeline's kind, at its `kind:` line (exit 64 for every
    /// command).
    pub fn wrong_kind(&self, message: String) -> ConfigError {
        match self.error_at("kind", message) {
            ConfigError::Invalid {
                path,
                line,
                message,
            } => ConfigError::WrongKind {
                path,
                line,
                message,
            },
            other => other,
        }
    }
}

/// Finds a pipeline by path or by name in `pipelines_dir` (`NAME.yml` or `NAME.yaml`).
pub fn resolve_pipeline_path(
    name_or_path: &str,
    pipelines_dir: &Path,
) -> Result<PathBuf, ConfigError> {
    let direct = PathBuf::from(name_or_path);
    if direct.is_file() {
        return Ok(direct);
    }
    let candidates = [
        pipelines_dir.join(format!("{name_or_path}.yml")),
        pipelines_dir.join(format!("{name_or_path}.yaml")),
    ];
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let mut available: Vec<String> = std::fs::read_dir(pipelines_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let p = e.path();
                    let ext = p.extension()?.to_str()?;
                    (ext == "yml" || ext == "yaml")
                        .then(|| p.file_stem()?.to_str().map(str::to_string))
                        .flatten()
                })
                .collect()
        })
        .unwrap_or_default();
    available.sort();
    Err(ConfigError::PipelineNotFound {
        name: name_or_path.to_string(),
        tried: std::iter::once(direct.display().to_string())
            .chain(candidates.iter().map(|p| p.display().to_string()))
            .collect::<Vec<_>>()
            .join(", "),
        choices: Box::new(PipelineChoices {
            available,
            pipelines_dir: pipelines_dir.to_path_buf(),
            in_bundle: Vec::new(),
            near: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::common::overlapping;
    use super::*;

    /// The merge settings of a `cdc_merge` pipeline.
    fn merge(p: &Pipeline) -> &CdcMerge {
        p.cdc_merge("test").expect("a cdc_merge pipeline")
    }

    const GOOD: &str = r#"
name: payments
kind: cdc_merge
source: { uri: "${var.lake}/bronze/payments_raw" }
target: { uri: "${var.lake}/silver/payments" }
keys: [payment_id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "${var.lake}/quarantine/payments" }
"#;

    fn vars() -> Vars {
        Vars::from_args(&["lake=/tmp/lake"]).unwrap()
    }

    fn parse(text: &str) -> Result<Pipeline, ConfigError> {
        Pipeline::parse(Path::new("p.yml"), text, &vars())
    }

    #[test]
    fn parses_the_reference_pipeline_with_defaults() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.kind(), Kind::CdcMerge);
        let p = merge(&p);
        assert_eq!(p.source_uri, "/tmp/lake/bronze/payments_raw");
        assert_eq!(p.overlap, Duration::from_secs(900));
        assert_eq!(p.max_future_skew, DEFAULT_MAX_FUTURE_SKEW);
        assert_eq!(p.deletes.as_ref().unwrap().mode, DeleteMode::Soft);
        assert!(p.soft_deletes());
        assert_eq!(p.order_columns(), vec!["updated_at", "_ingested_at"]);
        assert_eq!(p.target_file_size, DEFAULT_TARGET_FILE_SIZE);
    }

    #[test]
    fn the_kind_picks_the_spec_and_an_unknown_kind_lists_the_kinds() {
        let err = parse(&GOOD.replace("kind: cdc_merge", "kind: cdc_merg"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.yml:3:"), "{err}");
        assert!(err.contains("did you mean `cdc_merge`"), "{err}");
        assert!(err.contains("the kinds are: cdc_merge"), "{err}");
        let err = parse(&GOOD.replace("kind: cdc_merge\n", ""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing `kind`"), "{err}");
        // A key of the kind keeps its line: the file is parsed as the kind's own struct.
        let err = parse(&GOOD.replace("keys: [payment_id]", "keys: 5"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.yml:6:"), "{err}");
    }

    #[test]
    fn unknown_key_names_line_and_nearest_key() {
        let text = GOOD.replace("overlap: 15m", "overlaps: 15m");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.starts_with("p.yml:9:"), "{err}");
        assert!(err.contains("did you mean `overlap`"), "{err}");
    }

    #[test]
    fn a_repeated_key_points_at_its_second_line() {
        let err = parse(&format!("{GOOD}overlap: 1h\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.yml:13:"), "{err}");
        assert!(err.contains("`overlap` is given more than once"), "{err}");
    }

    #[test]
    fn missing_required_key_is_an_error() {
        let text = GOOD.replace("sequence_by: updated_at\n", "");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("missing field `sequence_by`"), "{err}");
    }

    #[test]
    fn unresolved_variable_names_variable_line_and_remedy() {
        let err = Pipeline::parse(Path::new("p.yml"), GOOD, &Vars::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("p.yml:4:"), "{err}");
        assert!(err.contains("${var.lake}"), "{err}");
        assert!(err.contains("--var lake=VALUE"), "{err}");
    }

    #[test]
    fn bad_and_negative_durations() {
        let err = parse(&GOOD.replace("15m", "-5m")).unwrap_err().to_string();
        assert!(
            err.contains("p.yml:9:") && err.contains("negative"),
            "{err}"
        );
        let err = parse(&GOOD.replace("15m", "fifteen"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a duration"), "{err}");
    }

    #[test]
    fn semantic_checks() {
        let err = parse(&GOOD.replace("exclude: [op]", "exclude: [payment_id]"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("merge needs"), "{err}");
        let err = parse(&GOOD.replace("kind: cdc_merge", "kind: append"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("the kinds are: cdc_merge"), "{err}");
        let err = parse(&GOOD.replace("mode: soft", "mode: gentle"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("p.yml:10:"), "{err}");
        let err = parse(&GOOD.replace("keys: [payment_id]", "keys: []"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`keys` is empty"), "{err}");
    }

    #[test]
    fn tables_must_not_overlap() {
        let err = parse(&GOOD.replace("/silver/payments", "/bronze/payments_raw"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.yml:5:"), "{err}");
        assert!(err.contains("same table as `source.uri`"), "{err}");
        let err = parse(&GOOD.replace("/quarantine/payments", "/silver/payments/q"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`quarantine.uri`"), "{err}");
        assert!(overlapping("file:///a/b/", "/a/b"));
        assert!(overlapping("/a/b/../c", "/a/c/d"));
        assert!(!overlapping("/a/bronze", "/a/bronze2"));
        assert!(!overlapping("s3://x/bronze", "s3://x/silver"));
    }

    #[test]
    fn reconcile_block_defaults_to_the_sequence_day() {
        let p = parse(GOOD).unwrap();
        assert_eq!(merge(&p).reconcile.day, "updated_at");
        assert!(merge(&p).reconcile.group_by.is_empty() && merge(&p).reconcile.sum.is_empty());
        let p = parse(&format!(
            "{GOOD}reconcile: {{ day: created_at, group_by: [currency], sum: [amount_cents], count_by: [status] }}\n"
        ))
        .unwrap();
        assert_eq!(merge(&p).reconcile.day, "created_at");
        assert_eq!(merge(&p).reconcile.sum, vec!["amount_cents"]);
        let err = parse(&format!("{GOOD}reconcile: {{ sum: [a, a] }}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("p.yml:13:") && err.contains("lists `a` twice"),
            "{err}"
        );
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("8MiB"), Some(8 << 20));
        assert_eq!(parse_bytes("64MB"), Some(64_000_000));
        assert_eq!(parse_bytes("1k"), None);
        assert_eq!(parse_bytes("lots"), None);
    }
}
