//! The merge-join of reconcile: the expected rows (newest per key of the source) and the
//! target's rows, both in key order, compared key by key and aggregated per day and group.

use super::*;

/// The rows of a canonical batch that are not deletes (hard-delete targets do not keep them).
pub(super) fn live_only(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let Some(col) = batch.column_by_name(DELETED_COLUMN) else {
        return Ok(batch.clone());
    };
    let deleted = col
        .as_boolean_opt()
        .ok_or_else(|| ArrowError::SchemaError(format!("{DELETED_COLUMN} is not boolean")))?;
    let live = arrow::compute::not(deleted)?;
    arrow::compute::filter_record_batch(batch, &live)
}

/// One batch of one side, with its keys and its other values encoded for comparison.
struct Loaded {
    batch: RecordBatch,
    keys: Rows,
    values: Rows,
}

/// A cursor over one side's key-ordered stream.
struct Cursor {
    name: &'static str,
    side: Side,
    stream: BatchStream,
    /// The batch under the cursor (an empty one before the first `ready`).
    cur: Loaded,
    row: usize,
    /// The last key of the previous batch, to check order (and find duplicates) across batches.
    last_of_previous: Option<OwnedRow>,
    /// Rows moved past.
    consumed: u64,
}

impl Cursor {
    fn new(name: &'static str, side: Side, stream: BatchStream, empty: Loaded) -> Self {
        Cursor {
            name,
            side,
            stream,
            cur: empty,
            row: 0,
            last_of_previous: None,
            consumed: 0,
        }
    }

    /// Makes sure a row is under the cursor; false at the end of the stream. Every batch is
    /// added to the aggregates as it is loaded, so each row is counted exactly once.
    async fn ready(
        &mut self,
        enc: &Encoders,
        agg: &mut Aggregator,
    ) -> Result<bool, ReconcileError> {
        loop {
            if self.row < self.cur.batch.num_rows() {
                return Ok(true);
            }
            let Some(batch) = self.stream.next().await.transpose()? else {
                return Ok(false);
            };
            if batch.num_rows() == 0 {
                continue;
            }
            agg.add(self.side, &batch).map_err(arrow_err)?;
            let loaded = enc.encode(batch).map_err(arrow_err)?;
            let previous = std::mem::replace(&mut self.cur, loaded);
            if let Some(last) = previous.keys.num_rows().checked_sub(1) {
                self.last_of_previous = Some(previous.keys.row(last).owned());
            }
            self.row = 0;
        }
    }

    /// The batch under the cursor; its row `self.row` exists after `ready` returned true.
    fn loaded(&self) -> &Loaded {
        &self.cur
    }

    fn key(&self) -> Row<'_> {
        self.loaded().keys.row(self.row)
    }

    fn values(&self) -> Row<'_> {
        self.loaded().values.row(self.row)
    }

    fn previous_key(&self) -> Option<Row<'_>> {
        if self.row > 0 {
            Some(self.loaded().keys.row(self.row - 1))
        } else {
            self.last_of_previous.as_ref().map(OwnedRow::row)
        }
    }

    /// Whether the row under the cursor repeats the previous key; an error when keys go down.
    fn repeats_previous(&self, keys: &[String]) -> Result<bool, ReconcileError> {
        match self.previous_key().map(|p| p.cmp(&self.key())) {
            Some(Ordering::Greater) => Err(ReconcileError::Unsorted {
                side: self.name,
                key: render_key(&self.loaded().batch, keys, self.row),
            }),
            Some(Ordering::Equal) => Ok(true),
            _ => Ok(false),
        }
    }

    fn advance(&mut self) {
        self.row += 1;
        self.consumed += 1;
    }
}

/// Encodes keys, and every other target column, into comparable rows.
struct Encoders {
    key_idx: Vec<usize>,
    value_idx: Vec<usize>,
    keys: RowConverter,
    values: RowConverter,
}

impl Encoders {
    /// Columns the row format cannot encode are left out of the value comparison (and named in
    /// a note), so that reconcile still runs on exotic tables.
    fn new(roles: &ColumnRoles, notes: &mut Vec<String>) -> Result<Self, ArrowError> {
        let schema: &SchemaRef = &roles.canonical;
        let field = |i: &usize| SortField::new(schema.field(*i).data_type().clone());
        let key_idx = roles.indices(&roles.keys);
        let mut value_idx = Vec::new();
        for (i, f) in schema.fields().iter().enumerate() {
            if key_idx.contains(&i) || !roles.target_columns.contains(f.name()) {
                continue;
            }
            if RowConverter::supports_fields(&[field(&i)]) {
                value_idx.push(i);
            } else {
                notes.push(format!(
                    "column `{}` ({}) cannot be compared row by row and was left out of the content comparison",
                    f.name(),
                    f.data_type()
                ));
            }
        }
        Ok(Encoders {
            keys: RowConverter::new(key_idx.iter().map(field).collect())?,
            values: RowConverter::new(value_idx.iter().map(field).collect())?,
            key_idx,
            value_idx,
        })
    }

