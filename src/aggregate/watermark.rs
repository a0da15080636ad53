//! Finality by the data's own clock (`watermark:`, seeds 002 and 003): the watermark is the
//! newest event time the source has shown (recorded in gold's and the status table's commits,
//! never moving back) minus `delay`; a window — a day without `window:` — is final once the
//! watermark is at or past its end plus `allowed_lateness`.
//!
//! The run turns the watermark into the day machinery's terms before it plans: the logical date
//! is the newest event's day, and the lookback reaches back to the first day not yet wholly
//! final. Every other rule (days restated whole, closed days restated or adjusted per
//! `after_close`, the status table) is the logical-date rule's; windows inside the first open
//! day that are already final are labelled so row by row.

use chrono::{DateTime, NaiveDate, Utc};
use datafusion::functions_aggregate::expr_fn::max;
use datafusion::logical_expr::{cast, ident};
use datafusion::prelude::SessionContext;
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;

use crate::config::pipeline::aggregate::Watermark;
use crate::config::pipeline::Aggregate;
use crate::lake;
use crate::lake::{max_from_stats, StatsMax};
use crate::run::{Attempt, Phase, RunError};

/// Where the data's clock stands for this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// The newest event time seen (µs; wall-clock µs for a column without a zone), this run's
    /// source included; `None` while the source has shown none.
    pub seen: Option<i64>,
    /// The previous run's, as recorded.
    pub seen_before: Option<i64>,
    /// Windows ending at or before it are final (`seen − delay − allowed_lateness`).
    pub final_before: Option<i64>,
    /// Event times past the run's clock were left out of `seen` (rows dated in the future).
    pub capped: bool,
}

impl Clock {
    /// The watermark itself: `seen − delay`.
    pub fn watermark(&self, w: Watermark) -> Option<i64> {
        self.seen.map(|s| s.saturating_sub(w.delay))
    }

    /// What finality was as of the previous run.
    pub fn final_before_then(&self, w: Watermark) -> Option<i64> {
        self.seen_before
            .map(|s| s.saturating_sub(w.delay).saturating_sub(w.allowed_lateness))
    }

    /// The logical date (the newest event's day) and the lookback reaching the first day not
    /// wholly final, for the day machinery; `None` before any event.
    pub fn days(&self, spec: &Aggregate, instants: bool) -> Option<(NaiveDate, u32)> {
        let date = |t: i64| local_date(t, spec, instants);
        let logical = date(self.seen?)?;
        let open_from = date(self.final_before?)?;
        Some((logical, (logical - open_from).num_days().max(0) as u32))
    }
}

/// The date of `t` in the pipeline's zone (an instant) or as is (a wall-clock time).
pub fn local_date(t: i64, spec: &Aggregate, instants: bool) -> Option<NaiveDate> {
    let at = DateTime::<Utc>::from_timestamp_micros(t)?;
    Some(match instants {
        true => at.with_timezone(&spec.time_zone).date_naive(),
        false => at.date_naive(),
    })
}

/// An instant as RFC 3339 (UTC, `Z`), or a wall-clock time (a column without a zone) as it
/// reads, without a zone.
pub fn text(t: i64, instants: bool) -> Option<String> {
    let at = DateTime::<Utc>::from_timestamp_micros(t)?;
    Some(match instants {
        true => at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        false => at.naive_utc().format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
    })
}

/// Whether `spec`'s event column holds instants (a zoned timestamp), not wall-clock times;
/// `true` when the source cannot tell.
pub async fn event_instants(spec: &Aggregate) -> bool {
    let Ok(Some(source)) = lake::open_if_exists(&spec.source_uri).await else {
        return true;
    };
    let field = source
        .snapshot()
        .ok()
        .and_then(|s| s.schema().field(&spec.event_date).cloned());
    !matches!(
        field.map(|f| f.data_type().clone()),
        Some(deltalake::kernel::DataType::Primitive(
            deltalake::kernel::PrimitiveType::TimestampNtz
        ))
    )
}

/// The transaction app id recording the newest event time seen.
fn app(pipeline_app: &str) -> String {
    format!("{pipeline_app}/event_time_seen")
}

/// The transaction recording `seen` in a commit.
pub fn transaction(pipeline_app: &str, seen: i64) -> Transaction {
    Transaction::new(app(pipeline_app), seen)
}

/// The newest event time an earlier run recorded in `table`.
pub async fn recorded(
    table: &DeltaTable,
    pipeline_app: &str,
) -> Result<Option<i64>, deltalake::DeltaTableError> {
    table
        .snapshot()?
        .transaction_version(table.log_store().as_ref(), &app(pipeline_app))
        .await
}

/// The clock of a run at `now`: the newest event time in the source (from the log's
/// statistics when every file has them, else a scan of the column), never past `now`, never
/// before what an earlier run recorded.
pub async fn clock(
    ctx: &SessionContext,
    spec: &Aggregate,
    w: Watermark,
    source: &DeltaTable,
    seen_before: Option<i64>,
    now: DateTime<Utc>,
    instants: bool,
) -> Result<Clock, RunError> {
    let limit = match instants {
        true => now.timestamp_micros(),
        // (a wall-clock column: now on the pipeline's wall clock)
        false => now
            .with_timezone(&spec.time_zone)
            .naive_local()
            .and_utc()
            .timestamp_micros(),
    };
    let (newest, capped) = newest_event(ctx, spec, source, limit).await?;
    let seen = match (seen_before, newest) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    Ok(Clock {
        seen,
        seen_before,
        final_before: seen.map(|s| s.saturating_sub(w.delay).saturating_sub(w.allowed_lateness)),
        capped,
    })
}

