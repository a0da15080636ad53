//! The phases of a `dimension` run: plan → read → fold → compare → write.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::RecordBatch;

use datafusion::logical_expr::Expr;
use datafusion::prelude::{ident, DataFrame};

use super::compare;
use super::fold::{self, Layout};
use super::infer;
use super::plan::Scope;
use super::Run;
use crate::lake;
use crate::lake::datafile::FastPath;
use crate::run::quarantine::REASON_COLUMN;
use crate::run::{Phase, RunError};
use deltalake::DeltaTable;

/// What the plan found: the tables, the source's rows and schema, the fold's layout, and the
/// keys to rebuild.
pub(super) struct Planned {
    pub(super) target: Option<DeltaTable>,
    pub(super) df: DataFrame,
    pub(super) schema: arrow::datatypes::Schema,
    pub(super) layout: Layout,
    pub(super) out_schema: arrow::datatypes::SchemaRef,
    pub(super) storage_schema: arrow::datatypes::SchemaRef,
    pub(super) scope: Scope,
}

/// What the compare decided: the rows to write, the keys they replace, and how.
pub(super) struct Compared {
    pub(super) fresh: RecordBatch,
    pub(super) replaced: HashSet<String>,
    pub(super) partial: bool,
    pub(super) changed: u64,
}

