//! Tumbling windows within an event day (`window:`): each local day, from its first instant to
//! the next day's, is cut into windows of the pipeline's length counted in elapsed time. An hour
//! window is therefore a local hour, a day that springs forward has 23 of them and one that falls
//! back 25 (the repeated hour is its own window), and a window never spans two event days. When
//! the length does not divide the day's, the last window of the day stretches to its end (a
//! `1d` window is always the whole local day; a 25-hour day in 2-hour windows ends with a 3-hour
//! one). A window is half-open, `[window_start, window_end)`, as seed 003 prints them.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, TimestampMicrosecondArray};
use arrow::datatypes::{
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use arrow::error::ArrowError;
use chrono_tz::Tz;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::local_date::{offset, Offsets, MICROS_PER_DAY};
use crate::config::pipeline::aggregate::Window;

/// Which end of its window an instant is mapped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    Start,
    End,
}

/// Expressions of the start and end of the window holding `column`'s instant (its wall-clock
/// time when `tz` is `None`, for a timestamp without a zone).
pub fn bounds(column: Expr, tz: Option<Tz>, window: Window) -> (Expr, Expr) {
    let udf = |end| {
        ScalarUDF::new_from_impl(WindowUdf {
            signature: Signature::any(1, Volatility::Immutable),
            tz,
            size: window.micros(),
            end,
        })
        .call(vec![column.clone()])
    };
    (udf(End::Start), udf(End::End))
}

/// The window holding `at` of the day `[first, next)` cut into windows of `size`: as many whole
/// ones as fit (at least one), the last of them stretched to the day's end.
fn cut(first: i64, next: i64, size: i64, at: i64) -> (i64, i64) {
    let count = ((next - first) / size).max(1);
    let k = ((at - first) / size).min(count - 1);
    let start = first + k * size;
    let end = if k == count - 1 { next } else { start + size };
    (start, end)
}

/// The windows of instants, with the first instant of each local day looked up once.
pub struct Windows {
    offsets: Offsets,
    tz: Option<Tz>,
    size: i64,
    /// Local day number → (its first instant, the next day's).
    days: HashMap<i64, (i64, i64)>,
    /// The day looked up last.
    last: Option<(i64, (i64, i64))>,
}

impl Windows {
    pub fn new(tz: Option<Tz>, size: i64) -> Self {
        Windows {
            offsets: Offsets::new(tz),
            tz,
            size,
            days: HashMap::new(),
            last: None,
        }
    }

    /// `[start, end)` of the window holding the instant `at` (µs since the epoch).
    pub fn of(&mut self, at: i64) -> Option<(i64, i64)> {
        let off = self.offsets.at(at)?;
        let day = at.checked_add(off)?.div_euclid(MICROS_PER_DAY);
        let (first, next) = match self.last {
            // (rows come clustered by time: most are on the day of the row before)
            Some((d, b)) if d == day => b,
            _ => {
                let b = match self.days.get(&day) {
                    Some(b) => *b,
                    None => {
                        let b = (self.first_instant(day)?, self.first_instant(day + 1)?);
                        self.days.insert(day, b);
                        b
                    }
                };
                self.last = Some((day, b));
                b
            }
        };
        if !(first..next).contains(&at) {
            // (a zone whose local date ran backwards: windows of the epoch's grid)
            let start = at - at.rem_euclid(self.size);
            return Some((start, start + self.size));
        }
        Some(cut(first, next, self.size, at))
    }

