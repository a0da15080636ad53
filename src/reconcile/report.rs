//! The reconciliation report: one JSON object for machines, a short text for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrow::array::RecordBatch;
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use super::stats::{BucketKey, BucketStats, SumValue};
use super::Join;
use crate::config::pipeline::CdcMerge;
use crate::config::Pipeline;
use crate::run::render::{render_key, render_value};

/// How one key differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffKind {
    /// A full reload would write this key; the target does not have it.
    MissingInTarget,
    /// The target has a key a full reload would not write.
    UnexpectedInTarget,
    /// Both have the key with different values.
    Different,
    /// The target holds the key more than once (each extra row counts once).
    DuplicateInTarget,
}

impl DiffKind {
    fn label(self) -> &'static str {
        match self {
            DiffKind::MissingInTarget => "missing in target",
            DiffKind::UnexpectedInTarget => "unexpected in target",
            DiffKind::Different => "different content",
            DiffKind::DuplicateInTarget => "duplicated in target",
        }
    }
}

/// How many keys differ, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiffCounts {
    /// Keys a full reload would write that the target lacks (lost rows).
    pub missing_in_target: u64,
    /// Target keys a full reload would not write (rows that should not be there).
    pub unexpected_in_target: u64,
    /// Keys on both sides whose values differ.
    pub different: u64,
    /// Extra target rows for a key already seen (corruption no merge can repair).
    pub duplicate_in_target: u64,
}

impl DiffCounts {
    pub(crate) fn add(&mut self, kind: DiffKind) {
        *match kind {
            DiffKind::MissingInTarget => &mut self.missing_in_target,
            DiffKind::UnexpectedInTarget => &mut self.unexpected_in_target,
            DiffKind::Different => &mut self.different,
            DiffKind::DuplicateInTarget => &mut self.duplicate_in_target,
        } += 1;
    }

    /// Every differing key (a duplicated key counts once per extra row).
    pub fn total(&self) -> u64 {
        self.missing_in_target
            + self.unexpected_in_target
            + self.different
            + self.duplicate_in_target
    }

    /// "1 missing in target, 2 different content, ..." for messages.
    pub fn detail(&self) -> String {
        [
            (self.missing_in_target, DiffKind::MissingInTarget),
            (self.unexpected_in_target, DiffKind::UnexpectedInTarget),
            (self.different, DiffKind::Different),
            (self.duplicate_in_target, DiffKind::DuplicateInTarget),
        ]
        .iter()
        .map(|(n, k)| format!("{n} {}", k.label()))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// One value that differs between the expected row and the target's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CellDiff {
    pub column: String,
    pub expected: Option<String>,
    pub actual: Option<String>,
}

/// One listed differing key, with the bucket it belongs to.
#[derive(Debug, Clone, Serialize)]
pub struct DiffKey {
    pub kind: DiffKind,
    /// Key column → value (null as JSON null).
    pub key: BTreeMap<String, Option<String>>,
    /// The key as `col=value, ...`, for text.
    #[serde(skip)]
    pub key_text: String,
    #[serde(skip)]
    pub bucket: BucketKey,
    /// Filled in by the report: the event day (YYYY-MM-DD) of the row the key is reported from.
    pub day: Option<String>,
    /// Filled in by the report: the group of that row.
    pub group: BTreeMap<String, Option<String>>,
    /// For `different`: the columns whose values differ.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<CellDiff>,
}

impl DiffKey {
    pub(crate) fn new(
        kind: DiffKind,
        batch: &RecordBatch,
        row: usize,
        keys: &[String],
        bucket: BucketKey,
        columns: Vec<CellDiff>,
    ) -> Self {
        let key = keys
            .iter()
            .map(|k| {
                let value = batch
                    .column_by_name(k)
                    .and_then(|c| render_value(c.as_ref(), row).ok().flatten());
                (k.clone(), value)
            })
            .collect();
        DiffKey {
            kind,
            key,
            key_text: render_key(batch, keys, row),
            bucket,
            day: None,
            group: BTreeMap::new(),
            columns,
        }
    }
}

/// One side's aggregates of a bucket (or of the whole table), as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Aggregates {
    /// Live rows.
    pub rows: u64,
    /// Soft-delete tombstones.
    pub deleted: u64,
    /// `reconcile.sum` column → sum over live rows (a number, or a decimal string).
    pub sum: BTreeMap<String, Value>,
    /// `reconcile.count_by` column → value → live rows (null is counted under `(null)`).
    pub count: BTreeMap<String, BTreeMap<String, u64>>,
    /// Hash of the set of live keys, as 16 hex digits.
    pub key_hash: String,
}

