//! Bronze's side of an ingest: its schema, the checks before writing, and the one commit that
//! appends the rows together with the ingest record of their files (the run's number and its
//! files, `record.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::error::ArrowError;
use chrono::{DateTime, Utc};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{col, lit};
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use super::landing::{Landing, LandingFile};
use super::record::{self, Entry};
use super::rows::Parsed;
use super::schema::{arrow_type, Col};
use super::{IngestError, Recorded};
use crate::config::pipeline::ingest::{ColumnType, Ingest, INGESTED_AT, RESCUED, SOURCE_FILE};
use crate::lake::{self, COMMIT_INFO_KEY};
use crate::run::quarantine::REASON_COLUMN;
use crate::run::{Phase, RunError};

/// How many of bronze's newest commits are searched for this pipeline's last run.
const FOREIGN_LOOKBACK: usize = 100;

/// Refuses bronze when another writer took rows out of it after this pipeline's last ingest
/// commit — a commit without tidemark's facts that removed data files (DELETE, UPDATE, MERGE,
/// an overwrite, a RESTORE by another engine): the ingest record still lists those files as
/// ingested, so their rows would never come back. tidemark's own commits (another pipeline's
/// full reload, `tidemark restore`, `maintain`) are not foreign. A last run further back than
/// the newest [`FOREIGN_LOOKBACK`] commits is not checked.
pub async fn check_foreign(
    table: &DeltaTable,
    uri: &str,
    pipeline: &str,
    path: &str,
) -> Result<(), RunError> {
    let ours = |e: &lake::CommitEntry| {
        e.run.as_ref().is_some_and(|r| {
            r.get("pipeline").and_then(|p| p.as_str()) == Some(pipeline)
                && r.get("kind").and_then(|k| k.as_str()) == Some("ingest")
        })
    };
    // (newest first, stopping at this pipeline's last run: usually the newest commit)
    let entries = lake::read_commits_until(table, FOREIGN_LOOKBACK, ours)
        .await
        .map_err(RunError::delta(Phase::Plan, uri))?;
    let (Some(last), Some(latest)) = (entries.iter().find(|e| ours(e)), table.version()) else {
        return Ok(());
    };
    if latest <= last.version {
        return Ok(());
    }
    let added = lake::files_added_between(table, last.version, latest)
        .await
        .map_err(RunError::delta(Phase::Plan, uri))?;
    let foreign = added.rewrites.iter().find(|r| {
        entries
            .iter()
            .find(|e| e.version == r.version)
            .is_some_and(|e| e.run.is_none())
    });
    match foreign {
        Some(r) => Err(IngestError::BronzeRewritten {
            uri: uri.to_string(),
            version: r.version,
            operation: r.operation.clone().unwrap_or_else(|| "unknown".into()),
            files_removed: r.files_removed,
            pipeline: path.to_string(),
        }
        .into()),
        None => Ok(()),
    }
}

/// Refuses a bronze table whose `txn` actions expire (the run number that ties bronze to its
/// record would vanish).
pub fn check_retention(table: &DeltaTable, uri: &str) -> Result<(), RunError> {
    let snapshot = table
        .snapshot()
        .map_err(RunError::delta(Phase::Plan, uri))?;
    if snapshot
        .metadata()
        .configuration()
        .contains_key("delta.setTransactionRetentionDuration")
    {
        return Err(IngestError::RecordExpires {
            uri: uri.to_string(),
        }
        .into());
    }
    Ok(())
}

/// Bronze's columns, in storage types.
pub fn table_schema(table: &DeltaTable, uri: &str) -> Result<Arc<Schema>, RunError> {
    let snapshot = table
        .snapshot()
        .map_err(RunError::delta(Phase::Read, uri))?;
    Ok(Arc::new(lake::storage::storage_schema(
        &snapshot.snapshot().arrow_schema(),
    )))
}

