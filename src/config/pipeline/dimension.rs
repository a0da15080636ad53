//! The `dimension` kind's file: a dimension table (e.g. merchants) kept from a CDC source, as
//! the current row per key (`history: scd1`) or its whole history (`history: scd2`). The raw
//! struct, the validated [`Dimension`], and the checks between them.

use serde::Deserialize;

use super::common::{Ctx, RawColumns, RawQuarantine, RawSource};
use super::Quarantine;
use crate::config::{ConfigError, Vars};

/// Output columns of an SCD2 dimension: the version's interval (`valid_to` exclusive, null
/// while current), whether it is the current one, a durable key per business key, a key per
/// version, and whether the row is a placeholder for a key the facts named first.
pub const VALID_FROM: &str = "valid_from";
pub const VALID_TO: &str = "valid_to";
pub const IS_CURRENT: &str = "is_current";
pub const DURABLE_KEY: &str = "durable_key";
pub const VERSION_KEY: &str = "version_key";
pub const IS_INFERRED: &str = "is_inferred";
/// When a placeholder was first written for the key (kept once the real record completes it;
/// null for keys never inferred).
pub const INFERRED_AT: &str = "inferred_at";
/// The columns a dimension adds itself (a source column may not take these names).
pub const ADDED: [&str; 7] = [
    VALID_FROM,
    VALID_TO,
    IS_CURRENT,
    DURABLE_KEY,
    VERSION_KEY,
    IS_INFERRED,
    INFERRED_AT,
];

/// Where the facts that name this dimension's keys are (`infer_from:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferFrom {
    /// The facts table: a table URI, or a pipeline beside this one whose target it is.
    pub source: String,
    /// The facts' column holding this dimension's key.
    pub key: String,
}

/// Inferred members: placeholders for keys the facts name before the dimension's records do.
#[derive(Debug, Clone, PartialEq)]
pub struct Infer {
    pub from: Vec<InferFrom>,
    /// Attribute values of a placeholder (column → value, cast to the column's type).
    pub placeholder: Vec<(String, String)>,
    /// Placeholders older than this are reported (a warning and a count).
    pub alert_after: Option<std::time::Duration>,
    /// Placeholders older than this stop the run (exit 65, nothing written).
    pub fail_after: Option<std::time::Duration>,
}

/// `history:`: what the table keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryMode {
    /// One row per live key: its newest values (a delete removes the key).
    Scd1,
    /// Every version of every key, with its validity interval.
    #[default]
    Scd2,
}

/// Which columns open a new version when they change (SCD2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracked {
    /// Every column but the key, sequence and tie-breaker columns.
    All,
    /// `track_history: [..]`: only these.
    Only(Vec<String>),
    /// `track_history_except: [..]`: all but these.
    Except(Vec<String>),
}

