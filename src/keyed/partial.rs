//! Partial updates: an upsert whose value for a column is null (`ignore_null_updates`) or the
//! feed's "not sent" marker (`unavailable_marker`, Debezium's `__debezium_unavailable_value`
//! for an unchanged TOASTed column) carries nothing for that column, and the key keeps the
//! value it had.
//!
//! **The definition** (what the tables must equal, whatever order records arrive in): order a
//! key's records by sequence, then tie-breakers, then content (as the merge breaks ties); take
//! the records after its newest delete; for each column, the value of the newest of them that
//! carries one, else the newest record's own value (a value never sent stays what the feed
//! said: null, or the marker). Keys, sequence, tie-breakers and the delete column are never
//! partial.
//!
//! Two walks apply it: [`fill_forward`] over a key's whole history, oldest first (a dimension
//! folds every record of the keys it rebuilds, so each version holds the values in force at its
//! sequence), and [`Filler`] from the newest record back (the merge's dedup sees a key's records
//! newest first and fills its winner from the older ones as they stream past).

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Schema};
use arrow::error::ArrowError;

use crate::config::pipeline::PartialUpdates;

/// Which columns can be partial, and which of their values carry nothing.
#[derive(Debug, Clone)]
pub struct Carrier {
    ignore_nulls: bool,
    marker: Option<String>,
    /// Indices (in the schema it was made for) of the columns that can be partial.
    columns: Vec<usize>,
}

impl Carrier {
    /// The carrier of `settings` over `schema`, every column but `fixed` partial; `None` when
    /// the settings are off.
    pub fn new(settings: &PartialUpdates, schema: &Schema, fixed: &[&str]) -> Option<Carrier> {
        if !settings.is_active() {
            return None;
        }
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| !fixed.contains(&f.name().as_str()))
            .map(|(i, _)| i)
            .collect();
        Some(Carrier {
            ignore_nulls: settings.ignore_nulls,
            marker: settings.marker.clone(),
            columns,
        })
    }

    /// The columns that can be partial.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// The partial columns row `i` of `batch` does not carry.
    pub fn open_in(&self, batch: &RecordBatch, i: usize) -> Vec<usize> {
        self.columns
            .iter()
            .copied()
            .filter(|&c| !self.carries(batch.column(c).as_ref(), i))
            .collect()
    }

    /// Whether row `i` of `col` carries a value.
    pub fn carries(&self, col: &dyn Array, i: usize) -> bool {
        if col.is_null(i) {
            return !self.ignore_nulls;
        }
        match &self.marker {
            Some(m) => text_at(col, i).is_none_or(|t| t != m),
            None => true,
        }
    }
}

