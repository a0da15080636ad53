//! The columns records are parsed into: declared in the pipeline, taken from bronze, or
//! inferred from the first files; and how one value of a record becomes a typed cell.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use chrono::{NaiveDate, NaiveDateTime};

use super::decimal::{self, Misfit};
use crate::config::pipeline::ingest::{
    ColumnType, DeclaredColumn, INGESTED_AT, MAX_DECIMAL_PRECISION, RESCUED, SOURCE_FILE,
};

/// One column records are parsed into.
#[derive(Debug, Clone, PartialEq)]
pub struct Col {
    pub name: String,
    pub ty: ColumnType,
    /// A record without a value for it is quarantined.
    pub required: bool,
}

impl From<&DeclaredColumn> for Col {
    fn from(d: &DeclaredColumn) -> Self {
        Col {
            name: d.name.clone(),
            ty: d.ty,
            required: d.required,
        }
    }
}

/// The Arrow type of a column type (timestamps: microseconds, UTC).
pub fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::String => DataType::Utf8,
        ColumnType::Long => DataType::Int64,
        ColumnType::Int => DataType::Int32,
        ColumnType::Double => DataType::Float64,
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ColumnType::Date => DataType::Date32,
        ColumnType::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
    }
}

/// The column type of a bronze column, when ingest can parse values into it.
pub fn from_arrow(dt: &DataType) -> Option<ColumnType> {
    Some(match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
        DataType::Int64 => ColumnType::Long,
        DataType::Int32 | DataType::Int16 | DataType::Int8 => ColumnType::Int,
        DataType::Float64 | DataType::Float32 => ColumnType::Double,
        DataType::Boolean => ColumnType::Boolean,
        DataType::Timestamp(_, _) => ColumnType::Timestamp,
        DataType::Date32 | DataType::Date64 => ColumnType::Date,
        // (a negative scale, 12e3 kept as 12, is not one `schema:` can declare)
        DataType::Decimal128(precision, scale) if *scale >= 0 => ColumnType::Decimal {
            precision: *precision,
            scale: *scale,
        },
        _ => return None,
    })
}

/// Whether `name` is one of the columns ingest itself adds.
pub fn is_bookkeeping(name: &str) -> bool {
    [INGESTED_AT, SOURCE_FILE, RESCUED].contains(&name)
        || name.starts_with(crate::config::pipeline::kafka::COLUMN_PREFIX)
}

/// The schema of parsed rows: the data columns, then `_rescued_data` when rescuing.
pub fn data_schema(cols: &[Col], rescue: bool) -> Arc<Schema> {
    let mut fields: Vec<Field> = cols
        .iter()
        .map(|c| Field::new(&c.name, arrow_type(c.ty), true))
        .collect();
    if rescue {
        fields.push(Field::new(RESCUED, DataType::Utf8, true));
    }
    Arc::new(Schema::new(fields))
}

/// One typed value of a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Str(String),
    I64(i64),
    I32(i32),
    F64(f64),
    Bool(bool),
    /// Microseconds since the epoch, UTC.
    Ts(i64),
    /// Days since the epoch.
    Date(i32),
    /// A decimal's unscaled value (`12.34` in `decimal(p, 2)` is 1234).
    Dec(i128),
}

/// A JSON value as a cell of `ty`; `None` when it does not fit (the caller rescues or rejects).
pub fn from_json(v: &serde_json::Value, ty: ColumnType) -> Option<Cell> {
    use serde_json::Value as V;
    Some(match (v, ty) {
        (V::Null, _) => Cell::Null,
        (V::String(s), ColumnType::String) => Cell::Str(s.clone()),
        // Nested values land in a string column as their JSON text.
        (V::Object(_) | V::Array(_), ColumnType::String) => Cell::Str(v.to_string()),
        (V::Number(n), ColumnType::String) => Cell::Str(n.to_string()),
        (V::Bool(b), ColumnType::String) => Cell::Str(b.to_string()),
        (V::Number(n), ColumnType::Long) => Cell::I64(n.as_i64()?),
        (V::Number(n), ColumnType::Int) => Cell::I32(i32::try_from(n.as_i64()?).ok()?),
        (V::Number(n), ColumnType::Double) => Cell::F64(n.as_f64()?),
        (V::Number(n), ColumnType::Timestamp) => Cell::Ts(n.as_i64()?),
        // An integer's digits are exact; a number with a point or an exponent is an f64 here,
        // so the caller parses its text as written ([`from_text`]).
        (V::Number(n), ColumnType::Decimal { .. }) if n.is_f64() => return None,
        (V::Number(n), ty @ ColumnType::Decimal { .. }) => return from_text(&n.to_string(), ty),
        (V::Bool(b), ColumnType::Boolean) => Cell::Bool(*b),
        // (a JSON string says a value was sent: a blank one is not a number, a date, ... — only
        // CSV, which cannot tell an empty field from a missing one, reads it as null)
        (V::String(s), ty) if ty != ColumnType::String && s.trim().is_empty() => return None,
        (V::String(s), ty) if ty != ColumnType::String => return from_text(s, ty),
        _ => return None,
    })
}

