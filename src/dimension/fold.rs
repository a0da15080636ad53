//! Source rows of some keys → the dimension's rows for those keys.
//!
//! A run gives this every change record of each key it rebuilds (not only the new ones), so the
//! result is the fold of everything the source holds for the key ([`super::history`]) — in
//! whatever order and batches the records arrived. Ties are broken on content, so the result
//! never depends on delivery order: among records of one key with the same sequence and
//! tie-breakers, an upsert and a delete both count (the delete last), and of two upserts the one
//! with the greater content is the newer (as the merge does).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, TimestampMicrosecondArray,
    UInt32Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};

use super::history::{Change, History};
use crate::config::pipeline::dimension::{
    Dimension, HistoryMode, Tracked, DURABLE_KEY, INFERRED_AT, IS_CURRENT, IS_INFERRED, VALID_FROM,
    VALID_TO, VERSION_KEY,
};

type ArrowResult<T> = Result<T, arrow::error::ArrowError>;

/// Which source columns play which part.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The output's attribute columns (keys first), in source order.
    pub columns: Vec<String>,
    pub keys: Vec<String>,
    /// Sequence, then tie-breakers.
    pub order: Vec<String>,
    /// Columns whose change opens a version (SCD2).
    pub tracked: Vec<String>,
    pub deletes: Option<(String, Vec<String>)>,
    pub history: HistoryMode,
    /// `ignore_null_updates` / `unavailable_marker`.
    pub partial: crate::config::pipeline::PartialUpdates,
}

impl Layout {
    /// The roles of `d` over a source with `schema`; `Err(column, setting)` names a column the
    /// pipeline uses that the source lacks.
    pub fn new(d: &Dimension, schema: &Schema) -> Result<Layout, (String, &'static str)> {
        let has = |c: &str| schema.field_with_name(c).is_ok();
        let check = |cols: &[String], setting: &'static str| {
            cols.iter()
                .find(|c| !has(c))
                .map_or(Ok(()), |c| Err((c.clone(), setting)))
        };
        check(&d.keys, "keys")?;
        check(std::slice::from_ref(&d.sequence_by), "sequence_by")?;
        check(&d.tie_breakers, "tie_breakers")?;
        check(&d.exclude, "exclude")?;
        if let Some((c, _)) = &d.deletes {
            check(std::slice::from_ref(c), "deletes")?;
        }
        let mut order = vec![d.sequence_by.clone()];
        order.extend(d.tie_breakers.iter().cloned());
        let mut columns: Vec<String> = d.keys.clone();
        columns.extend(
            schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|c| !d.keys.contains(c) && !d.exclude.contains(c)),
        );
        let not_tracked = |c: &String| {
            d.keys.contains(c)
                || order.contains(c)
                || d.deletes.as_ref().is_some_and(|(dc, _)| dc == c)
        };
        let tracked = match &d.tracked {
            Tracked::All => columns
                .iter()
                .filter(|c| !not_tracked(c))
                .cloned()
                .collect(),
            Tracked::Only(cols) => {
                check(cols, "track_history")?;
                cols.clone()
            }
            Tracked::Except(cols) => {
                check(cols, "track_history_except")?;
                columns
                    .iter()
                    .filter(|c| !not_tracked(c) && !cols.contains(c))
                    .cloned()
                    .collect()
            }
        };
        Ok(Layout {
            columns,
            keys: d.keys.clone(),
            order,
            tracked,
            deletes: d.deletes.clone(),
            history: d.history,
            partial: d.partial.clone(),
        })
    }

    /// The rules that decide the table's rows, as text (recorded in each commit: a change
    /// rebuilds every key).
    pub fn describe(&self) -> String {
        let rows = match self.history {
            HistoryMode::Scd1 => "scd1".to_string(),
            HistoryMode::Scd2 => format!("scd2; tracked: {}", self.tracked.join(", ")),
        };
        match self.partial.is_active() {
            true => format!("{rows}; {}", self.partial.describe()),
            false => rows,
        }
    }

    /// The partial updates over a source `schema` (`None`: off); keys, order and the delete
    /// column are never partial.
    fn carrier(&self, schema: &Schema) -> Option<crate::keyed::partial::Carrier> {
        let mut fixed: Vec<&str> = self
            .keys
            .iter()
            .chain(&self.order)
            .map(String::as_str)
            .collect();
        fixed.extend(self.deletes.as_ref().map(|(c, _)| c.as_str()));
        crate::keyed::partial::Carrier::new(&self.partial, schema, &fixed)
    }

    /// The output schema, for source `schema`.
    pub fn output_schema(&self, schema: &Schema) -> ArrowResult<SchemaRef> {
        let mut fields: Vec<Field> = self
            .columns
            .iter()
            .map(|c| {
                schema
                    .field_with_name(c)
                    .map(|f| f.clone().with_nullable(true))
            })
            .collect::<ArrowResult<_>>()?;
        let seq = schema.field_with_name(&self.order[0])?.data_type().clone();
        if self.history == HistoryMode::Scd2 {
            fields.push(Field::new(VALID_FROM, seq.clone(), false));
            fields.push(Field::new(VALID_TO, seq, true));
            fields.push(Field::new(IS_CURRENT, DataType::Boolean, false));
            fields.push(Field::new(DURABLE_KEY, DataType::Int64, false));
            fields.push(Field::new(VERSION_KEY, DataType::Int64, false));
        } else {
            fields.push(Field::new(DURABLE_KEY, DataType::Int64, false));
        }
        fields.push(Field::new(IS_INFERRED, DataType::Boolean, false));
        fields.push(Field::new(
            INFERRED_AT,
            DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ));
        Ok(Arc::new(Schema::new(fields)))
    }
}

