//! The plan of a `dimension` run: which keys it rebuilds.

use arrow::array::RecordBatch;
use datafusion::logical_expr::Expr;
use datafusion::prelude::ident;
use deltalake::DeltaTable;

use super::compare::written_layout;
use super::fold::Layout;
use super::Run;
use crate::lake;
use crate::report::RunMode;
use crate::run::{Phase, RunError};
use std::sync::Arc;

/// The most keys an incremental run replaces by name; more are rebuilt with the whole table.
const MAX_KEYS_REPLACED: usize = 50_000;

/// Which keys a run rebuilds.
pub(super) enum Scope {
    All,
    /// The keys of the rows landed since the previous run, and those rows (where rows without
    /// a key or sequence are found).
    Keys(Vec<RecordBatch>, Box<datafusion::prelude::DataFrame>),
    Nothing,
}

impl Run<'_, '_> {
    /// The keys to rebuild: all (no table yet, a full reload, or a table tidemark never
    /// recorded a source version in), those of the rows landed since the recorded version, or
    /// none.
    pub(super) async fn scope(
        &mut self,
        source: &DeltaTable,
        target: Option<&DeltaTable>,
        storage_schema: &arrow::datatypes::SchemaRef,
        layout: &Layout,
    ) -> Result<Scope, RunError> {
        let d = self.d;
        let Some(target) = target else {
            self.a.set_mode(RunMode::Bootstrap);
            return Ok(Scope::All);
        };
        let record = lake::record::read(target, &self.p.app_id())
            .await
            .map_err(RunError::delta(Phase::Plan, &d.target_uri))?;
        self.c.previous_source_version = record.version.map(|v| v as u64);
        if self.opts.full_reload {
            self.a.set_mode(RunMode::FullReload);
            return Ok(Scope::All);
        }
        let held = target
            .snapshot()
            .map(|s| Arc::new(lake::storage::storage_schema(&s.snapshot().arrow_schema())))
            .map_err(RunError::delta(Phase::Plan, &d.target_uri))?;
        self.a.set_mode(RunMode::Incremental);
        let Some(recorded) = record.version else {
            self.warn(format!(
                "{} holds no source version recorded by `{}`: every key is rebuilt from the source",
                d.target_uri, self.p.name
            ));
            return Ok(Scope::All);
        };
        if held.fields() != storage_schema.fields() {
            self.relayout = true;
            self.warn(format!("the dimension's columns changed (the source's or the pipeline's): {} is rebuilt from the whole source", d.target_uri));
            return Ok(Scope::All);
        }
        let written_with = written_layout(target, &self.p.name).await;
        if written_with
            .as_ref()
            .is_some_and(|w| *w != layout.describe())
        {
            self.relayout = true;
            self.warn(format!(
                "the dimension's rules changed since {} was written ({} -> {}): every key is rebuilt from the whole source",
                d.target_uri,
                written_with.unwrap_or_default(),
                layout.describe()
            ));
            return Ok(Scope::All);
        }
        self.a.check_source(&record, source, &d.source_uri)?;
        let version = self.a.summary.source_version.unwrap_or(0);
        if version as i64 == recorded {
            return Ok(Scope::Nothing);
        }
        let added = lake::files_added_between(source, recorded.max(0) as u64, version)
            .await
            .map_err(RunError::delta(Phase::Plan, &d.source_uri))?;
        if !added.complete {
            self.warn(format!("the source's log no longer holds every commit since version {recorded}: every key is rebuilt"));
            return Ok(Scope::All);
        }
        if let Some(first) = added.rewrites.first() {
            return Err(RunError::SourceRewritten {
                uri: d.source_uri.clone(),
                version: first.version,
                operation: first.operation.clone().unwrap_or_else(|| "unknown".into()),
                files_removed: first.files_removed,
                recorded,
                more: added.rewrites.len() - 1,
                pipeline: self.p.name.clone(),
            });
        }
        if added.adds.is_empty() {
            return Ok(Scope::Nothing);
        }
        let provider = source
            .table_provider()
            .with_file_selection(
                deltalake::delta_datafusion::FileSelection::from_adds(added.adds)
                    .with_missing_file_policy(
                        deltalake::delta_datafusion::MissingSelectedFilePolicy::Ignore,
                    ),
            )
            .await
            .map_err(RunError::query(Phase::Plan))?;
        let keys: Vec<Expr> = layout.keys.iter().map(ident).collect();
        let landed = self
            .a
            .ctx
            .read_table(provider)
            .map_err(RunError::query(Phase::Plan))?;
        let batches = landed
            .clone()
            .select(keys)
            .and_then(|df| df.distinct())
            .map_err(RunError::query(Phase::Plan))?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Plan, &d.source_uri))?;
        // (so many keys that naming each in the commit's predicate costs more than a rewrite)
        if batches.iter().map(RecordBatch::num_rows).sum::<usize>() > MAX_KEYS_REPLACED {
            return Ok(Scope::All);
        }
        Ok(Scope::Keys(batches, Box::new(landed)))
    }
}
