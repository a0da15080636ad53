//! The `aggregate` kind's file: a gold table of per-event-day measures over a Delta source
//! (usually a tidemark silver), restated by whole days, with finality labels and a day status
//! table. The raw struct, the validated [`Aggregate`], and the checks between them.

use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

use super::common::Ctx;

mod clock;
use super::expect::parse_expression;
use crate::config::{ConfigError, Vars};
use clock::RawWatermark;
pub use clock::{Watermark, Window};

/// The output column holding the event day.
pub const EVENT_DATE: &str = "event_date";
/// The output column: the latest arrival among the rows of the group.
pub const DATA_AS_OF: &str = "data_as_of";
/// The output column: whether the day is outside the lookback (will not be restated).
pub const IS_FINAL: &str = "is_final";
/// The output columns of a `window:`: where each window starts and ends (half-open).
pub const WINDOW_START: &str = "window_start";
pub const WINDOW_END: &str = "window_end";
/// Names a measure or group may not take.
const RESERVED: [&str; 5] = [EVENT_DATE, DATA_AS_OF, IS_FINAL, WINDOW_START, WINDOW_END];

/// An aggregate function of a measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agg {
    /// Rows (or, with `column`, rows where it is not null).
    Count,
    Sum,
    Min,
    Max,
    /// Distinct non-null values of `column`.
    CountDistinct,
}

impl Agg {
    pub fn as_str(self) -> &'static str {
        match self {
            Agg::Count => "count",
            Agg::Sum => "sum",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::CountDistinct => "count_distinct",
        }
    }

    /// Whether a day's value is the sum of its parts (so a late row's effect is a delta).
    pub fn additive(self) -> bool {
        matches!(self, Agg::Count | Agg::Sum)
    }
}

/// What a run does with late rows for a day that is already final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterClose {
    /// Recompute the day (its status shows it was restated after close).
    #[default]
    Restate,
    /// Never rewrite a final day: book the difference as adjustments in the open period.
    Adjust,
}

/// One measure of the output.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    pub name: String,
    pub agg: Agg,
    pub column: Option<String>,
    /// SQL condition: only rows meeting it count (e.g. refunds).
    pub filter: Option<String>,
}

/// A validated `aggregate` pipeline.
#[derive(Debug, Clone)]
pub struct Aggregate {
    pub source_uri: String,
    pub target_uri: String,
    /// The day status table (default `<target>_status`).
    pub status_uri: String,
    /// The adjustments table (default `<target>_adjustments`; written with `after_close: adjust`).
    pub adjustments_uri: String,
    /// Timestamp or date column whose (local) date is the event day.
    pub event_date: String,
    /// The finance day's time zone (a timestamp column's instant is taken as a date there).
    pub time_zone: Tz,
    pub group_by: Vec<String>,
    pub measures: Vec<Measure>,
    /// SQL condition rows must meet to count at all.
    pub where_sql: Option<String>,
    /// The arrival column whose latest value per group is `data_as_of`.
    pub data_as_of: String,
    /// Days before the logical date that each run recomputes; older days are final.
    pub lookback_days: u32,
    /// Recompute only the days holding rows changed since the last run (within the lookback,
    /// and final days per `after_close`, capped at `max_lookback_days`).
    pub touched: bool,
    /// How far back a changed row may reopen (restate) a final day.
    pub max_lookback_days: u32,
    pub after_close: AfterClose,
    /// Dimension columns joined to each source row, as of a time (`lookups:`).
    pub lookups: Vec<Lookup>,
    /// Tumbling windows within each event day (`window:`): rows of gold per window and group.
    pub window: Option<Window>,
    /// Finality by the data's own clock (`watermark:`) instead of the logical date's lookback.
    pub watermark: Option<Watermark>,
    /// The source's rows no day or window can count (no event time), with the reason (default
    /// `<target>_quarantine`).
    pub quarantine: super::Quarantine,
    /// With `late_rows:`, where each run stores the source rows that reached a final day or
    /// window after gold published it (default `<target>_late_rows`).
    pub late_rows: Option<String>,
}

