//! Sessions that read Delta tables without trusting what float statistics cannot say.
//!
//! Parquet and Delta leave NaN out of a float column's min/max (and write -0.0 as 0.0), and
//! DataFusion 55 replaces a column whose file statistics say `min == max` with no nulls by that
//! one value (`constant_columns_from_stats` in its Parquet opener; apache/datafusion#24804):
//! a file holding `[NaN, 1.5]` in a float key or amount is read as `[1.5, 1.5]`, which is a
//! silent wrong answer (a NaN key merged as a real key, a NaN amount summed as a number). Every
//! session tidemark reads tables with carries [`FloatStatsInexact`], which marks the
//! statistics of float columns inexact before a scan runs: pruning still uses them, no value
//! is ever taken from them.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

/// Marks the min/max statistics of float columns inexact in every file scan of a plan.
#[derive(Debug, Default)]
pub struct FloatStatsInexact;

impl PhysicalOptimizerRule for FloatStatsInexact {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            let Some(exec) = node.downcast_ref::<DataSourceExec>() else {
                return Ok(Transformed::no(node));
            };
            let Some(scan) = exec.data_source().downcast_ref::<FileScanConfig>() else {
                return Ok(Transformed::no(node));
            };
            let Some(scan) = demoted(scan) else {
                return Ok(Transformed::no(node));
            };
            let exec = exec.clone().with_data_source(Arc::new(scan));
            Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>))
        })
        .data()
    }

    fn name(&self) -> &str {
        "tidemark_float_stats_inexact"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `scan` with its files' float statistics inexact; `None` when none was exact.
fn demoted(scan: &FileScanConfig) -> Option<FileScanConfig> {
    let exact = |s: &Statistics| s.column_statistics.iter().any(exact_float);
    let any = scan
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .any(|f| f.statistics.as_deref().is_some_and(exact));
    if !any {
        return None;
    }
    let mut scan = scan.clone();
    for group in &mut scan.file_groups {
        let files: Vec<_> = std::mem::take(group)
            .into_inner()
            .into_iter()
            .map(|mut f| {
                if let Some(s) = f.statistics.as_deref().filter(|s| exact(s)) {
                    let mut s = s.clone();
                    s.column_statistics.iter_mut().for_each(demote);
                    f.statistics = Some(Arc::new(s));
                }
                f
            })
            .collect();
        *group = datafusion::datasource::physical_plan::FileGroup::new(files);
    }
    Some(scan)
}

fn is_float(v: &Precision<ScalarValue>) -> bool {
    matches!(
        v.get_value(),
        Some(ScalarValue::Float16(_) | ScalarValue::Float32(_) | ScalarValue::Float64(_))
    )
}

fn exact_float(c: &ColumnStatistics) -> bool {
    (is_float(&c.min_value) || is_float(&c.max_value))
        && (c.min_value.is_exact() == Some(true) || c.max_value.is_exact() == Some(true))
}

fn demote(c: &mut ColumnStatistics) {
    if is_float(&c.min_value) || is_float(&c.max_value) {
        c.min_value = std::mem::take(&mut c.min_value).to_inexact();
        c.max_value = std::mem::take(&mut c.max_value).to_inexact();
    }
}

/// `builder` with [`FloatStatsInexact`] after DataFusion's own rules.
pub fn guarded(builder: SessionStateBuilder) -> SessionStateBuilder {
    builder.with_physical_optimizer_rule(Arc::new(FloatStatsInexact))
}

/// A session on delta-rs' defaults, guarded: for the reads outside a run's engine (status,
/// maintenance, restore, `changes`).
pub fn context() -> SessionContext {
    let ctx = deltalake::delta_datafusion::DeltaSessionContext::default().into_inner();
    let state = guarded(SessionStateBuilder::new_from_existing(ctx.state())).build();
    SessionContext::new_with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Float64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Float64Type, Schema};

    /// `[NaN, 1.5]` has statistics min = max = 1.5 and no nulls: a guarded session reads NaN.
    #[tokio::test]
    async fn a_nan_beside_one_value_is_read_as_nan() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("f.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Float64Array::from(vec![f64::NAN, 1.5]))],
        )
        .expect("batch");
        let file = std::fs::File::create(&path).expect("create");
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
        w.write(&batch).expect("write");
        w.close().expect("close");
        let ctx = context();
        let df = ctx
            .read_parquet(path.display().to_string(), Default::default())
            .await
            .expect("read");
        let b = df.collect().await.expect("collect");
        let x: Vec<f64> = b
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Float64Type>().values().to_vec())
            .collect();
        assert_eq!(x.len(), 2);
        assert!(x.iter().any(|v| v.is_nan()), "{x:?}");
    }
}