/// The rows a full reload replaces: those of this pipeline's files — under its landing location
/// and matching its glob, or recorded by it — which must all still be there, or the reload would
/// drop their rows. Rows of other pipelines (another glob over the same folder) and of backfills
/// are not in scope. Returns the `_source_file` values to replace (the listed files included),
/// and the earliest `_ingested_at` (milliseconds) bronze's rows hold per `_source_file`: a file
/// the record misses keeps that arrival time.
pub async fn reload_scope(
    ctx: &SessionContext,
    table: &DeltaTable,
    spec: &Ingest,
    landing: &Landing,
    listed: &[LandingFile],
    record: &HashMap<String, Recorded>,
) -> Result<(Vec<String>, HashMap<String, i64>), RunError> {
    let uri = &spec.target_uri;
    let mut scope: Vec<String> = listed.iter().map(|f| f.uri.clone()).collect();
    let Some(held) = held_files(ctx, table, uri).await? else {
        return Ok((scope, HashMap::new()));
    };
    let prefix = format!("{}/", landing.root_uri);
    let present: HashSet<&str> = listed.iter().map(|f| f.uri.as_str()).collect();
    let glob = glob::Pattern::new(&spec.glob).ok();
    let mut arrived = HashMap::new();
    let (mut gone, mut moved) = (Vec::new(), Vec::new());
    for (file, first_ms) in held {
        let Some(rel) = file.strip_prefix(&prefix) else {
            // Under another location: this pipeline's file there before the landing location
            // moved, when the record holds its name with that very arrival.
            if let Some(rel) = moved_from(&file, record, first_ms) {
                if let Some(ms) = first_ms {
                    arrived.entry(format!("{prefix}{rel}")).or_insert(ms);
                }
                scope.push(file.clone());
                moved.push(file);
            }
            continue;
        };
        let mine = record.contains_key(rel)
            || glob
                .as_ref()
                .is_some_and(|g| g.matches_with(rel, super::landing::GLOB));
        if mine && !present.contains(file.as_str()) {
            gone.push(file.clone());
        }
        if let Some(ms) = first_ms {
            arrived.insert(file, ms);
        }
    }
    // (a moved file that is no longer in the new location would be dropped too)
    gone.sort();
    gone.extend(
        moved
            .iter()
            .filter(|f| {
                moved_from(f, record, None)
                    .is_some_and(|rel| !present.contains(format!("{prefix}{rel}").as_str()))
            })
            .cloned(),
    );
    if let Some(first) = gone.first() {
        return Err(IngestError::ReloadWouldDrop {
            uri: uri.clone(),
            landing: landing.root_uri.clone(),
            count: gone.len(),
            first: first.clone(),
        }
        .into());
    }
    if let Some(first) = moved.first() {
        tracing::warn!(
            "{} file(s) this pipeline ingested are in bronze under another landing location (first: {first}): the landing location moved; their rows are replaced by the same files' rows under {}, each keeping its first arrival",
            moved.len(),
            landing.root_uri
        );
    }
    scope.sort();
    Ok((scope, arrived))
}

/// Every `_source_file` bronze holds (not only those under this landing location: one that
/// moved left its rows under the old one) with its earliest `_ingested_at` in milliseconds;
/// `None` for a bronze without `_source_file`.
async fn held_files(
    ctx: &SessionContext,
    table: &DeltaTable,
    uri: &str,
) -> Result<Option<Vec<(String, Option<i64>)>>, RunError> {
    let q = RunError::query(Phase::Plan);
    table
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(Phase::Plan, uri))?;
    let provider = table.table_provider().await.map_err(q)?;
    if provider.schema().field_with_name(SOURCE_FILE).is_err() {
        return Ok(None);
    }
    let first_arrival = match provider.schema().field_with_name(INGESTED_AT).is_ok() {
        true => datafusion::logical_expr::cast(col(INGESTED_AT), DataType::Int64),
        false => lit(ScalarValue::Int64(None)),
    };
    let batches = ctx
        .read_table(provider)
        .and_then(|df| {
            df.aggregate(
                    vec![col(SOURCE_FILE)],
                    vec![datafusion::functions_aggregate::expr_fn::min(first_arrival)
                        .alias("first_us")],
                )
        })
        .map_err(RunError::query(Phase::Plan))?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Plan, uri))?;
    let mut out = Vec::new();
    for b in &batches {
        let c = arrow::compute::cast(b.column(0), &DataType::Utf8)
            .map_err(RunError::arrow(Phase::Plan))?;
        let Some(s) = c.as_any().downcast_ref::<StringArray>() else {
            continue;
        };
        let first = b
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .cloned()
            .unwrap_or_else(|| Int64Array::new_null(b.num_rows()));
        for (i, file) in s.iter().enumerate() {
            if let Some(file) = file {
                let first_ms = first.is_valid(i).then(|| first.value(i).div_euclid(1000));
                out.push((file.to_string(), first_ms));
            }
        }
    }
    Ok(Some(out))
}

