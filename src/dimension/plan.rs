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

/// Why an incremental run rebuilds every key from the whole source (a missing table and
/// `--full-reload` do too, and are decided before), with a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Whole {
    /// The table holds no source version recorded by this pipeline.
    NoRecord,
    /// The dimension's columns (the source's or the pipeline's) changed.
    ColumnsChanged,
    /// Its rules (history, tracked columns) changed: written with `was`, now `now`.
    RulesChanged { was: String, now: String },
    /// The source's log no longer holds every commit since the recorded version.
    LogIncomplete { recorded: i64 },
}

/// What the table holds that decides between rebuilding it whole and reading the source's log.
pub(super) struct Held<'a> {
    /// The source version the previous run recorded.
    pub recorded: Option<i64>,
    /// The table's columns, and those this run writes.
    pub columns: (&'a arrow::datatypes::Fields, &'a arrow::datatypes::Fields),
    /// The rules the table was written with (when its commits say), and this run's.
    pub rules: (Option<String>, String),
}

/// The table's side of the plan: every key (and why), or the recorded version to read the
/// source's log from. (A missing table and `--full-reload` are decided before.)
pub(super) fn whole_or_since(held: Held<'_>) -> Result<i64, Whole> {
    let Some(recorded) = held.recorded else {
        return Err(Whole::NoRecord);
    };
    if held.columns.0 != held.columns.1 {
        return Err(Whole::ColumnsChanged);
    }
    match held.rules {
        (Some(was), now) if was != now => Err(Whole::RulesChanged { was, now }),
        _ => Ok(recorded),
    }
}

/// The source's side: what landed between the recorded version and the one read.
#[derive(Debug, PartialEq)]
pub(super) enum Since {
    /// Nothing: the table is current.
    Nothing,
    /// Every key (the log is incomplete).
    Whole(Whole),
    /// The rows of these files, whose keys are rebuilt.
    Files(Vec<deltalake::kernel::Add>),
}

