//! Bookings the day status does not count yet. The commits go adjustments → gold → status: a run
//! killed after its adjustments' commit, before the status table's, leaves a booking the status
//! never saw — and its rerun finds the difference already booked, books nothing, and so would
//! never count it (`adjusted_after_close` one short, the day's facts stale, for good).
//!
//! So each status commit records (a `txn`) the adjustments table's version whose bookings it
//! counts, and a run that finds this pipeline's own bookings committed after that version counts
//! them: one more adjusting run per run that booked a day, the day's facts as the run reads them
//! (it adjusts those days again: nothing is owed, they are only read). The status then ends as
//! an uninterrupted run leaves it.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type};
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::prelude::{ident, lit, SessionContext};
use deltalake::kernel::{Action, Transaction};
use deltalake::DeltaTable;

use super::adjust::RUN_ID;
use super::compute::DayFacts;
use super::plan::Plan;
use super::status::{self, DayStatus};
use crate::config::pipeline::aggregate::{AfterClose, EVENT_DATE};
use crate::lake;
use crate::run::{Phase, RunError};

/// Bookings the status does not count yet: the run that booked → the days it booked.
pub(super) type Missed = BTreeMap<String, BTreeSet<NaiveDate>>;

fn accounted_app(pipeline_app: &str) -> String {
    format!("{pipeline_app}/adjustments_accounted")
}

/// The transaction of a status commit: the adjustments table's version whose bookings the status
/// counts (`-1`: no adjustments table yet).
pub(super) fn accounted_transaction(pipeline_app: &str, version: Option<u64>) -> Transaction {
    let v = version.and_then(|v| i64::try_from(v).ok()).unwrap_or(-1);
    Transaction::new(accounted_app(pipeline_app), v)
}

impl super::Run<'_, '_> {
    /// The bookings of this pipeline's runs in the adjustments table's commits after the version
    /// the status table counts (`after_close: adjust` only). A status table that records no
    /// such version (written before it was recorded) counts every booking as it stands.
    pub(super) async fn missed_bookings(
        &self,
        status_table: Option<&DeltaTable>,
        adjustments: Option<&DeltaTable>,
    ) -> Result<Missed, RunError> {
        let spec = self.spec;
        let (Some(st), Some(adj), AfterClose::Adjust) =
            (status_table, adjustments, spec.after_close)
        else {
            return Ok(Missed::new());
        };
        let accounted = st
            .snapshot()
            .map_err(RunError::delta(Phase::Plan, &spec.status_uri))?
            .transaction_version(st.log_store().as_ref(), &accounted_app(&self.p.app_id()))
            .await
            .map_err(RunError::delta(Phase::Plan, &spec.status_uri))?;
        let (Some(accounted), Some(latest)) = (accounted, adj.version()) else {
            return Ok(Missed::new());
        };
        let mut runs = Vec::new();
        for version in u64::try_from(accounted + 1).unwrap_or(0)..=latest {
            let run = booking_run(adj, version, &self.p.name)
                .await
                .map_err(RunError::delta(Phase::Plan, &spec.adjustments_uri))?;
            runs.extend(run);
        }
        if runs.is_empty() {
            return Ok(Missed::new());
        }
        days_booked(&self.a.ctx, adj, &spec.adjustments_uri, runs).await
    }
}

/// The run of `pipeline` that booked adjustments in commit `version` (an append), if any. (A
/// commit log cleanup removed says nothing; a delete or restore books nothing.)
async fn booking_run(
    table: &DeltaTable,
    version: u64,
    pipeline: &str,
) -> Result<Option<String>, deltalake::DeltaTableError> {
    let Some(actions) = lake::commit_actions(table, version).await? else {
        return Ok(None);
    };
    Ok(actions.into_iter().find_map(|a| match a {
        Action::CommitInfo(ci) if ci.operation.as_deref() == Some("WRITE") => {
            let run = ci.info.get(lake::COMMIT_INFO_KEY)?;
            let ours = run.get("pipeline")?.as_str()? == pipeline;
            ours.then(|| run.get("run_id")?.as_str().map(str::to_string))?
        }
        _ => None,
    }))
}

