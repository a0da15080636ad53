//! JSON lines: one object per line; blank lines are not records.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::rows::{Parsed, Reject, Rows};
use super::schema::{from_json, from_text, infer_json, misfit, widen, Cell, Col};
use super::Shape;
use crate::config::pipeline::ingest::ColumnType;

/// Parses a JSON-lines file into rows and rejects.
pub fn parse(body: &[u8], shape: &Shape<'_>) -> Result<Parsed, arrow::error::ArrowError> {
    let mut rows = Rows::new(shape.cols, shape.rescue);
    for_each_line(body, shape, &mut rows, |rows, line_no, line| {
        document(rows, line_no, line, shape)
    });
    rows.finish()
}

/// One JSON document (a file's line, a Kafka message's value) into a row, or a reject.
pub(super) fn document(rows: &mut Rows<'_>, line_no: Option<u64>, doc: &[u8], shape: &Shape<'_>) {
    if let Some(object) = object_of(rows, line_no, doc) {
        record(rows, object, line_no, doc, doc, shape);
    }
}

/// Calls `f` with each line of a JSON-lines body that may hold a record (number from 1, text
/// without its line end); blank lines are skipped, and lines over `max_record_bytes` or not
/// UTF-8 rejected.
pub(super) fn for_each_line(
    body: &[u8],
    shape: &Shape<'_>,
    rows: &mut Rows<'_>,
    mut f: impl FnMut(&mut Rows<'_>, Option<u64>, &[u8]),
) {
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let line_no = Some(i as u64 + 1);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if admissible(rows, line_no, line, shape) {
            f(rows, line_no, line);
        }
    }
}

/// Whether a record may be parsed: within `max_record_bytes` and UTF-8 (otherwise it is
/// rejected, and `false`).
pub(super) fn admissible(
    rows: &mut Rows<'_>,
    line_no: Option<u64>,
    line: &[u8],
    shape: &Shape<'_>,
) -> bool {
    if line.len() as u64 > shape.max_record_bytes {
        rows.reject(Reject::new(
            line_no,
            line,
            format!(
                "the {} is {}, over `max_record_bytes` ({})",
                if line_no.is_some() { "line" } else { "value" },
                crate::report::size(line.len() as u64),
                crate::report::size(shape.max_record_bytes)
            ),
        ));
        return false;
    }
    if let Err(e) = std::str::from_utf8(line) {
        rows.reject(Reject::new(
            line_no,
            line,
            format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
        ));
        return false;
    }
    true
}

/// The JSON object a line holds; a line that is not one is rejected (`None`).
pub(super) fn object_of(
    rows: &mut Rows<'_>,
    line_no: Option<u64>,
    line: &[u8],
) -> Option<Map<String, Value>> {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(m)) => Some(m),
        Ok(other) => {
            rows.reject(Reject::new(
                line_no,
                line,
                format!("not a JSON object ({})", kind(&other)),
            ));
            None
        }
        Err(e) => match out_of_range(line) {
            Some(m) => Some(m),
            None => {
                rows.reject(Reject::new(line_no, line, format!("malformed JSON: {e}")));
                None
            }
        },
    }
}

/// A line whose only fault is a number beyond an f64 (`1e400`, which serde_json refuses): its
/// fields, such numbers as their text as written — a string column keeps them, any other
/// column says they do not fit, instead of calling the line malformed.
fn out_of_range(line: &[u8]) -> Option<Map<String, Value>> {
    let raw: HashMap<String, &RawValue> = serde_json::from_slice(line).ok()?;
    let mut out = Map::new();
    for (k, v) in raw {
        let value = serde_json::from_str::<Value>(v.get())
            .unwrap_or_else(|_| Value::String(v.get().to_string()));
        out.insert(k, value);
    }
    Some(out)
}

