//! Debezium change events (`format: debezium`): one event per line, with or without the
//! schema envelope (`{"schema": …, "payload": …}`, or the payload alone).
//!
//! The row is `after` (creates `c`, updates `u`, snapshot reads `r`), or `before` for a delete
//! (`d`); besides the declared columns, bronze gets the change's metadata ([`META`]): the
//! operation, the source's commit time, its position in the source's log, when Debezium
//! produced the event, and `_sequence`, the order a merge keeps the newest by. A truncate (`t`)
//! stops the run: tidemark cannot apply it as row changes, and ignoring it would leave every
//! truncated row live downstream. A tombstone (a `null` event, what Kafka's log compaction
//! keys on after a delete) carries no row and is skipped.
//!
//! Values in Debezium's encodings become the declared types: a DECIMAL sent precisely (the
//! unscaled integer's two's-complement bytes, base64, with the scale in the schema) or as a
//! string becomes an exact decimal; `io.debezium.time.*` and Kafka Connect times (epoch days,
//! milliseconds, microseconds or nanoseconds, per the schema) become dates and timestamps.

use std::collections::HashMap;

use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::json::{for_each_line, kind, record};
use super::rows::{Parsed, Reject, Rows};
use super::schema::Col;
use super::Shape;
use crate::config::pipeline::ingest::ColumnType;

/// Why a row without Debezium's envelope is rejected.
const UNWRAPPED: &str = "a row without Debezium's envelope (no `op`, `before`, `after` or `source`): a sink that unwrapped it (Debezium's ExtractNewRecordState) writes plain rows, which are `format: json`";

/// The columns the format adds to each row, after the declared ones.
pub const META: [(&str, ColumnType); 5] = [
    ("_op", ColumnType::String),
    ("_sequence", ColumnType::Timestamp),
    ("_source_ts", ColumnType::Timestamp),
    ("_source_position", ColumnType::String),
    ("_event_ts", ColumnType::Timestamp),
];

/// `cols` with the metadata columns it lacks appended.
pub fn with_meta(mut cols: Vec<Col>) -> Vec<Col> {
    for (name, ty) in META {
        if !cols.iter().any(|c| c.name == name) {
            cols.push(Col {
                name: name.to_string(),
                ty,
                required: false,
            });
        }
    }
    cols
}

#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    before: Option<&'a RawValue>,
    #[serde(borrow)]
    after: Option<&'a RawValue>,
    source: Option<Map<String, Value>>,
    op: Option<String>,
    ts_ms: Option<i64>,
    ts_us: Option<i64>,
    ts_ns: Option<i64>,
}

/// Parses a file of Debezium events into rows and rejects; a truncate event sets the refusal.
pub fn parse(body: &[u8], shape: &Shape<'_>) -> Result<Parsed, arrow::error::ArrowError> {
    let mut rows = Rows::new(shape.cols, shape.rescue);
    let mut refusal = None;
    let (mut lines, mut unwrapped) = (0u64, 0u64);
    for_each_line(body, shape, &mut rows, |rows, line_no, line| {
        if refusal.is_some() {
            return;
        }
        lines += 1;
        match document(rows, line_no, line, shape) {
            Doc::Truncate => refusal = Some(line_no.unwrap_or_default()),
            Doc::Unwrapped => unwrapped += 1,
            Doc::Read => {}
        }
    });
    let mut parsed = rows.finish()?;
    parsed.truncate_at = refusal;
    parsed.not_debezium = lines > 0 && unwrapped == lines;
    Ok(parsed)
}

/// What one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Doc {
    /// A row, a reject, or nothing (a tombstone).
    Read,
    /// A truncate event: the caller refuses it.
    Truncate,
    /// A plain row without the envelope (rejected): a file of only these is not Debezium.
    Unwrapped,
}