/// A validated `dimension` pipeline.
#[derive(Debug, Clone)]
pub struct Dimension {
    pub source_uri: String,
    pub target_uri: String,
    /// `target.apply`: how an incremental run replaces the rows of the keys it rebuilt.
    pub target_apply: super::Apply,
    pub keys: Vec<String>,
    pub sequence_by: String,
    pub tie_breakers: Vec<String>,
    /// `deletes:`: the column and the values that mean "this key was deleted".
    pub deletes: Option<(String, Vec<String>)>,
    pub exclude: Vec<String>,
    pub history: HistoryMode,
    pub tracked: Tracked,
    pub quarantine: Quarantine,
    /// `infer_from:` and its settings (none: no placeholders).
    pub infer: Option<Infer>,
    /// `ignore_null_updates` / `unavailable_marker`.
    pub partial: super::PartialUpdates,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDimension {
    pub(super) name: String,
    #[serde(rename = "kind")]
    pub(super) _kind: serde::de::IgnoredAny,
    pub(super) source: RawSource,
    pub(super) target: RawDimTarget,
    pub(super) keys: Vec<String>,
    pub(super) sequence_by: String,
    #[serde(default)]
    pub(super) tie_breakers: Vec<String>,
    pub(super) deletes: Option<RawDimDeletes>,
    pub(super) columns: Option<RawColumns>,
    #[serde(default)]
    pub(super) history: HistoryMode,
    pub(super) track_history: Option<Vec<String>>,
    pub(super) track_history_except: Option<Vec<String>>,
    pub(super) quarantine: RawQuarantine,
    #[serde(default)]
    pub(super) infer_from: Vec<RawInferFrom>,
    pub(super) placeholder: Option<serde_yaml::Mapping>,
    pub(super) alert_after: Option<String>,
    pub(super) fail_after: Option<String>,
    #[serde(default)]
    pub(super) ignore_null_updates: bool,
    pub(super) unavailable_marker: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInferFrom {
    pub(super) source: String,
    pub(super) key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDimTarget {
    pub(super) uri: String,
    #[serde(default)]
    pub(super) apply: super::Apply,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDimDeletes {
    pub(super) column: String,
    pub(super) values: Vec<String>,
}

impl Ctx<'_> {
    /// Checks a `dimension` file: roles, the tracked columns, table locations.
    pub(super) fn dimension(
        &self,
        raw: RawDimension,
        vars: &Vars,
    ) -> Result<Dimension, ConfigError> {
        let roles = self.dimension_roles(&raw)?;
        let exclude = raw.columns.map(|c| c.exclude).unwrap_or_default();
        let tracked = self.tracked(raw.track_history, raw.track_history_except, raw.history)?;
        self.tracked_are_attributes(&tracked, &roles, &exclude)?;
        let deletes = match raw.deletes {
            Some(d) if d.values.is_empty() => {
                return Err(self.invalid("values", "`deletes.values` is empty; list the values of `deletes.column` that mean deleted, e.g. [D]"));
            }
            Some(d) => Some((d.column, d.values)),
            None => None,
        };
        if let Some(c) = exclude.iter().find(|c| roles.contains(c)) {
            return Err(self.invalid(
                "exclude",
                format!("`columns.exclude` lists `{c}`, which the dimension needs (key, sequence or tie-breaker)"),
            ));
        }
        let source_uri = self.substitute("source.uri", &raw.source.uri, vars)?;
        let target_uri = self.substitute("target.uri", &raw.target.uri, vars)?;
        let quarantine = self.quarantine(raw.quarantine, vars)?;
        self.separate(&[
            ("source.uri", &source_uri),
            ("target.uri", &target_uri),
            ("quarantine.uri", &quarantine.uri),
        ])?;
        if raw.source.on_recreate != super::SourceRecreate::Fail {
            return Err(self.invalid(
                "on_recreate",
                "`source.on_recreate` is for `cdc_merge`; a dimension reads the keys it rebuilds from the whole source anyway: a recreated source is rebuilt with `--full-reload`",
            ));
        }
        let infer = self.infer(
            &raw.keys,
            &roles,
            raw.infer_from,
            raw.placeholder,
            raw.alert_after,
            raw.fail_after,
            vars,
        )?;
        let partial = self.partial_updates(raw.ignore_null_updates, raw.unavailable_marker)?;
        Ok(Dimension {
            source_uri,
            target_uri,
            target_apply: raw.target.apply,
            keys: raw.keys,
            sequence_by: raw.sequence_by,
            tie_breakers: raw.tie_breakers,
            deletes,
            exclude,
            history: raw.history,
            tracked,
            quarantine,
            infer,
            partial,
        })
    }

    /// Keys, sequence and tie-breakers: each column one role, none a column the dimension adds.
    fn dimension_roles(&self, raw: &RawDimension) -> Result<Vec<String>, ConfigError> {
        if raw.keys.is_empty() {
            return Err(self.invalid(
                "keys",
                "`keys` is empty; list the business key column(s), e.g. [merchant_id]",
            ));
        }
        let roles: Vec<String> = raw
            .keys
            .iter()
            .chain(std::iter::once(&raw.sequence_by))
            .chain(&raw.tie_breakers)
            .cloned()
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for c in &roles {
            if !seen.insert(c.as_str()) {
                return Err(self.invalid(
                    "keys",
                    format!("column `{c}` is named twice among keys, sequence_by and tie_breakers; each has one role"),
                ));
            }
            if ADDED.contains(&c.as_str()) {
                return Err(self.invalid_at_text(
                    c,
                    format!("column `{c}` is one the dimension adds itself ({}); rename it in the source", ADDED.join(", ")),
                ));
            }
        }
        Ok(roles)
    }

    /// Which changes open a version: `track_history` or `track_history_except` (not both, and
    /// neither under `history: scd1`), or every column.
    fn tracked(
        &self,
        only: Option<Vec<String>>,
        except: Option<Vec<String>>,
        history: HistoryMode,
    ) -> Result<Tracked, ConfigError> {
        let key = if only.is_some() {
            "track_history"
        } else {
            "track_history_except"
        };
        match (only, except) {
            (Some(_), Some(_)) => Err(self.invalid(
                "track_history_except",
                "give `track_history` (the columns that open a version) or `track_history_except` (all but these), not both",
            )),
            (Some(_), None) | (None, Some(_)) if history == HistoryMode::Scd1 => Err(self.invalid(
                "history",
                format!("`{key}` chooses which changes open a new version, and `history: scd1` keeps no versions; remove it, or use `history: scd2`"),
            )),
            (Some(cols), None) if cols.is_empty() => Err(self.invalid(
                "track_history",
                "`track_history` is empty: no change would open a version; list the columns whose changes do (e.g. [segment]), or remove it to track every column",
            )),
            (Some(cols), None) => Ok(Tracked::Only(cols)),
            (None, Some(cols)) => Ok(Tracked::Except(cols)),
            (None, None) => Ok(Tracked::All),
        }
    }

    /// The tracked columns are attributes the table shows: no key, sequence or tie-breaker,
    /// nothing `columns.exclude` leaves out.
    fn tracked_are_attributes(
        &self,
        tracked: &Tracked,
        roles: &[String],
        exclude: &[String],
    ) -> Result<(), ConfigError> {
        let (key, cols) = match tracked {
            Tracked::Only(cols) => ("track_history", cols),
            Tracked::Except(cols) => ("track_history_except", cols),
            Tracked::All => return Ok(()),
        };
        for c in cols {
            if roles.contains(c) {
                return Err(self.invalid(
                    key,
                    format!("`{key}` lists `{c}`, a key, sequence or tie-breaker column: it is not an attribute whose history is tracked"),
                ));
            }
            if exclude.contains(c) {
                return Err(self.invalid(
                    key,
                    format!("`{key}` lists `{c}`, which `columns.exclude` leaves out of the table: a version would open on a change the table does not show; track it or exclude it, not both"),
                ));
            }
        }
        Ok(())
    }

    /// `infer_from`, `placeholder`, `alert_after`, `fail_after`.
    #[allow(clippy::too_many_arguments)]
    fn infer(
        &self,
        keys: &[String],
        roles: &[String],
        from: Vec<RawInferFrom>,
        placeholder: Option<serde_yaml::Mapping>,
        alert_after: Option<String>,
        fail_after: Option<String>,
        vars: &Vars,
    ) -> Result<Option<Infer>, ConfigError> {
        if from.is_empty() {
            for (given, key) in [
                (placeholder.is_some(), "placeholder"),
                (alert_after.is_some(), "alert_after"),
                (fail_after.is_some(), "fail_after"),
            ] {
                if given {
                    return Err(self.invalid(key, format!("`{key}` is about inferred members, which need `infer_from:` (the facts that name keys before the dimension does); add it or remove `{key}`")));
                }
            }
            return Ok(None);
        }
        if keys.len() != 1 {
            return Err(self.invalid("infer_from", format!("`infer_from` matches a fact column to the dimension's key, and this dimension has {} key columns; inferred members need a single key column", keys.len())));
        }
        let mut out = Vec::new();
        for f in from {
            if f.key.trim().is_empty() {
                return Err(self.invalid("infer_from", "an `infer_from` entry has an empty `key`; name the facts' column holding the dimension's key, e.g. `key: merchant_id`"));
            }
            let source = if f.source.contains('/')
                || f.source.contains("://")
                || f.source.contains("${")
            {
                self.substitute("infer_from.source", &f.source, vars)?
            } else {
                // A pipeline beside this one: the table it writes.
                let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
                let file = ["yml", "yaml"]
                    .iter()
                    .map(|ext| dir.join(format!("{}.{ext}", f.source)))
                    .find(|f| f.is_file())
                    .ok_or_else(|| {
                        self.invalid_at_text(
                            &f.source,
                            format!("`infer_from.source: {}` is neither a table path or URI nor a pipeline beside this file ({}.yml); give the facts table's location or the pipeline that writes it", f.source, f.source),
                        )
                    })?;
                self.load_referenced(&file, vars, "infer_from")?
                    .target_uri()
                    .to_string()
            };
            out.push(InferFrom { source, key: f.key });
        }
        let mut values = Vec::new();
        for (k, v) in placeholder.unwrap_or_default() {
            let Some(k) = k.as_str() else {
                return Err(self.invalid("placeholder", "`placeholder` keys are column names"));
            };
            if roles.iter().any(|r| r == k) || ADDED.contains(&k) {
                return Err(self.invalid("placeholder", format!("`placeholder` sets `{k}`, a key, sequence or tie-breaker column or one the dimension adds: a placeholder only fills attributes")));
            }
            let v = match v {
                serde_yaml::Value::String(s) => s,
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(self.invalid(
                        "placeholder",
                        format!(
                            "`placeholder.{k}` must be a single value (text, number or true/false)"
                        ),
                    ))
                }
            };
            values.push((k.to_string(), v));
        }
        let alert_after = alert_after
            .map(|v| self.duration("alert_after", &v))
            .transpose()?;
        let fail_after = fail_after
            .map(|v| self.duration("fail_after", &v))
            .transpose()?;
        if let (Some(a), Some(f)) = (alert_after, fail_after) {
            if f < a {
                return Err(self.invalid("fail_after", "`fail_after` is shorter than `alert_after`: a run would fail before it warned; make `fail_after` the longer one"));
            }
        }
        Ok(Some(Infer {
            from: out,
            placeholder: values,
            alert_after,
            fail_after,
        }))
    }
}

impl super::Settings for Dimension {
    fn target_uri(&self) -> &str {
        &self.target_uri
    }
    fn source_uri(&self) -> &str {
        &self.source_uri
    }
    /// The source is change records: the event time is the sequence.
    fn clocks(&self) -> super::Clocks<'_> {
        super::Clocks {
            table: &self.source_uri,
            role: "source",
            event_time: Some(&self.sequence_by),
            arrival: None,
            overlap: None,
        }
    }
    /// A version of a key (SCD2: with its `valid_from`).
    fn row_keys(&self) -> Vec<String> {
        let mut keys = self.keys.clone();
        if self.history == HistoryMode::Scd2 {
            keys.push(VALID_FROM.to_string());
        }
        keys
    }
}