impl Aggregate {
    /// What identifies a row of gold within its event day: the window (with `window:`), then
    /// the groups.
    pub fn group_keys(&self) -> Vec<String> {
        let window = self
            .window
            .map(|_| [WINDOW_START.to_string(), WINDOW_END.to_string()]);
        window
            .into_iter()
            .flatten()
            .chain(self.group_by.iter().cloned())
            .collect()
    }
}

/// A dimension looked up for each source row: its version valid at the row's `as_of` time (or
/// its current row, for an SCD1 dimension), adding `columns` the groups may use.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// The dimension table.
    pub uri: String,
    /// Its key column, and the source column holding the key.
    pub dimension_key: String,
    pub key: String,
    /// The source's time column: the version valid at that instant (SCD2 dimensions).
    pub as_of: Option<String>,
    pub columns: Vec<String>,
    /// The inferred member's values (a row with no version at its instant gets these: it is
    /// never dropped), from the dimension pipeline's `placeholder:`.
    pub placeholder: Vec<(String, String)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAggregate {
    pub(super) name: String,
    #[allow(dead_code)]
    pub(super) kind: String,
    source: RawUri,
    target: RawUri,
    #[serde(default)]
    status: Option<RawUri>,
    #[serde(default)]
    adjustments: Option<RawUri>,
    event_date: RawEventDate,
    #[serde(default)]
    group_by: Vec<String>,
    measures: Vec<RawMeasure>,
    #[serde(default, rename = "where")]
    where_sql: Option<String>,
    #[serde(default)]
    data_as_of: Option<String>,
    #[serde(default)]
    recompute: Option<RawRecompute>,
    #[serde(default)]
    after_close: AfterClose,
    #[serde(default)]
    lookups: Vec<RawLookup>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    watermark: Option<RawWatermark>,
    #[serde(default)]
    quarantine: Option<RawAggregateQuarantine>,
    #[serde(default)]
    late_rows: Option<RawLateRows>,
}

/// `late_rows:` of an aggregate: its location is optional (default `<target>_late_rows`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLateRows {
    #[serde(default)]
    uri: Option<String>,
}