/// One event (a file's line, a Kafka message's value) into a row, a reject, or nothing (a
/// tombstone).
pub(super) fn document(
    rows: &mut Rows<'_>,
    line_no: Option<u64>,
    doc: &[u8],
    shape: &Shape<'_>,
) -> Doc {
    match event(doc) {
        Ok(Event::Row { fields, object }) => {
            record(rows, object, line_no, doc, fields.as_bytes(), shape)
        }
        Ok(Event::Tombstone) => {}
        Ok(Event::Truncate) => return Doc::Truncate,
        Err(why) => {
            let unwrapped = why == UNWRAPPED;
            rows.reject(Reject::new(line_no, doc, why));
            if unwrapped {
                return Doc::Unwrapped;
            }
        }
    }
    Doc::Read
}

enum Event {
    /// The row's fields as an object (metadata added, values decoded) and its JSON text.
    Row {
        fields: String,
        object: Map<String, Value>,
    },
    Tombstone,
    Truncate,
}

/// One line as an event; `Err` says why it is not one.
fn event(line: &[u8]) -> Result<Event, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("malformed JSON: {e}"))?;
    let (schema, payload_text) = match &value {
        Value::Null => return Ok(Event::Tombstone),
        Value::Object(m) if m.contains_key("payload") && m.contains_key("schema") => {
            let payload = m.get("payload").cloned().unwrap_or(Value::Null);
            if payload.is_null() {
                return Ok(Event::Tombstone);
            }
            (m.get("schema").cloned(), payload.to_string())
        }
        Value::Object(_) => (None, String::from_utf8_lossy(line).into_owned()),
        other => return Err(format!("not a Debezium event: {}", kind(other))),
    };
    let p: Payload<'_> =
        serde_json::from_str(&payload_text).map_err(|e| format!("not a Debezium event: {e}"))?;
    let plain_row = p.op.is_none()
        && p.before.is_none()
        && p.after.is_none()
        && p.source.is_none()
        && matches!(&value, Value::Object(m) if !m.contains_key("payload"));
    if plain_row {
        return Err(UNWRAPPED.to_string());
    }
    let op =
        p.op.as_deref()
            .ok_or("not a Debezium change event: no `op` (a schema-change or heartbeat event?)")?;
    let row = match op {
        "c" | "u" | "r" => p.after,
        "d" => p.before,
        "t" => return Ok(Event::Truncate),
        other => {
            return Err(format!(
                "Debezium operation `{other}` is not a row change (c, u, d, r)"
            ))
        }
    };
    let Some(row) = row.filter(|r| r.get() != "null") else {
        let side = if op == "d" { "before" } else { "after" };
        return Err(format!("a `{op}` event without `{side}`: no row to ingest"));
    };
    let mut object: Map<String, Value> = match serde_json::from_str(row.get()) {
        Ok(Value::Object(m)) => m,
        _ => {
            return Err(format!(
                "the event's row is not a JSON object: {}",
                row.get()
            ))
        }
    };
    let side = if op == "d" { "before" } else { "after" };
    let logical = schema
        .as_ref()
        .map(|s| logical_types(s, side))
        .unwrap_or_default();
    for (name, l) in &logical {
        if let Some(v) = object.get_mut(name) {
            *v = decode(v, l).map_err(|why| format!("`{name}`: {why}"))?;
        }
    }
    add_meta(
        &mut object,
        op,
        p.source.as_ref(),
        (p.ts_ns, p.ts_us, p.ts_ms),
    );
    Ok(Event::Row {
        fields: row.get().to_string(),
        object,
    })
}

/// A field's logical type (Kafka Connect's `name`) and its `parameters`.
#[derive(Debug, Clone, Default)]
struct Logical {
    name: String,
    scale: Option<i8>,
}

/// The logical types of the fields of the envelope schema's `side` struct.
fn logical_types(schema: &Value, side: &str) -> HashMap<String, Logical> {
    let mut out = HashMap::new();
    let Some(fields) = schema.get("fields").and_then(Value::as_array) else {
        return out;
    };
    let Some(row) = fields
        .iter()
        .find(|f| f.get("field").and_then(Value::as_str) == Some(side))
        .and_then(|f| f.get("fields"))
        .and_then(Value::as_array)
    else {
        return out;
    };
    for f in row {
        let (Some(field), Some(name)) = (
            f.get("field").and_then(Value::as_str),
            f.get("name").and_then(Value::as_str),
        ) else {
            continue;
        };
        let scale = f
            .get("parameters")
            .and_then(|p| p.get("scale"))
            .and_then(|s| s.as_str().and_then(|t| t.parse().ok()).or(s.as_i64()))
            .and_then(|s| i8::try_from(s).ok());
        out.insert(
            field.to_string(),
            Logical {
                name: name.to_string(),
                scale,
            },
        );
    }
    out
}