/// One record's fields into a row (or a reject naming the field that does not fit). `line` is
/// the record as delivered (what a reject keeps); `fields` the JSON text of `object` (a
/// number's digits as written are read from it).
pub(super) fn record(
    rows: &mut Rows<'_>,
    mut object: Map<String, Value>,
    line_no: Option<u64>,
    line: &[u8],
    fields: &[u8],
    shape: &Shape<'_>,
) {
    let mut cells = Vec::with_capacity(shape.cols.len());
    let mut rescued = Map::new();
    let mut raw = RawFields::new(fields);
    for col in shape.cols {
        let Some(v) = object.remove(&col.name) else {
            cells.push(Cell::Null);
            continue;
        };
        // A number that is not an integer (1e2, 1.50, a 23-digit id) keeps its digits as
        // written: its f64 would print them otherwise (and collapse two ids into one, or round
        // a decimal).
        let keeps_digits = matches!(col.ty, ColumnType::String | ColumnType::Decimal { .. });
        let written = match &v {
            Value::Number(n) if n.is_f64() && keeps_digits => match raw.get(&col.name) {
                Some(t) => Some(t),
                None => {
                    rows.reject(Reject::new(line_no, line, wrong_type(col, &v, None)));
                    return;
                }
            },
            _ => None,
        };
        let cell = match &written {
            Some(t) if col.ty == ColumnType::String => Some(Cell::Str(t.clone())),
            Some(t) => from_text(t, col.ty),
            None => from_json(&v, col.ty),
        };
        match cell {
            Some(c) => cells.push(c),
            None if shape.rescue => {
                // (a decimal's digits as written: its f64 may have lost some)
                rescued.insert(col.name.clone(), written.map_or(v, Value::String));
                cells.push(Cell::Null);
            }
            None => {
                let why = wrong_type(col, &v, written.as_deref());
                rows.reject(Reject::new(line_no, line, why));
                return;
            }
        }
    }
    for (k, v) in object {
        if shape.rescue {
            rescued.insert(k, v);
        } else if let Some(ty) = infer_json(&v) {
            let e = rows.unknown.entry(k).or_insert(ty);
            *e = widen(*e, ty);
        } else {
            rows.unknown.entry(k).or_insert(ColumnType::String);
        }
    }
    if let Some(name) = rows.missing_required(&cells) {
        let why = if rescued.contains_key(name) {
            format!(
                "required field `{name}` has a value of the wrong type (rescued: {})",
                rescued.get(name).map(Value::to_string).unwrap_or_default()
            )
        } else {
            format!("required field `{name}` is missing or null")
        };
        rows.reject(Reject::new(line_no, line, why));
        return;
    }
    let rescued = (!rescued.is_empty()).then(|| Value::Object(rescued).to_string());
    rows.push(cells, rescued);
}