/// Text (a CSV field, a JSON string) as a cell of `ty`; `None` when it does not parse. Empty
/// text is null, except in a string column.
pub fn from_text(s: &str, ty: ColumnType) -> Option<Cell> {
    if ty == ColumnType::String {
        return Some(Cell::Str(s.to_string()));
    }
    let t = s.trim();
    if t.is_empty() {
        return Some(Cell::Null);
    }
    Some(match ty {
        ColumnType::String => Cell::Str(s.to_string()),
        ColumnType::Long => Cell::I64(t.parse().ok()?),
        ColumnType::Int => Cell::I32(t.parse().ok()?),
        ColumnType::Double => Cell::F64(t.parse().ok()?),
        ColumnType::Boolean => match t.to_ascii_lowercase().as_str() {
            "true" => Cell::Bool(true),
            "false" => Cell::Bool(false),
            _ => return None,
        },
        ColumnType::Timestamp => Cell::Ts(parse_timestamp(t)?),
        ColumnType::Date => Cell::Date(parse_date(t)?),
        ColumnType::Decimal { precision, scale } => {
            Cell::Dec(decimal::parse(t, precision, scale).ok()?)
        }
    })
}

/// Why `shown` (the value as written) is not a value of column `name` of type `ty`, for the
/// quarantine: a decimal that does not fit says by how much.
pub fn misfit(name: &str, shown: &str, ty: ColumnType) -> String {
    if let ColumnType::Decimal { precision, scale } = ty {
        let bare = shown.trim().trim_matches('"');
        if let Err(m @ (Misfit::Places { .. } | Misfit::IntegerDigits { .. })) =
            decimal::parse(bare, precision, scale)
        {
            return format!("`{name}` = {bare} does not fit {ty}: {m}");
        }
    }
    format!("`{name}`: {shown} is not a {ty}")
}

/// RFC 3339 with any offset, or `YYYY-MM-DD[T ]HH:MM:SS[.fff]` read as UTC: microseconds.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .map(|t| t.and_utc().timestamp_micros())
}

fn parse_date(s: &str) -> Option<i32> {
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((d - epoch).num_days()).ok()
}

/// The narrowest type holding a JSON value (`None` for null: it says nothing).
pub fn infer_json(v: &serde_json::Value) -> Option<ColumnType> {
    use serde_json::Value as V;
    match v {
        V::Null => None,
        V::Bool(_) => Some(ColumnType::Boolean),
        V::Number(n) if n.is_i64() => Some(ColumnType::Long),
        V::Number(_) => Some(ColumnType::Double),
        V::String(s) => Some(infer_string(s)),
        V::Array(_) | V::Object(_) => Some(ColumnType::String),
    }
}

/// The narrowest type holding a CSV field (`None` for an empty one).
pub fn infer_text(s: &str) -> Option<ColumnType> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    if t.parse::<i64>().is_ok() {
        return Some(ColumnType::Long);
    }
    if t.parse::<f64>().is_ok() {
        return Some(ColumnType::Double);
    }
    if t.eq_ignore_ascii_case("true") || t.eq_ignore_ascii_case("false") {
        return Some(ColumnType::Boolean);
    }
    Some(infer_string(t))
}

fn infer_string(s: &str) -> ColumnType {
    // Only text that is unmistakably a time: a date and a time of day.
    if s.len() >= 19 && parse_timestamp(s).is_some() {
        ColumnType::Timestamp
    } else {
        ColumnType::String
    }
}