/// Row `i` of a text column; `None` for other types.
fn text_at(col: &dyn Array, i: usize) -> Option<&str> {
    match col.data_type() {
        DataType::Utf8 => Some(col.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => Some(col.as_string::<i64>().value(i)),
        DataType::Utf8View => Some(col.as_string_view().value(i)),
        _ => None,
    }
}

/// `batch` with each partial value filled from the key's older records: `sorted` lists the
/// rows grouped by key, oldest first within a key (`same_key(a, b)` says whether two rows share
/// one); `deleted[i]` whether row `i` is a delete. Row `i` of the result holds the values in
/// force once row `i` is applied: a carried value, else the previous record's (filled) value,
/// unless that was a delete or another key's. Rows keep their positions.
pub fn fill_forward(
    carrier: &Carrier,
    batch: &RecordBatch,
    sorted: &[usize],
    same_key: impl Fn(usize, usize) -> bool,
    deleted: &[bool],
) -> Result<RecordBatch, ArrowError> {
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for &c in carrier.columns() {
        let col = batch.column(c);
        let mut src: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let mut prev: Option<usize> = None;
        for &i in sorted {
            let continues = prev.is_some_and(|p| same_key(p, i) && !deleted[p]);
            if !deleted[i] && !carrier.carries(col.as_ref(), i) && continues {
                if let Some(p) = prev {
                    src[i] = src[p];
                }
            }
            prev = Some(i);
        }
        columns[c] = arrow::compute::take(col.as_ref(), &UInt32Array::from(src), None)?;
    }
    RecordBatch::try_new(batch.schema(), columns)
}

/// A winner being filled from its key's older records, newest first.
#[derive(Debug, Clone)]
pub struct Filler {
    /// The winner, one row.
    row: RecordBatch,
    /// Partial columns it does not carry yet.
    open: Vec<usize>,
    /// A delete was passed (or the winner is one): older records carry nothing for it.
    stopped: bool,
}

impl Filler {
    /// Starts filling `row` (one row; `deleted`: whether it is a delete).
    pub fn new(carrier: &Carrier, row: RecordBatch, deleted: bool) -> Filler {
        let open = if deleted {
            Vec::new()
        } else {
            carrier.open_in(&row, 0)
        };
        Filler::with_open(row, open, deleted)
    }

    /// Starts filling `row`, whose `open` columns are known.
    pub fn with_open(row: RecordBatch, open: Vec<usize>, deleted: bool) -> Filler {
        Filler {
            row,
            open,
            stopped: deleted,
        }
    }

    /// Whether older records can still change the winner.
    pub fn wants_more(&self) -> bool {
        !self.stopped && !self.open.is_empty()
    }

    /// Applies the next older record: row `i` of `batch` (`deleted`: whether it is a delete).
    pub fn older(
        &mut self,
        carrier: &Carrier,
        batch: &RecordBatch,
        i: usize,
        deleted: bool,
    ) -> Result<(), ArrowError> {
        if !self.wants_more() {
            return Ok(());
        }
        if deleted {
            self.stopped = true;
            return Ok(());
        }
        let (fill, open): (Vec<usize>, Vec<usize>) = self
            .open
            .iter()
            .partition(|&&c| carrier.carries(batch.column(c).as_ref(), i));
        if fill.is_empty() {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = self.row.columns().to_vec();
        for c in fill {
            columns[c] = cell(batch.column(c), i);
        }
        self.row = RecordBatch::try_new(self.row.schema(), columns)?;
        self.open = open;
        Ok(())
    }

    /// The winner as filled so far, and the columns still open when no delete stopped it (what
    /// the target's row, the fold of the records before these, must fill).
    pub fn finish(self) -> (RecordBatch, Vec<usize>) {
        let open = if self.stopped { Vec::new() } else { self.open };
        (self.row, open)
    }
}

/// `row`'s `open` columns (one-row batch) taken from row `i` of `from` (same schema): where it
/// carries a value.
pub fn fill_from(
    carrier: &Carrier,
    row: &RecordBatch,
    open: &[usize],
    from: &RecordBatch,
    i: usize,
) -> Result<RecordBatch, ArrowError> {
    let mut columns: Vec<ArrayRef> = row.columns().to_vec();
    for &c in open {
        if carrier.carries(from.column(c).as_ref(), i) {
            columns[c] = cell(from.column(c), i);
        }
    }
    RecordBatch::try_new(row.schema(), columns)
}

/// A one-row slice of `batch` as an owned batch (its arrays keep only what the row needs).
pub fn own_row(batch: &RecordBatch, i: usize) -> RecordBatch {
    let columns: Vec<ArrayRef> = batch.columns().iter().map(|c| cell(c, i)).collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap_or_else(|_| batch.slice(i, 1))
}

/// Row `i` of `col` as a one-row array of its own. A string or binary view is compacted: its
/// slice would keep (and clone the list of) every data buffer of the whole batch.
pub fn cell(col: &ArrayRef, i: usize) -> ArrayRef {
    let one = col.slice(i, 1);
    match one.data_type() {
        DataType::Utf8View => std::sync::Arc::new(one.as_string_view().gc()),
        DataType::BinaryView => std::sync::Arc::new(one.as_binary_view().gc()),
        _ => one,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Field;
    use std::sync::Arc;

    fn settings(nulls: bool, marker: Option<&str>) -> PartialUpdates {
        PartialUpdates {
            ignore_nulls: nulls,
            marker: marker.map(str::to_string),
        }
    }

    fn batch(k: Vec<i64>, v: Vec<Option<&str>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(StringArray::from(v)),
            ],
        )
        .unwrap()
    }

    fn texts(b: &RecordBatch) -> Vec<Option<String>> {
        let v = b.column(1).as_string::<i32>();
        (0..b.num_rows())
            .map(|i| v.is_valid(i).then(|| v.value(i).to_string()))
            .collect()
    }

    #[test]
    fn nulls_and_the_marker_carry_nothing_as_configured() {
        let b = batch(vec![1, 1, 1], vec![Some("a"), None, Some("~")]);
        let off = Carrier::new(&settings(false, None), &b.schema(), &["k"]);
        assert!(off.is_none());
        let nulls = Carrier::new(&settings(true, None), &b.schema(), &["k"]).unwrap();
        assert_eq!(nulls.columns(), &[1]);
        let v = b.column(1);
        assert!(nulls.carries(v.as_ref(), 0) && !nulls.carries(v.as_ref(), 1));
        assert!(nulls.carries(v.as_ref(), 2));
        let marker = Carrier::new(&settings(false, Some("~")), &b.schema(), &["k"]).unwrap();
        assert!(
            marker.carries(v.as_ref(), 1),
            "a null is a value without ignore_nulls"
        );
        assert!(!marker.carries(v.as_ref(), 2));
    }

    #[test]
    fn filling_forward_stops_at_a_delete_and_at_another_key() {
        // rows: key 1: a, null, (delete), null, b ; key 2: null
        let b = batch(
            vec![1, 1, 1, 1, 1, 2],
            vec![Some("a"), None, Some("x"), None, Some("b"), None],
        );
        let c = Carrier::new(&settings(true, None), &b.schema(), &["k"]).unwrap();
        let deleted = [false, false, true, false, false, false];
        let keys = [1, 1, 1, 1, 1, 2];
        let out = fill_forward(
            &c,
            &b,
            &[0, 1, 2, 3, 4, 5],
            |a, b| keys[a] == keys[b],
            &deleted,
        )
        .unwrap();
        assert_eq!(
            texts(&out),
            vec![
                Some("a".into()),
                Some("a".into()),
                Some("x".into()),
                None,
                Some("b".into()),
                None
            ]
        );
    }

    #[test]
    fn a_winner_fills_from_older_records_until_a_delete() {
        let b = batch(
            vec![1, 1, 1, 1],
            vec![None, Some("~"), Some("old"), Some("older")],
        );
        let c = Carrier::new(&settings(true, Some("~")), &b.schema(), &["k"]).unwrap();
        let mut f = Filler::new(&c, own_row(&b, 0), false);
        f.older(&c, &b, 1, false).unwrap();
        assert!(f.wants_more());
        f.older(&c, &b, 2, false).unwrap();
        assert!(!f.wants_more());
        let (row, open) = f.finish();
        assert_eq!(texts(&row), vec![Some("old".into())]);
        assert!(open.is_empty());

        let mut f = Filler::new(&c, own_row(&b, 0), false);
        f.older(&c, &b, 2, true).unwrap();
        let (row, open) = f.finish();
        assert_eq!(texts(&row), vec![None]);
        assert!(open.is_empty(), "nothing before a delete fills the winner");

        let f = Filler::new(&c, own_row(&b, 1), false);
        let (_, open) = f.finish();
        assert_eq!(open, vec![1], "the target fills what the batch did not");
    }
}
