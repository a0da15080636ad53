//! Event days: the logical date, the days a run restates, finality, and the event-day
//! expression over the source (a timestamp's instant taken as a date in the pipeline's time
//! zone — finance days are local days — or a date column as it is).

use std::collections::BTreeSet;

use arrow::datatypes::{DataType, TimeUnit};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use datafusion::logical_expr::{cast, lit, Expr};
use datafusion::prelude::ident;
use datafusion::scalar::ScalarValue;

use crate::config::pipeline::Aggregate;

/// The days a run recomputes, and what decides their labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Days {
    /// The run's logical date: the newest day it considers.
    pub logical: NaiveDate,
    /// The oldest open day: days before it are final.
    pub open_from: NaiveDate,
    /// The days to recompute.
    pub set: BTreeSet<NaiveDate>,
}

impl Days {
    /// The lookback window of `logical`, widened back to `oldest_open` (days labelled open by an
    /// earlier run that are final now get their last restatement and their label).
    pub fn window(spec: &Aggregate, logical: NaiveDate, oldest_open: Option<NaiveDate>) -> Days {
        let open_from = open_from(spec, logical);
        let from = oldest_open.map_or(open_from, |o| o.min(open_from));
        Days::range(spec, logical, from, logical)
    }

    /// An explicit range (`--from/--to`), labelled as of `logical`.
    pub fn range(spec: &Aggregate, logical: NaiveDate, from: NaiveDate, to: NaiveDate) -> Days {
        Days {
            logical,
            open_from: open_from(spec, logical),
            set: from.iter_days().take_while(|d| *d <= to).collect(),
        }
    }

    /// Only `days` (and the days turning final since `oldest_open`, to label them), as of
    /// `logical`: `recompute.touched`.
    pub fn only(
        spec: &Aggregate,
        logical: NaiveDate,
        oldest_open: Option<NaiveDate>,
        days: impl IntoIterator<Item = NaiveDate>,
    ) -> Days {
        let open_from = open_from(spec, logical);
        let mut set: BTreeSet<NaiveDate> = days.into_iter().collect();
        if let Some(o) = oldest_open {
            set.extend(o.iter_days().take_while(|d| *d < open_from));
        }
        Days {
            logical,
            open_from,
            set,
        }
    }

    pub fn is_final(&self, day: NaiveDate) -> bool {
        day < self.open_from
    }

    pub fn first(&self) -> Option<NaiveDate> {
        self.set.first().copied()
    }

    pub fn last(&self) -> Option<NaiveDate> {
        self.set.last().copied()
    }

    /// Every day, oldest first.
    pub fn each(&self) -> impl Iterator<Item = NaiveDate> + '_ {
        self.set.iter().copied()
    }

    pub fn count(&self) -> u64 {
        self.set.len() as u64
    }

    /// The days as runs of consecutive days, `(first, last)` each.
    pub fn runs(&self) -> Vec<(NaiveDate, NaiveDate)> {
        let mut out: Vec<(NaiveDate, NaiveDate)> = Vec::new();
        for d in self.each() {
            match out.last_mut() {
                Some((_, last)) if *last + Duration::days(1) == d => *last = d,
                _ => out.push((d, d)),
            }
        }
        out
    }

    /// `event_date` is one of the days (a range when they are consecutive).
    pub fn contains_expr(&self, column: Expr) -> Expr {
        match (self.first(), self.last()) {
            (Some(a), Some(b)) if (b - a).num_days() + 1 == self.set.len() as i64 => column
                .clone()
                .gt_eq(date_lit(a))
                .and(column.lt_eq(date_lit(b))),
            (Some(_), Some(_)) => column.in_list(self.each().map(date_lit).collect(), false),
            _ => lit(false),
        }
    }
}

/// The first day still open on `logical`.
fn open_from(spec: &Aggregate, logical: NaiveDate) -> NaiveDate {
    logical - Duration::days(i64::from(spec.lookback_days))
}

/// The logical date: given, or today in the pipeline's time zone.
pub fn logical_date(spec: &Aggregate, given: Option<NaiveDate>, now: DateTime<Utc>) -> NaiveDate {
    given.unwrap_or_else(|| now.with_timezone(&spec.time_zone).date_naive())
}

/// A date literal.
pub fn date_lit(d: NaiveDate) -> Expr {
    lit(ScalarValue::Date32(Some(days_since_epoch(d))))
}

pub fn days_since_epoch(d: NaiveDate) -> i32 {
    (d - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default()).num_days() as i32
}

/// The event day of a source row, and a coarser condition on the raw column that statistics can
/// prune files and row groups with (`None` when the column's type gives none).
pub fn event_day(spec: &Aggregate, column_type: &DataType) -> Result<(Expr, RawRange), String> {
    let c = ident(&spec.event_date);
    let tz = spec.time_zone.name();
    match column_type {
        DataType::Date32 => Ok((c, RawRange::Date)),
        DataType::Date64 => Ok((cast(c, DataType::Date32), RawRange::Date)),
        // An instant: its date in the pipeline's time zone.
        DataType::Timestamp(unit, Some(_)) => Ok((
            cast(
                cast(c, DataType::Timestamp(*unit, Some(tz.into()))),
                DataType::Date32,
            ),
            RawRange::Instant(*unit),
        )),
        // A wall-clock time without a zone (`timestamp_ntz`): already local, its date as is.
        DataType::Timestamp(unit, None) => Ok((cast(c, DataType::Date32), RawRange::Local(*unit))),
        other => Err(format!(
            "`event_date.column: {}` is {other}; give a timestamp or date column",
            spec.event_date
        )),
    }
}

/// How the raw event column is bounded for a range of days.
#[derive(Debug, Clone, Copy)]
pub enum RawRange {
    Date,
    Instant(TimeUnit),
    Local(TimeUnit),
}

impl RawRange {
    /// A condition on the raw column true for every row whose day is in `[from, to]` (and a
    /// little more: a day of margin either side covers every time zone offset).
    pub fn covering(self, column: &str, from: NaiveDate, to: NaiveDate) -> Expr {
        let c = ident(column);
        match self {
            RawRange::Date => c.clone().gt_eq(date_lit(from)).and(c.lt_eq(date_lit(to))),
            RawRange::Instant(unit) | RawRange::Local(unit) => {
                let tz = matches!(self, RawRange::Instant(_)).then(|| "UTC".into());
                let at = |d: NaiveDate| {
                    let micros = d
                        .and_hms_opt(0, 0, 0)
                        .map(|t| t.and_utc().timestamp_micros())
                        .unwrap_or_default();
                    cast(
                        lit(ScalarValue::TimestampMicrosecond(Some(micros), tz.clone())),
                        DataType::Timestamp(unit, tz.clone()),
                    )
                };
                let lo = from - Duration::days(1);
                let hi = to + Duration::days(2);
                c.clone().gt_eq(at(lo)).and(c.lt(at(hi)))
            }
        }
    }
}
