//! The ingest record: which landing files bronze holds, each with its fingerprint (size and
//! modification time or ETag) and the `_ingested_at` it was given.
//!
//! **The truth is in bronze's commits.** Every ingest commit carries the run's number (a `txn`,
//! app id `tidemark/<pipeline>/ingest`, version N, `lastUpdated` = the run's `_ingested_at`) and
//! the files it ingested (commit info `tidemark.ingest_files`): rows and record land in one
//! commit or not at all, and two runs racing for run N cannot both commit (the same app id
//! conflicts; the loser plans again).
//!
//! **The look-up is an index beside bronze** (`target.record`, default
//! `<target>_ingest_record`): one row per pipeline, file and run, appended right after the
//! bronze commit, with a `txn` (`tidemark/<pipeline>/record`) saying the newest run it holds. A
//! run reads only the rows of the files it lists, so its cost does not grow with the files
//! ingested in the past (bronze's log holds one `txn` per pipeline, not one per file). A crash
//! between the two commits leaves the index behind bronze's run number; the next run reads the
//! missing runs from bronze's newest commits and appends them first. Bronze written before the
//! index existed (one `txn` per file, `tidemark/<pipeline>/file:<path>`) is migrated on its
//! first run: those `txn`s become the index's first rows (run 0).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, TimeUnit};
use datafusion::logical_expr::{cast, col, lit};
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::{Action, Transaction};
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::IngestError;
use crate::lake;
use crate::run::{Phase, RunError};

/// The commit-info key of an ingest commit's files.
pub const COMMIT_KEY: &str = "tidemark.ingest_files";

/// What the record holds of one landing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub fingerprint: i64,
    /// Its content hash, for files recorded since it was kept.
    pub content: Option<i64>,
    /// Its `_ingested_at`, in milliseconds.
    pub ingested_ms: i64,
}

/// One file of a run, as bronze's commit info and the index keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub file: String,
    pub fingerprint: i64,
    pub ingested_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<i64>,
}

/// An ingest commit's `tidemark.ingest_files`.
#[derive(Debug, Serialize, Deserialize)]
struct Files {
    pipeline: String,
    run: i64,
    files: Vec<Entry>,
}

/// The `txn` app id of a pipeline's run number in bronze.
pub fn run_app(pipeline: &str) -> String {
    format!("tidemark/{pipeline}/ingest")
}

/// The index's `txn` of a pipeline's runs into one bronze table (its `metaData.id`): a bronze
/// table deleted and created again starts a new record, whatever the old index rows say.
fn index_app(pipeline: &str, bronze_id: &str) -> String {
    format!("tidemark/{pipeline}/record/{bronze_id}")
}

/// The app-id part (after `tidemark/<pipeline>/`) of a file's `txn` in bronze written before
/// the index.
const LEGACY_FILE: &str = "file:";

/// The `txn` and commit info a bronze commit of `pipeline`'s `run` carries for `files`.
pub fn commit_parts(
    pipeline: &str,
    run: i64,
    now_ms: i64,
    files: Vec<Entry>,
) -> Result<(Transaction, (String, serde_json::Value)), RunError> {
    let info = serde_json::to_value(Files {
        pipeline: pipeline.to_string(),
        run,
        files,
    })
    .map_err(|e| RunError::Internal {
        phase: Phase::Commit,
        message: format!("the ingest record does not serialize: {e}"),
    })?;
    Ok((
        Transaction::new_with_last_update(run_app(pipeline), run, Some(now_ms)),
        (COMMIT_KEY.to_string(), info),
    ))
}

/// A pipeline's record as a run found it.
pub struct Record {
    uri: String,
    pipeline: String,
    /// Bronze's table id (`metaData.id`); `None` before bronze exists (nothing is recorded).
    bronze_id: Option<String>,
    index: Option<DeltaTable>,
    /// The newest run bronze committed, and its `_ingested_at` (milliseconds).
    committed: Option<i64>,
    pub latest_ms: Option<i64>,
    /// The index held nothing of this bronze table though bronze has runs (deleted, or never
    /// written): how many runs were read back from bronze's log.
    pub rebuilt: Option<usize>,
    /// Runs bronze holds that the index does not (yet): appended before the next run's own.
    behind: Vec<(i64, Option<i64>, Vec<Entry>)>,
    /// The index holds runs after the newest bronze committed (bronze was restored to an
    /// earlier version): their rows are dropped before this run commits, since its run number
    /// is one of theirs.
    pub stale_after: Option<i64>,
}

