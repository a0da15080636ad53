//! Writing to the target: the conditional merge of an incremental run, and the one overwrite
//! commit of a full reload. Each is exactly one Delta commit carrying the run's metadata.

use std::num::NonZeroU64;
use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::{Column, TableReference};
use datafusion::logical_expr::{lit, Expr, LogicalPlan};
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::merge::{MergeBuilder, MergeMetrics};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use crate::config::pipeline::DELETED_COLUMN;
use crate::keyed::roles::ColumnRoles;
use crate::lake;
use crate::lake::storage::storage_batch;
use crate::run::{Phase, RunError};

fn qualified(table: &str, column: &str) -> Expr {
    Expr::Column(Column::new(Some(TableReference::bare(table)), column))
}

/// Merges `changes` (rows already known to win) by key in one commit. The target handle must be
/// the snapshot the changes were computed against: if another writer committed since, Delta's
/// conflict check fails this commit instead of overwriting newer data.
pub async fn merge(
    ctx: &SessionContext,
    target: DeltaTable,
    uri: &str,
    roles: &ColumnRoles,
    changes: Vec<RecordBatch>,
    props: CommitProperties,
    add_new_columns: bool,
) -> Result<(DeltaTable, MergeMetrics), RunError> {
    let d = RunError::delta;
    let changes = changes
        .iter()
        .map(storage_batch)
        .collect::<Result<Vec<_>, _>>()
        .map_err(RunError::arrow(Phase::Commit))?;
    let schema = changes
        .first()
        .map(|b| b.schema())
        .ok_or_else(|| RunError::Arrow {
            phase: Phase::Commit,
            source: arrow::error::ArrowError::InvalidArgumentError("no rows to merge".into()),
        })?;
    let mem = datafusion::datasource::MemTable::try_new(schema, vec![changes])
        .map_err(RunError::query(Phase::Commit))?;
    let source = ctx
        .read_table(Arc::new(mem))
        .map_err(RunError::query(Phase::Commit))?;
    let target = live_feed(target, &roles.keys);
    let mut builder =
        keyed_merge(ctx, target, source, roles, props).with_merge_schema(add_new_columns);
    if roles.hard_deletes() {
        builder = builder
            .when_matched_delete(|del| del.predicate(qualified("s", DELETED_COLUMN).eq(lit(true))))
            .map_err(d(Phase::Commit, uri))?;
    }
    upsert(builder, roles, None)
        .map_err(d(Phase::Commit, uri))?
        .await
        .map_err(RunError::write(Phase::Commit, uri))
}

/// `target` with its MERGE's change data feed rewritten to describe the live table (soft
/// deletes as deletes; `super::feed`), when it keeps one.
pub(super) fn live_feed(target: DeltaTable, keys: &[String]) -> DeltaTable {
    match super::feed::LiveFeed::for_table(&target, keys) {
        Some(feed) => lake::facts::with_patches(target, vec![feed]),
        None => target,
    }
}

/// A MERGE of `source` (alias `s`) into `target` (alias `t`) on the key columns, committing
/// with `props`.
fn keyed_merge(
    ctx: &SessionContext,
    target: DeltaTable,
    source: datafusion::prelude::DataFrame,
    roles: &ColumnRoles,
    props: CommitProperties,
) -> MergeBuilder {
    let on = roles
        .keys
        .iter()
        .map(|k| qualified("t", k).eq(qualified("s", k)))
        .reduce(Expr::and)
        .unwrap_or_else(|| lit(false));
    target
        .merge(source, on)
        .with_source_alias("s")
        .with_target_alias("t")
        .with_commit_properties(props)
        .with_session_state(Arc::new(ctx.state()))
}

/// A matched key takes the source's row (when `only_if` holds, if given); an unmatched one is
/// inserted — every target column from the source.
fn upsert(
    builder: MergeBuilder,
    roles: &ColumnRoles,
    only_if: Option<Expr>,
) -> Result<MergeBuilder, deltalake::DeltaTableError> {
    let columns = roles.target_columns.clone();
    let update_cols = columns.clone();
    builder
        .when_matched_update(move |mut u| {
            if let Some(p) = only_if {
                u = u.predicate(p);
            }
            for c in &update_cols {
                u = u.update(c.as_str(), qualified("s", c));
            }
            u
        })?
        .when_not_matched_insert(move |mut i| {
            for c in &columns {
                i = i.set(c.as_str(), qualified("s", c));
            }
            i
        })
}