/// `quarantine:` of an aggregate: its location is optional (default `<target>_quarantine`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregateQuarantine {
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    max_rows: Option<u64>,
    #[serde(default)]
    max_fraction: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLookup {
    /// A `dimension` pipeline beside this file, or a dimension table's location.
    dimension: String,
    key: String,
    #[serde(default)]
    dimension_key: Option<String>,
    #[serde(default)]
    as_of: Option<String>,
    columns: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUri {
    uri: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEventDate {
    column: String,
    #[serde(default)]
    time_zone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeasure {
    name: String,
    agg: Agg,
    #[serde(default)]
    column: Option<String>,
    #[serde(default)]
    filter: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRecompute {
    #[serde(default)]
    lookback: Option<String>,
    #[serde(default)]
    touched: bool,
    #[serde(default)]
    max_lookback: Option<String>,
}

/// Default `recompute.lookback`.
pub const DEFAULT_LOOKBACK_DAYS: u32 = 3;
/// Default `recompute.max_lookback`.
pub const DEFAULT_MAX_LOOKBACK_DAYS: u32 = 35;

impl Ctx<'_> {
    /// Checks an `aggregate` file: the day, groups, measures, SQL, windows and locations.
    pub(super) fn aggregate(
        &self,
        raw: RawAggregate,
        vars: &Vars,
    ) -> Result<Aggregate, ConfigError> {
        let time_zone = match &raw.event_date.time_zone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name.trim()).map_err(|_| {
                self.invalid(
                    "time_zone",
                    format!("`event_date.time_zone: {name}` is not a time zone; use an IANA name like Europe/Amsterdam, America/New_York or UTC"),
                )
            })?,
        };
        if raw.measures.is_empty() {
            return Err(self.invalid(
                "measures",
                "`measures:` is empty; list at least one, like `{ name: payments, agg: count }`",
            ));
        }
        let measures = self.measures(raw.measures, &raw.group_by, raw.after_close)?;
        if let Some(w) = &raw.where_sql {
            if let Err(why) = parse_expression(w) {
                return Err(self.invalid(
                    "where",
                    format!("`where: {w}` is not a SQL condition ({why}); write one a counted row meets, like `amount_cents IS NOT NULL`"),
                ));
            }
        }
        let recompute = raw.recompute.unwrap_or_default();
        let (lookback_days, max_lookback_days) = match raw.watermark {
            // (with a watermark the lookback follows the data's clock, run by run)
            Some(_) => (
                DEFAULT_LOOKBACK_DAYS,
                match &recompute.max_lookback {
                    Some(v) => self.days("max_lookback", v)?,
                    None => DEFAULT_MAX_LOOKBACK_DAYS,
                },
            ),
            None => self.windows(&recompute)?,
        };
        let source_uri = self.substitute("source.uri", &raw.source.uri, vars)?;
        let target_uri = self.substitute("target.uri", &raw.target.uri, vars)?;
        let beside = |suffix: &str| format!("{}_{suffix}", target_uri.trim_end_matches('/'));
        let status_uri = match &raw.status {
            Some(s) => self.substitute("status.uri", &s.uri, vars)?,
            None => beside("status"),
        };
        let adjustments_uri = match &raw.adjustments {
            Some(s) => self.substitute("adjustments.uri", &s.uri, vars)?,
            None => beside("adjustments"),
        };
        let quarantine = match raw.quarantine {
            Some(q) => self.quarantine(
                super::common::RawQuarantine {
                    uri: q.uri.unwrap_or_else(|| beside("quarantine")),
                    max_rows: q.max_rows,
                    max_fraction: q.max_fraction,
                },
                vars,
            )?,
            None => super::Quarantine {
                uri: beside("quarantine"),
                max_rows: None,
                max_fraction: None,
            },
        };
        let late_rows = match raw.late_rows {
            Some(RawLateRows { uri: Some(uri) }) => {
                Some(self.substitute("late_rows.uri", &uri, vars)?)
            }
            Some(RawLateRows { uri: None }) => Some(beside("late_rows")),
            None => None,
        };
        let mut locations = vec![
            ("source.uri", source_uri.as_str()),
            ("target.uri", target_uri.as_str()),
            ("status.uri", status_uri.as_str()),
            ("adjustments.uri", adjustments_uri.as_str()),
            ("quarantine.uri", quarantine.uri.as_str()),
        ];
        locations.extend(late_rows.as_deref().map(|u| ("late_rows.uri", u)));
        self.separate(&locations)?;
        let lookups = self.lookups(raw.lookups, vars)?;
        let window = raw.window.as_deref().map(|w| self.window(w)).transpose()?;
        let watermark = raw
            .watermark
            .as_ref()
            .map(|w| self.watermark(w, recompute.lookback.is_some()))
            .transpose()?;
        Ok(Aggregate {
            source_uri,
            target_uri,
            status_uri,
            adjustments_uri,
            event_date: raw.event_date.column,
            time_zone,
            group_by: raw.group_by,
            measures,
            where_sql: raw.where_sql,
            data_as_of: raw
                .data_as_of
                .unwrap_or_else(|| crate::config::pipeline::ingest::INGESTED_AT.to_string()),
            lookback_days,
            touched: recompute.touched,
            max_lookback_days,
            after_close: raw.after_close,
            lookups,
            window,
            watermark,
            quarantine,
            late_rows,
        })
    }

    /// The measures: each named once (beside the group columns), plainly, with a column
    /// unless counted, a filter that parses, and additive when closed days are adjusted.
    fn measures(
        &self,
        raw: Vec<RawMeasure>,
        group_by: &[String],
        after_close: AfterClose,
    ) -> Result<Vec<Measure>, ConfigError> {
        let mut names: Vec<String> = group_by.to_vec();
        for g in group_by {
            if RESERVED.contains(&g.as_str()) {
                return Err(self.invalid_at_text(
                    g,
                    format!("`group_by` lists `{g}`, a column the output adds itself ({}); rename it in the source or leave it out", RESERVED.join(", ")),
                ));
            }
        }
        let mut measures = Vec::new();
        for m in raw {
            let plain = !m.name.is_empty()
                && m.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if names.contains(&m.name) {
                return Err(self.invalid_at_text(
                    &format!("name: {}", m.name),
                    format!("`{}` is named twice (measures and group_by columns share the output): give each its own name", m.name),
                ));
            }
            if !plain || RESERVED.contains(&m.name.as_str()) {
                return Err(self.invalid_at_text(
                    &format!("name: {}", m.name),
                    format!(
                        "measure name {:?} must be letters, digits or `_`, and not one of {}",
                        m.name,
                        RESERVED.join(", ")
                    ),
                ));
            }
            names.push(m.name.clone());
            if m.column.is_none() && m.agg != Agg::Count {
                return Err(self.invalid_at_text(
                    &format!("name: {}", m.name),
                    format!("measure `{}` ({}) needs a `column`", m.name, m.agg.as_str()),
                ));
            }
            if let Some(f) = &m.filter {
                if let Err(why) = parse_expression(f) {
                    return Err(self.invalid_at_text(
                        f,
                        format!("measure `{}`: filter `{f}` is not a SQL condition ({why}); write one like `status = 'refunded'`", m.name),
                    ));
                }
            }
            if after_close == AfterClose::Adjust && !m.agg.additive() {
                return Err(self.invalid_at_text(
                    &m.name,
                    format!("measure `{}` is {}, which cannot be adjusted: a late row's effect on it is not a difference to book. With `after_close: adjust` use count or sum measures only, or `after_close: restate`", m.name, m.agg.as_str()),
                ));
            }
            measures.push(Measure {
                name: m.name,
                agg: m.agg,
                column: m.column,
                filter: m.filter,
            });
        }
        Ok(measures)
    }

    /// `recompute.lookback` and `max_lookback`, in days (the cap at least the lookback).
    fn windows(&self, recompute: &RawRecompute) -> Result<(u32, u32), ConfigError> {
        let lookback_days = match &recompute.lookback {
            Some(v) => self.days("lookback", v)?,
            None => DEFAULT_LOOKBACK_DAYS,
        };
        let max_lookback_days = match &recompute.max_lookback {
            Some(v) => self.days("max_lookback", v)?,
            None => DEFAULT_MAX_LOOKBACK_DAYS.max(lookback_days),
        };
        if max_lookback_days < lookback_days {
            return Err(self.invalid(
                "max_lookback",
                format!("`recompute.max_lookback` ({max_lookback_days}d) is shorter than `lookback` ({lookback_days}d); it caps how far back a late row reopens a final day, so give at least the lookback"),
            ));
        }
        Ok((lookback_days, max_lookback_days))
    }

    /// `lookups:`: each dimension resolved (a pipeline beside this file: its table, key and
    /// placeholder), its columns distinct from each other.
    fn lookups(&self, raw: Vec<RawLookup>, vars: &Vars) -> Result<Vec<Lookup>, ConfigError> {
        let mut out: Vec<Lookup> = Vec::new();
        let mut added: Vec<String> = Vec::new();
        for l in raw {
            if l.columns.is_empty() {
                return Err(self.invalid_at_text(
                    &format!("dimension: {}", l.dimension),
                    format!("lookup of `{}` adds no `columns`; list the dimension's columns to add, e.g. [segment]", l.dimension),
                ));
            }
            for c in &l.columns {
                if added.contains(c) || RESERVED.contains(&c.as_str()) {
                    return Err(self.invalid_at_text(
                        &format!("dimension: {}", l.dimension),
                        format!("lookup column `{c}` is added twice or is one the output adds itself; each column comes from one place"),
                    ));
                }
                added.push(c.clone());
            }
            let by_path = l.dimension.contains('/')
                || l.dimension.contains("://")
                || l.dimension.contains("${");
            let (uri, dimension_key, placeholder, scd1) = if by_path {
                let uri = self.substitute("lookups.dimension", &l.dimension, vars)?;
                (
                    uri,
                    l.dimension_key.clone().unwrap_or_else(|| l.key.clone()),
                    Vec::new(),
                    false,
                )
            } else {
                let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
                let file = ["yml", "yaml"]
                    .iter()
                    .map(|ext| dir.join(format!("{}.{ext}", l.dimension)))
                    .find(|f| f.is_file())
                    .ok_or_else(|| {
                        self.invalid_at_text(
                            &format!("dimension: {}", l.dimension),
                            format!("`dimension: {}` is neither a dimension pipeline beside this file ({}.yml) nor a table path or URI", l.dimension, l.dimension),
                        )
                    })?;
                let other = self.load_referenced(&file, vars, "lookups")?;
                let super::Spec::Dimension(d) = &other.spec else {
                    return Err(self.invalid_at_text(
                        &format!("dimension: {}", l.dimension),
                        format!("`dimension: {}` names a {} pipeline; a lookup reads a `kind: dimension` table", l.dimension, other.kind()),
                    ));
                };
                if d.keys.len() != 1 {
                    return Err(self.invalid_at_text(&format!("dimension: {}", l.dimension), format!("dimension `{}` has {} key columns; a lookup matches one source column to a single key", l.dimension, d.keys.len())));
                }
                let placeholder = d
                    .infer
                    .as_ref()
                    .map(|i| i.placeholder.clone())
                    .unwrap_or_default();
                (
                    d.target_uri.clone(),
                    d.keys[0].clone(),
                    placeholder,
                    d.history == super::dimension::HistoryMode::Scd1,
                )
            };
            if scd1 && l.as_of.is_some() {
                return Err(self.invalid_at_text(
                    &format!("dimension: {}", l.dimension),
                    format!("`as_of` picks the version valid at a time, and dimension `{}` keeps no history (`history: scd1`); remove `as_of` to use its current rows", l.dimension),
                ));
            }
            out.push(Lookup {
                uri,
                dimension_key,
                key: l.key,
                as_of: l.as_of,
                columns: l.columns,
                placeholder,
            });
        }
        Ok(out)
    }

    /// A whole number of days (`3d`, `72h`, `1w`).
    fn days(&self, key: &str, value: &str) -> Result<u32, ConfigError> {
        let bad = || {
            self.invalid(
                key,
                format!("`recompute.{key}: {value}` is not a whole number of days; write it like 3d or 35d"),
            )
        };
        let d = humantime::parse_duration(value.trim()).map_err(|_| bad())?;
        let secs = d.as_secs();
        if secs % 86_400 != 0 || d.subsec_nanos() != 0 || secs / 86_400 > 36_600 {
            return Err(bad());
        }
        Ok((secs / 86_400) as u32)
    }
}

impl super::Settings for Aggregate {
    fn target_uri(&self) -> &str {
        &self.target_uri
    }
    fn source_uri(&self) -> &str {
        &self.source_uri
    }
    /// The source holds the event day and the arrival (`data_as_of`): how late that runs is what
    /// the lookback has to cover.
    fn clocks(&self) -> super::Clocks<'_> {
        super::Clocks {
            table: &self.source_uri,
            role: "source",
            event_time: Some(&self.event_date),
            arrival: Some(&self.data_as_of),
            overlap: None,
        }
    }
    /// A row of gold is a day, its window (with `window:`) and its groups.
    fn row_keys(&self) -> Vec<String> {
        std::iter::once(EVENT_DATE.to_string())
            .chain(self.group_keys())
            .collect()
    }
}
