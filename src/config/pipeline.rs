//! The pipeline file: one `cdc_merge` pipeline per YAML file in `pipelines/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::location::{explain_serde_message, line_of_key, line_of_text, lines_of_key};
use super::{ConfigError, Vars};

/// Default for `max_future_skew`: how far past the run's start a sequence value may lie before
/// the row is deferred instead of merged.
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);

/// Default `delta.targetFileSize` for targets tidemark creates. An hourly run rewrites every file
/// holding a changed key (row groups without one are copied as bytes), so a touched file costs
/// its size: 2 MiB halved the bytes and the time of a 10M-payment hour against 8 MiB, while the
/// file count stays in the hundreds (README, "Target layout").
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 2 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    name: String,
    kind: String,
    source: RawSource,
    target: RawTarget,
    keys: Vec<String>,
    sequence_by: String,
    #[serde(default)]
    tie_breakers: Vec<String>,
    overlap: String,
    max_future_skew: Option<String>,
    deletes: Option<RawDeletes>,
    columns: Option<RawColumns>,
    quarantine: RawQuarantine,
    #[serde(default)]
    on_schema_change: SchemaChange,
    reconcile: Option<RawReconcile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    uri: String,
    #[serde(default)]
    on_recreate: SourceRecreate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    uri: String,
    file_size: Option<String>,
    row_group_rows: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeletes {
    column: String,
    values: Vec<String>,
    #[serde(default)]
    mode: DeleteMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumns {
    #[serde(default)]
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuarantine {
    uri: String,
    max_rows: Option<u64>,
    max_fraction: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReconcile {
    day: Option<String>,
    #[serde(default)]
    group_by: Vec<String>,
    #[serde(default)]
    sum: Vec<String>,
    #[serde(default)]
    count_by: Vec<String>,
}

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

/// A validated pipeline: everything a run needs to know, with defaults applied.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub name: String,
    pub source_uri: String,
    /// `source.on_recreate`: what to do when the source's table id changed.
    pub source_on_recreate: SourceRecreate,
    pub target_uri: String,
    pub target_file_size: u64,
    /// Rows per Parquet row group in the target's files: the unit an hourly run re-encodes
    /// around a changed row (every other row group of a rewritten file is copied as bytes).
    pub target_row_group_rows: usize,
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
    /// The file it came from, for error messages.
    pub path: PathBuf,
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
        let raw: RawPipeline = serde_yaml::from_str(text).map_err(|e| {
            let message = e.to_string();
            // serde locates a repeated key at the start of its mapping: point at the repeat.
            let repeated = message
                .strip_prefix("duplicate field `")
                .and_then(|r| r.split('`').next())
                .and_then(|key| lines_of_key(text, key).nth(1));
            ConfigError::Invalid {
                path: path.to_path_buf(),
                line: repeated.or(e.location().map(|l| l.line())).unwrap_or(1),
                message: explain_serde_message(&message),
            }
        })?;
        let ctx = Ctx { path, text };
        ctx.build(raw, vars)
    }

    /// An error located at `key` in this pipeline's file.
    pub fn error_at(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            line: line_of_key(&self.text, key),
            message: message.into(),
        }
    }

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
}

struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Ctx<'_> {
    fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: line_of_key(self.text, key),
            message: message.into(),
        }
    }

    fn substitute(&self, key: &str, value: &str, vars: &Vars) -> Result<String, ConfigError> {
        let out = vars
            .substitute(value)
            .map_err(|u| ConfigError::Unresolved {
                path: self.path.to_path_buf(),
                line: line_of_text(self.text, &u.reference),
                key: key.to_string(),
                reference: u.reference,
                how: u.how,
            })?;
        if out.trim().is_empty() {
            return Err(self.invalid(
                key.rsplit('.').next().unwrap_or(key),
                format!("`{key}` is empty; give a table path or URI"),
            ));
        }
        Ok(vars.locate(&out))
    }

    fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        let v = value.trim();
        if v.starts_with('-') {
            return Err(self.invalid(
                key,
                format!("`{key}: {value}` is negative; use a duration of zero or more, like 15m"),
            ));
        }
        humantime::parse_duration(v).map_err(|e| {
            self.invalid(
                key,
                format!("`{key}: {value}` is not a duration ({e}); write it like 15m, 2h or 1h30m"),
            )
        })
    }

    /// The `reconcile:` block with its default (day = the sequence column, nothing else). Its
    /// columns are checked against the source schema with the pipeline's other columns.
    fn reconcile(
        &self,
        raw: Option<RawReconcile>,
        sequence_by: &str,
    ) -> Result<ReconcileSpec, ConfigError> {
        let Some(raw) = raw else {
            return Ok(ReconcileSpec {
                day: sequence_by.to_string(),
                group_by: Vec::new(),
                sum: Vec::new(),
                count_by: Vec::new(),
            });
        };
        for (key, list) in [
            ("group_by", &raw.group_by),
            ("sum", &raw.sum),
            ("count_by", &raw.count_by),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for c in list {
                if !seen.insert(c.as_str()) {
                    return Err(self.invalid(
                        key,
                        format!("`reconcile.{key}` lists `{c}` twice; list each column once"),
                    ));
                }
            }
        }
        Ok(ReconcileSpec {
            day: raw.day.unwrap_or_else(|| sequence_by.to_string()),
            group_by: raw.group_by,
            sum: raw.sum,
            count_by: raw.count_by,
        })
    }

    fn build(&self, raw: RawPipeline, vars: &Vars) -> Result<Pipeline, ConfigError> {
        if raw.name.is_empty()
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(self.invalid(
                "name",
                format!(
                    "`name: {:?}` must be non-empty letters, digits, `_` or `-`",
                    raw.name
                ),
            ));
        }
        if raw.kind != "cdc_merge" {
            return Err(self.invalid(
                "kind",
                format!(
                    "`kind: {}` is not supported; the only kind is cdc_merge",
                    raw.kind
                ),
            ));
        }
        if raw.keys.is_empty() {
            return Err(self.invalid(
                "keys",
                "`keys` is empty; list the business key column(s), e.g. [payment_id]",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in &raw.keys {
            if !seen.insert(k.as_str()) {
                return Err(self.invalid("keys", format!("key column `{k}` is listed twice")));
            }
        }
        if raw.keys.contains(&raw.sequence_by) {
            return Err(self.invalid(
                "sequence_by",
                format!("`sequence_by: {}` is also a key column; the sequence must order versions of one key", raw.sequence_by),
            ));
        }
        for tb in &raw.tie_breakers {
            if raw.keys.contains(tb) || *tb == raw.sequence_by {
                return Err(self.invalid(
                    "tie_breakers",
                    format!("tie-breaker `{tb}` is already a key or the sequence column"),
                ));
            }
        }
        let overlap = self.duration("overlap", &raw.overlap)?;
        let max_future_skew = match &raw.max_future_skew {
            Some(v) => self.duration("max_future_skew", v)?,
            None => DEFAULT_MAX_FUTURE_SKEW,
        };
        let deletes = match raw.deletes {
            Some(d) => {
                if d.values.is_empty() {
                    return Err(self.invalid("values", "`deletes.values` is empty; list the values of `deletes.column` that mean deleted, e.g. [D]"));
                }
                Some(Deletes {
                    column: d.column,
                    values: d.values,
                    mode: d.mode,
                })
            }
            None => None,
        };
        let exclude = raw.columns.map(|c| c.exclude).unwrap_or_default();
        for c in &exclude {
            if raw.keys.contains(c) || *c == raw.sequence_by || raw.tie_breakers.contains(c) {
                return Err(self.invalid(
                    "exclude",
                    format!("`columns.exclude` lists `{c}`, which the merge needs (key, sequence or tie-breaker)"),
                ));
            }
        }
        if let Some(f) = raw.quarantine.max_fraction {
            if !(0.0..=1.0).contains(&f) {
                return Err(self.invalid(
                    "max_fraction",
                    format!("`quarantine.max_fraction: {f}` must be between 0 and 1"),
                ));
            }
        }
        let reconcile = self.reconcile(raw.reconcile, &raw.sequence_by)?;
        let target_file_size = match &raw.target.file_size {
            Some(v) => parse_bytes(v).ok_or_else(|| {
                self.invalid(
                    "file_size",
                    format!("`target.file_size: {v}` is not a size; write it like 8MiB, 64MB or 1GiB (at least 1MiB)"),
                )
            })?,
            None => DEFAULT_TARGET_FILE_SIZE,
        };
        let target_row_group_rows = match raw.target.row_group_rows {
            Some(n) if (1..=1_048_576).contains(&n) => n as usize,
            Some(n) => {
                return Err(self.invalid(
                    "row_group_rows",
                    format!("`target.row_group_rows: {n}` is out of range; use a row count between 1 and 1048576 (default {})", crate::lake::datafile::DEFAULT_ROW_GROUP_ROWS),
                ))
            }
            None => crate::lake::datafile::DEFAULT_ROW_GROUP_ROWS,
        };
        let source_uri = self.substitute("source.uri", &raw.source.uri, vars)?;
        let target_uri = self.substitute("target.uri", &raw.target.uri, vars)?;
        let quarantine_uri = self.substitute("quarantine.uri", &raw.quarantine.uri, vars)?;
        for (key, uri, other_key, other) in [
            ("target", &target_uri, "source", &source_uri),
            ("quarantine", &quarantine_uri, "source", &source_uri),
            ("quarantine", &quarantine_uri, "target", &target_uri),
        ] {
            if overlapping(uri, other) {
                return Err(self.invalid(
                    key,
                    format!("`{key}.uri` ({uri}) is the same table as `{other_key}.uri` ({other}), or inside it: writing it would overwrite or mix with the {other_key}. Give each table its own location"),
                ));
            }
        }
        Ok(Pipeline {
            source_uri,
            source_on_recreate: raw.source.on_recreate,
            target_uri,
            target_file_size,
            target_row_group_rows,
            quarantine: Quarantine {
                uri: quarantine_uri,
                max_rows: raw.quarantine.max_rows,
                max_fraction: raw.quarantine.max_fraction,
            },
            name: raw.name,
            keys: raw.keys,
            sequence_by: raw.sequence_by,
            tie_breakers: raw.tie_breakers,
            overlap,
            max_future_skew,
            deletes,
            exclude,
            on_schema_change: raw.on_schema_change,
            reconcile,
            path: self.path.to_path_buf(),
            text: self.text.to_string(),
        })
    }
}

/// Whether two table URIs name the same location or one lies inside the other (compared by path
/// components, after `file://` is dropped and local paths are made absolute).
fn overlapping(a: &str, b: &str) -> bool {
    fn normal(uri: &str) -> PathBuf {
        let s = uri.strip_prefix("file://").unwrap_or(uri);
        let p = if s.contains("://") {
            PathBuf::from(s)
        } else {
            std::path::absolute(s).unwrap_or_else(|_| PathBuf::from(s))
        };
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => {
                    out.pop();
                }
                other => out.push(other),
            }
        }
        out
    }
    let (a, b) = (normal(a), normal(b));
    a.starts_with(&b) || b.starts_with(&a)
}