    fn encode(&self, batch: RecordBatch) -> Result<Loaded, ArrowError> {
        let batch = canonical_floats(batch, &self.value_idx)?;
        let cols = |idx: &[usize]| {
            idx.iter()
                .map(|i| batch.column(*i).clone())
                .collect::<Vec<_>>()
        };
        Ok(Loaded {
            keys: self.keys.convert_columns(&cols(&self.key_idx))?,
            values: self.values.convert_columns(&cols(&self.value_idx))?,
            batch,
        })
    }
}

/// The batch with its floating-point value columns (`columns`) as reconcile compares them:
/// every NaN is one NaN (whatever its sign and payload bits) and -0.0 is 0.0. Two writers may
/// store the same number with different bits; the row format compares bits, so without this an
/// identical target could show "different content". Key columns are left alone: they carry the
/// sort order both sides were read in.
pub(super) fn canonical_floats(
    batch: RecordBatch,
    columns: &[usize],
) -> Result<RecordBatch, ArrowError> {
    use arrow::datatypes::{DataType, Float32Type, Float64Type};
    use std::sync::Arc;
    let mut out = batch.columns().to_vec();
    let mut changed = false;
    for i in columns {
        let Some(col) = out.get(*i) else { continue };
        let canonical: arrow::array::ArrayRef = match col.data_type() {
            DataType::Float64 => Arc::new(
                col.as_primitive::<Float64Type>()
                    .unary::<_, Float64Type>(|v| if v.is_nan() { f64::NAN } else { v + 0.0 }),
            ),
            DataType::Float32 => Arc::new(
                col.as_primitive::<Float32Type>()
                    .unary::<_, Float32Type>(|v| if v.is_nan() { f32::NAN } else { v + 0.0 }),
            ),
            _ => continue,
        };
        out[*i] = canonical;
        changed = true;
    }
    if !changed {
        return Ok(batch);
    }
    RecordBatch::try_new(batch.schema(), out)
}

/// The merge-join of the two sides and what it found.
pub(crate) struct Join {
    pub(super) schema: SchemaRef,
    pub(super) keys: Vec<String>,
    enc: Encoders,
    pub(super) agg: Aggregator,
    pub(super) limit: usize,
    pub(super) value_names: Vec<String>,
    pub(super) counts: DiffCounts,
    pub(super) listed: Vec<DiffKey>,
    pub(super) expected_keys: u64,
    pub(super) target_rows: u64,
}

impl Join {
    pub(super) fn new(
        roles: &ColumnRoles,
        m: &CdcMerge,
        limit: usize,
        notes: &mut Vec<String>,
    ) -> Result<Self, ArrowError> {
        let enc = Encoders::new(roles, notes)?;
        let value_names = enc
            .value_idx
            .iter()
            .map(|i| roles.canonical.field(*i).name().clone())
            .collect();
        Ok(Join {
            schema: roles.canonical.clone(),
            keys: roles.keys.clone(),
            agg: Aggregator::new(roles, &m.reconcile)?,
            enc,
            limit,
            value_names,
            counts: DiffCounts::default(),
            listed: Vec::new(),
            expected_keys: 0,
            target_rows: 0,
        })
    }

    pub(super) async fn run(
        &mut self,
        expected: BatchStream,
        actual: BatchStream,
    ) -> Result<(), ReconcileError> {
        let empty = || self.enc.encode(RecordBatch::new_empty(self.schema.clone()));
        let mut e = Cursor::new(
            "expected (source)",
            Side::Expected,
            expected,
            empty().map_err(arrow_err)?,
        );
        let mut t = Cursor::new("target", Side::Actual, actual, empty().map_err(arrow_err)?);
        loop {
            let has_e = e.ready(&self.enc, &mut self.agg).await?;
            let has_t = t.ready(&self.enc, &mut self.agg).await?;
            if has_e && e.repeats_previous(&self.keys)? {
                // The deduper emits one row per key; anything else is a bug, not a finding.
                return Err(ReconcileError::Unsorted {
                    side: e.name,
                    key: render_key(&e.loaded().batch, &self.keys, e.row),
                });
            }
            if has_t && t.repeats_previous(&self.keys)? {
                self.record(DiffKind::DuplicateInTarget, &t, None)?;
                t.advance();
                continue;
            }
            let order = match (has_e, has_t) {
                (false, false) => break,
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                (true, true) => e.key().cmp(&t.key()),
            };
            match order {
                Ordering::Less => {
                    self.record(DiffKind::MissingInTarget, &e, None)?;
                    e.advance();
                }
                Ordering::Greater => {
                    self.record(DiffKind::UnexpectedInTarget, &t, None)?;
                    t.advance();
                }
                Ordering::Equal => {
                    if e.values() != t.values() {
                        self.record(DiffKind::Different, &e, Some(&t))?;
                    }
                    e.advance();
                    t.advance();
                }
            }
        }
        self.expected_keys = e.consumed;
        self.target_rows = t.consumed;
        Ok(())
    }

