//! Event days: the logical date, the days a run restates, finality, and the event-day
//! expression over the source (a timestamp's instant taken as a date in the pipeline's time
//! zone — finance days are local days — or a date column as it is).

use std::collections::BTreeSet;

use arrow::datatypes::{DataType, TimeUnit};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use chrono_tz::Tz;
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
pub fn open_from(spec: &Aggregate, logical: NaiveDate) -> NaiveDate {
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
    match column_type {
        DataType::Date32 => Ok((c, RawRange::Date)),
        DataType::Date64 => Ok((cast(c, DataType::Date32), RawRange::Date)),
        // An instant: its date in the pipeline's time zone.
        DataType::Timestamp(unit, Some(_)) => Ok((
            super::local_date::expr(c, Some(spec.time_zone)),
            RawRange::Instant(*unit),
        )),
        // A wall-clock time without a zone (`timestamp_ntz`): already local, its date as is.
        DataType::Timestamp(unit, None) => {
            Ok((super::local_date::expr(c, None), RawRange::Local(*unit)))
        }
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
    /// A condition on the raw column true for every row whose day in `tz` is in `[from, to]`,
    /// and tight: an instant column is bounded by the instants the days start and end in `tz`
    /// (widened only by an offset change near those midnights), so statistics prune every file
    /// and row group that holds none of the days.
    pub fn covering(self, column: &str, tz: Tz, from: NaiveDate, to: NaiveDate) -> Expr {
        let c = ident(column);
        let (lo, hi, zone) = match self {
            RawRange::Date => return c.clone().gt_eq(date_lit(from)).and(c.lt_eq(date_lit(to))),
            RawRange::Local(unit) => (
                midnight(from),
                midnight(to + Duration::days(1)),
                (unit, None),
            ),
            RawRange::Instant(unit) => {
                let (lo, hi) = instants_of(tz, from, to);
                (lo, hi, (unit, Some("UTC".into())))
            }
        };
        let (unit, zone) = zone;
        let at = |micros: i64| {
            cast(
                lit(ScalarValue::TimestampMicrosecond(
                    Some(micros),
                    zone.clone(),
                )),
                DataType::Timestamp(unit, zone.clone()),
            )
        };
        // (the bounds rounded outward to the column's unit by the cast: a second column's
        // bound is floored, so the upper one gets one unit of room)
        let hi = match unit {
            TimeUnit::Second => hi + 1_000_000,
            TimeUnit::Millisecond => hi + 1_000,
            _ => hi,
        };
        c.clone().gt_eq(at(lo)).and(c.lt(at(hi)))
    }
}

/// Instants (µs since the epoch) `[lo, hi)` holding every instant whose date in `tz` is in
/// `[from, to]`; exact unless an offset changes near one of the two midnights.
fn instants_of(tz: Tz, from: NaiveDate, to: NaiveDate) -> (i64, i64) {
    let end = to + Duration::days(1);
    let (_, largest) = offsets_near(tz, midnight(from));
    let (smallest, _) = offsets_near(tz, midnight(end));
    (midnight(from) - largest, midnight(end) - smallest)
}

/// `d`'s midnight read as UTC (µs since the epoch).
fn midnight(d: NaiveDate) -> i64 {
    d.and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc().timestamp_micros())
        .unwrap_or_default()
}

/// The smallest and largest UTC offset (µs) `tz` has within 15 hours of the instant `naive`
/// (a local midnight read as UTC): the instant that midnight happens lies in
/// `[naive - largest, naive - smallest]` (offsets are within ±14 h; sampled every 15 minutes,
/// finer than any zone's offset changes).
fn offsets_near(tz: Tz, naive: i64) -> (i64, i64) {
    const QUARTER_HOUR: i64 = 15 * 60 * 1_000_000;
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for k in -60..=60 {
        let at = naive + k * QUARTER_HOUR;
        let Some(off) = super::local_date::offset(tz, at) else {
            continue;
        };
        lo = lo.min(off);
        hi = hi.max(off);
    }
    if lo > hi {
        // (an instant outside chrono's range: the widest offsets there are)
        (-14 * 3_600_000_000, 14 * 3_600_000_000)
    } else {
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every instant whose local date is in the days lies inside the bounds (every 5 minutes over
    /// the days around them, in zones with DST changes at and near midnight, half and quarter
    /// hour offsets, and the date line); in UTC the bounds are the midnights exactly.
    #[test]
    fn instant_bounds_hold_every_instant_of_the_days() {
        let zones = [
            "UTC",
            "Europe/Amsterdam",
            "America/New_York",
            "America/Santiago",
            "America/Havana",
            "Asia/Beirut",
            "Australia/Lord_Howe",
            "Asia/Kathmandu",
            "Pacific/Kiritimati",
            "Pacific/Apia",
        ];
        let day = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        let ranges = [
            ("2024-03-09", "2024-03-10"),
            ("2024-03-31", "2024-03-31"),
            ("2024-04-06", "2024-04-07"),
            ("2024-09-07", "2024-09-08"),
            ("2024-10-27", "2024-11-03"),
            ("2011-12-29", "2011-12-31"),
            ("2024-12-31", "2024-12-31"),
        ];
        for name in zones {
            let tz: Tz = name.parse().unwrap();
            for (a, b) in ranges {
                let (from, to) = (day(a), day(b));
                let (lo, hi) = instants_of(tz, from, to);
                let start = (from - Duration::days(3))
                    .and_hms_opt(0, 0, 0)
                    .unwrap()
                    .and_utc()
                    .timestamp_micros();
                let step = 5 * 60 * 1_000_000;
                for k in 0..(9 * 24 * 12) {
                    let at = start + k * step;
                    let local = DateTime::<Utc>::from_timestamp_micros(at)
                        .unwrap()
                        .with_timezone(&tz)
                        .date_naive();
                    if local >= from && local <= to {
                        assert!(
                            lo <= at && at < hi,
                            "{name} {a}..{b}: {at} outside [{lo}, {hi})"
                        );
                    }
                }
                if name == "UTC" {
                    let m =
                        |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_micros();
                    assert_eq!((lo, hi), (m(from), m(to + Duration::days(1))));
                }
            }
        }
    }
}