/// A full reload of a target that keeps a change data feed: one MERGE of every winner, so the
/// feed holds the difference between the old and the new target — rows that differ are
/// updated, new keys inserted, keys no longer there deleted — and not every row deleted and
/// inserted again. Unchanged rows are copied without entering the feed.
pub async fn merge_all(
    ctx: &SessionContext,
    target: DeltaTable,
    uri: &str,
    roles: &ColumnRoles,
    winners: datafusion::prelude::DataFrame,
    props: CommitProperties,
) -> Result<(DeltaTable, MergeMetrics), RunError> {
    let d = RunError::delta;
    let differs = roles
        .target_columns
        .iter()
        .map(|c| {
            datafusion::logical_expr::binary_expr(
                qualified("t", c),
                datafusion::logical_expr::Operator::IsDistinctFrom,
                qualified("s", c),
            )
        })
        .reduce(Expr::or)
        .unwrap_or_else(|| lit(false));
    let target = live_feed(target, &roles.keys);
    upsert(
        keyed_merge(ctx, target, winners, roles, props),
        roles,
        Some(differs),
    )
    .map_err(d(Phase::Write, uri))?
    .when_not_matched_by_source_delete(|del| del)
    .map_err(d(Phase::Write, uri))?
    .await
    .map_err(RunError::write(Phase::Write, uri))
}

/// How big the target's files and their row groups are (the pipeline's `target:` block).
#[derive(Debug, Clone)]
pub struct FileShape {
    pub file_size: u64,
    pub row_group_rows: usize,
    /// Create the table with `delta.enableChangeDataFeed = true`.
    pub change_data_feed: bool,
    /// Create the table with the `deletionVectors` feature (`target.apply: deletion_vectors`).
    pub deletion_vectors: bool,
    /// The columns the rows are unique by (`keyed_writer_properties`).
    pub keys: Vec<String>,
}

/// What the overwrite commit carries: the run's facts known before the write, and those
/// completed when the commit file is written (`crate::lake::facts`).
pub struct OverwriteCommit {
    pub props: CommitProperties,
    pub final_facts: lake::facts::FinalFacts,
}

/// Replaces the whole target with the rows of `plan` in one commit; creates the table (with
/// `delta.targetFileSize`) when it does not exist. Readers see the old table or the new one.
pub async fn overwrite(
    ctx: &SessionContext,
    target: Option<DeltaTable>,
    uri: &str,
    name: &str,
    shape: FileShape,
    plan: LogicalPlan,
    commit: OverwriteCommit,
) -> Result<DeltaTable, RunError> {
    let OverwriteCommit { props, final_facts } = commit;
    let d = RunError::delta;
    let FileShape {
        file_size,
        row_group_rows,
        change_data_feed,
        deletion_vectors,
        keys,
    } = shape;
    let size = NonZeroU64::new(file_size);
    // A failed bootstrap leaves no empty target folder behind.
    let new_dirs = match target {
        Some(_) => lake::NewDirs::default(),
        None => lake::NewDirs::before_create(uri),
    };
    let table = match target {
        Some(t) => Ok(t),
        None => lake::create_url(uri)
            .map_err(RunError::from)
            .and_then(|url| {
                lake::builder(url)
                    .and_then(|b| b.build())
                    .map_err(d(Phase::Write, uri))
            }),
    };
    let table = match table {
        Ok(t) => t,
        Err(e) => {
            new_dirs.remove_empty();
            return Err(e);
        }
    };
    let fresh = table.version().is_none();
    let table = lake::facts::with_final_facts(table, final_facts);
    let mut builder = table
        .write(std::iter::empty())
        .with_input_plan(plan)
        .with_save_mode(SaveMode::Overwrite)
        .with_schema_mode(SchemaMode::Overwrite)
        .with_target_file_size(size)
        .with_writer_properties(lake::datafile::keyed_writer_properties(
            row_group_rows,
            &keys,
        ))
        .with_commit_properties(lake::no_blind_retry(props))
        .with_session_state(Arc::new(ctx.state()));
    if fresh {
        let mut config = vec![(
            "delta.targetFileSize".to_string(),
            Some(file_size.to_string()),
        )];
        if change_data_feed {
            config.push((
                lake::datafile::CHANGE_DATA_FEED.to_string(),
                Some("true".to_string()),
            ));
        }
        if deletion_vectors {
            config.push((lake::dv::ENABLE.to_string(), Some("true".to_string())));
        }
        builder = builder.with_table_name(name).with_configuration(config);
    }
    let written = builder.await.map_err(RunError::write(Phase::Write, uri));
    if written.is_err() {
        new_dirs.remove_empty();
    }
    written
}
