//! Delta file statistics (`add.stats`) from a Parquet footer.
//!
//! tidemark writes some data files itself (row groups copied byte for byte from the file they
//! replace), so it also writes their statistics. They follow what delta-rs writes for the same
//! file — the same columns (`delta.dataSkippingStatsColumns`, else the first
//! `delta.dataSkippingNumIndexedCols`), the same JSON shapes (timestamps cut to milliseconds) —
//! because data skipping and the watermark (`max(sequence)` from the log) read them back. A
//! column whose bounds are not known for every row group that holds values gets no bounds at
//! all: a missing statistic only costs pruning, a wrong one loses rows.

use std::cmp::Ordering;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{DataType, Schema, TimeUnit};
use chrono::{DateTime, NaiveDate};
use datafusion::scalar::ScalarValue;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::ParquetMetaData;
use serde_json::{Map, Value};

/// Which columns carry statistics, as the table's properties say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsColumns {
    /// `delta.dataSkippingStatsColumns`: exactly these top-level columns.
    Named(Vec<String>),
    /// `delta.dataSkippingNumIndexedCols`: the first n columns (`None`: all of them).
    First(Option<usize>),
}

impl Default for StatsColumns {
    /// Delta's default: the first 32 columns.
    fn default() -> Self {
        StatsColumns::First(Some(32))
    }
}

impl StatsColumns {
    /// From the table's configuration map (the raw `delta.*` properties).
    pub fn from_configuration<'a>(config: impl Iterator<Item = (&'a str, &'a str)>) -> Self {
        let mut named = None;
        let mut first = None;
        for (k, v) in config {
            match k {
                "delta.dataSkippingStatsColumns" => {
                    named = Some(
                        v.split(',')
                            .map(|c| c.trim().trim_matches('`').to_string())
                            .filter(|c| !c.is_empty())
                            .collect(),
                    )
                }
                "delta.dataSkippingNumIndexedCols" => {
                    first = v.trim().parse::<i64>().ok();
                }
                _ => {}
            }
        }
        match (named, first) {
            (Some(n), _) => StatsColumns::Named(n),
            (None, Some(n)) if n < 0 => StatsColumns::First(None),
            (None, Some(n)) => StatsColumns::First(Some(n as usize)),
            (None, None) => StatsColumns::default(),
        }
    }

    fn admits(&self, index: usize, name: &str) -> bool {
        match self {
            StatsColumns::Named(n) => n.iter().any(|c| c == name),
            StatsColumns::First(None) => true,
            StatsColumns::First(Some(n)) => index < *n,
        }
    }
}

/// The `stats` JSON of an `add` action for the file described by `meta`, whose columns are
/// `schema` (the file's Arrow schema).
pub fn delta_stats(
    meta: &ParquetMetaData,
    schema: &Schema,
    columns: &StatsColumns,
) -> Result<String, parquet::errors::ParquetError> {
    let descr = meta.file_metadata().schema_descr();
    let groups = meta.row_groups();
    let mut mins = Map::new();
    let mut maxs = Map::new();
    let mut nulls = Map::new();
    for (index, field) in schema.fields().iter().enumerate() {
        if !columns.admits(index, field.name()) || field.data_type().is_nested() {
            continue;
        }
        let conv = StatisticsConverter::try_new(field.name(), schema, descr)?;
        let null_counts = conv.row_group_null_counts(groups)?;
        if null_counts.null_count() == 0 {
            let total: u64 = null_counts.values().iter().sum();
            nulls.insert(field.name().clone(), Value::from(total));
        }
        if matches!(
            field.data_type(),
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        ) {
            continue;
        }
        // A row group with values but no bound leaves the file's bound unknown.
        let rows: Vec<i64> = groups.iter().map(|g| g.num_rows()).collect();
        let holds_values = |i: usize| {
            !(null_counts.is_valid(i) && null_counts.value(i) as i64 == rows[i]) && rows[i] > 0
        };
        let lo = conv.row_group_mins(groups)?;
        let hi = conv.row_group_maxes(groups)?;
        let (Some(lo), Some(hi)) = (
            fold(&lo, holds_values, Ordering::Less),
            fold(&hi, holds_values, Ordering::Greater),
        ) else {
            continue;
        };
        if let (Some(lo), Some(hi)) = (json_value(&lo), json_value(&hi)) {
            mins.insert(field.name().clone(), lo);
            maxs.insert(field.name().clone(), hi);
        }
    }
    let mut stats = Map::new();
    stats.insert(
        "numRecords".into(),
        Value::from(meta.file_metadata().num_rows()),
    );
    stats.insert("minValues".into(), Value::Object(mins));
    stats.insert("maxValues".into(), Value::Object(maxs));
    stats.insert("nullCount".into(), Value::Object(nulls));
    Ok(Value::Object(stats).to_string())
}

