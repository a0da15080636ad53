//! JSON lines: one object per line; blank lines are not records.

use serde_json::{Map, Value};

use super::rows::{Parsed, Reject, Rows};
use super::schema::{from_json, infer_json, type_name, widen, Cell, Col};
use super::Shape;

/// Parses a JSON-lines file into rows and rejects.
pub fn parse(body: &[u8], shape: &Shape<'_>) -> Result<Parsed, arrow::error::ArrowError> {
    let mut rows = Rows::new(shape.cols, shape.rescue);
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let line_no = Some(i as u64 + 1);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if line.len() as u64 > shape.max_record_bytes {
            rows.reject(Reject::new(
                line_no,
                line,
                format!(
                    "the line is {}, over `max_record_bytes` ({})",
                    crate::report::size(line.len() as u64),
                    crate::report::size(shape.max_record_bytes)
                ),
            ));
            continue;
        }
        if let Err(e) = std::str::from_utf8(line) {
            rows.reject(Reject::new(
                line_no,
                line,
                format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
            ));
            continue;
        }
        let object: Map<String, Value> = match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(m)) => m,
            Ok(other) => {
                rows.reject(Reject::new(
                    line_no,
                    line,
                    format!("not a JSON object ({})", kind(&other)),
                ));
                continue;
            }
            Err(e) => {
                rows.reject(Reject::new(line_no, line, format!("malformed JSON: {e}")));
                continue;
            }
        };
        record(&mut rows, object, line_no, line, shape);
    }
    rows.finish()
}

fn record(
    rows: &mut Rows<'_>,
    mut object: Map<String, Value>,
    line_no: Option<u64>,
    line: &[u8],
    shape: &Shape<'_>,
) {
    let mut cells = Vec::with_capacity(shape.cols.len());
    let mut rescued = Map::new();
    for col in shape.cols {
        let Some(v) = object.remove(&col.name) else {
            cells.push(Cell::Null);
            continue;
        };
        match from_json(&v, col.ty) {
            // A number that is not an integer (1e2, 1.50, a 23-digit id) keeps its digits as
            // written: its f64 would print them otherwise, and collapse two ids into one.
            Some(Cell::Str(_)) if matches!(&v, Value::Number(n) if n.is_f64()) => {
                match raw_field(line, &col.name) {
                    Some(raw) => cells.push(Cell::Str(raw)),
                    None => {
                        rows.reject(Reject::new(line_no, line, wrong_type(col, &v)));
                        return;
                    }
                }
            }
            Some(c) => cells.push(c),
            None if shape.rescue => {
                rescued.insert(col.name.clone(), v);
                cells.push(Cell::Null);
            }
            None => {
                rows.reject(Reject::new(line_no, line, wrong_type(col, &v)));
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
            rows.unknown
                .entry(k)
                .or_insert(crate::config::pipeline::ingest::ColumnType::String);
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

fn wrong_type(col: &Col, v: &Value) -> String {
    let mut shown = v.to_string();
    if shown.len() > 80 {
        shown.truncate(shown.floor_char_boundary(80));
        shown.push('…');
    }
    format!("`{}`: {shown} is not a {}", col.name, type_name(col.ty))
}

fn kind(v: &Value) -> &'static str {
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
pub fn infer(
    body: &[u8],
    limit: usize,
    out: &mut Vec<(String, Option<crate::config::pipeline::ingest::ColumnType>)>,
) {
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

/// The text of the top-level field `name` of a JSON object line, exactly as written.
fn raw_field(line: &[u8], name: &str) -> Option<String> {
    let fields: std::collections::HashMap<String, &serde_json::value::RawValue> =
        serde_json::from_slice(line).ok()?;
    fields.get(name).map(|r| r.get().to_string())
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
}