fn rows_of(batch: &RecordBatch, cols: &[String]) -> ArrowResult<Rows> {
    let arrays: Vec<ArrayRef> = cols
        .iter()
        .map(|c| {
            batch
                .column_by_name(c)
                .cloned()
                .ok_or_else(|| arrow::error::ArrowError::SchemaError(format!("no column {c}")))
        })
        .collect::<ArrowResult<_>>()?;
    let conv = RowConverter::new(
        arrays
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )?;
    conv.convert_columns(&arrays)
}

/// Each row's key values as text (what the surrogate keys hash: stable across versions).
pub fn key_text(batch: &RecordBatch, keys: &[String]) -> ArrowResult<Vec<String>> {
    crate::lake::replace_keys::key_text(batch, keys)
        .map_err(|e| arrow::error::ArrowError::ExternalError(Box::new(e)))
}

/// FNV-1a of `text`, folded to a non-negative i64: stable across builds and platforms.
fn surrogate(text: &str) -> i64 {
    crate::lake::record::table_fingerprint(text)
}

/// Whether each row is a delete.
fn deletes(batch: &RecordBatch, layout: &Layout) -> ArrowResult<Vec<bool>> {
    let Some((col, values)) = &layout.deletes else {
        return Ok(vec![false; batch.num_rows()]);
    };
    let c = batch
        .column_by_name(col)
        .ok_or_else(|| arrow::error::ArrowError::SchemaError(format!("no column {col}")))?;
    let c = arrow::compute::cast(c, &DataType::Utf8)?;
    let c = c.as_string::<i32>();
    Ok((0..batch.num_rows())
        .map(|i| c.is_valid(i) && values.iter().any(|v| v == c.value(i)))
        .collect())
}

/// What folding counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Folded {
    /// Upserts folded into an open version in place (no new version).
    pub updated_in_place: u64,
}

