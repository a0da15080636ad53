//! An instant's date in a time zone, fast: Arrow's cast looks the zone's offset up for every
//! value (a search in the zone's transitions and a calendar conversion per row: ~8% of an hourly
//! aggregate run). Here the offset is looked up once per quarter hour of UTC time and kept in a
//! small cache; the date is then integer arithmetic. A quarter hour whose two ends have different
//! offsets (a transition inside it) is computed per value, so the result is the cast's exactly.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Date32Array};
use arrow::datatypes::{
    ArrowTimestampType, DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use arrow::error::ArrowError;
use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

pub(super) const MICROS_PER_DAY: i64 = 86_400_000_000;
const QUARTER_HOUR: i64 = 15 * 60 * 1_000_000;
const CACHE: usize = 1024;

/// The date of each instant in `tz` (`None`: a wall-clock time without a zone, its date as is),
/// as `Date32`; nulls stay null.
pub fn local_dates(values: &dyn Array, tz: Option<Tz>) -> Result<ArrayRef, ArrowError> {
    let dates = match values.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            dates::<TimestampSecondType>(values, tz, |v| v.checked_mul(1_000_000))?
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            dates::<TimestampMillisecondType>(values, tz, |v| v.checked_mul(1_000))?
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            dates::<TimestampMicrosecondType>(values, tz, Some)?
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            dates::<TimestampNanosecondType>(values, tz, |v| Some(v.div_euclid(1_000)))?
        }
        other => {
            return Err(ArrowError::CastError(format!(
                "an event day needs a timestamp, got {other}"
            )))
        }
    };
    Ok(Arc::new(dates))
}

/// The dates of a timestamp array of unit `T`, its values taken to µs by `micros`.
fn dates<T: ArrowTimestampType>(
    values: &dyn Array,
    tz: Option<Tz>,
    micros: impl Fn(i64) -> Option<i64>,
) -> Result<Date32Array, ArrowError> {
    let mut offsets = Offsets::new(tz);
    values
        .as_primitive::<T>()
        .iter()
        .map(|v| {
            v.map(|v| {
                let at = micros(v).ok_or_else(|| out_of_range(v))?;
                let off = offsets.at(at).ok_or_else(|| out_of_range(v))?;
                let day = (at + off).div_euclid(MICROS_PER_DAY);
                i32::try_from(day).map_err(|_| out_of_range(v))
            })
            .transpose()
        })
        .collect()
}

fn out_of_range(v: i64) -> ArrowError {
    ArrowError::CastError(format!("the instant {v} has no date"))
}

/// The zone's UTC offset (µs) at an instant, cached per quarter hour of UTC time.
pub(super) struct Offsets {
    tz: Option<Tz>,
    /// (quarter hour, its offset; `None`: it holds a transition)
    cache: Vec<Option<(i64, Option<i64>)>>,
}

impl Offsets {
    pub(super) fn new(tz: Option<Tz>) -> Self {
        Offsets {
            tz,
            cache: vec![None; CACHE],
        }
    }

    pub(super) fn at(&mut self, at: i64) -> Option<i64> {
        let Some(tz) = self.tz else {
            return Some(0);
        };
        let quarter = at.div_euclid(QUARTER_HOUR);
        let slot = quarter.rem_euclid(CACHE as i64) as usize;
        let known = match self.cache[slot] {
            Some((q, off)) if q == quarter => off,
            _ => {
                let start = quarter.checked_mul(QUARTER_HOUR)?;
                let a = offset(tz, start)?;
                let b = offset(tz, start + QUARTER_HOUR - 1)?;
                let off = (a == b).then_some(a);
                self.cache[slot] = Some((quarter, off));
                off
            }
        };
        match known {
            Some(off) => Some(off),
            None => offset(tz, at),
        }
    }
}

