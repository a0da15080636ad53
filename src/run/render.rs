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

/// `k1="v1", k2=null` for the key columns of a row. Values are quoted and escaped, so control
/// characters, RTL marks and trailing spaces in a key show in the message.
pub(crate) fn render_key(batch: &RecordBatch, keys: &[String], row: usize) -> String {
    keys.iter()
        .map(|k| {
            let v = batch
                .column_by_name(k)
                .and_then(|c| render_value(c.as_ref(), row).ok().flatten())
                .map_or_else(|| "null".to_string(), |v| format!("{v:?}"));
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows in a set of batches.
pub fn row_count(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}