/// The instant an inferred member's versions start from: 1900-01-01, in the sequence's type
/// (its raw integer: seconds/ms/µs/ns for a timestamp, days for a date).
fn beginning(seq: &DataType) -> i64 {
    const SECS: i64 = -2_208_988_800;
    match seq {
        DataType::Timestamp(unit, _) => match unit {
            arrow::datatypes::TimeUnit::Second => SECS,
            arrow::datatypes::TimeUnit::Millisecond => SECS * 1_000,
            arrow::datatypes::TimeUnit::Microsecond => SECS * 1_000_000,
            arrow::datatypes::TimeUnit::Nanosecond => SECS * 1_000_000_000,
        },
        _ => SECS / 86_400,
    }
}

/// Raw sequence integers as the sequence's type.
fn as_sequence(raw: Int64Array, seq: &DataType) -> ArrowResult<ArrayRef> {
    let raw: ArrayRef = Arc::new(raw);
    match seq {
        DataType::Date32 => {
            arrow::compute::cast(&arrow::compute::cast(&raw, &DataType::Int32)?, seq)
        }
        _ => arrow::compute::cast(&raw, seq),
    }
}

/// The version key of a placeholder, and of the first version of a key that was one (it is
/// completed in place: the same keys).
fn inferred_version_key(key: &str) -> i64 {
    surrogate(&format!("{key}\u{1e}inferred"))
}

/// One output row of the fold.
struct Out {
    /// Source row of the values; rows of the records opening and closing the version.
    values: u32,
    from: u32,
    to: Option<u32>,
    current: bool,
    /// The key was a placeholder (first written then): its first version starts at 1900.
    inferred_at: Option<i64>,
    first: bool,
}

/// The dimension rows of every key in `batch` (all their valid change records), in key order
/// then validity; `schema` is [`Layout::output_schema`]. `inferred`: keys that were
/// placeholders (key text → when first inferred, µs): their first version starts at 1900-01-01
/// with the placeholder's version key, so facts from before the first record find it.
pub fn fold(
    batch: &RecordBatch,
    layout: &Layout,
    schema: &SchemaRef,
    inferred: &HashMap<String, i64>,
) -> ArrowResult<(RecordBatch, Folded)> {
    let key_text = key_text(batch, &layout.keys)?;
    let sorted = Sorted::new(batch, layout)?;
    // (with partial updates each record holds the values in force once it applies)
    let filled = match layout.carrier(&batch.schema()) {
        Some(c) => crate::keyed::partial::fill_forward(
            &c,
            batch,
            &sorted.idx,
            |a, b| sorted.keys.row(a) == sorted.keys.row(b),
            &sorted.deleted,
        )?,
        None => batch.clone(),
    };
    let batch = &filled;
    let (mut out, folded) = versions(batch, layout, &key_text, inferred, &sorted)?;
    if layout.history == HistoryMode::Scd1 {
        out.retain(|o| o.current);
    }
    let values = UInt32Array::from(out.iter().map(|o| o.values).collect::<Vec<_>>());
    let mut columns: Vec<ArrayRef> = layout
        .columns
        .iter()
        .map(|c| {
            let col = batch
                .column_by_name(c)
                .ok_or_else(|| arrow::error::ArrowError::SchemaError(format!("no column {c}")))?;
            arrow::compute::take(col, &values, None)
        })
        .collect::<ArrowResult<_>>()?;
    let durable: Int64Array = out
        .iter()
        .map(|o| Some(surrogate(&key_text[o.values as usize])))
        .collect();
    if layout.history == HistoryMode::Scd2 {
        let seq_col = batch
            .column_by_name(&layout.order[0])
            .cloned()
            .ok_or_else(|| arrow::error::ArrowError::SchemaError("no sequence column".into()))?;
        columns.extend(validity(&out, &seq_col)?);
        columns.push(Arc::new(durable));
        columns.push(Arc::new(version_keys(&out, &key_text, &seq_col)?));
    } else {
        columns.push(Arc::new(durable));
    }
    columns.push(Arc::new(BooleanArray::from(vec![false; out.len()])));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(out.iter().map(|o| o.inferred_at).collect::<Vec<_>>())
            .with_timezone("UTC"),
    ));
    finish(columns, schema, out.len()).map(|b| (b, folded))
}