/// The newest event time among the source's rows at or before `limit` (µs; `None` when there
/// is none), and whether some row is dated after it. From the log's statistics when they
/// suffice (every file has them, and nothing is dated past the limit), else a scan of the
/// column: a row dated in the future never stands for the data's clock.
async fn newest_event(
    ctx: &SessionContext,
    spec: &Aggregate,
    source: &DeltaTable,
    limit: i64,
) -> Result<(Option<i64>, bool), RunError> {
    let future = match max_from_stats(source, &spec.event_date)
        .map_err(RunError::delta(Phase::Plan, &spec.source_uri))?
    {
        StatsMax::Empty => return Ok((None, false)),
        // (statistics are truncated to milliseconds: the watermark is at most 999 µs behind)
        StatsMax::Max(v) if v <= limit => return Ok((Some(v), false)),
        StatsMax::Max(_) => true,
        StatsMax::Missing => false,
    };
    let q = |e| RunError::query(Phase::Plan)(e);
    let micros =
        arrow::datatypes::DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None);
    let column = cast(ident(&spec.event_date), micros);
    let at_most = datafusion::logical_expr::lit(
        datafusion::scalar::ScalarValue::TimestampMicrosecond(Some(limit), None),
    );
    let df = crate::run::frame(ctx, source, &spec.source_uri, Phase::Plan)
        .await?
        .aggregate(
            vec![],
            vec![
                max(
                    datafusion::logical_expr::when(column.clone().lt_eq(at_most), column.clone())
                        .end()
                        .map_err(q)?,
                )
                .alias("newest"),
                max(column).alias("any"),
            ],
        )
        .map_err(q)?;
    let batches = df
        .collect()
        .await
        .map_err(RunError::scan(Phase::Plan, &spec.source_uri))?;
    let Some(b) = batches.iter().find(|b| b.num_rows() > 0) else {
        return Ok((None, future));
    };
    let value = |i: usize| -> Result<Option<i64>, RunError> {
        let v = arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Int64)
            .map_err(RunError::arrow(Phase::Plan))?;
        let v = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&v);
        Ok(arrow::array::Array::is_valid(v, 0).then(|| v.value(0)))
    };
    let any = value(1)?;
    Ok((value(0)?, future || any.is_some_and(|a| a > limit)))
}

/// The pipeline as the data's clock makes it for this run (the logical date's lookback
/// reaching the first day not wholly final), the source it opened, and the clock.
pub(super) async fn by_watermark(
    spec: &Aggregate,
    w: Watermark,
    a: &mut Attempt<'_>,
    now: DateTime<Utc>,
) -> Result<(Aggregate, deltalake::DeltaTable, Option<Ticked>), RunError> {
    let source = lake::open_required(&spec.source_uri, "source").await?;
    let mut effective = spec.clone();
    let column = source
        .snapshot()
        .ok()
        .and_then(|s| s.schema().field(&spec.event_date).cloned());
    // (a missing or mistyped column is the plan's to name)
    let instants = match column.map(|f| f.data_type().clone()) {
        Some(deltalake::kernel::DataType::Primitive(
            deltalake::kernel::PrimitiveType::Timestamp,
        )) => true,
        Some(_) => false,
        None => return Ok((effective, source, None)),
    };
    let recorded_in = match lake::open_if_exists(&spec.status_uri).await? {
        Some(t) => Some(t),
        None => lake::open_if_exists(&spec.target_uri).await?,
    };
    let seen_before = match &recorded_in {
        Some(t) => recorded(t, &a.p.app_id())
            .await
            .map_err(RunError::delta(Phase::Plan, &spec.status_uri))?,
        None => None,
    };
    let clock = clock(&a.ctx, spec, w, &source, seen_before, now, instants).await?;
    if clock.capped {
        a.warn(format!(
            "the source has rows with an event time ({}) after this run's clock: the watermark stops at the clock, and their days wait for a run that reaches them (a producer's clock ahead, or a wrong time zone)",
            spec.event_date
        ));
    }
    let (logical, lookback) = clock.days(spec, instants).unwrap_or((
        super::days::logical_date(spec, None, now),
        spec.max_lookback_days,
    ));
    effective.lookback_days = lookback;
    effective.max_lookback_days = spec.max_lookback_days.max(lookback);
    Ok((
        effective,
        source,
        Some(Ticked {
            clock,
            logical,
            watermark: w,
            windows_final_before: spec.window.and(clock.final_before),
            instants,
        }),
    ))
}

/// A run's data clock (`watermark:`), as the days see it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticked {
    pub(super) clock: Clock,
    pub(super) logical: NaiveDate,
    pub(super) watermark: Watermark,
    /// With `window:`: windows ending at or before it are final, in any day.
    pub(super) windows_final_before: Option<i64>,
    /// The event column holds instants (not wall-clock times).
    pub(super) instants: bool,
}

impl Ticked {
    /// The first day the previous run left open (`None` before any run recorded a clock).
    pub(super) fn open_before(&self, spec: &Aggregate) -> Option<NaiveDate> {
        let x = self.clock.final_before_then(self.watermark)?;
        local_date(x, spec, self.instants)
    }
}
