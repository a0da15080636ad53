//! Message values into rows (through the same JSON and Debezium record code as landing files),
//! with the Kafka columns of each row, and the values that do not parse as quarantine rows.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::error::ArrowError;
use base64::Engine;

use super::broker::Message;
use crate::config::pipeline::ingest::{ColumnType, Format, INGESTED_AT};
use crate::config::pipeline::kafka::{HEADERS, KEY, OFFSET, PARTITION, TIMESTAMP};
use crate::ingest::rows::{Parsed, Rows};
use crate::ingest::schema::arrow_type;
use crate::ingest::{debezium, json, Shape};
use crate::run::quarantine::REASON_COLUMN;

/// The prefix of a key or header value stored in base64 (not UTF-8, or text that starts with
/// it): every other value is the bytes' UTF-8 text.
pub const BASE64_PREFIX: &str = "base64:";

/// The columns a Kafka ingest adds to each row, with their types.
pub fn columns() -> [(&'static str, DataType); 6] {
    [
        (INGESTED_AT, arrow_type(ColumnType::Timestamp)),
        (PARTITION, DataType::Int32),
        (OFFSET, DataType::Int64),
        (TIMESTAMP, arrow_type(ColumnType::Timestamp)),
        (KEY, DataType::Utf8),
        (HEADERS, DataType::Utf8),
    ]
}

/// What decoding the fetched messages gave.
pub struct Decoded {
    pub parsed: Parsed,
    /// The message of each row, by index into the messages.
    pub row_of: Vec<usize>,
    /// The message of each reject.
    pub reject_of: Vec<usize>,
    /// Messages without a row or a reject: null values, Debezium tombstones.
    pub tombstones: u64,
    /// A Debezium truncate event's message (decoding stopped there).
    pub truncate: Option<usize>,
}

/// Decodes each message's value as one `format` document.
pub fn decode(
    messages: &[Message],
    shape: &Shape<'_>,
    format: Format,
) -> Result<Decoded, ArrowError> {
    let mut rows = Rows::new(shape.cols, shape.rescue);
    let (mut row_of, mut reject_of, mut tombstones, mut truncate) = (vec![], vec![], 0, None);
    for (i, m) in messages.iter().enumerate() {
        let Some(value) = &m.value else {
            tombstones += 1;
            continue;
        };
        let (rejects, records) = (rows.rejects.len(), rows.records);
        if json::admissible(&mut rows, None, value, shape) {
            match format {
                Format::Debezium => {
                    if debezium::document(&mut rows, None, value, shape) == debezium::Doc::Truncate
                    {
                        truncate = Some(i);
                        break;
                    }
                }
                _ => json::document(&mut rows, None, value, shape),
            }
        }
        if rows.rejects.len() > rejects {
            reject_of.push(i);
        } else if rows.records > records {
            row_of.push(i);
        } else {
            tombstones += 1;
        }
    }
    Ok(Decoded {
        parsed: rows.finish()?,
        row_of,
        reject_of,
        tombstones,
        truncate,
    })
}

/// Bytes as text, losslessly: their UTF-8 text, or [`BASE64_PREFIX`] and their base64.
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(t) if !t.starts_with(BASE64_PREFIX) => t.to_string(),
        _ => format!(
            "{BASE64_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ),
    }
}

/// The headers as a JSON object of text values (see [`text`]).
fn headers_json(m: &Message) -> String {
    let map: serde_json::Map<String, serde_json::Value> = m
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(text(v))))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// The Kafka columns of the rows (and their `_ingested_at`), by name.
pub fn row_columns(
    messages: &[Message],
    row_of: &[usize],
    ingested_us: i64,
) -> Vec<(&'static str, ArrayRef)> {
    let rows: Vec<&Message> = row_of.iter().filter_map(|i| messages.get(*i)).collect();
    let ts = |v: Vec<i64>| Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"));
    vec![
        (INGESTED_AT, ts(vec![ingested_us; rows.len()])),
        (
            PARTITION,
            Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|m| m.partition),
            )),
        ),
        (
            OFFSET,
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|m| m.offset))),
        ),
        (
            TIMESTAMP,
            ts(rows
                .iter()
                .map(|m| m.timestamp.timestamp_micros())
                .collect()),
        ),
        (
            KEY,
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.key.as_deref().map(text)),
            )),
        ),
        (
            HEADERS,
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|m| headers_json(m)),
            )),
        ),
    ]
}

/// The rejected values as quarantine rows: topic, partition, offset, the value, the reason.
pub fn rejects_batch(
    topic: &str,
    messages: &[Message],
    d: &Decoded,
) -> Result<Option<RecordBatch>, ArrowError> {
    if d.parsed.rejects.is_empty() {
        return Ok(None);
    }
    let of: Vec<&Message> = d
        .reject_of
        .iter()
        .filter_map(|i| messages.get(*i))
        .collect();
    let schema = Schema::new(vec![
        Field::new("_kafka_topic", DataType::Utf8, false),
        Field::new(PARTITION, DataType::Int32, false),
        Field::new(OFFSET, DataType::Int64, false),
        Field::new("_record", DataType::Utf8, false),
        Field::new(REASON_COLUMN, DataType::Utf8, false),
    ]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![topic; of.len()])),
        Arc::new(Int32Array::from_iter_values(of.iter().map(|m| m.partition))),
        Arc::new(Int64Array::from_iter_values(of.iter().map(|m| m.offset))),
        Arc::new(StringArray::from_iter_values(
            d.parsed.rejects.iter().map(|r| r.record.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            d.parsed.rejects.iter().map(|r| r.reason.as_str()),
        )),
    ];
    RecordBatch::try_new(Arc::new(schema), columns).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_kept_losslessly() {
        assert_eq!(text(b"k-1"), "k-1");
        assert_eq!(text(&[0xff, 0x00]), "base64:/wA=");
        assert_eq!(text(b"base64:x"), "base64:YmFzZTY0Ong=");
    }
}