/// The type holding values of both `a` and `b`: longs widen to doubles, two decimals to one
/// holding both (up to 38 digits), anything else mixed to strings.
pub fn widen(a: ColumnType, b: ColumnType) -> ColumnType {
    use ColumnType as T;
    match (a, b) {
        (a, b) if a == b => a,
        (T::Long, T::Double) | (T::Double, T::Long) => T::Double,
        (T::Int, T::Long) | (T::Long, T::Int) => T::Long,
        (
            T::Decimal {
                precision: p1,
                scale: s1,
            },
            T::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => {
            let scale = s1.max(s2);
            let int_digits = (p1 as i16 - s1 as i16).max(p2 as i16 - s2 as i16);
            match u8::try_from(int_digits + scale as i16) {
                Ok(precision) if precision <= MAX_DECIMAL_PRECISION => {
                    T::Decimal { precision, scale }
                }
                _ => T::String,
            }
        }
        _ => T::String,
    }
}

/// The name of a column type, for messages (`long`, `decimal(12, 2)`).
pub fn type_name(ty: ColumnType) -> String {
    ty.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_convert_or_say_they_do_not_fit() {
        assert_eq!(from_json(&json!(5), ColumnType::Long), Some(Cell::I64(5)));
        assert_eq!(from_json(&json!("5"), ColumnType::Long), Some(Cell::I64(5)));
        assert_eq!(from_json(&json!("five"), ColumnType::Long), None);
        // a blank JSON string was sent: not a number (CSV's empty field is null, see from_text)
        assert_eq!(from_json(&json!(""), ColumnType::Long), None);
        assert_eq!(from_json(&json!("  "), ColumnType::Timestamp), None);
        assert_eq!(
            from_json(&json!(""), ColumnType::String),
            Some(Cell::Str(String::new()))
        );
        assert_eq!(from_text("", ColumnType::Long), Some(Cell::Null));
        assert_eq!(from_json(&json!(1.5), ColumnType::Long), None);
        assert_eq!(
            from_json(&json!(true), ColumnType::String),
            Some(Cell::Str("true".into()))
        );
        assert_eq!(
            from_json(&json!({"a":1}), ColumnType::String),
            Some(Cell::Str("{\"a\":1}".into()))
        );
        assert_eq!(from_json(&json!(3_000_000_000i64), ColumnType::Int), None);
        assert_eq!(
            from_json(&json!("2024-01-05T10:00:00+01:00"), ColumnType::Timestamp),
            Some(Cell::Ts(1_704_445_200_000_000))
        );
        assert_eq!(
            from_text("2024-01-05 09:00:00", ColumnType::Timestamp),
            Some(Cell::Ts(1_704_445_200_000_000))
        );
        assert_eq!(from_text("", ColumnType::Long), Some(Cell::Null));
        assert_eq!(
            from_text("", ColumnType::String),
            Some(Cell::Str(String::new()))
        );
        assert_eq!(
            from_text("1970-01-02", ColumnType::Date),
            Some(Cell::Date(1))
        );
        assert_eq!(from_text("yes", ColumnType::Boolean), None);
    }

    #[test]
    fn inference_picks_the_narrowest_type_and_widens() {
        assert_eq!(infer_json(&json!(1)), Some(ColumnType::Long));
        assert_eq!(
            infer_json(&json!("2024-01-05T10:00:00Z")),
            Some(ColumnType::Timestamp)
        );
        assert_eq!(infer_json(&json!("2024-01-05")), Some(ColumnType::String));
        assert_eq!(infer_text("1.5"), Some(ColumnType::Double));
        assert_eq!(
            widen(ColumnType::Long, ColumnType::Double),
            ColumnType::Double
        );
        assert_eq!(
            widen(ColumnType::Long, ColumnType::Boolean),
            ColumnType::String
        );
    }

    #[test]
    fn decimals_convert_exactly_and_say_why_they_do_not_fit() {
        let dec = ColumnType::Decimal {
            precision: 12,
            scale: 2,
        };
        assert_eq!(arrow_type(dec), DataType::Decimal128(12, 2));
        assert_eq!(from_arrow(&DataType::Decimal128(12, 2)), Some(dec));
        assert_eq!(from_arrow(&DataType::Decimal128(12, -2)), None);
        assert_eq!(from_json(&json!(5), dec), Some(Cell::Dec(500)));
        assert_eq!(from_json(&json!("0.10"), dec), Some(Cell::Dec(10)));
        assert_eq!(
            from_json(&json!(0.1), dec),
            None,
            "an f64: the caller reads its text"
        );
        assert_eq!(from_json(&json!("Infinity"), dec), None);
        assert_eq!(from_text(" -0.00 ", dec), Some(Cell::Dec(0)));
        assert_eq!(from_text("", dec), Some(Cell::Null));
        assert_eq!(
            misfit("amount", "12.345", dec),
            "`amount` = 12.345 does not fit decimal(12, 2): 3 decimal places, at most 2"
        );
        assert_eq!(
            misfit("amount", "\"abc\"", dec),
            "`amount`: \"abc\" is not a decimal(12, 2)"
        );
        let wide = ColumnType::Decimal {
            precision: 20,
            scale: 4,
        };
        assert_eq!(
            widen(dec, wide),
            ColumnType::Decimal {
                precision: 20,
                scale: 4
            }
        );
        let huge = ColumnType::Decimal {
            precision: 38,
            scale: 0,
        };
        assert_eq!(
            widen(huge, dec),
            ColumnType::String,
            "40 digits: no decimal holds both"
        );
    }
}
