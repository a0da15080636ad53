//! Parquet landing files: columns cast to the schema; a value that does not cast is rescued or
//! rejects its row; a file that is not Parquet is one rejected record.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringBuilder};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::DataType;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value};

use super::rows::{Parsed, Reject};
use super::schema::{arrow_type, data_schema, from_arrow, from_text, misfit, Cell};
use super::Shape;
use crate::config::pipeline::ingest::ColumnType;

/// Parses a Parquet file into rows and rejects.
pub fn parse(body: Bytes, shape: &Shape<'_>) -> Result<Parsed, arrow::error::ArrowError> {
    let schema = data_schema(shape.cols, shape.rescue);
    let mut out = Parsed {
        batch: RecordBatch::new_empty(schema.clone()),
        rejects: Vec::new(),
        records: 0,
        rescued: 0,
        unknown: BTreeMap::new(),
        truncate_at: None,
        not_debezium: false,
    };
    let reader = match ParquetRecordBatchReaderBuilder::try_new(body).and_then(|b| b.build()) {
        Ok(r) => r,
        Err(e) => {
            out.records = 1;
            out.rejects.push(Reject::new(
                None,
                b"",
                format!("not a readable Parquet file: {e}"),
            ));
            return Ok(out);
        }
    };
    let mut batches = Vec::new();
    let mut row_base = 0u64;
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                out.records += 1;
                out.rejects.push(Reject::new(
                    Some(row_base + 1),
                    b"",
                    format!("unreadable Parquet data from this row on: {e}"),
                ));
                break;
            }
        };
        batches.push(kept_rows(&batch, shape, &schema, row_base, &mut out)?);
        out.records += batch.num_rows() as u64;
        row_base += batch.num_rows() as u64;
    }
    out.batch = arrow::compute::concat_batches(&schema, &batches)?;
    Ok(out)
}

/// One batch of the file cast to the schema: the rows that fit (rescuing what does not, when
/// the pipeline does), the others rejected into `out` with their row number.
fn kept_rows(
    batch: &RecordBatch,
    shape: &Shape<'_>,
    schema: &arrow::datatypes::SchemaRef,
    row_base: u64,
    out: &mut Parsed,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let n = batch.num_rows();
    let opts = FormatOptions::default();
    let mut columns: Vec<ArrayRef> = Vec::new();
    let mut keep = vec![true; n];
    let mut reasons: Vec<Option<String>> = vec![None; n];
    let mut rescued: Vec<Map<String, Value>> = vec![Map::new(); n];
    for col in shape.cols {
        let target = arrow_type(col.ty);
        let Some(src) = batch.column_by_name(&col.name) else {
            columns.push(arrow::array::new_null_array(&target, n));
            continue;
        };
        // A type that does not cast at all (a nested column into a number) fits no row.
        let casted =
            exact_cast(src, &target).unwrap_or_else(|_| arrow::array::new_null_array(&target, n));
        let shown = ArrayFormatter::try_new(src.as_ref(), &opts)?;
        for i in 0..n {
            if src.is_valid(i) && casted.is_null(i) {
                if shape.rescue {
                    rescued[i].insert(col.name.clone(), Value::String(shown.value(i).to_string()));
                } else if reasons[i].is_none() {
                    keep[i] = false;
                    reasons[i] = Some(misfit(&col.name, &shown.value(i).to_string(), col.ty));
                }
            }
            if col.required && casted.is_null(i) && reasons[i].is_none() {
                keep[i] = false;
                reasons[i] = Some(format!("required field `{}` is missing or null", col.name));
            }
        }
        columns.push(casted);
    }
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        if shape.cols.iter().any(|c| c.name == *field.name()) {
            continue;
        }
        if shape.rescue {
            let shown = ArrayFormatter::try_new(array.as_ref(), &opts)?;
            for (i, r) in rescued.iter_mut().enumerate() {
                if array.is_valid(i) {
                    r.insert(
                        field.name().clone(),
                        Value::String(shown.value(i).to_string()),
                    );
                }
            }
        } else {
            let ty = from_arrow(field.data_type()).unwrap_or(ColumnType::String);
            out.unknown.entry(field.name().clone()).or_insert(ty);
        }
    }
    if shape.rescue {
        let mut b = StringBuilder::new();
        for r in &rescued {
            if r.is_empty() {
                b.append_null();
            } else {
                b.append_value(Value::Object(r.clone()).to_string());
            }
        }
        out.rescued += rescued
            .iter()
            .zip(&keep)
            .filter(|(r, k)| **k && !r.is_empty())
            .count() as u64;
        columns.push(Arc::new(b.finish()));
    }
    for (i, reason) in reasons.into_iter().enumerate() {
        if let Some(reason) = reason {
            out.rejects.push(Reject::new(
                Some(row_base + i as u64 + 1),
                row_text(batch, i).as_bytes(),
                reason,
            ));
        }
    }
    let full = RecordBatch::try_new(schema.clone(), columns)?;
    filter_record_batch(&full, &BooleanArray::from(keep))
}