/// A value in a Debezium encoding as what the ingest readers take: decimals as their digits,
/// dates as `YYYY-MM-DD`, timestamps as epoch microseconds.
fn decode(v: &Value, l: &Logical) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    match l.name.as_str() {
        "org.apache.kafka.connect.data.Decimal" => match v {
            Value::String(s) if s.parse::<f64>().is_err() => {
                let scale = l
                    .scale
                    .ok_or("a precise decimal without a scale in its schema")?;
                Ok(Value::String(unscaled(s, scale)?))
            }
            other => Ok(other.clone()),
        },
        "io.debezium.data.VariableScaleDecimal" => {
            let scale = v
                .get("scale")
                .and_then(Value::as_i64)
                .and_then(|s| i8::try_from(s).ok())
                .ok_or("a variable-scale decimal without its scale")?;
            let bytes = v
                .get("value")
                .and_then(Value::as_str)
                .ok_or("a variable-scale decimal without its value")?;
            Ok(Value::String(unscaled(bytes, scale)?))
        }
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            let days = v.as_i64().ok_or("a date that is not a day number")?;
            let date = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
                .and_then(|e| e.checked_add_signed(chrono::Duration::days(days)))
                .ok_or("a date out of range")?;
            Ok(Value::String(date.format("%Y-%m-%d").to_string()))
        }
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            micros(v, 1_000, 1)
        }
        "io.debezium.time.MicroTimestamp" => micros(v, 1, 1),
        "io.debezium.time.NanoTimestamp" => micros(v, 1, 1_000),
        _ => Ok(v.clone()),
    }
}

/// A number of `mul/div` microseconds as microseconds.
fn micros(v: &Value, mul: i64, div: i64) -> Result<Value, String> {
    let n = v.as_i64().ok_or("a timestamp that is not a whole number")?;
    let us = n
        .checked_mul(mul)
        .map(|x| x.div_euclid(div))
        .ok_or("a timestamp out of range")?;
    Ok(Value::from(us))
}

/// Base64 of a big-endian two's-complement integer, with `scale`, as decimal digits.
fn unscaled(b64: &str, scale: i8) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("`{b64}` is not a Debezium decimal (base64: {e})"))?;
    if bytes.len() > 16 {
        return Err(format!("`{b64}` holds more than 38 digits"));
    }
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut buf = [if negative { 0xff } else { 0 }; 16];
    buf[16 - bytes.len()..].copy_from_slice(&bytes);
    Ok(super::decimal::render(i128::from_be_bytes(buf), scale))
}

/// The metadata columns ([`META`]) from the event's `op`, `source` and own timestamps.
fn add_meta(
    object: &mut Map<String, Value>,
    op: &str,
    source: Option<&Map<String, Value>>,
    (ts_ns, ts_us, ts_ms): (Option<i64>, Option<i64>, Option<i64>),
) {
    let source_us = source.and_then(|s| {
        let n = |k: &str| s.get(k).and_then(Value::as_i64);
        n("ts_ns")
            .map(|v| v / 1_000)
            .or(n("ts_us"))
            .or(n("ts_ms").map(|v| v * 1_000))
    });
    let event_us = ts_ns
        .map(|v| v / 1_000)
        .or(ts_us)
        .or(ts_ms.map(|v| v * 1_000));
    // An initial snapshot's read is the row as of the snapshot's start: older than every
    // change the stream delivers after it, whatever the time the snapshot read it
    // (`source.ts_ms` of a read is when it was read, which can be later than a change streamed
    // after the snapshot). An incremental snapshot's read (`source.snapshot: incremental`, run
    // while streaming, often to repair rows) is the row at its read time: ordered by it.
    let incremental = source
        .and_then(|s| s.get("snapshot"))
        .and_then(Value::as_str)
        == Some("incremental");
    let sequence = match op {
        "r" if !incremental => Some(0),
        _ => source_us,
    };
    let position = source.and_then(position);
    object.insert("_op".into(), Value::from(op));
    object.insert(
        "_sequence".into(),
        sequence.map_or(Value::Null, Value::from),
    );
    object.insert(
        "_source_ts".into(),
        source_us.map_or(Value::Null, Value::from),
    );
    object.insert(
        "_source_position".into(),
        position.map_or(Value::Null, Value::from),
    );
    object.insert(
        "_event_ts".into(),
        event_us.map_or(Value::Null, Value::from),
    );
}