/// The recorded name (relative to a landing location) of `file`, a `_source_file` under
/// another location than this pipeline's: a name the record holds, with the same arrival
/// (`first_ms`, when given) — this pipeline's own file, from before its location moved, not
/// another pipeline's file of the same name.
fn moved_from<'f>(
    file: &'f str,
    record: &HashMap<String, Recorded>,
    first_ms: Option<i64>,
) -> Option<&'f str> {
    file.match_indices('/')
        .map(|(i, _)| &file[i + 1..])
        .find(|rel| {
            record
                .get(*rel)
                .is_some_and(|r| first_ms.is_none_or(|ms| r.ingested_ms == ms))
        })
}

/// Whether `f` is the file `r` records: the same fingerprint, or the same contents (a copied
/// folder gives every file a new modification time, not new contents).
pub fn same_file(r: &Recorded, f: &LandingFile) -> bool {
    r.fingerprint == f.fingerprint || (r.content.is_some() && r.content == f.content)
}

/// The rejected records of every file, as rows for the quarantine table.
pub fn rejects_batch(parsed: &[(LandingFile, Parsed)]) -> Result<Option<RecordBatch>, ArrowError> {
    let n: usize = parsed.iter().map(|(_, p)| p.rejects.len()).sum();
    if n == 0 {
        return Ok(None);
    }
    let (mut files, mut lines, mut records, mut reasons) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (f, p) in parsed {
        for r in &p.rejects {
            files.push(f.uri.as_str());
            lines.push(r.line.map(|l| l as i64));
            records.push(r.record.as_str());
            reasons.push(r.reason.as_str());
        }
    }
    let schema = Schema::new(vec![
        Field::new(SOURCE_FILE, DataType::Utf8, false),
        Field::new("_line", DataType::Int64, true),
        Field::new("_record", DataType::Utf8, false),
        Field::new(REASON_COLUMN, DataType::Utf8, false),
    ]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(files)),
        Arc::new(Int64Array::from(lines)),
        Arc::new(StringArray::from(records)),
        Arc::new(StringArray::from(reasons)),
    ];
    RecordBatch::try_new(Arc::new(schema), columns).map(Some)
}

/// Everything the commit needs.
pub struct Write<'a> {
    pub ctx: &'a SessionContext,
    pub target: Option<DeltaTable>,
    pub spec: &'a Ingest,
    pub pipeline: &'a str,
    pub cols: &'a [Col],
    pub parsed: Vec<(LandingFile, Parsed)>,
    pub record: &'a HashMap<String, Recorded>,
    /// A full reload: the earliest `_ingested_at` of each `_source_file` in bronze's rows.
    pub arrived: &'a HashMap<String, i64>,
    /// The run's number in the record.
    pub run: i64,
    pub now: DateTime<Utc>,
    /// A full reload: replace the rows of `scope` (this pipeline's files) instead of appending.
    pub whole: bool,
    pub scope: Vec<String>,
    pub facts: serde_json::Value,
}

/// What the commit did.
pub struct Written {
    /// Bronze after the commit.
    pub table: DeltaTable,
    pub version: u64,
    pub run: i64,
    /// The files the commit recorded.
    pub entries: Vec<Entry>,
    pub files_added: u64,
    pub files_removed: u64,
}

