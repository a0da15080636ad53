//! The `cdc_merge` kind's file: change records (bronze) merged into one row per key (silver).
//! The raw struct as written, the validated [`CdcMerge`], and the checks between them.

use std::time::Duration;

use serde::Deserialize;

use super::common::{Ctx, RawColumns, RawQuarantine, RawSource};
use super::{
    Apply, Quarantine, SchemaChange, SourceRecreate, DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_SIZE,
};
use crate::config::size::parse_bytes;
use crate::config::{ConfigError, Vars};

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCdcMerge {
    pub(super) name: String,
    /// The tag, already read by [`RawTag`].
    #[serde(rename = "kind")]
    pub(super) _kind: serde::de::IgnoredAny,
    pub(super) source: RawSource,
    pub(super) target: RawTarget,
    pub(super) keys: Vec<String>,
    pub(super) sequence_by: String,
    #[serde(default)]
    pub(super) tie_breakers: Vec<String>,
    pub(super) overlap: String,
    pub(super) max_future_skew: Option<String>,
    pub(super) deletes: Option<RawDeletes>,
    pub(super) columns: Option<RawColumns>,
    pub(super) quarantine: RawQuarantine,
    #[serde(default)]
    pub(super) on_schema_change: SchemaChange,
    pub(super) reconcile: Option<RawReconcile>,
    #[serde(default)]
    pub(super) expectations: Vec<super::expect::RawExpectation>,
    #[serde(default)]
    pub(super) ignore_null_updates: bool,
    pub(super) unavailable_marker: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) uri: String,
    pub(super) file_size: Option<String>,
    pub(super) row_group_rows: Option<u64>,
    #[serde(default)]
    pub(super) apply: Apply,
    #[serde(default)]
    pub(super) change_data_feed: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeletes {
    pub(super) column: String,
    pub(super) values: Vec<String>,
    #[serde(default)]
    pub(super) mode: DeleteMode,
    /// How long tombstones are kept (`maintain` removes older ones), e.g. `30d`.
    #[serde(default)]
    pub(super) retain: Option<String>,
    /// Where the removed tombstones' keys are recorded (default: beside the target).
    #[serde(default)]
    pub(super) removed_keys: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReconcile {
    pub(super) day: Option<String>,
    #[serde(default)]
    pub(super) group_by: Vec<String>,
    #[serde(default)]
    pub(super) sum: Vec<String>,
    #[serde(default)]
    pub(super) count_by: Vec<String>,
}

/// Default for `max_future_skew`: how far past the run's start a sequence value may lie before
/// the row is deferred instead of merged.
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);

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
    pub expectations: Vec<super::expect::Expectation>,
    /// `ignore_null_updates` / `unavailable_marker`.
    pub partial: super::PartialUpdates,
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