/// `tz`'s UTC offset (µs) at the instant `at` (µs since the epoch).
pub(super) fn offset(tz: Tz, at: i64) -> Option<i64> {
    if at >= CHRONO_TZ_END {
        return far_offset(tz, at);
    }
    let t = DateTime::<Utc>::from_timestamp_micros(at)?;
    let off = tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    Some(i64::from(off.local_minus_utc()) * 1_000_000)
}

/// 2100-01-01T00:00Z (µs): chrono-tz's transition tables end before it, and after them it keeps
/// the last offset (a summer in 2100 would be on winter time).
const CHRONO_TZ_END: i64 = 4_102_444_800_000_000;

/// The offset of an instant past chrono-tz's tables, from the zone's rule (the POSIX TZ string
/// that ends its TZif data), through jiff's bundled database.
fn far_offset(tz: Tz, at: i64) -> Option<i64> {
    thread_local! {
        static ZONES: std::cell::RefCell<std::collections::HashMap<Tz, jiff::tz::TimeZone>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    let ts = jiff::Timestamp::from_microsecond(at).ok()?;
    ZONES.with(|zones| {
        let mut zones = zones.borrow_mut();
        let zone = match zones.get(&tz) {
            Some(z) => z.clone(),
            None => {
                let z = jiff::tz::db().get(tz.name()).ok()?;
                zones.insert(tz, z.clone());
                z
            }
        };
        Some(i64::from(zone.to_offset(ts).seconds()) * 1_000_000)
    })
}

/// `column`'s date in `tz` (`None`: its date as is) as an expression.
pub fn expr(column: Expr, tz: Option<Tz>) -> Expr {
    ScalarUDF::new_from_impl(LocalDateUdf {
        signature: Signature::any(1, Volatility::Immutable),
        tz,
    })
    .call(vec![column])
}

#[derive(Debug)]
struct LocalDateUdf {
    signature: Signature,
    tz: Option<Tz>,
}

impl PartialEq for LocalDateUdf {
    fn eq(&self, other: &Self) -> bool {
        self.tz == other.tz
    }
}

impl Eq for LocalDateUdf {}

impl Hash for LocalDateUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tz.map(|t| t.name()).hash(state)
    }
}