/// The least (`want = Less`) or greatest bound over the row groups; `None` when a row group that
/// holds values has no bound, or no row group holds values.
fn fold(
    bounds: &ArrayRef,
    holds_values: impl Fn(usize) -> bool,
    want: Ordering,
) -> Option<ScalarValue> {
    let mut best: Option<ScalarValue> = None;
    for i in 0..bounds.len() {
        if !holds_values(i) {
            continue;
        }
        if !bounds.is_valid(i) {
            return None;
        }
        let v = ScalarValue::try_from_array(bounds, i).ok()?;
        best = match best {
            None => Some(v),
            Some(b) => match v.partial_cmp(&b) {
                Some(o) if o == want => Some(v),
                Some(_) => Some(b),
                None => return None,
            },
        };
    }
    best
}

/// A bound as Delta's JSON statistics spell it (the same shapes as delta-rs).
fn json_value(v: &ScalarValue) -> Option<Value> {
    use ScalarValue as S;
    Some(match v {
        S::Boolean(Some(b)) => Value::Bool(*b),
        S::Int8(Some(x)) => Value::from(*x),
        S::Int16(Some(x)) => Value::from(*x),
        S::Int32(Some(x)) => Value::from(*x),
        S::Int64(Some(x)) => Value::from(*x),
        S::UInt8(Some(x)) => Value::from(*x),
        S::UInt16(Some(x)) => Value::from(*x),
        S::UInt32(Some(x)) => Value::from(*x),
        S::UInt64(Some(x)) => Value::from(*x),
        S::Float32(Some(x)) if x.is_finite() => Value::from(*x),
        S::Float64(Some(x)) if x.is_finite() => Value::from(*x),
        S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s)) => Value::from(s.clone()),
        S::Date32(Some(d)) => {
            let day = NaiveDate::from_num_days_from_ce_opt(719_163 + *d)?;
            Value::from(day.format("%Y-%m-%d").to_string())
        }
        S::Decimal128(Some(x), _, scale) => {
            let value = *x as f64 / 10f64.powi(i32::from(*scale));
            if *scale == 0 {
                Value::from(*x as i64)
            } else {
                Value::from(value)
            }
        }
        S::TimestampSecond(Some(x), tz) => timestamp(*x, TimeUnit::Second, tz.is_some())?,
        S::TimestampMillisecond(Some(x), tz) => timestamp(*x, TimeUnit::Millisecond, tz.is_some())?,
        S::TimestampMicrosecond(Some(x), tz) => timestamp(*x, TimeUnit::Microsecond, tz.is_some())?,
        S::TimestampNanosecond(Some(x), tz) => timestamp(*x, TimeUnit::Nanosecond, tz.is_some())?,
        _ => return None,
    })
}

/// Delta's JSON statistics hold timestamps to the millisecond (delta-rs truncates, so do we).
fn timestamp(x: i64, unit: TimeUnit, utc: bool) -> Option<Value> {
    let micros = match unit {
        TimeUnit::Second => x.checked_mul(1_000_000)?,
        TimeUnit::Millisecond => x.checked_mul(1_000)?,
        TimeUnit::Microsecond => x,
        TimeUnit::Nanosecond => x.div_euclid(1_000),
    };
    let t = DateTime::from_timestamp_micros(micros)?.naive_utc();
    let whole = micros.rem_euclid(1_000_000) == 0;
    let format = match (utc, whole) {
        (true, true) => "%Y-%m-%dT%H:%M:%SZ",
        (true, false) => "%Y-%m-%dT%H:%M:%S%.3fZ",
        (false, true) => "%Y-%m-%d %H:%M:%S",
        (false, false) => "%Y-%m-%d %H:%M:%S%.3f",
    };
    Some(Value::from(t.format(format).to_string()))
}