/// The change's position in its source's log, as text that sorts in log order: PostgreSQL's
/// LSN, MySQL's binlog file and position (and row), SQL Server's commit and change LSNs,
/// Oracle's SCN, zero-padded; `None` for other sources.
fn position(source: &Map<String, Value>) -> Option<String> {
    // (a number, or its digits as text: some converters send 64-bit positions as strings)
    let num = |k: &str| {
        let v = source.get(k)?;
        v.as_u64()
            .or_else(|| v.as_str().and_then(|t| t.parse().ok()))
    };
    let text = |k: &str| source.get(k).and_then(Value::as_str);
    match text("connector")? {
        "postgresql" => num("lsn").map(|l| format!("{l:020}")),
        "mysql" | "mariadb" => Some(format!(
            "{}:{:020}:{:010}",
            text("file")?,
            num("pos")?,
            num("row").unwrap_or(0)
        )),
        "sqlserver" => Some(format!(
            "{}:{}",
            text("commit_lsn")?,
            text("change_lsn").unwrap_or("")
        )),
        "oracle" => text("scn")
            .and_then(|s| s.parse::<u128>().ok())
            .map(|s| format!("{s:039}")),
        _ => None,
    }
}

/// The declared columns of rows in a file of events, inferred from their `after` (or
/// `before`) objects (for a pipeline without `schema:`).
pub fn infer(body: &[u8], limit: usize, out: &mut Vec<(String, Option<ColumnType>)>) {
    let mut rows = Vec::new();
    for line in body.split(|b| *b == b'\n').take(limit) {
        if let Ok(Event::Row { fields, .. }) = event(line) {
            rows.extend_from_slice(fields.as_bytes());
            rows.push(b'\n');
        }
    }
    super::json::infer(&rows, limit, out);
}

#[cfg(test)]
mod tests {
    use super::super::{test_cols, test_column as column, test_rejects, test_shape};
    use super::*;
    use crate::config::pipeline::ingest::ColumnType::*;

    fn cols() -> Vec<Col> {
        with_meta(test_cols(&[
            ("id", Long, true),
            (
                "amount",
                Decimal {
                    precision: 12,
                    scale: 2,
                },
                false,
            ),
            ("note", String, false),
            ("created", Timestamp, false),
            ("day", Date, false),
        ]))
    }

    #[test]
    fn rows_come_from_after_or_before_with_the_change_metadata() {
        let cols = cols();
        let body = br#"{"before":null,"after":{"id":1,"amount":"12.30","note":"a"},"source":{"connector":"postgresql","ts_ms":1700000000000,"lsn":123},"op":"c","ts_ms":1700000000500}
{"before":{"id":1,"amount":"12.30","note":"a"},"after":null,"source":{"connector":"postgresql","ts_us":1700000001000000,"lsn":456},"op":"d","ts_ms":1700000001500}
{"before":null,"after":{"id":2,"amount":"1.00"},"source":{"connector":"postgresql","ts_ms":1700000009000,"lsn":100,"snapshot":"true"},"op":"r"}
null
"#;
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(column(&p, "id"), ["1", "1", "2"]);
        assert_eq!(column(&p, "amount"), ["12.30", "12.30", "1.00"]);
        assert_eq!(column(&p, "_op"), ["c", "d", "r"]);
        assert_eq!(
            column(&p, "_source_position"),
            [
                "00000000000000000123",
                "00000000000000000456",
                "00000000000000000100"
            ]
        );
        assert_eq!(
            column(&p, "_sequence"),
            [
                "2023-11-14T22:13:20Z",
                "2023-11-14T22:13:21Z",
                "1970-01-01T00:00:00Z"
            ]
        );
        assert_eq!(column(&p, "_source_ts")[2], "2023-11-14T22:13:29Z");
        // an incremental snapshot's read is ordered by its read time; a position as text sorts
        let body = br#"{"after":{"id":3},"source":{"connector":"postgresql","ts_ms":1700000009000,"lsn":"789","snapshot":"incremental"},"op":"r"}
"#;
        let q = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(column(&q, "_sequence"), ["2023-11-14T22:13:29Z"]);
        assert_eq!(column(&q, "_source_position"), ["00000000000000000789"]);
        assert_eq!(column(&p, "_event_ts")[0], "2023-11-14T22:13:20.500Z");
        assert_eq!(p.truncate_at, None);
    }