impl ScalarUDFImpl for LocalDateUdf {
    fn name(&self) -> &str {
        "tidemark_local_date"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Date32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let Some(arg) = args.args.into_iter().next() else {
            return Ok(ColumnarValue::Array(arrow::array::new_null_array(
                &DataType::Date32,
                rows,
            )));
        };
        let array = arg.into_array(rows)?;
        Ok(ColumnarValue::Array(local_dates(&array, self.tz)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::TimestampMicrosecondArray;
    use proptest::prelude::*;

    /// Past chrono-tz's tables the zone's rule still applies: summer time in 2100 and 2150, and
    /// the switch on the last Sunday of March (2100-03-28) at 01:00 UTC.
    #[test]
    fn daylight_saving_goes_on_after_2099() {
        let ams: Tz = "Europe/Amsterdam".parse().expect("zone");
        let at = |s: &str| {
            s.parse::<DateTime<Utc>>()
                .expect("instant")
                .timestamp_micros()
        };
        let hour = 3_600_000_000;
        assert_eq!(offset(ams, at("2100-07-01T22:30:00Z")), Some(2 * hour));
        assert_eq!(offset(ams, at("2150-07-01T22:30:00Z")), Some(2 * hour));
        assert_eq!(offset(ams, at("2100-01-15T12:00:00Z")), Some(hour));
        assert_eq!(offset(ams, at("2100-03-28T00:59:59Z")), Some(hour));
        assert_eq!(offset(ams, at("2100-03-28T01:00:00Z")), Some(2 * hour));
        assert_eq!(offset(ams, at("2099-07-01T22:30:00Z")), Some(2 * hour));
        let values = TimestampMicrosecondArray::from(vec![at("2100-07-01T22:30:00Z")]);
        let dates = local_dates(&values, Some(ams)).expect("dates");
        let dates = dates.as_primitive::<arrow::datatypes::Date32Type>();
        assert_eq!(
            dates.value_as_date(0),
            chrono::NaiveDate::from_ymd_opt(2100, 7, 2)
        );
    }

    /// The same dates as Arrow's cast (the timestamp in the zone, then its date), in zones with
    /// DST changes, half and quarter hour offsets and the date line, around their transitions.
    fn same_as_the_cast(name: &str, values: Vec<Option<i64>>) {
        let tz: Tz = name.parse().expect("zone");
        let a = TimestampMicrosecondArray::from(values).with_timezone(name);
        let ours = local_dates(&a, Some(tz)).expect("ours");
        let cast = arrow::compute::cast(&a, &DataType::Date32).expect("cast");
        assert_eq!(ours.as_ref(), cast.as_ref(), "{name}");
    }

    proptest! {
        #[test]
        fn equals_arrows_cast(
            zone in prop::sample::select(vec![
                "UTC", "Europe/Amsterdam", "America/New_York", "America/St_Johns",
                "Australia/Lord_Howe", "Asia/Kathmandu", "Pacific/Apia", "America/Havana",
                "Asia/Beirut", "Europe/London",
            ]),
            // around 1900 (offsets of seconds), 1970-2040 (DST) and beyond
            base in prop::sample::select(vec![-2_208_988_800i64, 0, 1_711_846_800, 1_730_000_000, 2_200_000_000]),
            offsets in prop::collection::vec((0i64..400 * 86_400, 0i64..1_000_000), 1..300),
            nulls in prop::collection::vec(any::<bool>(), 300),
        ) {
            let values = offsets
                .iter()
                .zip(nulls)
                .map(|((s, us), null)| (!null).then_some((base + s) * 1_000_000 + us))
                .collect();
            same_as_the_cast(zone, values);
        }
    }

    #[test]
    fn every_minute_around_transitions() {
        // Europe/Amsterdam 2024-03-31 01:00 UTC, America/St_Johns 2024-11-03 (at 03:30 UTC),
        // Australia/Lord_Howe 2024-04-07 (a half hour), Pacific/Apia skipping 2011-12-30
        for (zone, at) in [
            ("Europe/Amsterdam", 1_711_846_800i64),
            ("America/St_Johns", 1_730_611_800),
            ("Australia/Lord_Howe", 1_712_415_600),
            ("Pacific/Apia", 1_325_239_200),
        ] {
            let values = (-3 * 1440..3 * 1440)
                .map(|m| Some((at + m * 60 + 7) * 1_000_000))
                .collect();
            same_as_the_cast(zone, values);
        }
    }

    /// Abidjan's offset went from -0:16:08 to 0 at 1912-01-01 00:16:08 UTC, inside a quarter
    /// hour: the values of that quarter are looked up one by one.
    #[test]
    fn a_transition_inside_a_quarter_hour() {
        let at = -1_830_383_032i64;
        let values = (-1800..1800).map(|s| Some((at + s) * 1_000_000)).collect();
        same_as_the_cast("Africa/Abidjan", values);
        // (the dates cannot tell 16 minutes apart there: the offsets themselves)
        let tz: Tz = "Africa/Abidjan".parse().expect("zone");
        let mut cached = Offsets::new(Some(tz));
        for s in -1800..1800 {
            let t = (at + s) * 1_000_000;
            assert_eq!(cached.at(t), offset(tz, t), "at {t}");
        }
    }

    #[test]
    fn a_wall_clock_without_a_zone_keeps_its_date() {
        let a =
            TimestampMicrosecondArray::from(vec![Some(-1), Some(0), Some(86_400_000_000), None]);
        let ours = local_dates(&a, None).expect("ours");
        let cast = arrow::compute::cast(&a, &DataType::Date32).expect("cast");
        assert_eq!(ours.as_ref(), cast.as_ref());
    }
}
