//! Inferred members (seed 001): a fact that names a key the dimension has no record of yet gets
//! a **placeholder** row now — stable surrogate keys, `is_inferred = true`, valid from
//! 1900-01-01, the `placeholder:` attribute values — instead of being dropped or mapped to
//! "Unknown" forever. When the key's first record arrives, the placeholder is completed in place
//! (`fold::fold`: same durable and version keys, `is_inferred = false`, its first version still
//! valid from 1900-01-01 so facts from before the record find it). A placeholder that stays
//! pending past `alert_after` is reported; past `fail_after` the run stops: a growing count means
//! the dimension's feed is broken, not slow.

use std::collections::{HashMap, HashSet};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, TimeUnit};
use chrono::{DateTime, Utc};
use datafusion::prelude::{ident, SessionContext};

use super::fold;
use crate::config::pipeline::dimension::{Infer, INFERRED_AT, IS_INFERRED};
use crate::config::Pipeline;
use crate::lake;
use crate::run::{Phase, RunError};

/// The keys of `batches` that are (or were) placeholders: key text → when first inferred (µs).
pub fn inferred_keys(
    batches: &[RecordBatch],
    keys: &[String],
) -> Result<HashMap<String, i64>, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let mut out = HashMap::new();
    for b in batches {
        let Some(at) = b.column_by_name(INFERRED_AT) else {
            continue;
        };
        let at = arrow::compute::cast(at, &DataType::Timestamp(TimeUnit::Microsecond, None))
            .map_err(a)?;
        let at = at.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let text = fold::key_text(b, keys).map_err(a)?;
        for (i, k) in text.into_iter().enumerate() {
            if at.is_valid(i) {
                out.insert(k, at.value(i));
            }
        }
    }
    Ok(out)
}

/// The placeholders still pending in `batches` (rows with `is_inferred = true`): key text and
/// when inferred (µs).
pub fn pending(batches: &[&RecordBatch], keys: &[String]) -> Result<Vec<(String, i64)>, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let mut out = Vec::new();
    for b in batches {
        let (Some(flag), Some(at)) = (b.column_by_name(IS_INFERRED), b.column_by_name(INFERRED_AT))
        else {
            continue;
        };
        let at = arrow::compute::cast(at, &DataType::Timestamp(TimeUnit::Microsecond, None))
            .map_err(a)?;
        let at = at.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let flag = flag.as_boolean();
        let text = fold::key_text(b, keys).map_err(a)?;
        for (i, k) in text.into_iter().enumerate() {
            if flag.is_valid(i) && flag.value(i) && at.is_valid(i) {
                out.push((k, at.value(i)));
            }
        }
    }
    Ok(out)
}

/// What the facts say: every key they name (nulls left out, as key text), and their newest
/// arrival (`_ingested_at`, µs) when they record one.
pub struct Facts {
    pub keys: HashSet<String>,
    pub newest_arrival: Option<i64>,
}

/// Every key the facts of `infer` name, and their newest arrival.
pub async fn fact_keys(
    ctx: &SessionContext,
    p: &Pipeline,
    infer: &Infer,
) -> Result<Facts, RunError> {
    let mut out = HashSet::new();
    let mut newest_arrival = None;
    for f in &infer.from {
        let uri = f.source.clone();
        let table = lake::open_required(&uri, "infer_from source").await?;
        if let Ok(lake::StatsMax::Max(us)) =
            lake::max_from_stats(&table, crate::config::pipeline::ingest::INGESTED_AT)
        {
            newest_arrival = newest_arrival.max(Some(us));
        }
        let df = crate::run::frame(ctx, &table, &uri, Phase::Read).await?;
        if df.schema().field_with_unqualified_name(&f.key).is_err() {
            let at = format!("key: {}", f.key);
            let at = if p.mentions(&at) {
                at
            } else {
                "infer_from".to_string()
            };
            return Err(p
                .error_at_text(
                    &at,
                    format!(
                        "`infer_from` names column `{}`, which the facts table {uri} does not have; its columns are: {}",
                        f.key,
                        df.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )
                .into());
        }
        let batches = df
            .select(vec![ident(&f.key)])
            .and_then(|df| df.filter(ident(&f.key).is_not_null()))
            .and_then(|df| df.distinct())
            .map_err(RunError::query(Phase::Read))?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Read, &uri))?;
        for b in &batches {
            out.extend(
                fold::key_text(b, std::slice::from_ref(&f.key))
                    .map_err(RunError::arrow(Phase::Read))?,
            );
        }
    }
    Ok(Facts {
        keys: out,
        newest_arrival,
    })
}

/// What the pending placeholders say: the counts and warnings, or the error when some are
/// older than `fail_after`.
pub struct Overdue {
    pub pending: u64,
    pub overdue: u64,
    pub warning: Option<String>,
}

/// A placeholder's age is measured on the facts' clock: from when it was inferred to the facts'
/// newest arrival (the run's time when they record none, or when that is later) — a pipeline
/// that stopped, or a clock ahead of the data, does not make the dimension's feed look broken.
pub fn check(
    p: &Pipeline,
    infer: &Infer,
    pending: &[(String, i64)],
    now: DateTime<Utc>,
    newest_arrival: Option<i64>,
) -> Result<Overdue, RunError> {
    let reference =
        newest_arrival.map_or(now.timestamp_micros(), |a| a.min(now.timestamp_micros()));
    let older = |d: Option<std::time::Duration>| -> Vec<&(String, i64)> {
        let Some(d) = d else { return Vec::new() };
        let horizon = reference - i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let mut v: Vec<&(String, i64)> = pending.iter().filter(|(_, t)| *t < horizon).collect();
        v.sort_by_key(|(_, t)| *t);
        v
    };
    let since = |t: i64| {
        DateTime::<Utc>::from_timestamp_micros(t)
            .map(|t| crate::report::rfc3339(&t))
            .unwrap_or_default()
    };
    let failing = older(infer.fail_after);
    if let Some((key, t)) = failing.first() {
        return Err(super::error::DimensionError::InferredOverdue {
            pipeline: p.name.clone(),
            count: failing.len() as u64,
            oldest: key.clone(),
            since: since(*t),
            after: humantime::format_duration(infer.fail_after.unwrap_or_default()).to_string(),
        }
        .into());
    }
    let alerting = older(infer.alert_after);
    let warning = alerting.first().map(|(key, t)| {
        format!(
            "{} inferred member(s) still pending after {} (oldest: {key}, since {}): the facts name keys the dimension's feed has not delivered; a growing count means the feed is broken, not slow",
            alerting.len(),
            humantime::format_duration(infer.alert_after.unwrap_or_default()),
            since(*t)
        )
    });
    Ok(Overdue {
        pending: pending.len() as u64,
        overdue: alerting.len() as u64,
        warning,
    })
}