/// The columns tidemark adds to a file ingest's rows.
pub(super) fn file_columns() -> [(&'static str, DataType); 2] {
    [
        (INGESTED_AT, arrow_type(ColumnType::Timestamp)),
        (SOURCE_FILE, DataType::Utf8),
    ]
}

/// The schema bronze has after this commit: its columns in order (or the parsed ones for a new
/// table), then the columns this run adds, then the `system` columns tidemark adds it lacks.
pub(super) fn output_schema(
    bronze: Option<&Schema>,
    cols: &[Col],
    rescue: bool,
    system: &[(&str, DataType)],
) -> Arc<Schema> {
    let mut fields: Vec<Field> = match bronze {
        Some(s) => s.fields().iter().map(|f| f.as_ref().clone()).collect(),
        None => Vec::new(),
    };
    let has = |fields: &[Field], n: &str| fields.iter().any(|f| f.name() == n);
    for c in cols {
        if !has(&fields, &c.name) {
            fields.push(Field::new(&c.name, arrow_type(c.ty), true));
        }
    }
    if rescue && !has(&fields, RESCUED) {
        fields.push(Field::new(RESCUED, DataType::Utf8, true));
    }
    for (name, ty) in system {
        if !has(&fields, name) {
            fields.push(Field::new(*name, ty.clone(), true));
        }
    }
    Arc::new(Schema::new(fields))
}

/// Parsed `rows` in the output `schema`: each column from `fixed` (what tidemark adds), else
/// from the rows, else null; cast to the schema's type.
pub(super) fn conform(
    schema: &Arc<Schema>,
    rows: &RecordBatch,
    fixed: &[(&str, ArrayRef)],
) -> Result<RecordBatch, ArrowError> {
    let n = rows.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|f| -> Result<ArrayRef, ArrowError> {
            let given = fixed.iter().find(|(name, _)| name == f.name());
            let array: ArrayRef = match (given, rows.column_by_name(f.name())) {
                (Some((_, a)), _) => a.clone(),
                (None, Some(c)) => c.clone(),
                (None, None) => arrow::array::new_null_array(f.data_type(), n),
            };
            if array.data_type() == f.data_type() {
                Ok(array)
            } else {
                arrow::compute::cast(&array, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

/// One file's rows in the output schema, with its `_ingested_at` and `_source_file`.
pub(super) fn file_batch(
    schema: &Arc<Schema>,
    rows: &RecordBatch,
    ingested_us: i64,
    source: &str,
) -> Result<RecordBatch, ArrowError> {
    let n = rows.num_rows();
    let fixed: [(&str, ArrayRef); 2] = [
        (
            INGESTED_AT,
            Arc::new(TimestampMicrosecondArray::from(vec![ingested_us; n]).with_timezone("UTC")),
        ),
        (SOURCE_FILE, Arc::new(StringArray::from(vec![source; n]))),
    ];
    conform(schema, rows, &fixed)
}

/// Each parsed file's rows in the output schema with their arrival time, and the record
/// entries of the files (a full reload keeps the time each file first arrived — from the
/// record, else from its rows in bronze — and records again only what the record does not
/// already say; everything else arrives now).
fn rows_and_entries(
    w: &Write<'_>,
    schema: &Arc<Schema>,
    now_ms: i64,
) -> Result<(Vec<RecordBatch>, Vec<Entry>), RunError> {
    let mut batches = Vec::with_capacity(w.parsed.len());
    let mut entries = Vec::with_capacity(w.parsed.len());
    for (f, p) in &w.parsed {
        let recorded = w.record.get(&f.rel);
        let ingested_ms = match (w.whole, recorded) {
            // Contents the record holds keep their arrival; a file that changed since arrives
            // now (`on_file_change: reingest`).
            (true, Some(r)) if same_file(r, f) => r.ingested_ms,
            (true, Some(_)) => now_ms,
            (true, None) => w.arrived.get(&f.uri).copied().unwrap_or(now_ms),
            _ => now_ms,
        };
        let entry = Entry {
            file: f.rel.clone(),
            fingerprint: f.fingerprint,
            ingested_ms,
            content: f.content,
        };
        let known = recorded.is_some_and(|r| {
            r.fingerprint == entry.fingerprint
                && r.ingested_ms == entry.ingested_ms
                && (r.content.is_some() || entry.content.is_none())
        });
        if !(w.whole && known) {
            entries.push(entry);
        }
        if p.batch.num_rows() > 0 {
            batches.push(
                file_batch(schema, &p.batch, ingested_ms * 1000, &f.uri)
                    .map_err(RunError::arrow(Phase::Commit))?,
            );
        }
    }
    if batches.is_empty() {
        // Files without rows are recorded too (so they are not read again): an empty batch
        // still makes the commit.
        batches.push(RecordBatch::new_empty(schema.clone()));
    }
    Ok((batches, entries))
}

/// A new bronze table at `uri`.
pub(super) fn created(uri: &str, phase: Phase) -> Result<DeltaTable, RunError> {
    lake::create_url(uri)
        .map_err(RunError::from)
        .and_then(|url| {
            lake::builder(url)
                .and_then(|b| b.build())
                .map_err(RunError::delta(phase, uri))
        })
}

/// Appends (or, for a full reload, replaces) the rows and records the files, in one commit.
pub async fn write(w: Write<'_>) -> Result<Written, RunError> {
    let uri = &w.spec.target_uri;
    let bronze = match &w.target {
        Some(t) => Some(table_schema(t, uri)?),
        None => None,
    };
    let schema = output_schema(bronze.as_deref(), w.cols, w.spec.rescue, &file_columns());
    let grows = bronze
        .as_ref()
        .is_some_and(|b| b.fields().len() != schema.fields().len());
    let now_ms = w.now.timestamp_millis();
    let (batches, entries) = rows_and_entries(&w, &schema, now_ms)?;
    let (txn, files) = record::commit_parts(w.pipeline, w.run, now_ms, entries.clone())?;
    let props = CommitProperties::default()
        .with_metadata([(COMMIT_INFO_KEY.to_string(), w.facts), files])
        .with_application_transactions(vec![txn]);
    let phase = if w.whole { Phase::Write } else { Phase::Commit };
    let new_dirs = match &w.target {
        Some(_) => lake::NewDirs::default(),
        None => lake::NewDirs::before_create(uri),
    };
    let table = match w.target {
        Some(t) => t,
        None => match created(uri, phase) {
            Ok(t) => t,
            Err(e) => {
                new_dirs.remove_empty();
                return Err(e);
            }
        },
    };
    let fresh = table.version().is_none();
    let replace = w.whole
        && !fresh
        && !w.scope.is_empty()
        && bronze
            .as_ref()
            .is_some_and(|b| b.field_with_name(SOURCE_FILE).is_ok());
    // (a creation or a replacement that loses a commit race plans again; an append is retried,
    // delta-rs checking its application transactions against the winner's)
    let props = if fresh || replace {
        crate::lake::no_blind_retry(props)
    } else {
        props
    };
    let mut builder = table
        .write(batches)
        .with_commit_properties(props)
        .with_session_state(Arc::new(w.ctx.state()));
    builder = match (replace, grows) {
        (true, _) => builder
            .with_save_mode(SaveMode::Overwrite)
            .with_replace_where(
                col(SOURCE_FILE).in_list(w.scope.iter().map(|f| lit(f.clone())).collect(), false),
            )
            .with_schema_mode(SchemaMode::Merge),
        (_, true) => builder
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge),
        _ => builder.with_save_mode(SaveMode::Append),
    };
    if fresh {
        builder = builder.with_table_name(w.pipeline);
    }
    let table = match builder.await {
        Ok(t) => t,
        Err(e) => {
            new_dirs.remove_empty();
            return Err(RunError::write(phase, uri)(e));
        }
    };
    let version = table.version().unwrap_or(0);
    let (files_added, files_removed) = match lake::read_commits(&table, 1).await {
        Ok(entries) => entries
            .first()
            .map(|e| (e.files_added, e.files_removed))
            .unwrap_or((0, 0)),
        Err(_) => (0, 0),
    };
    Ok(Written {
        table,
        version,
        run: w.run,
        entries,
        files_added,
        files_removed,
    })
}