/// One event day and group, both sides.
#[derive(Debug, Clone, Serialize)]
pub struct BucketReport {
    pub day: Option<String>,
    pub group: BTreeMap<String, Option<String>>,
    pub matches: bool,
    pub expected: Aggregates,
    pub actual: Aggregates,
}

/// Both sides summed over every bucket.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub matches: bool,
    pub expected: Aggregates,
    pub actual: Aggregates,
}

/// Everything `tidemark reconcile` found.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileReport {
    pub pipeline: String,
    /// The pipeline file, for the commands the error message suggests.
    #[serde(skip)]
    pub pipeline_file: String,
    /// True when the target is exactly what a full reload would write.
    pub identical: bool,
    pub source_uri: String,
    /// Source version the expected rows were computed from.
    pub source_version: u64,
    /// Why that version: "recorded by the target's last run" or "latest".
    pub source_version_basis: String,
    pub target_uri: String,
    pub target_version: Option<u64>,
    /// The clock that decided which rows were still in the future.
    pub now: String,
    pub day: String,
    pub group_by: Vec<String>,
    pub sum: Vec<String>,
    pub count_by: Vec<String>,
    /// Rows a full reload would write (tombstones included).
    pub expected_rows: u64,
    /// Rows the target holds.
    pub target_rows: u64,
    pub differing_keys: DiffCounts,
    /// `--limit`: how many differing keys are listed in `keys`.
    pub limit: usize,
    pub keys: Vec<DiffKey>,
    pub totals: Totals,
    pub buckets_compared: usize,
    pub buckets_differing: usize,
    /// Every day/group bucket, ordered by day then group.
    pub buckets: Vec<BucketReport>,
    pub notes: Vec<String>,
}

/// The versions compared.
pub(crate) struct Versions {
    pub source: u64,
    pub basis: &'static str,
    pub target: Option<u64>,
}

fn day_text(day: Option<i32>) -> Option<String> {
    day.and_then(|d| {
        NaiveDate::from_ymd_opt(1970, 1, 1)?.checked_add_signed(chrono::Duration::days(d.into()))
    })
    .map(|d| d.format("%Y-%m-%d").to_string())
}

fn group_map(names: &[String], values: &[Option<String>]) -> BTreeMap<String, Option<String>> {
    names.iter().cloned().zip(values.iter().cloned()).collect()
}

fn sum_value(v: SumValue, scale: i8) -> Value {
    match v {
        SumValue::Exact(n) if scale <= 0 => match i64::try_from(n) {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(n.to_string()),
        },
        SumValue::Exact(n) => {
            let digits = n.unsigned_abs().to_string();
            let scale = scale as usize;
            let padded = format!("{digits:0>width$}", width = scale + 1);
            let (int, frac) = padded.split_at(padded.len() - scale);
            let sign = if n < 0 { "-" } else { "" };
            Value::from(format!("{sign}{int}.{frac}"))
        }
        // JSON has no NaN or infinity (serde_json would print null): name them.
        SumValue::Float(f) if f.is_nan() => Value::from("NaN"),
        SumValue::Float(f) if f.is_infinite() => Value::from(if f > 0.0 { "inf" } else { "-inf" }),
        // -0.0 is shown as 0, as it compares.
        SumValue::Float(f) => Value::from(f + 0.0),
    }
}

fn aggregates(s: &BucketStats, spec: &crate::config::ReconcileSpec, scales: &[i8]) -> Aggregates {
    Aggregates {
        rows: s.rows,
        deleted: s.deleted,
        sum: spec
            .sum
            .iter()
            .zip(&s.sums)
            .zip(scales)
            .map(|((c, v), scale)| (c.clone(), sum_value(*v, *scale)))
            .collect(),
        count: spec
            .count_by
            .iter()
            .zip(&s.counts)
            .map(|(c, m)| {
                (
                    c.clone(),
                    m.iter()
                        .map(|(k, n)| (k.clone().unwrap_or_else(|| "(null)".to_string()), *n))
                        .collect(),
                )
            })
            .collect(),
        key_hash: format!("{:016x}", s.key_hash),
    }
}

fn add_into(total: &mut BucketStats, s: &BucketStats) {
    total.rows += s.rows;
    total.deleted += s.deleted;
    total.key_hash = total.key_hash.wrapping_add(s.key_hash);
    for (t, v) in total.sums.iter_mut().zip(&s.sums) {
        *t = match (*t, *v) {
            (SumValue::Exact(a), SumValue::Exact(b)) => SumValue::Exact(a.saturating_add(b)),
            (SumValue::Float(a), SumValue::Float(b)) => SumValue::Float(a + b),
            (t, _) => t,
        };
    }
    for (t, m) in total.counts.iter_mut().zip(&s.counts) {
        for (k, n) in m {
            *t.entry(k.clone()).or_default() += n;
        }
    }
}