impl Record {
    /// Reads bronze's run number and the index's, and what the index misses. `rebuild` (a full
    /// reload) tolerates runs whose commits are gone from bronze's log: the reload records its
    /// files again.
    pub async fn open(
        uri: &str,
        bronze: Option<&DeltaTable>,
        bronze_uri: &str,
        pipeline: &str,
        rebuild: bool,
    ) -> Result<Record, RunError> {
        let mut record = Record {
            uri: uri.to_string(),
            pipeline: pipeline.to_string(),
            bronze_id: None,
            index: open_index(uri).await?,
            committed: None,
            latest_ms: None,
            rebuilt: None,
            behind: Vec::new(),
            stale_after: None,
        };
        let Some(bronze) = bronze else {
            return Ok(record);
        };
        let bronze_id =
            lake::record::table_id(bronze).map_err(RunError::delta(Phase::Plan, bronze_uri))?;
        let prefix = format!("tidemark/{pipeline}/");
        let txns = lake::txns::with_prefix(bronze, &prefix)
            .await
            .map_err(RunError::delta(Phase::Plan, bronze_uri))?;
        if let Some(t) = txns.get("ingest") {
            record.committed = Some(t.version);
            record.latest_ms = t.last_updated;
        }
        let indexed = match &record.index {
            Some(t) => lake::txns::with_prefix(t, &index_app(pipeline, &bronze_id))
                .await
                .map_err(RunError::delta(Phase::Plan, uri))?
                .get("")
                .map(|t| t.version),
            None => None,
        };
        record.bronze_id = Some(bronze_id);
        if indexed.is_some_and(|i| i > record.committed.unwrap_or(0)) {
            record.stale_after = Some(record.committed.unwrap_or(0));
        }
        if indexed.is_none() {
            // Bronze from before the index: its per-file `txn`s are the record so far.
            let files: Vec<Entry> = txns
                .iter()
                .filter_map(|(k, t)| {
                    let file = k.strip_prefix(LEGACY_FILE)?;
                    Some(Entry {
                        file: file.to_string(),
                        fingerprint: t.version,
                        ingested_ms: t.last_updated.unwrap_or(0),
                        content: None,
                    })
                })
                .collect();
            if !files.is_empty() {
                record.latest_ms = record
                    .latest_ms
                    .max(files.iter().map(|e| e.ingested_ms).max());
                record.behind.push((0, None, files));
            }
        }
        let from = indexed.unwrap_or(0) + 1;
        if let Some(to) = record.committed.filter(|c| *c >= from) {
            match runs_in_log(bronze, bronze_uri, pipeline, from, to).await? {
                Ok(mut runs) => {
                    if indexed.is_none() {
                        record.rebuilt = Some(runs.len());
                    }
                    record.behind.append(&mut runs)
                }
                Err(missing) if !rebuild => {
                    return Err(IngestError::RecordBehind {
                        record: uri.to_string(),
                        bronze: bronze_uri.to_string(),
                        held: match indexed {
                            Some(i) if i > 0 => format!("holds this pipeline's runs up to {i}"),
                            _ => "holds none of this pipeline's runs".to_string(),
                        },
                        committed: to,
                        runs: if from == missing {
                            format!("run {missing}")
                        } else {
                            format!("runs {from} to {missing}")
                        },
                    }
                    .into())
                }
                Err(_) => {}
            }
        }
        info!(
            committed = record.committed,
            indexed,
            behind = record.behind.len(),
            "ingest record opened"
        );
        Ok(record)
    }