    /// The first instant (µs) whose local date is day number `day` or later: local dates only
    /// move forward, and a local midnight is within 26 hours of the same wall-clock time in UTC
    /// (offsets are within ±14 hours; a skipped day, as Samoa's in 2011, adds one).
    fn first_instant(&mut self, day: i64) -> Option<i64> {
        const SECOND: i64 = 1_000_000;
        let naive = day.checked_mul(MICROS_PER_DAY)?;
        let local_day = |s: i64| -> Option<i64> {
            let at = s * SECOND;
            let off = match self.tz {
                Some(tz) => offset(tz, at)?,
                None => 0,
            };
            Some((at + off).div_euclid(MICROS_PER_DAY))
        };
        // the smallest second s in (lo, hi] with local_day(s) >= day
        let (mut lo, mut hi) = (naive / SECOND - 26 * 3600, naive / SECOND + 26 * 3600);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if local_day(mid)? >= day {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi.checked_mul(SECOND)
    }
}

/// The start or end of each value's window, as µs timestamps (in UTC for instants, wall clock
/// for a timestamp without a zone); nulls stay null.
pub fn window_bounds(
    values: &dyn Array,
    tz: Option<Tz>,
    size: i64,
    end: End,
) -> Result<ArrayRef, ArrowError> {
    let micros = micros_of(values)?;
    let zoned = matches!(values.data_type(), DataType::Timestamp(_, Some(_)));
    let mut windows = Windows::new(if zoned { tz } else { None }, size);
    let out: TimestampMicrosecondArray = micros
        .into_iter()
        .map(|v| {
            v.map(|at| {
                let (s, e) = windows.of(at).ok_or_else(|| {
                    ArrowError::CastError(format!("the instant {at} µs has no window"))
                })?;
                Ok::<_, ArrowError>(if end == End::Start { s } else { e })
            })
            .transpose()
        })
        .collect::<Result<_, _>>()?;
    Ok(Arc::new(out.with_timezone_opt(zoned.then_some("UTC"))))
}

/// A timestamp array's values in µs (floored, as the event day takes them).
fn micros_of(values: &dyn Array) -> Result<Vec<Option<i64>>, ArrowError> {
    let scaled = |v: Option<i64>, f: &dyn Fn(i64) -> Option<i64>| {
        v.map(|v| {
            f(v).ok_or_else(|| ArrowError::CastError(format!("the instant {v} has no window")))
        })
        .transpose()
    };
    match values.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => values
            .as_primitive::<TimestampSecondType>()
            .iter()
            .map(|v| scaled(v, &|v| v.checked_mul(1_000_000)))
            .collect(),
        DataType::Timestamp(TimeUnit::Millisecond, _) => values
            .as_primitive::<TimestampMillisecondType>()
            .iter()
            .map(|v| scaled(v, &|v| v.checked_mul(1_000)))
            .collect(),
        DataType::Timestamp(TimeUnit::Microsecond, _) => Ok(values
            .as_primitive::<TimestampMicrosecondType>()
            .iter()
            .collect()),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => Ok(values
            .as_primitive::<TimestampNanosecondType>()
            .iter()
            .map(|v| v.map(|v| v.div_euclid(1_000)))
            .collect()),
        other => Err(ArrowError::CastError(format!(
            "a window needs a timestamp, got {other}"
        ))),
    }
}

#[derive(Debug)]
struct WindowUdf {
    signature: Signature,
    tz: Option<Tz>,
    size: i64,
    end: End,
}

impl PartialEq for WindowUdf {
    fn eq(&self, other: &Self) -> bool {
        (self.tz, self.size, self.end) == (other.tz, other.size, other.end)
    }
}

impl Eq for WindowUdf {}

impl Hash for WindowUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.tz.map(|t| t.name()), self.size, self.end).hash(state)
    }
}

