//! Which event days the source changed since the version the aggregate last read: the days a
//! late row, a correction or a delete moved. Read from the source's change data feed when it
//! keeps one for the whole range (exactly the changed rows, before and after images), else from
//! the data files its commits added and removed (every row of a rewritten file counts: more
//! days than changed, never fewer).

use std::collections::BTreeSet;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type};
use chrono::NaiveDate;
use datafusion::prelude::SessionContext;
use deltalake::kernel::Action;
use deltalake::DeltaTable;
use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::config::pipeline::Aggregate;
use crate::lake;
use crate::lake::datafile::DataFile;
use crate::run::{Phase, RunError};

/// The changed days, or why they cannot be known (the caller then restates every day it may).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    Days(BTreeSet<NaiveDate>),
    Unknown(String),
}

/// The event days of the rows the source changed in versions `since + 1 ..= its loaded version`.
pub async fn since(
    ctx: &SessionContext,
    source: &DeltaTable,
    spec: &Aggregate,
    since: u64,
) -> Result<Touched, RunError> {
    let Some(now) = source.version() else {
        return Ok(Touched::Days(BTreeSet::new()));
    };
    if now <= since {
        return Ok(Touched::Days(BTreeSet::new()));
    }
    if lake::datafile::change_data_feed(source) {
        if let Some(days) = from_feed(ctx, source, spec, since + 1, now).await {
            return Ok(Touched::Days(days));
        }
    }
    from_files(source, spec, since, now).await
}

/// The days of the feed's rows; `None` when the feed does not cover the range (turned on
/// later, or its files cleaned up).
async fn from_feed(
    ctx: &SessionContext,
    source: &DeltaTable,
    spec: &Aggregate,
    from: u64,
    to: u64,
) -> Option<BTreeSet<NaiveDate>> {
    let plan = source
        .clone()
        .scan_cdf()
        .with_starting_version(from)
        .with_ending_version(to)
        .build(&ctx.state(), None)
        .await
        .ok()?;
    let mut stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()).ok()?;
    let mut out = BTreeSet::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.ok()?;
        out.extend(days_of(&batch, spec).ok()?);
    }
    Some(out)
}

/// The days of every row of the files the commits added or removed as a data change.
async fn from_files(
    source: &DeltaTable,
    spec: &Aggregate,
    since: u64,
    now: u64,
) -> Result<Touched, RunError> {
    let uri = &spec.source_uri;
    let d = |e| RunError::delta(Phase::Plan, uri)(e);
    let store = source.object_store();
    let mut files: Vec<(String, Option<u64>)> = Vec::new();
    for version in (since + 1)..=now {
        let Some(actions) = lake::commit_actions(source, version).await.map_err(d)? else {
            return Ok(Touched::Unknown(format!(
                "the source's commit {version} is gone (log cleanup)"
            )));
        };
        for action in actions {
            match action {
                Action::Add(a) if a.data_change => files.push((a.path, u64::try_from(a.size).ok())),
                Action::Remove(r) if r.data_change => {
                    files.push((r.path, r.size.and_then(|s| u64::try_from(s).ok())))
                }
                _ => {}
            }
        }
    }
    let column = vec![spec.event_date.clone()];
    let mut out = BTreeSet::new();
    for (path, size) in files {
        let size = match size {
            Some(s) => s,
            None => match store.head(&Path::from(path.as_str())).await {
                Ok(m) => m.size,
                Err(_) => {
                    return Ok(Touched::Unknown(format!(
                        "{path}, which a commit since the last run removed, is gone (vacuumed)"
                    )))
                }
            },
        };
        let file = match DataFile::open(&store, &path, size).await {
            Ok(f) => f,
            Err(_) => {
                return Ok(Touched::Unknown(format!(
                    "{path}, which a commit since the last run added or removed, cannot be read"
                )))
            }
        };
        let groups = (0..file.row_groups().len()).collect();
        let batches =
            file.read(&store, groups, &column)
                .await
                .map_err(|e| RunError::TargetRead {
                    uri: uri.clone(),
                    source: Box::new(e),
                })?;
        for b in &batches {
            out.extend(days_of(b, spec)?);
        }
    }
    Ok(Touched::Days(out))
}

/// The event days of a batch's event column, as the aggregate takes them (see
/// [`super::days::event_day`]).
pub fn days_of(batch: &RecordBatch, spec: &Aggregate) -> Result<Vec<NaiveDate>, RunError> {
    let Some(c) = batch.column_by_name(&spec.event_date) else {
        return Ok(Vec::new());
    };
    let a = |e| RunError::arrow(Phase::Plan)(e);
    let as_date: ArrayRef = match c.data_type() {
        DataType::Timestamp(_, zone) => {
            super::local_date::local_dates(c, zone.as_ref().map(|_| spec.time_zone)).map_err(a)?
        }
        _ => arrow::compute::cast(c, &DataType::Date32).map_err(a)?,
    };
    let dates = as_date.as_primitive::<Date32Type>();
    Ok((0..dates.len())
        .filter(|i| dates.is_valid(*i))
        .filter_map(|i| dates.value_as_date(i))
        .collect())
}
