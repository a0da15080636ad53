//! Debezium change events as a PostgreSQL connector sends them through Kafka Connect's JSON
//! converter, for the suites that feed `format: debezium` (files or a topic): the TOAST
//! marker, decimals in the precise (base64) and string encodings, the schema envelope, and one
//! event's JSON.

use base64::Engine;
use serde_json::{json, Value};

/// What Debezium sends for an unchanged TOASTed column.
pub const MARKER: &str = "__debezium_unavailable_value";

/// The unscaled integer as Kafka Connect's precise decimal: minimal big-endian two's
/// complement, base64 (the scale travels in the envelope's schema).
pub fn precise(unscaled: i128) -> String {
    let bytes = unscaled.to_be_bytes();
    let mut start = 0;
    while start < bytes.len() - 1
        && ((bytes[start] == 0 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    base64::engine::general_purpose::STANDARD.encode(&bytes[start..])
}

/// The unscaled integer as `decimal.handling.mode: string` sends it, with `scale` decimals.
pub fn text_decimal(unscaled: i128, scale: u32) -> String {
    let sign = if unscaled < 0 { "-" } else { "" };
    let abs = unscaled.unsigned_abs();
    if scale == 0 {
        return format!("{sign}{abs}");
    }
    let unit = 10u128.pow(scale);
    format!(
        "{sign}{}.{:0w$}",
        abs / unit,
        abs % unit,
        w = scale as usize
    )
}

/// A `DECIMAL(precision, scale)` column in the envelope's schema (precise mode: bytes).
pub fn decimal_field(name: &str, precision: u32, scale: u32) -> Value {
    json!({"field": name, "type": "bytes", "optional": true,
           "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": scale.to_string(), "connect.decimal.precision": precision.to_string()}})
}

/// The schema envelope of a table's change events, `before` and `after` holding `fields`.
pub fn envelope_schema(fields: Value) -> Value {
    json!({"type": "struct", "fields": [
        {"field": "before", "type": "struct", "optional": true, "fields": fields},
        {"field": "after", "type": "struct", "optional": true, "fields": fields},
        {"field": "source", "type": "struct", "fields": []},
        {"field": "op", "type": "string"}
    ]})
}

/// One change event: `row` is `after` (or `before`, for a delete `d`), committed (for a
/// read `r`: read by the initial snapshot) at `ts_ms` and log position `lsn`; wrapped in
/// `schema`'s envelope when there is one.
pub fn event(op: &str, row: Value, ts_ms: i64, lsn: u64, schema: Option<&Value>) -> String {
    let (before, after) = if op == "d" {
        (row, Value::Null)
    } else {
        (Value::Null, row)
    };
    let payload = json!({
        "before": before,
        "after": after,
        "source": {"connector": "postgresql", "ts_ms": ts_ms, "lsn": lsn,
                   "snapshot": if op == "r" { "true" } else { "false" }},
        "op": op,
        "ts_ms": ts_ms + 250,
    });
    match schema {
        Some(s) => json!({"schema": s, "payload": payload}),
        None => payload,
    }
    .to_string()
}

#[test]
fn precise_decimals_are_minimal_twos_complement() {
    let raw = |v: i128| {
        base64::engine::general_purpose::STANDARD
            .decode(precise(v))
            .expect("base64")
    };
    assert_eq!(raw(0), vec![0]);
    assert_eq!(raw(127), vec![0x7f]);
    assert_eq!(raw(128), vec![0x00, 0x80]);
    assert_eq!(raw(-1), vec![0xff]);
    assert_eq!(raw(-129), vec![0xff, 0x7f]);
    assert_eq!(text_decimal(-5, 2), "-0.05");
    assert_eq!(
        text_decimal(999_999_999_999_999_999, 2),
        "9999999999999999.99"
    );
}
