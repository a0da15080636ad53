//! Helpers for the readers' tests (csv, json, parquet).

use super::rows::Parsed;
use super::schema::Col;
use super::Shape;
use crate::config::pipeline::ingest::{ColumnType, CsvOptions};

/// A shape for the readers' tests: `cols` (see [`test_cols`]), the default CSV options and
/// record limit.
pub(crate) fn test_shape(cols: &[Col], rescue: bool) -> Shape<'_> {
    Shape {
        cols,
        rescue,
        max_record_bytes: crate::config::pipeline::ingest::DEFAULT_MAX_RECORD_BYTES,
        csv: CsvOptions::default(),
    }
}

/// Columns for the readers' tests, from `(name, type, required)`.
pub(crate) fn test_cols(spec: &[(&str, ColumnType, bool)]) -> Vec<Col> {
    spec.iter()
        .map(|(name, ty, required)| Col {
            name: name.to_string(),
            ty: *ty,
            required: *required,
        })
        .collect()
}

/// A column of a parsed batch as text (null as `-`), for the readers' tests.
pub(crate) fn test_column(p: &Parsed, name: &str) -> Vec<String> {
    use arrow::array::Array;
    let col = p.batch.column_by_name(name).expect("a column of the batch");
    let f = arrow::util::display::ArrayFormatter::try_new(
        col.as_ref(),
        &arrow::util::display::FormatOptions::default().with_null("-"),
    )
    .expect("displayable");
    (0..col.len()).map(|i| f.value(i).to_string()).collect()
}

/// The rejects of a parse as (line, reason), for the readers' tests.
pub(crate) fn test_rejects(p: &Parsed) -> Vec<(Option<u64>, &str)> {
    p.rejects
        .iter()
        .map(|r| (r.line, r.reason.as_str()))
        .collect()
}