/// Parses sizes like `8MiB`, `64MB`, `1GiB`, `1048576`. Sizes under 1 MiB are refused: Delta
/// files that small only add log and listing overhead.
pub fn parse_bytes(s: &str) -> Option<u64> {
    parse_size(s).filter(|b| *b >= 1 << 20)
}

/// Parses a byte size with an optional unit: `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000),
/// `KiB`/`MiB`/`GiB`/`TiB` or `K`/`M`/`G`/`T` (powers of 1024), case-insensitive.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        "tb" => 1_000_000_000_000,
        "tib" | "t" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
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
        available: if available.is_empty() {
            format!("(none in {})", pipelines_dir.display())
        } else {
            available.join(", ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(p.source_uri, "/tmp/lake/bronze/payments_raw");
        assert_eq!(p.overlap, Duration::from_secs(900));
        assert_eq!(p.max_future_skew, DEFAULT_MAX_FUTURE_SKEW);
        assert_eq!(p.deletes.as_ref().unwrap().mode, DeleteMode::Soft);
        assert!(p.soft_deletes());
        assert_eq!(p.order_columns(), vec!["updated_at", "_ingested_at"]);
        assert_eq!(p.target_file_size, DEFAULT_TARGET_FILE_SIZE);
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
        assert!(err.contains("only kind is cdc_merge"), "{err}");
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
        assert_eq!(p.reconcile.day, "updated_at");
        assert!(p.reconcile.group_by.is_empty() && p.reconcile.sum.is_empty());
        let p = parse(&format!(
            "{GOOD}reconcile: {{ day: created_at, group_by: [currency], sum: [amount_cents], count_by: [status] }}\n"
        ))
        .unwrap();
        assert_eq!(p.reconcile.day, "created_at");
        assert_eq!(p.reconcile.sum, vec!["amount_cents"]);
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