    #[test]
    fn the_schema_envelope_decodes_precise_decimals_dates_and_times() {
        let cols = cols();
        // 1234 (0x04D2) = 12.34 at scale 2; -5 (0xFB) = -0.05; 19700 days; 1.7e12 ms
        let schema = r#"{"type":"struct","fields":[{"type":"struct","field":"after","fields":[{"field":"id","type":"int64"},{"field":"amount","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"}},{"field":"created","type":"int64","name":"io.debezium.time.Timestamp"},{"field":"day","type":"int32","name":"io.debezium.time.Date"}]}]}"#;
        let body = format!(
            "{{\"schema\":{schema},\"payload\":{{\"after\":{{\"id\":7,\"amount\":\"BNI=\",\"created\":1700000000000,\"day\":19700}},\"op\":\"u\",\"source\":{{\"connector\":\"mysql\",\"file\":\"bin.000003\",\"pos\":4015,\"row\":1,\"ts_ms\":1700000000000}}}}}}\n{{\"schema\":{schema},\"payload\":{{\"after\":{{\"id\":8,\"amount\":\"+w==\"}},\"op\":\"c\"}}}}\n{{\"schema\":null,\"payload\":null}}\n"
        );
        let p = parse(body.as_bytes(), &test_shape(&cols, false)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(column(&p, "amount"), ["12.34", "-0.05"]);
        assert_eq!(column(&p, "created")[0], "2023-11-14T22:13:20Z");
        assert_eq!(column(&p, "day")[0], "2023-12-09");
        assert_eq!(
            column(&p, "_source_position")[0],
            "bin.000003:00000000000000004015:0000000001"
        );
    }

    #[test]
    fn a_file_of_unwrapped_rows_is_not_debezium() {
        let cols = cols();
        let body = b"{\"id\":1,\"amount\":\"1.00\"}\n{\"id\":2}\n";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert!(p.not_debezium);
        assert!(
            test_rejects(&p)[0].1.contains("ExtractNewRecordState"),
            "{:?}",
            p.rejects
        );
        let mixed = b"{\"id\":1}\n{\"after\":{\"id\":2},\"op\":\"c\"}\n";
        let p = parse(mixed, &test_shape(&cols, false)).unwrap();
        assert!(
            !p.not_debezium,
            "one event: a Debezium file with a stray row"
        );
        assert_eq!(column(&p, "id"), ["2"]);
    }

    #[test]
    fn a_truncate_stops_the_file_and_other_events_are_rejected_with_reasons() {
        let cols = cols();
        let body = br#"{"after":{"id":1},"op":"c"}
{"op":"m","message":{"prefix":"x"}}
{"after":{"id":2,"amount":"1.234"},"op":"c"}
{"source":{"connector":"postgresql"},"databaseName":"db","ddl":"ALTER TABLE"}
{"op":"t","source":{"connector":"postgresql"}}
{"after":{"id":3},"op":"c"}
"#;
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(p.truncate_at, Some(5));
        assert_eq!(column(&p, "id"), ["1"]);
        let rejects = test_rejects(&p);
        assert_eq!(rejects.len(), 3, "{rejects:?}");
        assert!(
            rejects[0].1.contains("`m` is not a row change"),
            "{rejects:?}"
        );
        assert!(
            rejects[1].1.contains("does not fit decimal(12, 2)"),
            "{rejects:?}"
        );
        assert!(rejects[2].1.contains("no `op`"), "{rejects:?}");
    }
}