    /// Drops the index's rows of runs bronze no longer holds ([`Record::stale_after`]), and
    /// records the index's newest run as bronze's, in one commit: done before a run commits to
    /// bronze, so its run number never meets an undone run's files.
    pub async fn drop_stale(&mut self, ctx: &SessionContext) -> Result<(), RunError> {
        let (Some(after), Some(index), Some(bronze_id)) =
            (self.stale_after, self.index.take(), self.bronze_id.as_ref())
        else {
            return Ok(());
        };
        let predicate = col("pipeline")
            .eq(lit(self.pipeline.clone()))
            .and(col("bronze_id").eq(lit(bronze_id.clone())))
            .and(col("run").gt(lit(after)));
        let props =
            CommitProperties::default().with_application_transactions(vec![Transaction::new(
                index_app(&self.pipeline, bronze_id),
                after,
            )]);
        let (table, _) = index
            .delete()
            .with_predicate(predicate)
            .with_commit_properties(props)
            .with_session_state(Arc::new(ctx.state()))
            .await
            .map_err(RunError::write(Phase::Commit, &self.uri))?;
        info!(
            after,
            "dropped the ingest record's rows of runs bronze no longer holds"
        );
        self.index = Some(table);
        self.stale_after = None;
        Ok(())
    }

    /// Whether this pipeline has ingested into bronze before (a run number, or per-file `txn`s
    /// of an older version).
    pub fn has_history(&self) -> bool {
        self.committed.is_some() || !self.behind.is_empty()
    }

    /// The number the next commit to bronze carries.
    pub fn next_run(&self) -> i64 {
        self.committed.unwrap_or(0) + 1
    }

    /// What the record holds of `files` (every file of the pipeline when `None`): the newest
    /// run's entry per file, the runs the index misses included.
    pub async fn lookup(
        &self,
        ctx: &SessionContext,
        files: Option<&[&str]>,
    ) -> Result<HashMap<String, Recorded>, RunError> {
        let mut out: HashMap<String, (i64, Recorded)> = HashMap::new();
        let mut keep = |file: &str, run: i64, r: Recorded| match out.get_mut(file) {
            Some(have) if have.0 > run => {}
            Some(have) => *have = (run, r),
            None => {
                out.insert(file.to_string(), (run, r));
            }
        };
        let index = self
            .index
            .as_ref()
            .zip(self.bronze_id.as_ref())
            .filter(|_| files.is_none_or(|f| !f.is_empty()));
        if let Some((index, bronze_id)) = index {
            let mut df = crate::run::frame(ctx, index, &self.uri, Phase::Plan)
                .await?
                .filter(
                    col("pipeline")
                        .eq(lit(self.pipeline.clone()))
                        .and(col("bronze_id").eq(lit(bronze_id.clone()))),
                )
                .map_err(RunError::query(Phase::Plan))?;
            // The listed names' range: the index's file statistics skip what lies outside it
            // (an `IN` list of thousands of names costs more to plan than the rows it saves).
            let range = files.and_then(|f| Some((f.iter().min()?, f.iter().max()?)));
            if let Some((lo, hi)) = range {
                df = df
                    .filter(
                        col("file")
                            .gt_eq(lit(lo.to_string()))
                            .and(col("file").lt_eq(lit(hi.to_string()))),
                    )
                    .map_err(RunError::query(Phase::Plan))?;
            }
            // (an index written before contents were recorded has no `content`)
            let content = match df.schema().field_with_unqualified_name("content") {
                Ok(_) => col("content"),
                Err(_) => cast(
                    lit(datafusion::scalar::ScalarValue::Int64(None)),
                    DataType::Int64,
                ),
            };
            let batches = df
                .select(vec![
                    col("file"),
                    col("fingerprint"),
                    cast(col("ingested_at"), DataType::Int64).alias("ingested_us"),
                    col("run"),
                    content.alias("content"),
                ])
                .map_err(RunError::query(Phase::Plan))?
                .collect()
                .await
                .map_err(RunError::scan(Phase::Plan, &self.uri))?;
            for b in &batches {
                let file = arrow::compute::cast(b.column(0), &DataType::Utf8)
                    .map_err(RunError::arrow(Phase::Plan))?;
                let file = file.as_string::<i32>();
                let fp = b.column(1).as_primitive::<Int64Type>();
                let us = b.column(2).as_primitive::<Int64Type>();
                let run = b.column(3).as_primitive::<Int64Type>();
                let content = b.column(4).as_primitive::<Int64Type>();
                for i in 0..b.num_rows() {
                    // A run bronze never committed (bronze restored to an earlier version, or
                    // an index written by hand): not recorded. Run 0 holds the files an older
                    // bronze recorded as per-file `txn`s, migrated before it had a run number.
                    if file.is_null(i) || run.value(i) > self.committed.unwrap_or(0) {
                        continue;
                    }
                    let r = Recorded {
                        fingerprint: fp.value(i),
                        content: content.is_valid(i).then(|| content.value(i)),
                        ingested_ms: us.value(i).div_euclid(1000),
                    };
                    keep(file.value(i), run.value(i), r);
                }
            }
        }
        for (run, _, entries) in &self.behind {
            for e in entries {
                let r = Recorded {
                    fingerprint: e.fingerprint,
                    content: e.content,
                    ingested_ms: e.ingested_ms,
                };
                keep(&e.file, *run, r);
            }
        }
        let wanted: Option<std::collections::HashSet<&str>> =
            files.map(|f| f.iter().copied().collect());
        Ok(out
            .into_iter()
            .filter(|(k, _)| wanted.as_ref().is_none_or(|w| w.contains(k.as_str())))
            .map(|(k, (_, r))| (k, r))
            .collect())
    }

