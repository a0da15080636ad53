//! CSV files: a header row (or the declared columns, in order), a delimiter and a quote.

use serde_json::{Map, Value};

use super::rows::{Parsed, Reject, Rows};
use super::schema::{from_text, infer_text, type_name, widen, Cell};
use super::Shape;
use crate::config::pipeline::ingest::ColumnType;

fn reader<'b>(body: &'b [u8], shape: &Shape<'_>) -> csv::Reader<&'b [u8]> {
    csv::ReaderBuilder::new()
        .has_headers(shape.csv.header)
        .delimiter(shape.csv.delimiter)
        .quote(shape.csv.quote)
        .flexible(true)
        .from_reader(body)
}

fn raw(rec: &csv::ByteRecord, delimiter: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in rec.iter().enumerate() {
        if i > 0 {
            out.push(delimiter);
        }
        out.extend_from_slice(f);
    }
    out
}

/// Parses a CSV file into rows and rejects.
pub fn parse(body: &[u8], shape: &Shape<'_>) -> Result<Parsed, arrow::error::ArrowError> {
    let mut rows = Rows::new(shape.cols, shape.rescue);
    let mut rdr = reader(body, shape);
    let header: Vec<String> = if shape.csv.header {
        match rdr.byte_headers() {
            Ok(h) => h
                .iter()
                .map(|f| String::from_utf8_lossy(f).trim().to_string())
                .collect(),
            Err(e) => {
                rows.reject(Reject::new(Some(1), b"", format!("unreadable header: {e}")));
                return rows.finish();
            }
        }
    } else {
        shape.cols.iter().map(|c| c.name.clone()).collect()
    };
    if header.is_empty() || header.iter().all(String::is_empty) {
        return rows.finish();
    }
    // Which schema column each field feeds, by header position.
    let slots: Vec<Option<usize>> = header
        .iter()
        .map(|h| shape.cols.iter().position(|c| c.name == *h))
        .collect();
    let mut rec = csv::ByteRecord::new();
    loop {
        let line_no = rdr.position().line();
        match rdr.read_byte_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                rows.reject(Reject::new(
                    Some(line_no),
                    b"",
                    format!("malformed CSV: {e}"),
                ));
                break;
            }
        }
        let line_no = Some(rec.position().map_or(line_no, |p| p.line()));
        let text = raw(&rec, shape.csv.delimiter);
        if rec.len() == 1 && rec.get(0).is_some_and(<[u8]>::is_empty) {
            continue; // a blank line
        }
        if text.len() as u64 > shape.max_record_bytes {
            rows.reject(Reject::new(
                line_no,
                &text,
                format!(
                    "the row is {}, over `max_record_bytes` ({})",
                    crate::report::size(text.len() as u64),
                    crate::report::size(shape.max_record_bytes)
                ),
            ));
            continue;
        }
        if rec.len() != header.len() {
            rows.reject(Reject::new(
                line_no,
                &text,
                format!(
                    "the row has {} fields, the header {}",
                    rec.len(),
                    header.len()
                ),
            ));
            continue;
        }
        let mut cells = vec![Cell::Null; shape.cols.len()];
        let mut rescued = Map::new();
        let mut bad = None;
        for ((field, slot), name) in rec.iter().zip(&slots).zip(&header) {
            let Ok(s) = std::str::from_utf8(field) else {
                bad = Some(format!("field `{name}` is not valid UTF-8"));
                break;
            };
            match slot {
                Some(i) => match from_text(s, shape.cols[*i].ty) {
                    Some(c) => cells[*i] = c,
                    None if shape.rescue => {
                        rescued.insert(name.clone(), Value::String(s.to_string()));
                    }
                    None => {
                        bad = Some(format!(
                            "`{name}`: {s:?} is not a {}",
                            type_name(shape.cols[*i].ty)
                        ));
                        break;
                    }
                },
                None if shape.rescue => {
                    if !s.is_empty() {
                        rescued.insert(name.clone(), Value::String(s.to_string()));
                    }
                }
                None => {
                    let ty = infer_text(s).unwrap_or(ColumnType::String);
                    let e = rows.unknown.entry(name.clone()).or_insert(ty);
                    *e = widen(*e, ty);
                }
            }
        }
        if let Some(reason) = bad {
            rows.reject(Reject::new(line_no, &text, reason));
            continue;
        }
        if let Some(name) = rows.missing_required(&cells) {
            rows.reject(Reject::new(
                line_no,
                &text,
                format!("required field `{name}` is missing or empty"),
            ));
            continue;
        }
        let rescued = (!rescued.is_empty()).then(|| Value::Object(rescued).to_string());
        rows.push(cells, rescued);
    }
    rows.finish()
}

/// The header's columns with the types the first `limit` rows suggest.
pub fn infer(
    body: &[u8],
    shape: &Shape<'_>,
    limit: usize,
    out: &mut Vec<(String, Option<ColumnType>)>,
) {
    let mut rdr = reader(body, shape);
    let Ok(header) = rdr.byte_headers().cloned() else {
        return;
    };
    let names: Vec<String> = header
        .iter()
        .map(|f| String::from_utf8_lossy(f).trim().to_string())
        .collect();
    for n in &names {
        if !out.iter().any(|(m, _)| m == n) {
            out.push((n.clone(), None));
        }
    }
    let mut rec = csv::StringRecord::new();
    for _ in 0..limit {
        match rdr.read_record(&mut rec) {
            Ok(true) => {}
            _ => break,
        }
        for (f, n) in rec.iter().zip(&names) {
            let ty = infer_text(f);
            if let Some((_, t)) = out.iter_mut().find(|(m, _)| m == n) {
                *t = match (*t, ty) {
                    (Some(a), Some(b)) => Some(widen(a, b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }
}