impl ScalarUDFImpl for WindowUdf {
    fn name(&self) -> &str {
        match self.end {
            End::Start => "tidemark_window_start",
            End::End => "tidemark_window_end",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let zone = match args.first() {
            Some(DataType::Timestamp(_, Some(_))) => Some("UTC".into()),
            _ => None,
        };
        Ok(DataType::Timestamp(TimeUnit::Microsecond, zone))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let out_type = args.return_field.data_type().clone();
        let Some(arg) = args.args.into_iter().next() else {
            return Ok(ColumnarValue::Array(arrow::array::new_null_array(
                &out_type, rows,
            )));
        };
        let array = arg.into_array(rows)?;
        Ok(ColumnarValue::Array(window_bounds(
            &array, self.tz, self.size, self.end,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, NaiveDate, TimeZone, Utc};

    const MINUTE: i64 = 60_000_000;

    /// An independent account of the windows of a local day: walk its instants minute by minute
    /// from well before to well after, note where the local date changes (the day's first and
    /// next day's first instant), and count windows from there.
    fn expected(
        tz: Tz,
        size: i64,
        at: i64,
        known: &mut HashMap<NaiveDate, (i64, i64)>,
    ) -> (i64, i64) {
        let date = |t: i64| {
            DateTime::<Utc>::from_timestamp_micros(t)
                .expect("instant")
                .with_timezone(&tz)
                .date_naive()
        };
        let d = date(at);
        let (first, next) = *known.entry(d).or_insert_with(|| {
            let mut first = at - at.rem_euclid(MINUTE);
            while date(first - MINUTE) >= d {
                first -= MINUTE;
            }
            let mut next = at - at.rem_euclid(MINUTE) + MINUTE;
            while date(next) <= d {
                next += MINUTE;
            }
            (first, next)
        });
        let whole = ((next - first) / size).max(1);
        let mut start = first;
        while start + size <= at && start + 2 * size <= first + whole * size {
            start += size;
        }
        let end = if start + size > first + (whole - 1) * size {
            next
        } else {
            start + size
        };
        (start, end)
    }

    /// Every instant of days around DST changes (at 02:00, at midnight, half-hour ones), in
    /// half-hour and quarter-hour zones, across Samoa's skipped day: its window holds it, starts
    /// on the grid of its day, and matches the minute-by-minute account.
    #[test]
    fn each_instant_lies_in_its_days_window() {
        let zones = [
            "UTC",
            "Europe/Amsterdam",
            "America/New_York",
            "America/Santiago",
            "America/Havana",
            "Australia/Lord_Howe",
            "Asia/Kathmandu",
            "Pacific/Apia",
        ];
        let days = [
            "2024-03-10",
            "2024-03-31",
            "2024-04-06",
            "2024-09-07",
            "2024-10-27",
            "2024-11-03",
            "2011-12-29",
        ];
        for name in zones {
            let tz: Tz = name.parse().expect("zone");
            let mut known = HashMap::new();
            for size_min in [1, 5, 60, 120, 1440] {
                let size = size_min * MINUTE;
                let mut w = Windows::new(Some(tz), size);
                for day in days {
                    let d = NaiveDate::parse_from_str(day, "%Y-%m-%d").expect("date");
                    let from = Utc
                        .from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"))
                        .timestamp_micros()
                        - 16 * 60 * MINUTE;
                    // every 7 minutes (and 13 seconds) over two days
                    for k in 0..(2 * 24 * 60 / 7) {
                        let at = from + k * (7 * MINUTE + 13_000_000);
                        let got = w.of(at).expect("window");
                        assert!(
                            got.0 <= at && at < got.1,
                            "{name} {size_min}m {at}: {got:?}"
                        );
                        assert_eq!(
                            got,
                            expected(tz, size, at, &mut known),
                            "{name} {size_min}m at {at}"
                        );
                    }
                }
            }
        }
    }

    /// New York's 2024-11-03 has 25 hour windows (01:00 twice) and 2024-03-10 has 23.
    #[test]
    fn dst_days_have_23_and_25_hours() {
        let tz: Tz = "America/New_York".parse().expect("zone");
        let mut w = Windows::new(Some(tz), 60 * MINUTE);
        for (day, hours) in [("2024-11-03", 25), ("2024-03-10", 23), ("2024-07-01", 24)] {
            let d = NaiveDate::parse_from_str(day, "%Y-%m-%d").expect("date");
            let first = tz
                .from_local_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"))
                .earliest()
                .expect("midnight exists")
                .timestamp_micros();
            let mut starts = std::collections::BTreeSet::new();
            let mut at = first;
            loop {
                let (s, e) = w.of(at).expect("window");
                if DateTime::<Utc>::from_timestamp_micros(at)
                    .expect("instant")
                    .with_timezone(&tz)
                    .date_naive()
                    != d
                {
                    break;
                }
                starts.insert(s);
                at = e;
            }
            assert_eq!(starts.len(), hours, "{day}");
        }
    }

    /// Without a zone the windows are the wall clock's.
    #[test]
    fn a_wall_clock_time_is_windowed_as_is() {
        let mut w = Windows::new(None, 15 * MINUTE);
        let at = 1_700_000_000_000_000 + 7 * MINUTE;
        let (s, e) = w.of(at).expect("window");
        assert_eq!(s % (15 * MINUTE), 0);
        assert!(s <= at && at < e && e - s == 15 * MINUTE);
    }
}