/// A batch's records in fold order: by key, then sequence, deletes last, then content (as
/// delivered), so the result does not depend on arrival order.
struct Sorted {
    idx: Vec<usize>,
    keys: Rows,
    order: Rows,
    deleted: Vec<bool>,
}

impl Sorted {
    fn new(batch: &RecordBatch, layout: &Layout) -> ArrowResult<Sorted> {
        let keys = rows_of(batch, &layout.keys)?;
        let order = rows_of(batch, &layout.order)?;
        let content = rows_of(batch, &layout.columns)?;
        let deleted = deletes(batch, layout)?;
        let mut idx: Vec<usize> = (0..batch.num_rows()).collect();
        idx.sort_by(|&a, &b| {
            keys.row(a)
                .cmp(&keys.row(b))
                .then(order.row(a).cmp(&order.row(b)))
                .then(deleted[a].cmp(&deleted[b]))
                .then(content.row(a).cmp(&content.row(b)))
        });
        Ok(Sorted {
            idx,
            keys,
            order,
            deleted,
        })
    }
}

/// Every key's versions: its records in [`Sorted`] order folded by [`History::fold`].
fn versions(
    batch: &RecordBatch,
    layout: &Layout,
    key_text: &[String],
    inferred: &HashMap<String, i64>,
    sorted: &Sorted,
) -> ArrowResult<(Vec<Out>, Folded)> {
    let (keys, order, deleted, idx) = (&sorted.keys, &sorted.order, &sorted.deleted, &sorted.idx);
    let tracked = rows_of(batch, &layout.tracked)?;
    let mut out: Vec<Out> = Vec::new();
    let mut folded = Folded::default();
    for run in idx.chunk_by(|a, b| keys.row(*a) == keys.row(*b)) {
        let changes: Vec<Change<Vec<u8>, usize>> = run
            .iter()
            .map(|&i| Change {
                order: order.row(i).as_ref().to_vec(),
                delete: deleted[i],
                row: i,
            })
            .collect();
        let h = History::fold(changes, |a, b| tracked.row(*a) == tracked.row(*b));
        let was = inferred.get(&key_text[run[0]]).copied();
        for (k, v) in h.versions.iter().enumerate() {
            folded.updated_in_place += v.changes.iter().filter(|c| !c.delete).count() as u64 - 1;
            let closer = if v.closed_by_delete() {
                v.changes.last().map(|c| c.row as u32)
            } else {
                h.versions.get(k + 1).map(|next| next.changes[0].row as u32)
            };
            out.push(Out {
                values: v.row as u32,
                from: v.changes[0].row as u32,
                to: closer,
                current: v.to.is_none(),
                inferred_at: was,
                first: k == 0,
            });
        }
    }
    Ok((out, folded))
}

/// A placeholder's first version: it starts at the beginning of time.
fn from_1900(o: &Out) -> bool {
    o.first && o.inferred_at.is_some()
}

/// `valid_from`, `valid_to` and `is_current` of each version.
fn validity(out: &[Out], seq_col: &ArrayRef) -> ArrowResult<[ArrayRef; 3]> {
    let seq_type = seq_col.data_type().clone();
    let seq_i64 = arrow::compute::cast(seq_col, &DataType::Int64)?;
    let seq_i64 = seq_i64.as_primitive::<arrow::datatypes::Int64Type>();
    let from: Int64Array = out
        .iter()
        .map(|o| {
            Some(if from_1900(o) {
                beginning(&seq_type)
            } else {
                seq_i64.value(o.from as usize)
            })
        })
        .collect();
    let to: UInt32Array = out.iter().map(|o| o.to).collect();
    Ok([
        as_sequence(from, &seq_type)?,
        arrow::compute::take(seq_col, &to, None)?,
        Arc::new(BooleanArray::from(
            out.iter().map(|o| o.current).collect::<Vec<_>>(),
        )),
    ])
}

