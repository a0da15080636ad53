//! Counting conditions inside the stream that reads the source, instead of in a pass of its
//! own: a full reload's `warn` expectations are only counted, and a separate aggregate over the
//! whole source would decode every column they name a second time.
//!
//! [`Tally::filter`] wraps a row filter in one opaque function call whose arguments are the
//! filter and the conditions to count: all are evaluated on every batch the scan produces (a
//! function's arguments are, before it runs), the trues of each condition are added to shared
//! counters, and the filter's result (NULL as false) is returned. The call is volatile, so the
//! optimizer neither removes it nor splits it; the counts are complete once the stream has been
//! read to its end.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Counters of conditions evaluated inside a stream.
#[derive(Debug, Clone)]
pub struct Tally {
    counts: Arc<Vec<AtomicU64>>,
}

impl Tally {
    /// `keep` (the row filter) with `counted` counted on the way; read the counts with
    /// [`Tally::counts`] once the stream is drained.
    pub fn filter(counted: Vec<Expr>, keep: Expr) -> (Expr, Tally) {
        let tally = Tally {
            counts: Arc::new((0..counted.len()).map(|_| AtomicU64::new(0)).collect()),
        };
        let udf = ScalarUDF::new_from_impl(TallyUdf {
            signature: Signature::variadic_any(Volatility::Volatile),
            tally: tally.clone(),
        });
        let mut args = vec![keep];
        args.extend(counted);
        (udf.call(args), tally)
    }

    /// Rows each condition was true for, so far.
    pub fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

#[derive(Debug)]
struct TallyUdf {
    signature: Signature,
    tally: Tally,
}

impl PartialEq for TallyUdf {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.tally.counts, &other.tally.counts)
    }
}

impl Eq for TallyUdf {}

impl Hash for TallyUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.tally.counts) as usize).hash(state)
    }
}

impl ScalarUDFImpl for TallyUdf {
    fn name(&self) -> &str {
        "tidemark_tally"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays: Vec<ArrayRef> = args
            .args
            .into_iter()
            .map(|a| a.into_array(rows))
            .collect::<Result<_>>()?;
        let boolean = |a: &ArrayRef| -> Result<BooleanArray> {
            a.as_boolean_opt().cloned().ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "tidemark_tally counts conditions, got {}",
                    a.data_type()
                ))
            })
        };
        for (i, a) in arrays.iter().enumerate().skip(1) {
            let b = boolean(a)?;
            let trues = b.true_count() as u64;
            if let Some(c) = self.tally.counts.get(i - 1) {
                c.fetch_add(trues, Ordering::Relaxed);
            }
        }
        let keep = match arrays.first() {
            Some(a) => boolean(a)?,
            None => BooleanArray::from(vec![true; rows]),
        };
        // NULL keeps nothing, as in a filter.
        let keep: BooleanArray = keep.iter().map(|v| Some(v.unwrap_or(false))).collect();
        Ok(ColumnarValue::Array(Arc::new(keep)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{Field, Schema};
    use datafusion::prelude::{col, lit, SessionContext};

    #[tokio::test]
    async fn counts_every_row_and_keeps_what_the_filter_keeps() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from(vec![
                Some(1),
                Some(5),
                None,
                Some(-3),
                Some(8),
            ]))],
        )
        .expect("batch");
        let ctx = SessionContext::new();
        let df = ctx.read_batch(batch).expect("df");
        let (filter, tally) = Tally::filter(
            vec![col("v").lt(lit(0)), col("v").gt(lit(4))],
            col("v").gt(lit(0)),
        );
        let kept: usize = df
            .filter(filter)
            .expect("filter")
            .collect()
            .await
            .expect("collect")
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(kept, 3, "1, 5 and 8; NULL is dropped");
        assert_eq!(
            tally.counts(),
            vec![1, 2],
            "counted over every row, kept or not"
        );
    }
}
