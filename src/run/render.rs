//! Values and keys rendered for people: in messages, quarantine reasons and reconcile reports.

use arrow::array::{Array, RecordBatch};
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};

/// A value as people read it in messages and reports: `None` for null, long values cut (a
/// 1 MB payload is still reported, not printed).
pub(crate) fn render_value(col: &dyn Array, row: usize) -> Result<Option<String>, ArrowError> {
    const MAX: usize = 120;
    if col.is_null(row) {
        return Ok(None);
    }
    let f = ArrayFormatter::try_new(col, &FormatOptions::default())?;
    let s = f.value(row).to_string();
    let chars = s.chars().count();
    Ok(Some(if chars > MAX {
        format!(
            "{}… ({chars} characters)",
            s.chars().take(MAX).collect::<String>()
        )
    } else {
        s
    }))
}

/// `k1="v1", k2=7, k3=null` for the key columns of a row. Text values are quoted and escaped,
/// so control characters, RTL marks and trailing spaces in a key show in the message; numbers,
/// dates and times are written as they are (`id=42`, not `id="42"`).
pub(crate) fn render_key(batch: &RecordBatch, keys: &[String], row: usize) -> String {
    keys.iter()
        .map(|k| {
            let col = batch.column_by_name(k);
            let text = col.is_some_and(|c| is_text(c.data_type()));
            let v = col
                .and_then(|c| render_value(c.as_ref(), row).ok().flatten())
                .map_or_else(
                    || "null".to_string(),
                    |v| match text {
                        true => format!("{v:?}"),
                        false => v,
                    },
                );
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether values of `t` are text a reader must see quoted (where a space or control character
/// matters), including dictionary-encoded text.
fn is_text(t: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType::*;
    match t {
        Utf8 | LargeUtf8 | Utf8View => true,
        Dictionary(_, v) => is_text(v),
        _ => false,
    }
}

/// Rows in a set of batches.
pub fn row_count(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn keys_quote_text_and_write_numbers_as_they_are() {
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![Some(42), None])) as _),
            ("region", Arc::new(StringArray::from(vec!["eu ", "7"])) as _),
        ])
        .expect("batch");
        let keys = ["id".to_string(), "region".to_string()];
        assert_eq!(render_key(&batch, &keys, 0), "id=42, region=\"eu \"");
        assert_eq!(render_key(&batch, &keys, 1), "id=null, region=\"7\"");
    }
}