/// One key per version: its key and `valid_from` — not the opening record's tie-breakers, so
/// a late record at the same instant does not change it. Versions opening at one instant (a
/// change and its correction at the same time) are told apart by their rank counted from the
/// last: the one in force keeps its key when an earlier one, which no point in time selects,
/// arrives late.
fn version_keys(out: &[Out], key_text: &[String], seq_col: &ArrayRef) -> ArrowResult<Int64Array> {
    let seq_i64 = arrow::compute::cast(seq_col, &DataType::Int64)?;
    let seq_i64 = seq_i64.as_primitive::<arrow::datatypes::Int64Type>();
    let mut next: Option<(&str, i64)> = None;
    let mut rank = 0u32;
    let mut keys: Vec<Option<i64>> = out
        .iter()
        .rev()
        .map(|o| {
            let key = key_text[o.values as usize].as_str();
            if from_1900(o) {
                next = None;
                return Some(inferred_version_key(key));
            }
            let from = seq_i64.value(o.from as usize);
            rank = match next {
                Some(n) if n == (key, from) => rank + 1,
                _ => 0,
            };
            next = Some((key, from));
            Some(match rank {
                0 => surrogate(&format!("{key}\u{1e}{from}")),
                n => surrogate(&format!("{key}\u{1e}{from}\u{1e}{n}")),
            })
        })
        .collect();
    keys.reverse();
    Ok(Int64Array::from(keys))
}

/// `columns` cast to `schema`'s types, as a batch of `rows` rows.
fn finish(columns: Vec<ArrayRef>, schema: &SchemaRef, rows: usize) -> ArrowResult<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow::compute::cast(&c, f.data_type()))
        .collect::<ArrowResult<Vec<_>>>()?;
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options)
}

/// Placeholder rows for `keys` (key text → when first inferred, µs), in `schema`: the key, the
/// `placeholder` values (text, cast to each column's type), other attributes null, valid from
/// 1900-01-01 and current. `Err(column)` names a placeholder value its column cannot take.
pub fn placeholders(
    keys: &[(String, i64)],
    layout: &Layout,
    schema: &SchemaRef,
    placeholder: &[(String, String)],
) -> Result<RecordBatch, String> {
    let n = keys.len();
    let e = |e: arrow::error::ArrowError| e.to_string();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for c in &layout.columns {
        let field = schema.field_with_name(c).map_err(e)?;
        let text: arrow::array::StringArray = if layout.keys.contains(c) {
            keys.iter().map(|(k, _)| Some(k.as_str())).collect()
        } else {
            match placeholder.iter().find(|(pc, _)| pc == c) {
                Some((_, v)) => std::iter::repeat_n(Some(v.as_str()), n).collect(),
                None => std::iter::repeat_n(None::<&str>, n).collect(),
            }
        };
        let options = arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        };
        let cast = arrow::compute::cast_with_options(&text, field.data_type(), &options)
            .map_err(|_| c.clone())?;
        columns.push(cast);
    }
    let seq_type = schema
        .field_with_name(VALID_FROM)
        .map(|f| f.data_type().clone())
        .ok();
    if let Some(seq_type) = &seq_type {
        let from = Int64Array::from(vec![beginning(seq_type); n]);
        columns.push(as_sequence(from, seq_type).map_err(e)?);
        columns.push(arrow::array::new_null_array(seq_type, n));
        columns.push(Arc::new(BooleanArray::from(vec![true; n])));
    }
    columns.push(Arc::new(Int64Array::from_iter_values(
        keys.iter().map(|(k, _)| surrogate(k)),
    )));
    if seq_type.is_some() {
        columns.push(Arc::new(Int64Array::from_iter_values(
            keys.iter().map(|(k, _)| inferred_version_key(k)),
        )));
    }
    columns.push(Arc::new(BooleanArray::from(vec![true; n])));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from_iter_values(keys.iter().map(|(_, t)| *t))
            .with_timezone("UTC"),
    ));
    finish(columns, schema, n).map_err(e)
}