/// The days each of `runs` booked, as the adjustments table holds them now (a restore may have
/// taken a booking back: then it is not counted).
async fn days_booked(
    ctx: &SessionContext,
    adj: &DeltaTable,
    uri: &str,
    runs: Vec<String>,
) -> Result<Missed, RunError> {
    let df = crate::run::frame(ctx, adj, uri, Phase::Plan).await?;
    if df.schema().field_with_unqualified_name(RUN_ID).is_err() {
        return Ok(Missed::new());
    }
    let batches = df
        .filter(ident(RUN_ID).in_list(runs.into_iter().map(lit).collect(), false))
        .and_then(|df| df.select(vec![ident(RUN_ID), ident(EVENT_DATE)]))
        .and_then(|df| df.distinct())
        .map_err(RunError::query(Phase::Plan))?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Plan, uri))?;
    let mut out = Missed::new();
    for b in &batches {
        for (run, day) in runs_and_days(b)? {
            out.entry(run).or_default().insert(day);
        }
    }
    Ok(out)
}

/// The (run id, event day) pairs of a batch of those two columns.
fn runs_and_days(b: &RecordBatch) -> Result<Vec<(String, NaiveDate)>, RunError> {
    let cast = |i: usize, t: &DataType| {
        arrow::compute::cast(b.column(i), t).map_err(RunError::arrow(Phase::Plan))
    };
    let (runs, days) = (cast(0, &DataType::Utf8)?, cast(1, &DataType::Date32)?);
    let (runs, days) = (runs.as_string::<i32>(), days.as_primitive::<Date32Type>());
    Ok((0..b.num_rows())
        .filter(|i| runs.is_valid(*i) && days.is_valid(*i))
        .filter_map(|i| Some((runs.value(i).to_string(), days.value_as_date(i)?)))
        .collect())
}

/// The run reads the days of missed bookings: it adjusts those it does not recompute.
pub(super) fn widen(plan: &mut Plan, missed: &Missed) {
    for d in missed.values().flatten() {
        if !plan.days.set.contains(d) {
            plan.adjust.insert(*d);
        }
    }
}

/// How many runs booked each day that the status does not count yet: the missed ones, and this
/// run for the days it books (once: a run planned again after losing a commit race may have
/// booked already, under the same id).
pub(super) fn runs_by_day(
    missed: &Missed,
    booked_now: Vec<NaiveDate>,
    run_id: &str,
) -> BTreeMap<NaiveDate, i64> {
    let mut runs: BTreeMap<NaiveDate, BTreeSet<&str>> = BTreeMap::new();
    for (run, days) in missed {
        for d in days {
            runs.entry(*d).or_default().insert(run);
        }
    }
    for d in booked_now {
        runs.entry(d).or_default().insert(run_id);
    }
    runs.into_iter().map(|(d, r)| (d, r.len() as i64)).collect()
}

/// After a full reload: the missed bookings of the days it rebuilt counted (the reload's own
/// status keeps each day's count of adjusting runs, as an uninterrupted run left it).
pub(super) fn count_after_reload(
    new_status: &mut BTreeMap<NaiveDate, DayStatus>,
    missed: &Missed,
    facts: &BTreeMap<NaiveDate, DayFacts>,
    logical: NaiveDate,
    now: DateTime<Utc>,
) {
    let mut runs = runs_by_day(missed, Vec::new(), "");
    runs.retain(|d, _| facts.contains_key(d) && new_status.contains_key(d));
    status::adjusted(new_status, &runs, facts, logical, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn each_run_counts_once_per_day_this_one_included() {
        let mut missed = Missed::new();
        missed.insert("a".into(), [d("2024-04-01"), d("2024-04-02")].into());
        missed.insert("b".into(), [d("2024-04-02")].into());
        let runs = runs_by_day(&missed, vec![d("2024-04-02"), d("2024-04-03")], "c");
        let want: BTreeMap<NaiveDate, i64> = [
            (d("2024-04-01"), 1),
            (d("2024-04-02"), 3),
            (d("2024-04-03"), 1),
        ]
        .into();
        assert_eq!(runs, want);
        // (a run planned again after it booked: its own earlier booking is the same run)
        let runs = runs_by_day(&missed, vec![d("2024-04-01")], "a");
        assert_eq!(runs.get(&d("2024-04-01")), Some(&1));
    }

    #[test]
    fn the_accounted_version_is_minus_one_without_a_table() {
        let t = accounted_transaction("tidemark/p", None);
        assert_eq!(
            (t.app_id.as_str(), t.version),
            ("tidemark/p/adjustments_accounted", -1)
        );
        assert_eq!(accounted_transaction("tidemark/p", Some(4)).version, 4);
    }
}
