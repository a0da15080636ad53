//! Pipeline files: one pipeline per YAML file in `pipelines/`, of one [`Kind`].
//!
//! One file per kind (`cdc_merge.rs`, `ingest.rs`, `aggregate.rs`, `dimension.rs`) holds the
//! kind's raw struct as written, its validated settings and the checks between them;
//! `common.rs` what the kinds share (the file being checked, the `source`, `columns` and
//! `quarantine` blocks); `kinds.rs` the list of kinds (one line each: the [`Kind`], the [`Spec`]
//! variant, the parse as that kind); `raw.rs` the `kind:` tag and `build.rs` the parse that
//! builds the validated [`Pipeline`]: a header every kind shares (name, file) and a [`Spec`].
//! This module keeps the settings more than one kind uses.

pub mod aggregate;
mod build;
mod cdc_merge;
mod common;
pub mod dimension;
pub mod expect;
pub mod ingest;
pub mod kafka;
mod kinds;
mod raw;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::config::size::{parse_bytes, parse_size};
pub use aggregate::Aggregate;
pub use cdc_merge::{CdcMerge, DeleteMode, Deletes, ReconcileSpec, DEFAULT_MAX_FUTURE_SKEW};
pub use dimension::Dimension;
pub use ingest::Ingest;
pub(crate) use kinds::with_spec;
pub use kinds::{Clocks, Kind, Settings, Spec};

use super::location::line_of_key;
use super::{ConfigError, PipelineChoices, Vars};

/// Default `delta.targetFileSize` for targets tidemark creates. An hourly run rewrites every file
/// holding a changed key (row groups without one are copied as bytes), so a touched file costs
/// its size: 2 MiB halved the bytes and the time of a 10M-payment hour against 8 MiB, while the
/// file count stays in the hundreds (docs/operations/table-layout.md). On an object store it was also the
/// best of 2–128 MiB in both apply modes (BENCHMARKS.md, "The file size on object storage").
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 2 * 1024 * 1024;

/// Rows per row group when a pipeline does not say (`target.row_group_rows`): small enough that
/// re-encoding the row group around one late refund costs little, large enough that scans and
/// compression do not suffer (measured in BENCHMARKS.md).
pub const DEFAULT_ROW_GROUP_ROWS: usize = 4096;

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

/// Where rejected rows go and how many are tolerated before the run fails.
#[derive(Debug, Clone, PartialEq)]
pub struct Quarantine {
    pub uri: String,
    pub max_rows: Option<u64>,
    pub max_fraction: Option<f64>,
}

/// Partial updates (`ignore_null_updates`, `unavailable_marker`): which values of an upsert
/// carry nothing, so that the key keeps the value it had. A key's row is then, column by
/// column, the value of its newest record (by sequence and tie-breakers) since its last delete
/// that carries one — whatever order the records arrived in — else the newest record's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialUpdates {
    /// A null in an upsert keeps the current value (AUTO CDC's `ignore_null_updates`).
    pub ignore_nulls: bool,
    /// A text value meaning "not sent": Debezium's `__debezium_unavailable_value` for an
    /// unchanged TOASTed column. Only text columns can hold it.
    pub marker: Option<String>,
}

impl PartialUpdates {
    /// Whether any value of an upsert can carry nothing.
    pub fn is_active(&self) -> bool {
        self.ignore_nulls || self.marker.is_some()
    }

    /// `ignore_null_updates` as a definition records it: empty when off (as before it existed).
    pub fn ignore_nulls_text(&self) -> String {
        match self.ignore_nulls {
            true => "true".into(),
            false => String::new(),
        }
    }

    /// The settings as a person reads them (`ignore_null_updates: true, unavailable_marker:
    /// "…"`); empty when off.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.ignore_nulls {
            parts.push("ignore_null_updates: true".to_string());
        }
        if let Some(m) = &self.marker {
            parts.push(format!("unavailable_marker: {m:?}"));
        }
        parts.join(", ")
    }
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
        self.spec.kind()
    }

    /// The table this pipeline writes (what `history`, `restore` and `maintain` act on).
    pub fn target_uri(&self) -> &str {
        with_spec!(&self.spec, k => k.target_uri())
    }

    /// What this pipeline reads: a table, or a landing location for `ingest`.
    pub fn source_uri(&self) -> &str {
        with_spec!(&self.spec, k => k.source_uri())
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
    use super::*;

    /// A `cdc_merge` pipeline: what the loader's tests (here and in the kinds' files) parse.
    pub(super) const GOOD: &str = r#"
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

    pub(super) fn vars() -> Vars {
        Vars::from_args(&["lake=/tmp/lake"]).unwrap()
    }

    pub(super) fn parse(text: &str) -> Result<Pipeline, ConfigError> {
        Pipeline::parse(Path::new("p.yml"), text, &vars())
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
    fn parses_sizes() {
        assert_eq!(parse_bytes("8MiB"), Some(8 << 20));
        assert_eq!(parse_bytes("64MB"), Some(64_000_000));
        assert_eq!(parse_bytes("1k"), None);
        assert_eq!(parse_bytes("lots"), None);
    }
}