/// Decides from the commits added since `recorded`; commits that took rows away upstream are
/// refused (the first, and how many more): an incremental run cannot take them back.
pub(super) fn since(
    recorded: i64,
    added: lake::AddedFiles,
) -> Result<Since, (lake::Rewrite, usize)> {
    if !added.complete {
        return Ok(Since::Whole(Whole::LogIncomplete { recorded }));
    }
    if let Some(first) = added.rewrites.first() {
        return Err((first.clone(), added.rewrites.len() - 1));
    }
    Ok(match added.adds.is_empty() {
        true => Since::Nothing,
        false => Since::Files(added.adds),
    })
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
        let recorded = match whole_or_since(Held {
            recorded: record.version,
            columns: (held.fields(), storage_schema.fields()),
            rules: (
                written_layout(target, &self.p.name).await,
                layout.describe(),
            ),
        }) {
            Ok(recorded) => recorded,
            Err(why) => return Ok(self.whole(why)),
        };
        self.a.check_source(&record, source, &d.source_uri)?;
        let version = self.a.summary.source_version.unwrap_or(0);
        if version as i64 == recorded {
            return Ok(Scope::Nothing);
        }
        let added = lake::files_added_between(source, recorded.max(0) as u64, version)
            .await
            .map_err(RunError::delta(Phase::Plan, &d.source_uri))?;
        match since(recorded, added) {
            Ok(Since::Nothing) => Ok(Scope::Nothing),
            Ok(Since::Whole(why)) => Ok(self.whole(why)),
            Ok(Since::Files(adds)) => self.landed_keys(source, adds, layout).await,
            Err((first, more)) => Err(RunError::SourceRewritten {
                uri: d.source_uri.clone(),
                version: first.version,
                operation: first.operation.unwrap_or_else(|| "unknown".into()),
                files_removed: first.files_removed,
                recorded,
                more,
                pipeline: self.p.name.clone(),
            }),
        }
    }

    /// Every key, saying why.
    fn whole(&mut self, why: Whole) -> Scope {
        let uri = &self.d.target_uri;
        // (a new layout: the table's rows are all replaced, not merged by key)
        self.relayout |= matches!(why, Whole::ColumnsChanged | Whole::RulesChanged { .. });
        let warning = match why {
            Whole::NoRecord => format!(
                "{uri} holds no source version recorded by `{}`: every key is rebuilt from the source",
                self.p.name
            ),
            Whole::ColumnsChanged => format!("the dimension's columns changed (the source's or the pipeline's): {uri} is rebuilt from the whole source"),
            Whole::RulesChanged { was, now } => format!(
                "the dimension's rules changed since {uri} was written ({was} -> {now}): every key is rebuilt from the whole source"
            ),
            Whole::LogIncomplete { recorded } => format!("the source's log no longer holds every commit since version {recorded}: every key is rebuilt"),
        };
        self.warn(warning);
        Scope::All
    }

    /// The keys of the rows in `adds` (every key when there are too many to name).
    async fn landed_keys(
        &mut self,
        source: &DeltaTable,
        adds: Vec<deltalake::kernel::Add>,
        layout: &Layout,
    ) -> Result<Scope, RunError> {
        let provider = source
            .table_provider()
            .with_file_selection(
                deltalake::delta_datafusion::FileSelection::from_adds(adds)
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
            .map_err(RunError::scan(Phase::Plan, &self.d.source_uri))?;
        // (so many keys that naming each in the commit's predicate costs more than a rewrite)
        if batches.iter().map(RecordBatch::num_rows).sum::<usize>() > MAX_KEYS_REPLACED {
            return Ok(Scope::All);
        }
        Ok(Scope::Keys(batches, Box::new(landed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Fields};

    fn fields(names: &[&str]) -> Fields {
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, true))
            .collect()
    }

    #[test]
    fn the_table_decides_whole_or_since_its_recorded_version() {
        let (a, b) = (fields(&["k", "name"]), fields(&["k", "name", "segment"]));
        let held = |recorded, columns, was: Option<&str>| Held {
            recorded,
            columns,
            rules: (was.map(str::to_string), "scd2 [segment]".to_string()),
        };
        assert_eq!(
            whole_or_since(held(Some(4), (&a, &a), Some("scd2 [segment]"))),
            Ok(4)
        );
        // (a table written before its rules were recorded keeps its version)
        assert_eq!(whole_or_since(held(Some(4), (&a, &a), None)), Ok(4));
        assert_eq!(
            whole_or_since(held(None, (&a, &a), None)),
            Err(Whole::NoRecord)
        );
        assert_eq!(
            whole_or_since(held(Some(4), (&a, &b), None)),
            Err(Whole::ColumnsChanged)
        );
        assert_eq!(
            whole_or_since(held(Some(4), (&a, &a), Some("scd1"))),
            Err(Whole::RulesChanged {
                was: "scd1".into(),
                now: "scd2 [segment]".into()
            })
        );
    }

    fn add(path: &str) -> deltalake::kernel::Add {
        deltalake::kernel::Add {
            path: path.into(),
            data_change: true,
            ..Default::default()
        }
    }

    fn rewrite(version: u64) -> lake::Rewrite {
        lake::Rewrite {
            version,
            operation: Some("DELETE".into()),
            files_removed: 1,
        }
    }

    #[test]
    fn the_source_log_decides_which_rows_landed() {
        let added = |adds: Vec<_>, complete, rewrites| lake::AddedFiles {
            adds,
            complete,
            rewrites,
        };
        assert_eq!(since(3, added(vec![], true, vec![])), Ok(Since::Nothing));
        match since(3, added(vec![add("a.parquet")], true, vec![])) {
            Ok(Since::Files(adds)) => assert_eq!(adds[0].path, "a.parquet"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            since(3, added(vec![add("a.parquet")], false, vec![])),
            Ok(Since::Whole(Whole::LogIncomplete { recorded: 3 }))
        );
        assert_eq!(
            since(3, added(vec![], true, vec![rewrite(5), rewrite(7)])),
            Err((rewrite(5), 1))
        );
    }
}