/// Why `v` (written as `written`, for a number kept as written) does not fit `col`.
fn wrong_type(col: &Col, v: &Value, written: Option<&str>) -> String {
    let mut shown = written.map_or_else(|| v.to_string(), str::to_string);
    if shown.len() > 80 {
        shown.truncate(shown.floor_char_boundary(80));
        shown.push('…');
    }
    misfit(&col.name, &shown, col.ty)
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The columns of JSON-lines records, in first-seen order, with the types their values
/// suggest (for a pipeline without a declared schema and a bronze table to take one from).
pub fn infer(body: &[u8], limit: usize, out: &mut Vec<(String, Option<ColumnType>)>) {
    for line in body.split(|b| *b == b'\n').take(limit) {
        let Ok(Ordered(m)) = serde_json::from_slice::<Ordered>(line) else {
            continue;
        };
        for (k, v) in m {
            let ty = infer_json(&v);
            match out.iter_mut().find(|(n, _)| *n == k) {
                Some((_, t)) => {
                    *t = match (*t, ty) {
                        (Some(a), Some(b)) => Some(widen(a, b)),
                        (a, b) => a.or(b),
                    }
                }
                None => out.push((k, ty)),
            }
        }
    }
}

/// A JSON object's fields in the order written (serde_json's map sorts them): inferred
/// columns follow the producer's order.
struct Ordered(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// The top-level fields of a JSON object line exactly as written, read once per line and only
/// when a number's digits are wanted.
struct RawFields<'l> {
    line: &'l [u8],
    fields: Option<HashMap<String, &'l RawValue>>,
}

impl<'l> RawFields<'l> {
    fn new(line: &'l [u8]) -> Self {
        RawFields { line, fields: None }
    }

    /// The text of field `name`, as written.
    fn get(&mut self, name: &str) -> Option<String> {
        if self.fields.is_none() {
            self.fields = serde_json::from_slice(self.line).ok();
        }
        let fields = self.fields.as_ref()?;
        fields.get(name).map(|r| r.get().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_cols, test_column as column, test_rejects, test_shape};
    use super::*;
    use crate::config::pipeline::ingest::ColumnType::*;

    fn cols() -> Vec<Col> {
        test_cols(&[
            ("id", String, true),
            ("amount", Long, false),
            ("rate", Double, false),
        ])
    }

    #[test]
    fn a_number_beyond_a_double_is_text_for_a_string_and_a_misfit_elsewhere() {
        let cols = test_cols(&[("id", String, true), ("amount", Long, false)]);
        let body = b"{\"id\": 1e400, \"amount\": 1}\n{\"id\": \"b\", \"amount\": 1e400}\n";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(column(&p, "id"), ["1e400"]);
        let rejects = test_rejects(&p);
        assert_eq!(rejects.len(), 1, "{rejects:?}");
        assert!(rejects[0].1.contains("is not a long"), "{rejects:?}");
    }

    #[test]
    fn objects_become_rows_and_ids_keep_their_digits() {
        let cols = cols();
        // CRLF, a blank line, a 23-digit id, -0.0, and a last line cut off without a newline
        let body = b"{\"id\": 12345678901234567890123, \"amount\": 5, \"rate\": -0.0}\r\n\n{\"id\": \"b\", \"amount\": null}\n{\"id\": \"c\"}";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(column(&p, "id"), ["12345678901234567890123", "b", "c"]);
        assert_eq!(column(&p, "amount"), ["5", "-", "-"]);
        assert_eq!(column(&p, "rate")[0], "-0.0");
    }

    #[test]
    fn lines_that_are_not_records_are_rejected_with_their_line() {
        let cols = cols();
        let body = b"{\"id\": \"a\"}\n[1]\n{\"id\": \"b\",\n{\"amount\": 1}\n{\"id\": \"e\", \"amount\": 1.5}\n\xff\n{\"id\": \"ok\"}\n";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        let got: Vec<(Option<u64>, &str)> = test_rejects(&p)
            .into_iter()
            .map(|(line, reason)| (line, reason.split(':').next().unwrap_or("")))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(2), "not a JSON object (an array)"),
                (Some(3), "malformed JSON"),
                (Some(4), "required field `id` is missing or null"),
                (Some(5), "`amount`"),
                (Some(6), "not valid UTF-8 (at byte 0)"),
            ]
        );
        assert_eq!(column(&p, "id"), ["a", "ok"]);
        assert_eq!(p.records, 7);
    }

    #[test]
    fn rescue_and_unknown_fields() {
        let cols = cols();
        let body =
            b"{\"id\": \"a\", \"amount\": \"lots\", \"note\": 1}\n{\"id\": \"b\", \"note\": 2.5}\n";
        let p = parse(body, &test_shape(&cols, true)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(p.rescued, 2);
        assert_eq!(
            column(&p, crate::config::pipeline::ingest::RESCUED),
            [r#"{"amount":"lots","note":1}"#, r#"{"note":2.5}"#]
        );
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(p.rejects.len(), 1);
        assert_eq!(p.unknown.get("note"), Some(&Double), "1 widened by 2.5");
    }

    #[test]
    fn inference_follows_the_producers_field_order() {
        let mut out = Vec::new();
        infer(
            b"{\"z\": 1, \"a\": \"x\"}\n{\"z\": 1.5, \"m\": true}\n",
            10,
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                ("z".to_string(), Some(Double)),
                ("a".to_string(), Some(String)),
                ("m".to_string(), Some(Boolean)),
            ]
        );
    }

    #[test]
    fn decimals_keep_the_digits_as_written_and_misfits_are_rejected() {
        let cols = test_cols(&[
            ("id", String, true),
            (
                "amount",
                Decimal {
                    precision: 38,
                    scale: 2,
                },
                false,
            ),
        ]);
        let body = concat!(
            "{\"id\": \"a\", \"amount\": 0.10}\n",
            "{\"id\": \"b\", \"amount\": 12345678901234567890123.45}\n",
            "{\"id\": \"c\", \"amount\": \" 12.30 \"}\n",
            "{\"id\": \"d\", \"amount\": -0.00}\n",
            "{\"id\": \"e\", \"amount\": 1.5e2}\n",
            "{\"id\": \"f\", \"amount\": 7}\n",
            "{\"id\": \"g\", \"amount\": 12.345}\n",
            "{\"id\": \"h\", \"amount\": \"NaN\"}\n",
            "{\"id\": \"i\", \"amount\": 1e40}\n",
            "{\"id\": \"j\", \"amount\": true}\n",
        );
        let p = parse(body.as_bytes(), &test_shape(&cols, false)).unwrap();
        assert_eq!(
            column(&p, "amount"),
            [
                "0.10",
                "12345678901234567890123.45",
                "12.30",
                "0.00",
                "150.00",
                "7.00"
            ]
        );
        assert_eq!(
            test_rejects(&p),
            vec![
                (
                    Some(7),
                    "`amount` = 12.345 does not fit decimal(38, 2): 3 decimal places, at most 2"
                ),
                (Some(8), "`amount`: \"NaN\" is not a decimal(38, 2)"),
                (
                    Some(9),
                    "`amount` = 1e40 does not fit decimal(38, 2): 41 digits before the point, at most 36"
                ),
                (Some(10), "`amount`: true is not a decimal(38, 2)"),
            ]
        );
        let p = parse(body.as_bytes(), &test_shape(&cols, true)).unwrap();
        let rescued = column(&p, crate::config::pipeline::ingest::RESCUED);
        assert_eq!(
            rescued[6], r#"{"amount":"12.345"}"#,
            "the digits as written"
        );
    }
}