impl Ctx<'_> {
    /// Checks a `cdc_merge` file: key, sequence and tie-breaker roles, durations, sizes and
    /// table locations (substituted, none inside another).
    pub(super) fn cdc_merge(&self, raw: RawCdcMerge, vars: &Vars) -> Result<CdcMerge, ConfigError> {
        self.merge_roles(&raw)?;
        let overlap = self.duration("overlap", &raw.overlap)?;
        let max_future_skew = match &raw.max_future_skew {
            Some(v) => self.duration("max_future_skew", v)?,
            None => DEFAULT_MAX_FUTURE_SKEW,
        };
        let deletes = raw.deletes.map(|d| self.deletes(d, vars)).transpose()?;
        let exclude = raw.columns.map(|c| c.exclude).unwrap_or_default();
        self.merge_excludes(&raw.keys, &raw.sequence_by, &raw.tie_breakers, &exclude)?;
        let reconcile = self.reconcile(raw.reconcile, &raw.sequence_by)?;
        let expectations = self.expectations(raw.expectations)?;
        let (target_file_size, target_row_group_rows) = self.merge_layout(&raw.target)?;
        let partial = self.partial_updates(raw.ignore_null_updates, raw.unavailable_marker)?;
        let mut m = CdcMerge {
            source_uri: self.substitute("source.uri", &raw.source.uri, vars)?,
            source_on_recreate: raw.source.on_recreate,
            target_uri: self.substitute("target.uri", &raw.target.uri, vars)?,
            target_file_size,
            target_row_group_rows,
            target_apply: raw.target.apply,
            change_data_feed: raw.target.change_data_feed,
            quarantine: self.quarantine(raw.quarantine, vars)?,
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
            partial,
        };
        // Removed tombstones are recorded beside the target unless told where.
        let target = m.target_uri.trim_end_matches('/').to_string();
        if let Some(d) = m.deletes.as_mut().filter(|d| d.retain.is_some()) {
            d.removed_keys
                .get_or_insert_with(|| format!("{target}_removed_keys"));
        }
        self.merge_locations(&m)?;
        Ok(m)
    }

    /// Keys, sequence and tie-breakers: each column in one role, keys listed once.
    fn merge_roles(&self, raw: &RawCdcMerge) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// `columns.exclude` cannot drop a column the merge orders or matches by.
    fn merge_excludes(
        &self,
        keys: &[String],
        sequence_by: &str,
        tie_breakers: &[String],
        exclude: &[String],
    ) -> Result<(), ConfigError> {
        match exclude
            .iter()
            .find(|c| keys.contains(c) || *c == sequence_by || tie_breakers.contains(c))
        {
            Some(c) => Err(self.invalid(
                "exclude",
                format!("`columns.exclude` lists `{c}`, which the merge needs (key, sequence or tie-breaker)"),
            )),
            None => Ok(()),
        }
    }

    /// The `deletes:` block: values, mode, and how long tombstones are kept.
    fn deletes(&self, d: RawDeletes, vars: &Vars) -> Result<Deletes, ConfigError> {
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
        Ok(Deletes {
            column: d.column,
            values: d.values,
            mode: d.mode,
            retain,
            removed_keys,
        })
    }

    /// The target's file size and rows per row group, with their defaults.
    fn merge_layout(&self, t: &RawTarget) -> Result<(u64, usize), ConfigError> {
        let file_size = match &t.file_size {
            Some(v) => parse_bytes(v).ok_or_else(|| {
                self.invalid(
                    "file_size",
                    format!("`target.file_size: {v}` is not a size; write it like 8MiB, 64MB or 1GiB (at least 1MiB)"),
                )
            })?,
            None => DEFAULT_TARGET_FILE_SIZE,
        };
        let row_group_rows = match t.row_group_rows {
            Some(n) if (1..=1_048_576).contains(&n) => n as usize,
            Some(n) => {
                return Err(self.invalid(
                    "row_group_rows",
                    format!("`target.row_group_rows: {n}` is out of range; use a row count between 1 and 1048576 (default {DEFAULT_ROW_GROUP_ROWS})"),
                ))
            }
            None => DEFAULT_ROW_GROUP_ROWS,
        };
        Ok((file_size, row_group_rows))
    }

    /// No table the merge writes lies inside another it reads or writes.
    fn merge_locations(&self, m: &CdcMerge) -> Result<(), ConfigError> {
        let mut locations = vec![
            ("source.uri", m.source_uri.as_str()),
            ("target.uri", &m.target_uri),
            ("quarantine.uri", &m.quarantine.uri),
        ];
        if let Some(removed) = m.deletes.as_ref().and_then(|d| d.removed_keys.as_ref()) {
            locations.push(("deletes.removed_keys", removed));
        }
        self.separate(&locations)
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
}

impl super::Settings for CdcMerge {
    fn target_uri(&self) -> &str {
        &self.target_uri
    }
    fn source_uri(&self) -> &str {
        &self.source_uri
    }
    /// The source (bronze) holds both clocks: its event time is the sequence.
    fn clocks(&self) -> super::Clocks<'_> {
        super::Clocks {
            table: &self.source_uri,
            role: "source",
            event_time: Some(&self.sequence_by),
            arrival: None,
            overlap: Some(self.overlap),
        }
    }
    fn row_keys(&self) -> Vec<String> {
        self.keys.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::common::overlapping;
    use super::super::tests::{parse, GOOD};
    use super::super::{Kind, Pipeline, DEFAULT_TARGET_FILE_SIZE};
    use super::*;

    /// The merge settings of a `cdc_merge` pipeline.
    fn merge(p: &Pipeline) -> &CdcMerge {
        p.cdc_merge("test").expect("a cdc_merge pipeline")
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
}
