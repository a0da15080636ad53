//! Planning: what the target recorded, its watermark, whether its schema still fits, and
//! whether another writer committed since it was read.

use chrono::{DateTime, Utc};
use datafusion::prelude::ident;
use deltalake::DeltaTable;

use super::*;

impl Run<'_, '_> {
    /// Whether a run of this pipeline already committed to `target` (it then records the
    /// source version it read). Such a target stays incremental even while it is empty.
    pub(super) async fn has_run_before(&mut self, target: &DeltaTable) -> Result<bool, RunError> {
        Ok(self.recorded(target).await?.version.is_some())
    }

    /// What the target's commits recorded about the source (version read, table id, deferred
    /// rows); read once per run.
    pub(super) async fn recorded(
        &mut self,
        target: &DeltaTable,
    ) -> Result<lake::SourceRecord, RunError> {
        if let Some(r) = self.record {
            return Ok(r);
        }
        let r = lake::record::read(target, &self.p.app_id())
            .await
            .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        self.record = Some(r);
        Ok(r)
    }

    /// Fails with a (re-plannable) conflict when another writer committed to the target after
    /// this run read it. delta-rs' own conflict check covers the remaining window up to the
    /// commit (a winning commit with this pipeline's app id is always a conflict).
    pub(super) async fn ensure_unchanged(&self, target: &DeltaTable) -> Result<(), RunError> {
        let Some(planned) = target.version() else {
            return Ok(());
        };
        let latest = target
            .log_store()
            .get_latest_version(planned)
            .await
            .map_err(RunError::delta(Phase::Commit, &self.m.target_uri))?;
        if latest != planned {
            return Err(RunError::Conflict {
                uri: self.m.target_uri.clone(),
                planned,
                found: latest,
            });
        }
        Ok(())
    }

    /// `max(sequence)` of the target: from log statistics, scanning only when some file lacks them.
    pub(super) async fn watermark(
        &mut self,
        target: &DeltaTable,
        roles: &ColumnRoles,
    ) -> Result<Option<DateTime<Utc>>, RunError> {
        let seq = roles.sequence();
        let stats = lake::max_from_stats(target, seq)
            .map_err(RunError::delta(Phase::Watermark, &self.m.target_uri))?;
        let micros = match stats {
            StatsMax::Max(us) => Some(us),
            StatsMax::Empty => None,
            StatsMax::Missing => {
                self.warn(format!(
                    "some target files have no statistics for `{seq}`; the watermark needed a scan of that column"
                ));
                let provider = target
                    .table_provider()
                    .await
                    .map_err(RunError::query(Phase::Watermark))?;
                let batches = self
                    .a
                    .ctx
                    .read_table(provider)
                    .and_then(|df| {
                        df.aggregate(
                            vec![],
                            vec![datafusion::functions_aggregate::expr_fn::max(ident(seq))],
                        )
                    })
                    .map_err(RunError::query(Phase::Watermark))?
                    .collect()
                    .await
                    .map_err(RunError::query(Phase::Watermark))?;
                batches
                    .first()
                    .and_then(|b| {
                        arrow::compute::cast(
                            b.column(0),
                            &arrow::datatypes::DataType::Timestamp(
                                arrow::datatypes::TimeUnit::Microsecond,
                                None,
                            ),
                        )
                        .ok()
                    })
                    .and_then(|a| {
                        let a = arrow::array::AsArray::as_primitive::<
                            arrow::datatypes::TimestampMicrosecondType,
                        >(a.as_ref())
                        .clone();
                        arrow::array::Array::is_valid(&a, 0).then(|| a.value(0))
                    })
            }
        };
        Ok(micros.and_then(micros_to_time))
    }

    /// Compares the target's columns with what the pipeline now produces. New source columns
    /// are returned (to be added by the merge) when `on_schema_change: add_new_columns`;
    /// dropped or retyped columns are always errors, because merging would silently lose or
    /// change data.
    pub(super) fn schema_drift(
        &self,
        target_schema: &arrow::datatypes::Schema,
        roles: &ColumnRoles,
    ) -> Result<Vec<String>, RunError> {
        use crate::config::pipeline::DELETED_COLUMN;
        use crate::config::SchemaChange;
        let drift = |message: String| RunError::SchemaDrift {
            uri: self.m.target_uri.clone(),
            message,
        };
        let produced = |c: &str| roles.target_columns.iter().any(|t| t == c);
        let dropped: Vec<&str> = target_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .filter(|c| !produced(c))
            .collect();
        if !dropped.is_empty() {
            return Err(drift(format!(
                "column(s) {} are in the target but the pipeline no longer produces them (dropped from the source, or newly excluded); tidemark never drops target columns on its own: restore them upstream, or rebuild with `--full-reload` if the change is intended",
                dropped.join(", ")
            )));
        }
        let mut retyped = Vec::new();
        let mut added = Vec::new();
        for c in &roles.target_columns {
            let want = roles
                .canonical
                .field_with_name(c)
                .map(|f| storage::storage_type(f.data_type()))
                .map_err(|e| RunError::arrow(Phase::Plan)(e))?;
            match target_schema.field_with_name(c) {
                Ok(f) => {
                    let have = storage::storage_type(f.data_type());
                    if have != want {
                        retyped.push(format!(
                            "`{c}` is {have} in the target but {want} in the source"
                        ));
                    }
                }
                Err(_) if c == DELETED_COLUMN => {
                    return Err(drift(format!(
                        "the pipeline now writes soft-delete tombstones but the target has no `{DELETED_COLUMN}` column; rebuild with `--full-reload`"
                    )));
                }
                Err(_) => added.push(c.clone()),
            }
        }
        if !retyped.is_empty() {
            return Err(drift(format!(
                "column type changed: {}; nothing was written. Cast the column back upstream, or rebuild with `--full-reload` if the new type is intended",
                retyped.join("; ")
            )));
        }
        if !added.is_empty() && self.m.on_schema_change == SchemaChange::Fail {
            return Err(drift(format!(
                "the source has new column(s) {} that the target lacks; set `on_schema_change: add_new_columns` in {} to add them, list them in `columns.exclude`, or rebuild with `--full-reload`",
                added.join(", "),
                self.p.path.display()
            )));
        }
        Ok(added)
    }
}
