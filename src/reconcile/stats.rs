//! Per event day and group aggregates of one side of a reconciliation.
//!
//! Each side's rows are added batch by batch as they stream past; only one small record per
//! (day, group) bucket is kept, so the cost in memory follows the number of days and groups,
//! never the number of rows.

use std::collections::BTreeMap;

/// What an exact reconcile sum past 38 digits says (the caller makes it a data error).
pub(crate) const SUM_OVERFLOW: &str = "a sum overflowed 38 decimal digits";

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type, Decimal128Type, Float64Type};
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::config::pipeline::DELETED_COLUMN;
use crate::config::ReconcileSpec;
use crate::keyed::ColumnRoles;

/// One side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// What a full reload of the source would write.
    Expected = 0,
    /// What the target holds.
    Actual = 1,
}

/// A bucket: the UTC date of the day column (days since 1970-01-01, `None` when null) and the
/// rendered values of the `group_by` columns (`None` for null).
pub type BucketKey = (Option<i32>, Vec<Option<String>>);

/// A running sum of one `reconcile.sum` column.
#[derive(Debug, Clone, Copy)]
pub enum SumValue {
    /// Integers and decimals, exactly, as an unscaled integer (the column's scale applies).
    Exact(i128),
    /// Floating-point columns.
    Float(f64),
}

/// Two sums are equal when they hold the same number. For floating-point sums a NaN equals a
/// NaN (a column holding NaN sums to NaN on both sides of an identical table) and -0.0 equals
/// 0.0; IEEE equality would call every table with a NaN in a summed column different.
impl PartialEq for SumValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SumValue::Exact(a), SumValue::Exact(b)) => a == b,
            (SumValue::Float(a), SumValue::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
            _ => false,
        }
    }
}

/// The aggregates of one side in one bucket. Rows that are soft-delete tombstones are counted
/// in `deleted` only: finance totals are about live payments.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStats {
    /// Live rows.
    pub rows: u64,
    /// Tombstones (`_deleted = true`).
    pub deleted: u64,
    /// One per `reconcile.sum` column, over live rows.
    pub sums: Vec<SumValue>,
    /// One per `reconcile.count_by` column: live rows per value (`None` = null).
    pub counts: Vec<BTreeMap<Option<String>, u64>>,
    /// Order-independent hash of the live rows' keys (sum of a 64-bit hash per key), so two
    /// sides with the same counts but different keys still differ.
    pub key_hash: u64,
}

/// How a sum column is accumulated.
#[derive(Debug, Clone, Copy)]
enum SumKind {
    /// Cast to decimal(38, scale) and added exactly.
    Exact {
        scale: i8,
    },
    Float,
}

/// Accumulates both sides' buckets.
pub struct Aggregator {
    day_idx: usize,
    group_idx: Vec<usize>,
    sums: Vec<(usize, SumKind)>,
    count_idx: Vec<usize>,
    key_idx: Vec<usize>,
    deleted_idx: Option<usize>,
    buckets: BTreeMap<BucketKey, [Option<BucketStats>; 2]>,
}

fn index(roles: &ColumnRoles, column: &str) -> Result<usize, ArrowError> {
    roles.canonical.index_of(column)
}

/// Renders values the way people read them; nulls are told apart from the text "null".
fn formatter_options() -> FormatOptions<'static> {
    FormatOptions::default().with_null("\u{0}null")
}

impl Aggregator {
    /// An aggregator for canonical batches of `roles`, reporting what `spec` asks for.
    pub fn new(roles: &ColumnRoles, spec: &ReconcileSpec) -> Result<Self, ArrowError> {
        let sums = spec
            .sum
            .iter()
            .map(|c| {
                let i = index(roles, c)?;
                let kind = match roles.canonical.field(i).data_type() {
                    DataType::Decimal128(_, scale) => SumKind::Exact { scale: *scale },
                    dt if dt.is_floating() => SumKind::Float,
                    _ => SumKind::Exact { scale: 0 },
                };
                Ok((i, kind))
            })
            .collect::<Result<Vec<_>, ArrowError>>()?;
        Ok(Aggregator {
            day_idx: index(roles, &spec.day)?,
            group_idx: spec
                .group_by
                .iter()
                .map(|c| index(roles, c))
                .collect::<Result<_, _>>()?,
            sums,
            count_idx: spec
                .count_by
                .iter()
                .map(|c| index(roles, c))
                .collect::<Result<_, _>>()?,
            key_idx: roles.indices(&roles.keys),
            deleted_idx: roles.canonical.index_of(DELETED_COLUMN).ok(),
            buckets: BTreeMap::new(),
        })
    }

    fn empty_stats(&self) -> BucketStats {
        BucketStats {
            rows: 0,
            deleted: 0,
            sums: self
                .sums
                .iter()
                .map(|(_, k)| match k {
                    SumKind::Exact { .. } => SumValue::Exact(0),
                    SumKind::Float => SumValue::Float(0.0),
                })
                .collect(),
            counts: vec![BTreeMap::new(); self.count_idx.len()],
            key_hash: 0,
        }
    }

    /// The scale of each sum column (0 for integers and floats).
    pub fn sum_scales(&self) -> Vec<i8> {
        self.sums
            .iter()
            .map(|(_, k)| match k {
                SumKind::Exact { scale } => *scale,
                SumKind::Float => 0,
            })
            .collect()
    }