/// Assembles the report from a finished join.
pub(crate) fn build(
    p: &Pipeline,
    m: &CdcMerge,
    versions: Versions,
    now: DateTime<Utc>,
    join: Join,
    limit: usize,
    notes: Vec<String>,
) -> ReconcileReport {
    let spec = &m.reconcile;
    let scales = join.agg.sum_scales();
    let mut keys = join.listed;
    for k in &mut keys {
        k.day = day_text(k.bucket.0);
        k.group = group_map(&spec.group_by, &k.bucket.1);
    }
    let buckets = join.agg.into_buckets();
    let mut total_e: Option<BucketStats> = None;
    let mut total_a: Option<BucketStats> = None;
    let mut reports = Vec::with_capacity(buckets.len());
    for (key, e, a) in &buckets {
        match &mut total_e {
            Some(t) => add_into(t, e),
            None => total_e = Some(e.clone()),
        }
        match &mut total_a {
            Some(t) => add_into(t, a),
            None => total_a = Some(a.clone()),
        }
        reports.push(BucketReport {
            day: day_text(key.0),
            group: group_map(&spec.group_by, &key.1),
            matches: e == a,
            expected: aggregates(e, spec, &scales),
            actual: aggregates(a, spec, &scales),
        });
    }
    let zero = |s: Option<BucketStats>| {
        s.map(|s| aggregates(&s, spec, &scales))
            .unwrap_or(Aggregates {
                rows: 0,
                deleted: 0,
                sum: spec
                    .sum
                    .iter()
                    .map(|c| (c.clone(), Value::from(0)))
                    .collect(),
                count: spec
                    .count_by
                    .iter()
                    .map(|c| (c.clone(), BTreeMap::new()))
                    .collect(),
                key_hash: format!("{:016x}", 0),
            })
    };
    let (expected, actual) = (zero(total_e), zero(total_a));
    let buckets_differing = reports.iter().filter(|b| !b.matches).count();
    ReconcileReport {
        pipeline: p.name.clone(),
        pipeline_file: p.path.display().to_string(),
        identical: join.counts.total() == 0 && buckets_differing == 0,
        source_uri: m.source_uri.clone(),
        source_version: versions.source,
        source_version_basis: versions.basis.to_string(),
        target_uri: m.target_uri.clone(),
        target_version: versions.target,
        now: now.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        day: spec.day.clone(),
        group_by: spec.group_by.clone(),
        sum: spec.sum.clone(),
        count_by: spec.count_by.clone(),
        expected_rows: join.expected_keys,
        target_rows: join.target_rows,
        differing_keys: join.counts,
        limit,
        keys,
        totals: Totals {
            matches: expected == actual,
            expected,
            actual,
        },
        buckets_compared: reports.len(),
        buckets_differing,
        buckets: reports,
        notes,
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn describe(a: &Aggregates) -> String {
    let mut parts = vec![crate::report::rows(a.rows)];
    if a.deleted > 0 {
        parts.push(format!("{} deleted", a.deleted));
    }
    for (c, v) in &a.sum {
        parts.push(format!("sum {c} {}", value_text(v)));
    }
    for (c, m) in &a.count {
        let values: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n}")).collect();
        parts.push(format!("{c}: {}", values.join(", ")));
    }
    parts.push(format!("key hash {}", a.key_hash));
    parts.join("; ")
}

/// What differs between two sides' aggregates, as "rows 3 → 2; sum amount 600 → 400; ...".
fn bucket_changes(e: &Aggregates, a: &Aggregates) -> String {
    let mut parts = Vec::new();
    if e.rows != a.rows {
        parts.push(format!("rows {} → {}", e.rows, a.rows));
    }
    if e.deleted != a.deleted {
        parts.push(format!("deleted {} → {}", e.deleted, a.deleted));
    }
    for (c, v) in &e.sum {
        let other = a.sum.get(c).cloned().unwrap_or(Value::Null);
        if *v != other {
            parts.push(format!(
                "sum {c} {} → {}",
                value_text(v),
                value_text(&other)
            ));
        }
    }
    for (c, m) in &e.count {
        let empty = BTreeMap::new();
        let other = a.count.get(c).unwrap_or(&empty);
        let values: std::collections::BTreeSet<&String> = m.keys().chain(other.keys()).collect();
        for v in values {
            let (x, y) = (
                m.get(v).copied().unwrap_or(0),
                other.get(v).copied().unwrap_or(0),
            );
            if x != y {
                parts.push(format!("{c}={v} {x} → {y}"));
            }
        }
    }
    if e.key_hash != a.key_hash {
        parts.push("key set differs".to_string());
    }
    parts.join("; ")
}

fn bucket_label(day: &Option<String>, group: &BTreeMap<String, Option<String>>) -> String {
    let mut s = day.clone().unwrap_or_else(|| "(no day)".to_string());
    for (k, v) in group {
        let _ = write!(s, " {k}={}", v.as_deref().unwrap_or("(null)"));
    }
    s
}

impl ReconcileReport {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report for people: the verdict, totals, then the first differing keys and every
    /// bucket that disagrees (`--output json` has every bucket).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} reconcile: target {} (version {}) against source {} version {} ({})",
            self.pipeline,
            self.target_uri,
            self.target_version
                .map_or_else(|| "-".to_string(), |v| v.to_string()),
            self.source_uri,
            self.source_version,
            self.source_version_basis
        );
        let verdict = if self.identical {
            format!(
                "identical: {} rows, {} day/group buckets match",
                self.target_rows, self.buckets_compared
            )
        } else {
            format!(
                "DIFFERENT: {} key(s) differ, {} of {} day/group buckets disagree",
                self.differing_keys.total(),
                self.buckets_differing,
                self.buckets_compared
            )
        };
        let mut group = vec![format!("day = {}", self.day)];
        if !self.group_by.is_empty() {
            group.push(format!("group by {}", self.group_by.join(", ")));
        }
        let rows: Vec<(&str, String)> = vec![
            ("result", verdict),
            ("buckets", group.join(", ")),
            (
                "rows",
                format!(
                    "{} expected (a full reload would write them), {} in target",
                    self.expected_rows, self.target_rows
                ),
            ),
            ("differing keys", self.differing_keys.detail()),
            ("expected totals", describe(&self.totals.expected)),
            ("target totals", describe(&self.totals.actual)),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        if !self.keys.is_empty() {
            let _ = writeln!(
                out,
                "\ndiffering keys (first {} of {}):",
                self.keys.len(),
                self.differing_keys.total()
            );
            for k in &self.keys {
                let mut line = format!(
                    "  {:<21} {}  [{}]",
                    k.kind.label(),
                    k.key_text,
                    bucket_label(&k.day, &k.group)
                );
                for c in &k.columns {
                    let _ = write!(
                        line,
                        " {} {} → {}",
                        c.column,
                        c.expected.as_deref().unwrap_or("null"),
                        c.actual.as_deref().unwrap_or("null")
                    );
                }
                let _ = writeln!(out, "{line}");
            }
        }
        if self.buckets_differing > 0 {
            let _ = writeln!(
                out,
                "\nday/group buckets that disagree (expected → target):"
            );
            for b in self.buckets.iter().filter(|b| !b.matches) {
                let _ = writeln!(
                    out,
                    "  {}: {}",
                    bucket_label(&b.day, &b.group),
                    bucket_changes(&b.expected, &b.actual)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_sums_keep_their_scale() {
        assert_eq!(sum_value(SumValue::Exact(12345), 2), Value::from("123.45"));
        assert_eq!(sum_value(SumValue::Exact(-5), 2), Value::from("-0.05"));
        assert_eq!(sum_value(SumValue::Exact(7), 0), Value::from(7));
        assert_eq!(
            sum_value(SumValue::Exact(i128::MAX), 0),
            Value::from(i128::MAX.to_string())
        );
    }

    #[test]
    fn float_sums_name_nan_and_infinity_and_drop_the_sign_of_zero() {
        assert_eq!(sum_value(SumValue::Float(f64::NAN), 0), Value::from("NaN"));
        assert_eq!(
            sum_value(SumValue::Float(f64::INFINITY), 0),
            Value::from("inf")
        );
        assert_eq!(
            sum_value(SumValue::Float(f64::NEG_INFINITY), 0),
            Value::from("-inf")
        );
        assert_eq!(sum_value(SumValue::Float(-0.0), 0).to_string(), "0.0");
        assert_eq!(sum_value(SumValue::Float(1.5), 0), Value::from(1.5));
    }

    #[test]
    fn days_render_as_dates() {
        assert_eq!(day_text(Some(0)).as_deref(), Some("1970-01-01"));
        assert_eq!(day_text(Some(-1)).as_deref(), Some("1969-12-31"));
        assert_eq!(day_text(None), None);
    }
}
