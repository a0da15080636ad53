//! CSV files: a header row (or the declared columns, in order), a delimiter and a quote.

use serde_json::{Map, Value};

use super::rows::{Parsed, Reject, Rows};
use super::schema::{from_text, infer_text, misfit, widen, Cell};
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
        match cells(&rec, &header, &slots, shape, &mut rows) {
            Ok((cells, rescued)) => {
                let rescued = (!rescued.is_empty()).then(|| Value::Object(rescued).to_string());
                rows.push(cells, rescued);
            }
            Err(reason) => rows.reject(Reject::new(line_no, &text, reason)),
        }
    }
    rows.finish()
}

/// One row's typed cells (and, rescuing, the fields that did not fit), or why it is rejected.
fn cells(
    rec: &csv::ByteRecord,
    header: &[String],
    slots: &[Option<usize>],
    shape: &Shape<'_>,
    rows: &mut Rows<'_>,
) -> Result<(Vec<Cell>, Map<String, Value>), String> {
    let mut cells = vec![Cell::Null; shape.cols.len()];
    let mut rescued = Map::new();
    for ((field, slot), name) in rec.iter().zip(slots).zip(header) {
        let Ok(s) = std::str::from_utf8(field) else {
            return Err(format!("field `{name}` is not valid UTF-8"));
        };
        match slot {
            Some(i) => match from_text(s, shape.cols[*i].ty) {
                Some(c) => cells[*i] = c,
                None if shape.rescue => {
                    rescued.insert(name.clone(), Value::String(s.to_string()));
                }
                None => return Err(misfit(name, &format!("{s:?}"), shape.cols[*i].ty)),
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
    // (CSV has no null: an empty field of a required text column is as missing as any)
    let empty_text = shape
        .cols
        .iter()
        .zip(&cells)
        .find(|(c, v)| c.required && matches!(v, Cell::Str(s) if s.trim().is_empty()))
        .map(|(c, _)| c.name.as_str());
    if let Some(name) = rows.missing_required(&cells).or(empty_text) {
        return Err(format!("required field `{name}` is missing or empty"));
    }
    Ok((cells, rescued))
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

#[cfg(test)]
mod tests {
    use super::super::{test_cols, test_column as column, test_rejects, test_shape};
    use super::*;
    use ColumnType::*;

    fn cols() -> Vec<super::super::schema::Col> {
        test_cols(&[
            ("id", String, true),
            ("amount", Long, false),
            ("at", Timestamp, false),
        ])
    }

    #[test]
    fn typed_rows_quoted_fields_and_a_last_line_without_newline() {
        let cols = cols();
        let body =
            b"id,amount,at\n\"p,1\",100,2024-01-05T10:00:00Z\n\np2,,2024-01-05 11:00:00\np3,-7,";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(p.records, 3, "a blank line is not a record");
        assert_eq!(column(&p, "id"), ["p,1", "p2", "p3"]);
        assert_eq!(column(&p, "amount"), ["100", "-", "-7"]);
        assert_eq!(
            column(&p, "at"),
            ["2024-01-05T10:00:00Z", "2024-01-05T11:00:00Z", "-"]
        );
    }

    #[test]
    fn bad_rows_are_rejected_with_their_line_and_the_rest_kept() {
        let cols = cols();
        let body = b"id,amount,at\np1,ten,\n,5,\np3,1,2,3\np4,\xff1,\np5,1,\n";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        let got = test_rejects(&p);
        assert_eq!(
            got,
            vec![
                (Some(2), "`amount`: \"ten\" is not a long"),
                (Some(3), "required field `id` is missing or empty"),
                (Some(4), "the row has 4 fields, the header 3"),
                (Some(5), "field `amount` is not valid UTF-8"),
            ]
        );
        assert_eq!(column(&p, "id"), ["p5"]);
        assert_eq!(p.records, 5);
    }

    #[test]
    fn rescue_keeps_the_row_and_unknown_columns_are_reported() {
        let cols = cols();
        let body = b"id,amount,extra\np1,ten,x\np2,3,4\n";
        let p = parse(body, &test_shape(&cols, true)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(
            column(&p, crate::config::pipeline::ingest::RESCUED),
            [r#"{"amount":"ten","extra":"x"}"#, r#"{"extra":"4"}"#]
        );
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(p.rejects.len(), 1);
        // (the rejected row's fields past its bad one are not looked at)
        assert_eq!(p.unknown.get("extra"), Some(&Long));
        let p = parse(b"id,extra\np1,4\np2,x\n", &test_shape(&cols, false)).unwrap();
        assert_eq!(p.unknown.get("extra"), Some(&String), "x widens 4 to text");
    }

    #[test]
    fn without_a_header_the_declared_columns_are_read_in_order() {
        let cols = cols();
        let mut shape = test_shape(&cols, false);
        shape.csv.header = false;
        shape.csv.delimiter = b';';
        let p = parse(b"p1;2;\n", &shape).unwrap();
        assert_eq!(
            (column(&p, "id"), column(&p, "amount")),
            (vec!["p1".into()], vec!["2".into()])
        );
    }

    #[test]
    fn a_row_over_the_record_limit_is_rejected_not_parsed() {
        let cols = cols();
        let mut shape = test_shape(&cols, false);
        shape.max_record_bytes = 10;
        let p = parse(b"id,amount,at\np1,1,\np-much-too-long,1,\n", &shape).unwrap();
        assert_eq!(column(&p, "id"), ["p1"]);
        assert!(
            p.rejects[0].reason.contains("over `max_record_bytes`"),
            "{:?}",
            p.rejects
        );
    }

    #[test]
    fn decimals_parse_exactly_and_misfits_are_rejected_with_their_line() {
        let cols = test_cols(&[
            ("id", String, true),
            (
                "amount",
                Decimal {
                    precision: 5,
                    scale: 2,
                },
                false,
            ),
        ]);
        let body = b"id,amount\np1,0.10\np2, 0.20 \np3,\np4,1.005\np5,1000\np6,-0.00\np7,1e2\np8,Infinity\n";
        let p = parse(body, &test_shape(&cols, false)).unwrap();
        assert_eq!(
            column(&p, "amount"),
            ["0.10", "0.20", "-", "0.00", "100.00"]
        );
        assert_eq!(
            test_rejects(&p),
            vec![
                (
                    Some(5),
                    "`amount` = 1.005 does not fit decimal(5, 2): 3 decimal places, at most 2"
                ),
                (
                    Some(6),
                    "`amount` = 1000 does not fit decimal(5, 2): 4 digits before the point, at most 3"
                ),
                (Some(9), "`amount`: \"Infinity\" is not a decimal(5, 2)"),
            ]
        );
    }
}
