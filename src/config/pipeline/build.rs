//! Validation: a raw pipeline file becomes a [`Pipeline`], or an error naming the file, the line
//! and the key.

use super::common::{overlapping, Ctx};
use super::raw::{Kind, RawCdcMerge, RawPipeline, RawReconcile, RawTag};
use super::{
    CdcMerge, DeleteMode, Deletes, Pipeline, Quarantine, ReconcileSpec, Spec,
    DEFAULT_MAX_FUTURE_SKEW, DEFAULT_TARGET_FILE_SIZE,
};
use crate::config::location::{explain_serde_message, lines_of_key, nearest};
use crate::config::size::parse_bytes;
use crate::config::{ConfigError, Vars};

impl Ctx<'_> {
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

    /// Parses the file as the kind it declares and validates it.
    pub(super) fn pipeline(&self, vars: &Vars) -> Result<Pipeline, ConfigError> {
        let (name, spec) = match self.raw()? {
            RawPipeline::CdcMerge(raw) => {
                (raw.name.clone(), Spec::CdcMerge(self.cdc_merge(raw, vars)?))
            }
            RawPipeline::Ingest(raw) => (raw.name.clone(), Spec::Ingest(self.ingest(raw, vars)?)),
            RawPipeline::Aggregate(raw) => (
                raw.name.clone(),
                Spec::Aggregate(self.aggregate(raw, vars)?),
            ),
            RawPipeline::Dimension(raw) => (
                raw.name.clone(),
                Spec::Dimension(self.dimension(raw, vars)?),
            ),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(self.invalid(
                "name",
                format!("`name: {name:?}` must be non-empty letters, digits, `_` or `-`"),
            ));
        }
        Ok(Pipeline {
            name,
            path: self.path.to_path_buf(),
            spec,
            text: self.text.to_string(),
        })
    }

    /// The file as its kind's raw struct: the tag first, then the whole file as that kind.
    fn raw(&self) -> Result<RawPipeline, ConfigError> {
        let tag: RawTag = self.parse_as()?;
        let Some(kind) = tag.kind else {
            return Err(ConfigError::Invalid {
                path: self.path.to_path_buf(),
                line: 1,
                message: format!(
                    "missing `kind`; add `kind: cdc_merge` (the kinds are: {})",
                    Kind::names()
                ),
            });
        };
        match Kind::from_name(kind.trim()) {
            Some(Kind::CdcMerge) => Ok(RawPipeline::CdcMerge(self.parse_as()?)),
            Some(Kind::Ingest) => Ok(RawPipeline::Ingest(self.parse_as()?)),
            Some(Kind::Aggregate) => Ok(RawPipeline::Aggregate(self.parse_as()?)),
            Some(Kind::Dimension) => Ok(RawPipeline::Dimension(self.parse_as()?)),
            None => {
                let hint = nearest(kind.trim(), Kind::ALL.iter().map(|k| k.as_str()))
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                Err(self.invalid(
                    "kind",
                    format!(
                        "`kind: {kind}` is not a pipeline kind{hint}; the kinds are: {}",
                        Kind::names()
                    ),
                ))
            }
        }
    }

    pub(super) fn parse_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        serde_yaml::from_str(self.text).map_err(|e| {
            let message = e.to_string();
            // serde locates a repeated key at the start of its mapping: point at the repeat.
            let repeated = message
                .strip_prefix("duplicate field `")
                .and_then(|r| r.split('`').next())
                .and_then(|key| lines_of_key(self.text, key).nth(1));
            ConfigError::Invalid {
                path: self.path.to_path_buf(),
                line: repeated.or(e.location().map(|l| l.line())).unwrap_or(1),
                message: explain_serde_message(&message),
            }
        })
    }

    /// Checks a `cdc_merge` file: key, sequence and tie-breaker roles, durations, sizes and
    /// table locations (substituted, none inside another).
    fn cdc_merge(&self, raw: RawCdcMerge, vars: &Vars) -> Result<CdcMerge, ConfigError> {
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
        let mut deletes = match raw.deletes {
            Some(d) => {
                if d.values.is_empty() {
                    return Err(self.invalid("values", "`deletes.values` is empty; list the values of `deletes.column` that mean deleted, e.g. [D]"));
                }
                let retain = match &d.retain {
                    Some(v) if d.mode == DeleteMode::Hard => {
                        return Err(self.invalid(
                            "retain",
                            format!("`deletes.retain: {v}` bounds tombstones, and `mode: hard` keeps none; remove `retain`, or use `mode: soft`"),
                        ));
                    }
                    Some(v) => Some(self.duration("retain", v)?),
                    None => None,
                };
                if d.removed_keys.is_some() && retain.is_none() {
                    return Err(self.invalid(
                        "removed_keys",
                        "`deletes.removed_keys` records tombstones that `maintain` removes, which it only does with `deletes.retain`; add `retain` (e.g. 30d) or remove `removed_keys`",
                    ));
                }
                let removed_keys = d
                    .removed_keys
                    .map(|u| self.substitute("deletes.removed_keys", &u, vars))
                    .transpose()?;
                Some(Deletes {
                    column: d.column,
                    values: d.values,
                    mode: d.mode,
                    retain,
                    removed_keys,
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
        let expectations = self.expectations(raw.expectations)?;
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
                    format!("`target.row_group_rows: {n}` is out of range; use a row count between 1 and 1048576 (default {})", crate::config::pipeline::DEFAULT_ROW_GROUP_ROWS),
                ))
            }
            None => crate::config::pipeline::DEFAULT_ROW_GROUP_ROWS,
        };
        let source_uri = self.substitute("source.uri", &raw.source.uri, vars)?;
        let target_uri = self.substitute("target.uri", &raw.target.uri, vars)?;
        let quarantine_uri = self.substitute("quarantine.uri", &raw.quarantine.uri, vars)?;
        // Removed tombstones are recorded beside the target unless told where.
        if let Some(d) = deletes.as_mut().filter(|d| d.retain.is_some()) {
            if d.removed_keys.is_none() {
                d.removed_keys = Some(format!("{}_removed_keys", target_uri.trim_end_matches('/')));
            }
        }
        let removed_keys = deletes
            .as_ref()
            .and_then(|d| d.removed_keys.clone())
            .unwrap_or_default();
        let mut pairs = vec![
            ("target", &target_uri, "source", &source_uri),
            ("quarantine", &quarantine_uri, "source", &source_uri),
            ("quarantine", &quarantine_uri, "target", &target_uri),
        ];
        if !removed_keys.is_empty() {
            pairs.extend([
                ("removed_keys", &removed_keys, "source", &source_uri),
                ("removed_keys", &removed_keys, "target", &target_uri),
                ("removed_keys", &removed_keys, "quarantine", &quarantine_uri),
            ]);
        }
        for (key, uri, other_key, other) in pairs {
            if overlapping(uri, other) {
                let setting = |k: &str| match k {
                    "removed_keys" => "deletes.removed_keys".to_string(),
                    k => format!("{k}.uri"),
                };
                return Err(self.invalid(
                    key,
                    format!("`{}` ({uri}) is the same table as `{}` ({other}), or inside it: writing it would overwrite or mix with the {other_key}. Give each table its own location", setting(key), setting(other_key)),
                ));
            }
        }
        Ok(CdcMerge {
            source_uri,
            source_on_recreate: raw.source.on_recreate,
            target_uri,
            target_file_size,
            target_row_group_rows,
            target_apply: raw.target.apply,
            change_data_feed: raw.target.change_data_feed,
            quarantine: Quarantine {
                uri: quarantine_uri,
                max_rows: raw.quarantine.max_rows,
                max_fraction: raw.quarantine.max_fraction,
            },
            keys: raw.keys,
            sequence_by: raw.sequence_by,
            tie_breakers: raw.tie_breakers,
            overlap,
            max_future_skew,
            deletes,
            exclude,
            on_schema_change: raw.on_schema_change,
            reconcile,
            expectations,
        })
    }
}