    /// The files this pipeline recorded (in this bronze table) with one of `contents`: content
    /// hash → file.
    pub async fn by_content(
        &self,
        ctx: &SessionContext,
        contents: &[i64],
    ) -> Result<HashMap<i64, String>, RunError> {
        let mut out = HashMap::new();
        for (_, _, entries) in &self.behind {
            for e in entries {
                if let Some(c) = e.content.filter(|c| contents.contains(c)) {
                    out.entry(c).or_insert_with(|| e.file.clone());
                }
            }
        }
        let (Some(index), Some(bronze_id)) = (&self.index, &self.bronze_id) else {
            return Ok(out);
        };
        if contents.is_empty() {
            return Ok(out);
        }
        let df = crate::run::frame(ctx, index, &self.uri, Phase::Plan).await?;
        if df.schema().field_with_unqualified_name("content").is_err() {
            return Ok(out);
        }
        let batches = df
            .filter(
                col("pipeline")
                    .eq(lit(self.pipeline.clone()))
                    .and(col("bronze_id").eq(lit(bronze_id.clone())))
                    .and(col("run").lt_eq(lit(self.committed.unwrap_or(0))))
                    .and(col("content").in_list(contents.iter().map(|c| lit(*c)).collect(), false)),
            )
            .and_then(|df| df.select(vec![col("content"), col("file")]))
            .map_err(RunError::query(Phase::Plan))?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Plan, &self.uri))?;
        for b in &batches {
            let content = b.column(0).as_primitive::<Int64Type>();
            let file = arrow::compute::cast(b.column(1), &DataType::Utf8)
                .map_err(RunError::arrow(Phase::Plan))?;
            let file = file.as_string::<i32>();
            for i in 0..b.num_rows() {
                out.entry(content.value(i))
                    .or_insert_with(|| file.value(i).to_string());
            }
        }
        Ok(out)
    }

    /// Appends the runs the index misses and, when given, the run just committed to bronze
    /// (at `bronze_version`), in one commit of the index. Another run that indexed them first
    /// is not an error.
    pub async fn append(
        self,
        ctx: &SessionContext,
        committed: Option<(&DeltaTable, i64, Vec<Entry>)>,
    ) -> Result<(), RunError> {
        let mut runs = self.behind;
        let mut bronze_id = self.bronze_id;
        if let Some((bronze, run, files)) = committed {
            // A bootstrap learns bronze's id from its first commit.
            let id = lake::record::table_id(bronze)
                .map_err(RunError::delta(Phase::Commit, &self.uri))?;
            bronze_id = Some(id);
            runs.push((run, bronze.version().map(|v| v as i64), files));
        }
        let (Some(newest), Some(bronze_id)) = (runs.iter().map(|(r, _, _)| *r).max(), bronze_id)
        else {
            return Ok(());
        };
        let batch = index_batch(&self.pipeline, &bronze_id, &runs)
            .map_err(RunError::arrow(Phase::Commit))?;
        let fresh = self.index.is_none();
        let table = lake::or_new(self.index, &self.uri)?;
        let props =
            CommitProperties::default().with_application_transactions(vec![Transaction::new(
                index_app(&self.pipeline, &bronze_id),
                newest,
            )]);
        let mut write = table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(deltalake::operations::write::SchemaMode::Merge)
            .with_commit_properties(props)
            .with_session_state(Arc::new(ctx.state()));
        if fresh {
            write = write.with_table_name("ingest_record");
        }
        match write.await {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = RunError::write(Phase::Commit, &self.uri)(e);
                if err.is_commit_conflict() {
                    // Another run appended at the same time; the next run completes the index
                    // from bronze's commits if it misses anything.
                    return Ok(());
                }
                Err(err)
            }
        }
    }
}