    /// The bucket of row `row` of a canonical batch.
    pub fn bucket_of(&self, batch: &RecordBatch, row: usize) -> Result<BucketKey, ArrowError> {
        let day = days(batch.column(self.day_idx))?;
        let day = day.is_valid(row).then(|| day.value(row));
        let opts = formatter_options();
        let mut group = Vec::with_capacity(self.group_idx.len());
        for i in &self.group_idx {
            let f = ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts)?;
            group.push(
                batch
                    .column(*i)
                    .is_valid(row)
                    .then(|| f.value(row).to_string()),
            );
        }
        Ok((day, group))
    }

    /// Adds every row of a canonical batch to `side`.
    pub fn add(&mut self, side: Side, batch: &RecordBatch) -> Result<(), ArrowError> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let opts = formatter_options();
        let day = days(batch.column(self.day_idx))?;
        let groups = self
            .group_idx
            .iter()
            .map(|i| ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let counted = self
            .count_idx
            .iter()
            .map(|i| ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = self
            .key_idx
            .iter()
            .map(|i| ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let sums = self
            .sums
            .iter()
            .map(|(i, kind)| {
                let to = match kind {
                    SumKind::Exact { scale } => DataType::Decimal128(38, *scale),
                    SumKind::Float => DataType::Float64,
                };
                arrow::compute::cast(batch.column(*i), &to)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let deleted = match self.deleted_idx {
            Some(i) => Some(batch.column(i).as_boolean_opt().cloned().ok_or_else(|| {
                ArrowError::SchemaError(format!("{DELETED_COLUMN} is not boolean"))
            })?),
            None => None,
        };
        let mut key_text = String::new();
        for row in 0..n {
            let bucket: BucketKey = (
                day.is_valid(row).then(|| day.value(row)),
                self.group_idx
                    .iter()
                    .zip(&groups)
                    .map(|(i, f)| {
                        batch
                            .column(*i)
                            .is_valid(row)
                            .then(|| f.value(row).to_string())
                    })
                    .collect(),
            );
            let empty = self.empty_stats();
            let slot = &mut self.buckets.entry(bucket).or_insert([None, None])[side as usize];
            let stats = slot.get_or_insert(empty);
            if deleted
                .as_ref()
                .is_some_and(|d| d.is_valid(row) && d.value(row))
            {
                stats.deleted += 1;
                continue;
            }
            stats.rows += 1;
            key_text.clear();
            for f in &keys {
                key_text.push_str(&f.value(row).to_string());
                key_text.push('\u{1f}');
            }
            stats.key_hash = stats.key_hash.wrapping_add(hash64(key_text.as_bytes()));
            for (sum, col) in stats.sums.iter_mut().zip(&sums) {
                if !col.is_valid(row) {
                    continue;
                }
                *sum = match *sum {
                    SumValue::Exact(acc) => {
                        let v = col.as_primitive::<Decimal128Type>().value(row);
                        SumValue::Exact(
                            acc.checked_add(v)
                                .ok_or_else(|| ArrowError::ComputeError(SUM_OVERFLOW.into()))?,
                        )
                    }
                    SumValue::Float(acc) => {
                        SumValue::Float(acc + col.as_primitive::<Float64Type>().value(row))
                    }
                };
            }
            for ((counts, f), i) in stats.counts.iter_mut().zip(&counted).zip(&self.count_idx) {
                let value = batch
                    .column(*i)
                    .is_valid(row)
                    .then(|| f.value(row).to_string());
                *counts.entry(value).or_default() += 1;
            }
        }
        Ok(())
    }

    /// Every bucket with both sides' aggregates (a side without rows there has empty ones).
    pub fn into_buckets(self) -> Vec<(BucketKey, BucketStats, BucketStats)> {
        let empty = self.empty_stats();
        self.buckets
            .into_iter()
            .map(|(k, [e, a])| {
                (
                    k,
                    e.unwrap_or_else(|| empty.clone()),
                    a.unwrap_or_else(|| empty.clone()),
                )
            })
            .collect()
    }
}

/// A date column as days since the epoch (timestamps are taken in UTC).
fn days(
    column: &arrow::array::ArrayRef,
) -> Result<arrow::array::PrimitiveArray<Date32Type>, ArrowError> {
    let column = match column.data_type() {
        // A zone-aware timestamp is cast to a date in its zone; Delta stores UTC instants, so
        // drop the zone and take the UTC date whatever the reader attached.
        DataType::Timestamp(unit, Some(_)) => {
            arrow::compute::cast(column, &DataType::Timestamp(*unit, None))?
        }
        _ => column.clone(),
    };
    let d = arrow::compute::cast(&column, &DataType::Date32)?;
    Ok(d.as_primitive::<Date32Type>().clone())
}

/// FNV-1a over the bytes, then the SplitMix64 finalizer so that summing the hashes of
/// similar keys does not cancel out.
fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_sums_compare_nan_as_nan_and_zero_regardless_of_sign() {
        assert_eq!(SumValue::Float(f64::NAN), SumValue::Float(-f64::NAN));
        assert_eq!(SumValue::Float(-0.0), SumValue::Float(0.0));
        assert_ne!(SumValue::Float(f64::NAN), SumValue::Float(0.0));
        assert_ne!(SumValue::Float(1.5), SumValue::Float(2.5));
        assert_ne!(
            SumValue::Float(f64::INFINITY),
            SumValue::Float(f64::NEG_INFINITY)
        );
        assert_eq!(SumValue::Exact(3), SumValue::Exact(3));
        assert_ne!(SumValue::Exact(0), SumValue::Float(0.0));
    }

    #[test]
    fn key_hash_is_order_independent_and_tells_keys_apart() {
        let a = hash64(b"a\x1f");
        let b = hash64(b"b\x1f");
        assert_ne!(a, b);
        assert_eq!(a.wrapping_add(b), b.wrapping_add(a));
        assert_ne!(a.wrapping_add(b), hash64(b"c\x1f").wrapping_add(a));
    }
}
