//! The windows of an aggregate with `window:`, for `tidemark status`: per window of the days
//! still open (and of the newest day), whether it is final, its groups and latest arrival — and
//! with `watermark:`, where the data's clock stands.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use chrono::NaiveDate;
use datafusion::functions_aggregate::expr_fn::{bool_and, count, max};
use datafusion::logical_expr::{lit, SortExpr};
use datafusion::prelude::ident;

use super::days::date_lit;
use crate::config::pipeline::aggregate::{
    Aggregate, DATA_AS_OF, EVENT_DATE, IS_FINAL, WINDOW_END, WINDOW_START,
};
use crate::lake;
use crate::run::{Phase, RunError};

/// One window of gold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WindowStatus {
    pub event_date: NaiveDate,
    pub window_start: At,
    pub window_end: At,
    pub is_final: bool,
    /// Rows of gold (groups) in the window.
    pub groups: i64,
    #[serde(serialize_with = "ser_opt_micros")]
    pub data_as_of: Option<i64>,
}

/// A window bound: an instant (µs, UTC), or a wall-clock time when the event column has no
/// zone; written as RFC 3339 (`Z`), or as the wall clock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub micros: i64,
    pub wall_clock: bool,
}

impl serde::Serialize for At {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::watermark::text(self.micros, !self.wall_clock).unwrap_or_default())
    }
}

fn ser_opt_micros<S: serde::Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&super::watermark::text(*v, true).unwrap_or_default()),
        None => s.serialize_none(),
    }
}

/// Gold's windows on `days` (oldest first), when the pipeline has `window:`.
pub async fn windows(spec: &Aggregate, days: &[NaiveDate]) -> Result<Vec<WindowStatus>, RunError> {
    if spec.window.is_none() || days.is_empty() {
        return Ok(Vec::new());
    }
    let Some(gold) = lake::open_if_exists(&spec.target_uri).await? else {
        return Ok(Vec::new());
    };
    let q = |e| RunError::query(Phase::Read)(e);
    let ctx = lake::session::context();
    let on = ident(EVENT_DATE).in_list(days.iter().map(|d| date_lit(*d)).collect(), false);
    let order: Vec<SortExpr> = vec![ident(WINDOW_START).sort(true, true)];
    let batches = crate::run::frame(&ctx, &gold, &spec.target_uri, Phase::Read)
        .await?
        .filter(on)
        .and_then(|df| {
            df.aggregate(
                vec![ident(EVENT_DATE), ident(WINDOW_START), ident(WINDOW_END)],
                vec![
                    bool_and(ident(IS_FINAL)).alias(IS_FINAL),
                    count(lit(1i64)).alias("groups"),
                    max(ident(DATA_AS_OF)).alias(DATA_AS_OF),
                ],
            )
        })
        .and_then(|df| df.sort(order))
        .map_err(q)?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Read, &spec.target_uri))?;
    let mut out = Vec::new();
    for b in &batches {
        rows(b, &mut out).map_err(RunError::arrow(Phase::Read))?;
    }
    Ok(out)
}

fn rows(b: &RecordBatch, out: &mut Vec<WindowStatus>) -> Result<(), arrow::error::ArrowError> {
    let micros = |name: &str| -> Result<arrow::array::ArrayRef, arrow::error::ArrowError> {
        let c = b
            .column_by_name(name)
            .ok_or_else(|| arrow::error::ArrowError::SchemaError(format!("no column {name}")))?;
        let c = arrow::compute::cast(c, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        arrow::compute::cast(&c, &DataType::Int64)
    };
    let wall_clock = matches!(
        b.schema()
            .field_with_name(WINDOW_START)
            .map(|f| f.data_type().clone()),
        Ok(DataType::Timestamp(_, None))
    );
    let at = |micros| At { micros, wall_clock };
    let (start, end, arrival) = (
        micros(WINDOW_START)?,
        micros(WINDOW_END)?,
        micros(DATA_AS_OF)?,
    );
    let (start, end, arrival) = (
        start.as_primitive::<Int64Type>(),
        end.as_primitive::<Int64Type>(),
        arrival.as_primitive::<Int64Type>(),
    );
    let day = b.column(0).as_primitive::<arrow::datatypes::Date32Type>();
    let fin = b.column_by_name(IS_FINAL).map(|c| c.as_boolean().clone());
    let groups = b
        .column_by_name("groups")
        .map(|c| arrow::compute::cast(c, &DataType::Int64))
        .transpose()?;
    for i in 0..b.num_rows() {
        let Some(event_date) = day.value_as_date(i) else {
            continue;
        };
        out.push(WindowStatus {
            event_date,
            window_start: at(start.value(i)),
            window_end: at(end.value(i)),
            is_final: fin.as_ref().is_some_and(|f| f.is_valid(i) && f.value(i)),
            groups: groups
                .as_ref()
                .map_or(0, |g| g.as_primitive::<Int64Type>().value(i)),
            data_as_of: arrival.is_valid(i).then(|| arrival.value(i)),
        });
    }
    Ok(())
}

/// The newest event time an earlier run recorded (with `watermark:`), from the status table.
pub async fn event_time_seen(spec: &Aggregate, pipeline_app: &str) -> Option<i64> {
    let t = lake::open_if_exists(&spec.status_uri).await.ok()??;
    super::watermark::recorded(&t, pipeline_app).await.ok()?
}