/// `src` cast to `target`, with the values that would lose information null (they do not fit:
/// rejected or rescued by the caller): a double or decimal into an integer column must be a
/// whole number in range — Arrow's cast truncates 4.7 to 4 and 3.99 to 3 — and anything into a
/// decimal column must keep its value (Arrow's cast rounds 12.345 to 12.35).
fn exact_cast(src: &ArrayRef, target: &DataType) -> Result<ArrayRef, arrow::error::ArrowError> {
    let from = src.data_type();
    if let (DataType::Decimal128(p, s), true) = (target, is_text(from)) {
        return text_to_decimal(src, *p, *s);
    }
    let casted = cast(src, target)?;
    let lossy = (target.is_integer()
        && (from.is_floating()
            || matches!(from, DataType::Decimal128(..) | DataType::Decimal256(..))))
        || (matches!(target, DataType::Decimal128(..)) && from != target);
    if !lossy {
        return Ok(casted);
    }
    let back = cast(&casted, from)?;
    let same = arrow::compute::kernels::cmp::eq(&back, src)?;
    // (null on either side: nothing to lose)
    let differs: BooleanArray = same.iter().map(|v| Some(v == Some(false))).collect();
    arrow::compute::nullif(&casted, &differs)
}

fn is_text(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// A text column's values as exact decimals (null where one does not parse or fit).
fn text_to_decimal(
    src: &ArrayRef,
    precision: u8,
    scale: i8,
) -> Result<ArrayRef, arrow::error::ArrowError> {
    let text = cast(src, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    let ty = ColumnType::Decimal { precision, scale };
    let values: arrow::array::Decimal128Array = text
        .iter()
        .map(|t| match t.and_then(|t| from_text(t, ty)) {
            Some(Cell::Dec(v)) => Some(v),
            _ => None,
        })
        .collect();
    Ok(Arc::new(values.with_precision_and_scale(precision, scale)?))
}

/// A row of the file as JSON text, for the quarantine table.
fn row_text(batch: &RecordBatch, i: usize) -> String {
    let opts = FormatOptions::default();
    let mut m = Map::new();
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        if array.is_null(i) {
            m.insert(field.name().clone(), Value::Null);
        } else if let Ok(f) = ArrayFormatter::try_new(array.as_ref(), &opts) {
            m.insert(field.name().clone(), Value::String(f.value(i).to_string()));
        }
    }
    Value::Object(m).to_string()
}

/// The file's columns with their types (for a pipeline inferring its schema).
pub fn infer(body: Bytes, out: &mut Vec<(String, Option<ColumnType>)>) {
    let Ok(b) = ParquetRecordBatchReaderBuilder::try_new(body) else {
        return;
    };
    for f in b.schema().fields() {
        if !out.iter().any(|(n, _)| n == f.name()) {
            let ty = match f.data_type() {
                DataType::Null => None,
                dt => Some(from_arrow(dt).unwrap_or(ColumnType::String)),
            };
            out.push((f.name().clone(), ty));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_cols, test_column as column, test_rejects, test_shape};
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use ColumnType::*;

    fn file(batch: &RecordBatch) -> Bytes {
        let mut out = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    fn landing() -> Bytes {
        file(
            &RecordBatch::try_from_iter([
                (
                    "id",
                    Arc::new(StringArray::from(vec![
                        Some("a"),
                        None,
                        Some("c"),
                        Some("d"),
                    ])) as ArrayRef,
                ),
                (
                    "amount",
                    Arc::new(Float64Array::from(vec![1.0, 2.0, 4.7, f64::NAN])),
                ),
                ("extra", Arc::new(Int64Array::from(vec![7, 8, 9, 10]))),
            ])
            .unwrap(),
        )
    }

    #[test]
    fn columns_are_cast_exactly_and_rows_that_do_not_fit_are_rejected() {
        let cols = test_cols(&[
            ("id", String, true),
            ("amount", Long, false),
            ("gone", Int, false),
        ]);
        let p = parse(landing(), &test_shape(&cols, false)).unwrap();
        assert_eq!(p.records, 4);
        assert_eq!(column(&p, "id"), ["a"]);
        assert_eq!(column(&p, "amount"), ["1"]);
        assert_eq!(column(&p, "gone"), ["-"], "a column the file lacks is null");
        let got = test_rejects(&p);
        assert_eq!(
            got,
            vec![
                (Some(2), "required field `id` is missing or null"),
                (Some(3), "`amount`: 4.7 is not a long"),
                (Some(4), "`amount`: NaN is not a long"),
            ]
        );
        assert_eq!(p.unknown.get("extra"), Some(&Long));
    }

    #[test]
    fn rescue_keeps_the_rows_with_what_did_not_fit() {
        let cols = test_cols(&[("id", String, false), ("amount", Long, false)]);
        let p = parse(landing(), &test_shape(&cols, true)).unwrap();
        assert!(p.rejects.is_empty(), "{:?}", p.rejects);
        assert_eq!(column(&p, "amount"), ["1", "2", "-", "-"]);
        let rescued = column(&p, crate::config::pipeline::ingest::RESCUED);
        assert_eq!(rescued[2], r#"{"amount":"4.7","extra":"9"}"#);
        assert_eq!(p.rescued, 4, "every row carries `extra`");
    }

    #[test]
    fn a_file_that_is_not_parquet_is_one_rejected_record() {
        let cols = test_cols(&[("id", String, false)]);
        let p = parse(Bytes::from_static(b"id\na\n"), &test_shape(&cols, false)).unwrap();
        assert_eq!((p.records, p.batch.num_rows()), (1, 0));
        assert_eq!(p.rejects[0].line, None);
        assert!(p.rejects[0]
            .reason
            .starts_with("not a readable Parquet file"));
        let mut out = Vec::new();
        infer(landing(), &mut out);
        assert_eq!(
            out,
            vec![
                ("id".to_string(), Some(String)),
                ("amount".to_string(), Some(Double)),
                ("extra".to_string(), Some(Long)),
            ]
        );
    }

    #[test]
    fn decimal_columns_cast_only_when_exact() {
        let amounts = arrow::array::Decimal128Array::from(vec![Some(12_340), Some(12_345), None])
            .with_precision_and_scale(10, 3)
            .unwrap();
        let text = StringArray::from(vec!["0.10", "0.105", "x"]);
        let body = file(
            &RecordBatch::try_from_iter([
                ("amount", Arc::new(amounts) as ArrayRef),
                ("fee", Arc::new(text) as ArrayRef),
            ])
            .unwrap(),
        );
        let dec = Decimal {
            precision: 12,
            scale: 2,
        };
        let cols = test_cols(&[("amount", dec, false), ("fee", dec, false)]);
        let p = parse(body.clone(), &test_shape(&cols, false)).unwrap();
        assert_eq!(
            p.batch.schema().field(0).data_type(),
            &DataType::Decimal128(12, 2)
        );
        assert_eq!(column(&p, "amount"), ["12.34"]);
        assert_eq!(column(&p, "fee"), ["0.10"]);
        assert_eq!(
            test_rejects(&p),
            vec![
                (
                    Some(2),
                    "`amount` = 12.345 does not fit decimal(12, 2): 3 decimal places, at most 2"
                ),
                (Some(3), "`fee`: x is not a decimal(12, 2)"),
            ]
        );
        let mut out = Vec::new();
        infer(body, &mut out);
        assert_eq!(
            out[0],
            (
                "amount".to_string(),
                Some(Decimal {
                    precision: 10,
                    scale: 3
                })
            )
        );
    }
}