/// The index table at `uri`, when there is one — refused when it is another kind of table.
pub async fn open_index(uri: &str) -> Result<Option<DeltaTable>, RunError> {
    let Some(t) = lake::open_if_exists(uri).await? else {
        return Ok(None);
    };
    let schema = t
        .snapshot()
        .map_err(RunError::delta(Phase::Plan, uri))?
        .snapshot()
        .arrow_schema();
    for f in index_schema().fields() {
        if schema.field_with_name(f.name()).is_err() {
            return Err(IngestError::NotARecord {
                uri: uri.to_string(),
                column: f.name().clone(),
            }
            .into());
        }
    }
    Ok(Some(t))
}

/// The pipeline's runs `from..=to` as bronze's commits recorded them, newest commit first
/// walked back; `Err(run)` names the first run whose commit the log no longer holds.
async fn runs_in_log(
    bronze: &DeltaTable,
    uri: &str,
    pipeline: &str,
    from: i64,
    to: i64,
) -> Result<Result<Vec<(i64, Option<i64>, Vec<Entry>)>, i64>, RunError> {
    let mut found: Vec<(i64, Option<i64>, Vec<Entry>)> = Vec::new();
    let mut next = bronze.version();
    let mut want = to;
    while let Some(version) = next.filter(|_| want >= from) {
        let Some(actions) = lake::commit_actions(bronze, version)
            .await
            .map_err(RunError::delta(Phase::Plan, uri))?
        else {
            break;
        };
        for action in actions {
            let Action::CommitInfo(ci) = action else {
                continue;
            };
            let Some(v) = ci.info.get(COMMIT_KEY) else {
                continue;
            };
            let Ok(files) = serde_json::from_value::<Files>(v.clone()) else {
                continue;
            };
            if files.pipeline == pipeline && files.run >= from && files.run <= want {
                want = files.run - 1;
                found.push((files.run, Some(version as i64), files.files));
            }
        }
        next = version.checked_sub(1);
    }
    if want >= from {
        return Ok(Err(want));
    }
    found.reverse();
    Ok(Ok(found))
}

/// The index's rows of `runs`.
fn index_batch(
    pipeline: &str,
    bronze_id: &str,
    runs: &[(i64, Option<i64>, Vec<Entry>)],
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let n: usize = runs.iter().map(|(_, _, f)| f.len()).sum();
    let (mut file, mut fp, mut at, mut run, mut version) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut content = Vec::with_capacity(n);
    for (r, v, entries) in runs {
        for e in entries {
            file.push(e.file.as_str());
            fp.push(e.fingerprint);
            at.push(e.ingested_ms * 1000);
            run.push(*r);
            version.push(*v);
            content.push(e.content);
        }
    }
    RecordBatch::try_new(
        Arc::new(index_schema()),
        vec![
            Arc::new(StringArray::from(vec![pipeline; n])),
            Arc::new(StringArray::from(vec![bronze_id; n])),
            Arc::new(StringArray::from(file)),
            Arc::new(Int64Array::from(fp)),
            Arc::new(TimestampMicrosecondArray::from(at).with_timezone("UTC")),
            Arc::new(Int64Array::from(run)),
            Arc::new(Int64Array::from(version)),
            Arc::new(Int64Array::from(content)),
        ],
    )
}

fn index_schema() -> Schema {
    Schema::new(vec![
        Field::new("pipeline", DataType::Utf8, false),
        Field::new("bronze_id", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, false),
        Field::new("fingerprint", DataType::Int64, false),
        Field::new(
            "ingested_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("run", DataType::Int64, false),
        Field::new("bronze_version", DataType::Int64, true),
        Field::new("content", DataType::Int64, true),
    ])
}