impl Run<'_, '_> {
    pub(super) fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.a.end_phase(phase)
    }

    /// plan → read → fold → compare → write.
    pub(super) async fn execute(&mut self) -> Result<(), RunError> {
        let Some(plan) = self.plan().await? else {
            return Ok(());
        };
        let valid = self.read_keys(&plan).await?;
        let compared = self.compare(&plan, &valid).await?;
        if self.opts.dry_run || (compared.changed == 0 && plan.target.is_some() && !self.relayout) {
            return Ok(());
        }
        self.write(plan, compared).await
    }

    /// Opens the tables, checks the pipeline's columns against the source, and finds the keys
    /// to rebuild; `None` when there are none.
    async fn plan(&mut self) -> Result<Option<Planned>, RunError> {
        let d = self.d;
        let q = RunError::query;
        let source = lake::open_required(&d.source_uri, "source").await?;
        let source_version = source.version().unwrap_or(0);
        self.a.summary.source_version = Some(source_version);
        let source_id =
            lake::record::table_id(&source).map_err(RunError::delta(Phase::Plan, &d.source_uri))?;
        self.source_table = Some(lake::record::table_fingerprint(&source_id));
        let target = lake::open_if_exists(&d.target_uri).await?;
        let df = crate::run::frame(&self.a.ctx, &source, &d.source_uri, Phase::Plan).await?;
        let schema = df.schema().as_arrow().clone();
        let layout = Layout::new(d, &schema).map_err(|(col, setting)| {
            self.p.error_at(
                setting,
                format!(
                    "column `{col}` (in `{setting}`) is not in the source table {}; its columns are: {}",
                    d.source_uri,
                    schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let seq_type = schema
            .field_with_name(&d.sequence_by)
            .map(|f| f.data_type().clone())
            .map_err(|e| q(Phase::Plan)(e.into()))?;
        if !matches!(
            seq_type,
            arrow::datatypes::DataType::Timestamp(..) | arrow::datatypes::DataType::Date32
        ) {
            return Err(self
                .p
                .error_at(
                    "sequence_by",
                    format!("`sequence_by: {}` is {seq_type} in {}; a dimension's versions are valid from their sequence, so it must be a timestamp or a date", d.sequence_by, d.source_uri),
                )
                .into());
        }
        self.layout = layout.describe();
        if let Some(infer) = &d.infer {
            if let Some((c, _)) = infer
                .placeholder
                .iter()
                .find(|(c, _)| !layout.columns.contains(c) || d.keys.contains(c))
            {
                return Err(self
                    .p
                    .error_at(
                        "placeholder",
                        format!(
                            "`placeholder.{c}` is not an attribute of the dimension; its attributes: {}",
                            layout.columns.iter().filter(|a| !d.keys.contains(a)).cloned().collect::<Vec<_>>().join(", ")
                        ),
                    )
                    .into());
            }
        }
        let out_schema = layout
            .output_schema(&schema)
            .map_err(RunError::arrow(Phase::Plan))?;
        let storage_schema = Arc::new(lake::storage::storage_schema(&out_schema));
        let scope = self
            .scope(&source, target.as_ref(), &storage_schema, &layout)
            .await?;
        self.end_phase(Phase::Plan)?;
        if matches!(scope, Scope::Nothing) && d.infer.is_none() {
            self.c.num_rows_total = target
                .as_ref()
                .and_then(|t| lake::row_count_from_stats(t).ok().flatten())
                .unwrap_or_default();
            return Ok(None);
        }
        Ok(Some(Planned {
            target,
            df,
            schema,
            layout,
            out_schema,
            storage_schema,
            scope,
        }))
    }

    /// Every valid source row of the keys; rows without a key or a sequence to the quarantine.
    async fn read_keys(&mut self, plan: &Planned) -> Result<RecordBatch, RunError> {
        let (d, q) = (self.d, RunError::query);
        let (df, schema) = (&plan.df, &plan.schema);
        let (keys_filter, landed) = match &plan.scope {
            // Facts may name new keys even when no record landed.
            Scope::Nothing if d.infer.is_some() => {
                let none = df.clone().limit(0, Some(0)).map_err(q(Phase::Read))?;
                (Some(Vec::new()), none)
            }
            Scope::Nothing => {
                return Err(RunError::Internal {
                    phase: Phase::Read,
                    message: "a dimension without inference read with nothing to rebuild".into(),
                })
            }
            Scope::All => (None, df.clone()),
            Scope::Keys(batches, landed) => (Some(batches.clone()), (**landed).clone()),
        };
        let mut input = df.clone();
        if keys_filter.as_ref().is_some_and(Vec::is_empty) {
            input = input.limit(0, Some(0)).map_err(q(Phase::Read))?;
        } else if let Some(keys) = keys_filter {
            let wanted = self.a.ctx.read_batches(keys).map_err(q(Phase::Read))?;
            let cols: Vec<&str> = d.keys.iter().map(String::as_str).collect();
            input = input
                .join(
                    wanted,
                    datafusion::common::JoinType::LeftSemi,
                    &cols,
                    &cols,
                    None,
                )
                .map_err(q(Phase::Read))?;
        }
        let rules = crate::keyed::expect::built_in_for(&d.keys, &d.sequence_by, schema);
        let (any_null, reason) =
            crate::run::quarantine::rejection(&rules).map_err(q(Phase::Read))?;
        let rejected = landed
            .filter(any_null.clone())
            .and_then(|df| df.with_column(REASON_COLUMN, reason))
            .map_err(q(Phase::Read))?;
        let valid = input
            .filter(datafusion::logical_expr::not(any_null))
            .map_err(q(Phase::Read))?;
        let (valid, rejected) = tokio::join!(valid.collect(), rejected.collect());
        let valid = valid.map_err(RunError::scan(Phase::Read, &d.source_uri))?;
        let rejected = rejected.map_err(RunError::scan(Phase::Read, &d.source_uri))?;
        let valid = arrow::compute::concat_batches(&Arc::new(schema.clone()), &valid)
            .map_err(RunError::arrow(Phase::Read))?;
        let n_rejected: usize = rejected.iter().map(RecordBatch::num_rows).sum();
        self.a.summary.num_source_rows_read = (valid.num_rows() + n_rejected) as u64;
        self.a.quarantine(&d.quarantine, rejected).await?;
        self.end_phase(Phase::Read)?;
        Ok(valid)
    }

    /// One commit: the rebuilt keys' rows replaced (an incremental run), or the whole table.
    async fn write(&mut self, plan: Planned, compared: Compared) -> Result<(), RunError> {
        let d = self.d;
        let (target, storage_schema) = (plan.target, plan.storage_schema);
        let Compared {
            fresh,
            replaced,
            partial,
            ..
        } = compared;
        let bootstrap = target.is_none();
        let planned = target.as_ref().and_then(|t| t.version());
        let table = lake::or_new(target, &d.target_uri)?;
        if let Some(v) = planned {
            let latest = lake::open_required(&d.target_uri, "target")
                .await?
                .version();
            if latest != Some(v) {
                return Err(RunError::Conflict {
                    uri: d.target_uri.clone(),
                    planned: v,
                    found: latest.unwrap_or_default(),
                });
            }
        }
        let marking = d.target_apply == crate::config::pipeline::Apply::DeletionVectors;
        if partial {
            if let Some(fast) =
                FastPath::check(&table).map_err(RunError::delta(Phase::Write, &d.target_uri))?
            {
                return self.replace_rows(table, fast, &replaced, &fresh).await;
            }
        }
        if partial && marking {
            self.warn(format!(
                "{} is partitioned or column-mapped: this run replaces the keys' rows by rewriting their files (target.apply: deletion_vectors needs a plain table)",
                d.target_uri
            ));
        }
        // Written in key order, in files of the merge's size: an hour's keys touch a few.
        let mut builder = table
            .write(vec![fresh])
            .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
            .with_target_file_size(std::num::NonZeroU64::new(
                crate::config::pipeline::DEFAULT_TARGET_FILE_SIZE,
            ))
            .with_commit_properties(crate::lake::no_blind_retry(self.commit_properties()));
        if partial {
            let replaced: Vec<&String> = replaced.iter().collect();
            let key_type = storage_schema
                .field_with_name(&d.keys[0])
                .map(|f| f.data_type().clone())
                .map_err(RunError::arrow(Phase::Write))?;
            builder = builder
                .with_replace_where(compare::keys_predicate(&d.keys[0], &key_type, &replaced));
        } else {
            builder = builder.with_schema_mode(deltalake::operations::write::SchemaMode::Overwrite);
        }
        if bootstrap {
            builder = builder.with_table_name(&self.p.name);
            if d.target_apply == crate::config::pipeline::Apply::DeletionVectors {
                builder = builder
                    .with_configuration([(lake::dv::ENABLE.to_string(), Some("true".to_string()))]);
            }
        }
        let table = builder
            .await
            .map_err(RunError::write(Phase::Write, &d.target_uri))?;
        self.a.summary.target_version = table.version();
        if let Ok(entries) = lake::read_commits(&table, 1).await {
            if let Some(e) = entries.first() {
                self.a.summary.num_files_added = e.files_added;
                self.a.summary.num_files_removed = e.files_removed;
            }
        }
        self.end_phase(Phase::Write)
    }

    /// The incremental write: the rows the table holds for `keys` leave — marked deleted with
    /// `target.apply: deletion_vectors` (the table upgraded to the feature first, in a commit of
    /// its own, when it lacks it), else their files rewritten without them — and `fresh` is
    /// written into one new file, in one commit.
    async fn replace_rows(
        &mut self,
        table: DeltaTable,
        fast: FastPath,
        keys: &HashSet<String>,
        fresh: &RecordBatch,
    ) -> Result<(), RunError> {
        let d = self.d;
        let mark = d.target_apply == crate::config::pipeline::Apply::DeletionVectors;
        let (table, fast) = if fast.dv_enabled || !mark {
            (table, fast)
        } else {
            let table = lake::dv::enable(table)
                .await
                .map_err(RunError::write(Phase::Write, &d.target_uri))?;
            self.warn(lake::dv::upgraded(&d.target_uri, table.version()));
            let fast = FastPath::check(&table)
                .map_err(RunError::delta(Phase::Write, &d.target_uri))?
                .ok_or_else(|| RunError::Internal {
                    phase: Phase::Write,
                    message: "the upgraded table is no longer directly writable".into(),
                })?;
            (table, fast)
        };
        let done = lake::replace_keys::replace_keys(
            &table,
            &fast,
            &d.keys,
            keys,
            fresh,
            mark,
            crate::config::pipeline::DEFAULT_ROW_GROUP_ROWS,
            self.a.ctx.state().config().target_partitions(),
            self.commit_properties(),
            deltalake::protocol::DeltaOperation::Merge {
                predicate: None,
                merge_predicate: Some("key match (tidemark dimension)".into()),
                matched_predicates: vec![],
                not_matched_predicates: vec![],
                not_matched_by_source_predicates: vec![],
            },
        )
        .await
        .map_err(RunError::write(Phase::Write, &d.target_uri))?;
        self.a.summary.target_version = done.version;
        self.a.summary.num_files_added = done.files_added;
        self.a.summary.num_files_removed = done.files_removed;
        if mark {
            self.c.num_rows_marked_deleted = done.rows_marked;
            self.c.num_files_marked = done.files_marked;
        }
        self.end_phase(Phase::Write)
    }

    /// The keys the facts name that the dimension knows nothing of — no record in the source,
    /// no row in the table (`rows`) — with when each was first inferred (now, or when an earlier
    /// placeholder for it was written).
    pub(super) async fn infer(
        &self,
        infer: &crate::config::pipeline::dimension::Infer,
        source: &datafusion::prelude::DataFrame,
        rows: &[&RecordBatch],
        inferred: &std::collections::HashMap<String, i64>,
    ) -> Result<(Vec<(String, i64)>, Option<i64>), RunError> {
        let d = self.d;
        let facts = infer::fact_keys(&self.a.ctx, self.p, infer).await?;
        let newest_arrival = facts.newest_arrival;
        let facts = facts.keys;
        let mut known: HashSet<String> = HashSet::new();
        let keys: Vec<Expr> = d.keys.iter().map(ident).collect();
        let recorded = source
            .clone()
            .select(keys)
            .and_then(|df| df.distinct())
            .map_err(RunError::query(Phase::Read))?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Read, &d.source_uri))?;
        for b in recorded.iter().chain(rows.iter().copied()) {
            known.extend(fold::key_text(b, &d.keys).map_err(RunError::arrow(Phase::Compare))?);
        }
        let now = self.now.timestamp_micros();
        let mut new: Vec<(String, i64)> = facts
            .into_iter()
            .filter(|k| !known.contains(k))
            .map(|k| {
                let at = inferred.get(&k).copied().unwrap_or(now);
                (k, at)
            })
            .collect();
        new.sort();
        Ok((new, newest_arrival))
    }

    pub(super) fn warn(&mut self, message: String) {
        self.a.warn(message);
    }

    /// The run's facts in its commit (with the layout it wrote), and what it read of the
    /// source.
    fn commit_properties(&self) -> deltalake::kernel::transaction::CommitProperties {
        let record = lake::SourceRecord {
            version: self.a.summary.source_version.map(|v| v as i64),
            table: self.source_table,
            deferred_floor: None,
        };
        let mut extra = serde_json::Map::new();
        extra.insert("layout".into(), self.layout.clone().into());
        self.a
            .commit_properties(&self.c, extra, &record, Vec::new())
    }
}