    /// Counts a differing key and lists it while under the limit. `at` is the row the key is
    /// reported from; for different contents, `other` is the target's row.
    fn record(
        &mut self,
        kind: DiffKind,
        at: &Cursor,
        other: Option<&Cursor>,
    ) -> Result<(), ReconcileError> {
        self.counts.add(kind);
        if self.listed.len() >= self.limit {
            return Ok(());
        }
        let batch = &at.loaded().batch;
        let columns = match other {
            Some(t) => self.cell_diffs(batch, at.row, &t.loaded().batch, t.row)?,
            None => Vec::new(),
        };
        let bucket = self.agg.bucket_of(batch, at.row).map_err(arrow_err)?;
        self.listed.push(DiffKey::new(
            kind, batch, at.row, &self.keys, bucket, columns,
        ));
        Ok(())
    }

    /// The value columns whose values differ between two rows, rendered.
    fn cell_diffs(
        &self,
        expected: &RecordBatch,
        e_row: usize,
        actual: &RecordBatch,
        a_row: usize,
    ) -> Result<Vec<CellDiff>, ReconcileError> {
        let mut out = Vec::new();
        for (i, name) in self.enc.value_idx.iter().zip(&self.value_names) {
            let e = render_value(expected.column(*i), e_row).map_err(arrow_err)?;
            let a = render_value(actual.column(*i), a_row).map_err(arrow_err)?;
            if e != a {
                out.push(CellDiff {
                    column: name.clone(),
                    expected: e,
                    actual: a,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{BooleanArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;
    use crate::config::Vars;

    const PIPELINE: &str = r#"
name: t
kind: cdc_merge
source: { uri: "/nowhere/bronze" }
target: { uri: "/nowhere/silver" }
keys: [id]
sequence_by: updated_at
overlap: 15m
deletes: { column: op, values: [D] }
columns: { exclude: [op] }
quarantine: { uri: "/nowhere/q" }
reconcile: { day: updated_at, group_by: [cur], sum: [amount], count_by: [status] }
"#;

    fn roles() -> (Pipeline, ColumnRoles) {
        let p = Pipeline::parse(std::path::Path::new("t.yml"), PIPELINE, &Vars::new())
            .expect("pipeline");
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let source = Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("updated_at", ts, true),
            Field::new("cur", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("op", DataType::Utf8, true),
        ]);
        let roles =
            ColumnRoles::new(&p, p.cdc_merge("test").expect("merge"), &source).expect("roles");
        (p, roles)
    }

    /// Canonical rows `(id, day offset, currency, amount, status, deleted)`.
    fn batch(roles: &ColumnRoles, rows: &[(&str, i64, &str, i64, &str, bool)]) -> RecordBatch {
        const DAY: i64 = 86_400_000_000;
        RecordBatch::try_new(
            roles.canonical.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.1 * DAY))
                        .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.4))),
                Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.5)))),
            ],
        )
        .expect("batch")
    }

    fn stream(batches: Vec<RecordBatch>) -> BatchStream {
        Box::pin(futures::stream::iter(batches.into_iter().map(Ok)))
    }

    async fn join(expected: Vec<RecordBatch>, actual: Vec<RecordBatch>) -> Join {
        let (p, roles) = roles();
        let mut notes = Vec::new();
        let mut j =
            Join::new(&roles, p.cdc_merge("test").expect("merge"), 10, &mut notes).expect("join");
        j.run(stream(expected), stream(actual)).await.expect("run");
        assert!(notes.is_empty(), "{notes:?}");
        j
    }

    #[test]
    fn float_values_compare_by_number_not_by_bits() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
        let side = |values: Vec<Option<f64>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(arrow::array::Float64Array::from(values))],
            )
            .expect("batch")
        };
        // Another writer's NaN payload and a negative zero, against this one's.
        let a = side(vec![
            Some(f64::from_bits(0x7ff8_0000_0000_0001)),
            Some(-0.0),
            None,
            Some(1.5),
        ]);
        let b = side(vec![Some(-f64::NAN), Some(0.0), None, Some(1.5)]);
        let conv = RowConverter::new(vec![SortField::new(DataType::Float64)]).expect("conv");
        let rows = |b: &RecordBatch| conv.convert_columns(&[b.column(0).clone()]).expect("rows");
        let (raw_a, raw_b) = (rows(&a), rows(&b));
        assert_ne!(raw_a.row(0), raw_b.row(0), "the bits differ");
        assert_ne!(raw_a.row(1), raw_b.row(1), "the bits differ");
        let a = canonical_floats(a, &[0]).expect("canonical");
        let b = canonical_floats(b, &[0]).expect("canonical");
        let (ra, rb) = (rows(&a), rows(&b));
        for i in 0..4 {
            assert_eq!(ra.row(i), rb.row(i), "row {i}");
        }
        assert_ne!(ra.row(0), ra.row(3), "NaN is still not 1.5");
        assert_eq!(a.column(0).null_count(), 1);
    }

    #[tokio::test]
    async fn identical_sides_across_batch_boundaries_have_no_differences() {
        let (_, l) = roles();
        let e = vec![
            batch(&l, &[("a", 0, "EUR", 5, "ok", false)]),
            batch(
                &l,
                &[
                    ("b", 0, "EUR", 7, "ok", false),
                    ("c", 1, "USD", 1, "x", true),
                ],
            ),
        ];
        let a = vec![
            batch(
                &l,
                &[
                    ("a", 0, "EUR", 5, "ok", false),
                    ("b", 0, "EUR", 7, "ok", false),
                ],
            ),
            batch(&l, &[("c", 1, "USD", 1, "x", true)]),
        ];
        let j = join(e, a).await;
        assert_eq!(j.counts, DiffCounts::default());
        assert_eq!((j.expected_keys, j.target_rows), (3, 3));
        let buckets = j.agg.into_buckets();
        assert_eq!(buckets.len(), 2);
        for (_, e, a) in &buckets {
            assert_eq!(e, a);
        }
        assert_eq!(buckets[0].1.rows, 2);
        assert_eq!(buckets[1].1.deleted, 1);
    }

    #[tokio::test]
    async fn finds_missing_unexpected_different_and_duplicate_keys() {
        let (_, l) = roles();
        let e = vec![batch(
            &l,
            &[
                ("a", 0, "EUR", 5, "ok", false),
                ("b", 0, "EUR", 7, "ok", false),
                ("d", 0, "EUR", 1, "ok", false),
            ],
        )];
        let a = vec![
            batch(
                &l,
                &[
                    ("b", 0, "EUR", 9, "ok", false),
                    ("c", 0, "EUR", 3, "ok", false),
                ],
            ),
            batch(
                &l,
                &[
                    ("c", 0, "EUR", 3, "ok", false),
                    ("d", 0, "EUR", 1, "ok", false),
                ],
            ),
        ];
        let j = join(e, a).await;
        assert_eq!(j.counts.missing_in_target, 1);
        assert_eq!(j.counts.unexpected_in_target, 1);
        assert_eq!(j.counts.different, 1);
        assert_eq!(j.counts.duplicate_in_target, 1);
        let kinds: Vec<(DiffKind, String)> = j
            .listed
            .iter()
            .map(|k| (k.kind, k.key_text.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (DiffKind::MissingInTarget, r#"id="a""#.to_string()),
                (DiffKind::Different, r#"id="b""#.to_string()),
                (DiffKind::UnexpectedInTarget, r#"id="c""#.to_string()),
                (DiffKind::DuplicateInTarget, r#"id="c""#.to_string()),
            ]
        );
        assert_eq!(j.listed[1].columns.len(), 1);
        assert_eq!(j.listed[1].columns[0].column, "amount");
        assert_eq!((j.expected_keys, j.target_rows), (3, 4));
        let (_, e, a) = &j.agg.into_buckets()[0];
        assert_eq!((e.rows, a.rows), (3, 4));
        assert_eq!(e.sums, vec![stats::SumValue::Exact(13)]);
        assert_eq!(a.sums, vec![stats::SumValue::Exact(16)]);
        assert_ne!(e.key_hash, a.key_hash);
    }

    #[tokio::test]
    async fn keys_out_of_order_are_a_bug_not_a_finding() {
        let (p, l) = roles();
        let mut notes = Vec::new();
        let mut j =
            Join::new(&l, p.cdc_merge("test").expect("merge"), 10, &mut notes).expect("join");
        let unsorted = vec![batch(
            &l,
            &[
                ("b", 0, "EUR", 1, "ok", false),
                ("a", 0, "EUR", 1, "ok", false),
            ],
        )];
        let err = j.run(stream(vec![]), stream(unsorted)).await.unwrap_err();
        assert!(matches!(err, ReconcileError::Unsorted { .. }), "{err}");
    }
}
