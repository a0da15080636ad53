//! Streaming ingest: an appending run (a first run, or an incremental one) reads its files in
//! waves of about [`WAVE_BYTES`], and each wave's rows are encoded into Parquet data files
//! under bronze's root as soon as they are parsed, then dropped. The run still commits once —
//! every file's `add`, the run's `txn` and its record of files together — so the files written
//! before a crash are never referenced (`tidemark maintain` vacuums them, as it does other
//! kinds' leftovers). Peak memory is a wave (its bytes and their rows) plus one data file being
//! encoded ([`FILE_BYTES`]), whatever the run's input.
//!
//! A run whose schema grows (fields bronze does not have), a full reload (which replaces rows)
//! and a table with partitions or column mapping (which the direct writer does not handle) read
//! everything first, as before ([`super::Run::read_planned`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Add};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;

use super::commit::{self, Written};
use super::landing::LandingFile;
use super::record::Entry;
use super::rows::Parsed;
use super::{Planned, Run};
use crate::config::pipeline::ingest::Format;
use crate::lake::datafile::{FastPath, NewFile};
use crate::lake::{self, COMMIT_INFO_KEY};
use crate::run::{Phase, Point, RunError, Table};

/// About this many bytes of landing files are read and parsed at a time.
pub const WAVE_BYTES: u64 = 64 << 20;
/// A data file is closed and written once this many encoded bytes are in it.
pub const FILE_BYTES: usize = 32 << 20;
/// Rows per Parquet row group of a streamed file.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// How a streamed run ended.
pub(super) enum Streamed {
    /// Committed (or nothing to commit).
    Done,
    /// The files carry fields bronze lacks (or the table cannot be written directly): the run
    /// reads everything first instead, with its plan back. Nothing was committed; the files
    /// written are removed.
    Fallback(Box<Planned>),
}

/// What the waves gather for the commit.
#[derive(Default)]
pub(super) struct Acc {
    pub(super) entries: Vec<Entry>,
    pub(super) rejects: Vec<RecordBatch>,
    /// The contents this run delivered, by file (a later copy delivers nothing).
    pub(super) earlier: HashMap<i64, String>,
    pub(super) copies: Vec<(String, String)>,
    pub(super) deferred: Vec<LandingFile>,
}

/// Where the rows go: the data files, in bronze's columns.
pub(super) struct Out<'s> {
    sink: &'s mut Sink,
    schema: &'s Arc<Schema>,
    uri: &'s str,
}

/// The data files a run writes as it reads.
pub(super) struct Sink {
    /// The folders a first run's files would leave behind (removed when it stops).
    new_dirs: lake::NewDirs,
    fast: FastPath,
    schema: Arc<Schema>,
    file: Option<NewFile>,
    adds: Vec<Add>,
}

impl Sink {
    /// `None` when bronze cannot be written directly (partitions, column mapping) or its
    /// columns are not `schema`'s.
    fn open(
        target: Option<&DeltaTable>,
        uri: &str,
        schema: &Arc<Schema>,
    ) -> Result<Option<Sink>, RunError> {
        let storage = Arc::new(lake::storage::storage_schema(schema));
        let new_dirs = match target {
            Some(_) => lake::NewDirs::default(),
            None => lake::NewDirs::before_create(uri),
        };
        let fast = match target {
            Some(t) => match FastPath::check(t).map_err(RunError::delta(Phase::Read, uri))? {
                Some(f) if f.schema.fields() == storage.fields() => f,
                _ => return Ok(None),
            },
            None => {
                let created = commit::created(uri, Phase::Read)?;
                FastPath {
                    store: created.log_store().object_store(None),
                    schema: storage.clone(),
                    stats: Default::default(),
                    change_data_feed: false,
                    deletion_vectors: Default::default(),
                    dv_enabled: false,
                }
            }
        };
        Ok(Some(Sink {
            new_dirs,
            fast,
            schema: storage,
            file: None,
            adds: Vec::new(),
        }))
    }

    /// Encodes `batch`; writes the data file out once it holds [`FILE_BYTES`].
    async fn push(&mut self, batch: &RecordBatch, uri: &str) -> Result<(), RunError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let w = |e| RunError::write(Phase::Read, uri)(e);
        let batch = lake::storage::storage_batch(batch).map_err(RunError::arrow(Phase::Read))?;
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())
            .map_err(RunError::arrow(Phase::Read))?;
        let file = match &mut self.file {
            Some(f) => f,
            None => self
                .file
                .insert(NewFile::new(self.schema.clone(), ROW_GROUP_ROWS, 0).map_err(w)?),
        };
        file.write(&batch).map_err(w)?;
        if file.encoded_bytes() >= FILE_BYTES {
            self.close(uri).await?;
        }
        Ok(())
    }

    /// Writes the data file being encoded.
    async fn close(&mut self, uri: &str) -> Result<(), RunError> {
        if let Some(f) = self.file.take() {
            let add = f
                .put(&self.fast)
                .await
                .map_err(RunError::write(Phase::Read, uri))?;
            self.adds.extend(add);
        }
        Ok(())
    }

    /// Removes the data files written (best effort: a file left behind is unreferenced, and
    /// `maintain` vacuums it).
    async fn abandon(self) {
        for a in &self.adds {
            let path = object_store::path::Path::from(a.path.as_str());
            let _ = self.fast.store.delete(&path).await;
        }
        self.new_dirs.remove_empty();
    }
}

impl Run<'_, '_> {
    /// Reads, writes and commits the planned files wave by wave (see the module's notes).
    pub(super) async fn stream(&mut self, plan: Planned) -> Result<Streamed, RunError> {
        let spec = self.spec;
        let bronze = match &plan.target {
            Some(t) => Some(commit::table_schema(t, &spec.target_uri)?),
            None => None,
        };
        let cols = self
            .columns(bronze.as_deref(), Some((&plan.landing, &plan.files)))
            .await?;
        let schema = commit::output_schema(
            bronze.as_deref(),
            &cols,
            spec.rescue,
            &commit::file_columns(),
        );
        if bronze
            .as_ref()
            .is_some_and(|b| b.fields().len() != schema.fields().len())
        {
            return Ok(Streamed::Fallback(Box::new(plan)));
        }
        let Some(mut sink) = Sink::open(plan.target.as_ref(), &spec.target_uri, &schema)? else {
            return Ok(Streamed::Fallback(Box::new(plan)));
        };
        // (a run that stops before its commit removes the data files it wrote; a killed one
        // leaves them unreferenced, for `maintain`)
        let acc = match self.gather(&plan, &cols, &schema, &mut sink).await {
            Ok(Some(acc)) => acc,
            Ok(None) => {
                sink.abandon().await;
                return Ok(Streamed::Fallback(Box::new(plan)));
            }
            Err(e) => {
                sink.abandon().await;
                return Err(e);
            }
        };
        if acc.entries.is_empty() && plan.target.is_some() {
            // Every file planned is still being written (left for a later run): no commit.
            sink.abandon().await;
            plan.book.append(&self.a.ctx, None).await?;
            return Ok(Streamed::Done);
        }
        if let Err(e) = self.a.quarantine(&spec.quarantine, acc.rejects).await {
            sink.abandon().await;
            return Err(e);
        }
        self.end_phase(Phase::Validate)?;
        self.commit_streamed(plan, sink, acc.entries, &schema)
            .await?;
        Ok(Streamed::Done)
    }

    /// Reads and writes the waves; `None` when a wave carries fields bronze lacks.
    async fn gather(
        &mut self,
        plan: &Planned,
        cols: &[super::schema::Col],
        schema: &Arc<Schema>,
        sink: &mut Sink,
    ) -> Result<Option<Acc>, RunError> {
        let spec = self.spec;
        let mut acc = Acc::default();
        let mut out = Out {
            sink,
            schema,
            uri: &spec.target_uri,
        };
        let chunked = matches!(spec.format, Format::Json | Format::Debezium);
        for wave in waves(&plan.files) {
            let grew = match chunked {
                true => {
                    self.chunked_wave(plan, wave, cols, &mut out, &mut acc)
                        .await?
                }
                false => {
                    self.whole_wave(plan, wave, cols, &mut out, &mut acc)
                        .await?
                }
            };
            if grew {
                return Ok(None);
            }
        }
        self.warn_pending(&acc.deferred);
        self.warn_copies(&acc.copies);
        out.sink.close(&spec.target_uri).await?;
        self.end_phase(Phase::Read)?;
        Ok(Some(acc))
    }

    /// A wave of files parsed whole (CSV, Parquet), then written; `true` when they carry fields
    /// bronze lacks (nothing of the wave written).
    async fn whole_wave(
        &mut self,
        plan: &Planned,
        wave: &[LandingFile],
        cols: &[super::schema::Col],
        out: &mut Out<'_>,
        acc: &mut Acc,
    ) -> Result<bool, RunError> {
        let (mut parsed, later) = self.read(&plan.landing, wave, cols).await?;
        acc.deferred.extend(later);
        if parsed.iter().any(|(_, p)| !p.unknown.is_empty()) {
            return Ok(true);
        }
        acc.copies.extend(
            self.redelivered(&plan.book, &plan.record, &mut parsed, &mut acc.earlier)
                .await?,
        );
        for (f, p) in parsed {
            self.record_file(&f, acc);
            self.take_rows(&f, p, out, acc).await?;
        }
        Ok(false)
    }

    /// Records a file read (it arrives now) and counts it; its rows are counted as they are
    /// taken.
    pub(super) fn record_file(&mut self, f: &LandingFile, acc: &mut Acc) {
        self.c.num_bytes_read += f.size;
        self.c.num_files_ingested += 1;
        acc.entries.push(entry(f, self.now.timestamp_millis()));
    }

    /// Counts a parse's records, writes its rows and keeps its rejects.
    pub(super) async fn take_rows(
        &mut self,
        f: &LandingFile,
        p: Parsed,
        out: &mut Out<'_>,
        acc: &mut Acc,
    ) -> Result<(), RunError> {
        self.a.summary.num_source_rows_read += p.records;
        self.c.num_rescued += p.rescued;
        self.c.num_rows_written += p.batch.num_rows() as u64;
        let now_us = self.now.timestamp_micros();
        let rows = commit::file_batch(out.schema, &p.batch, now_us, &f.uri)
            .map_err(RunError::arrow(Phase::Read))?;
        out.sink.push(&rows, out.uri).await?;
        drop(rows);
        let pair = [(f.clone(), p)];
        acc.rejects
            .extend(commit::rejects_batch(&pair).map_err(RunError::arrow(Phase::Validate))?);
        Ok(())
    }

    /// Forgets what a streamed read counted before it handed the run to the whole read.
    pub(super) fn reset_read_counts(&mut self) {
        self.a.summary.num_source_rows_read = 0;
        self.c.num_bytes_read = 0;
        self.c.num_rescued = 0;
        self.c.num_files_ingested = 0;
        self.c.num_rows_written = 0;
        self.c.num_files_pending = 0;
        self.c.num_files_duplicate = 0;
    }

    /// The one commit: the data files, the run's `txn` and its record of files (creating bronze
    /// on a first run); then the record's index.
    async fn commit_streamed(
        &mut self,
        plan: Planned,
        sink: Sink,
        entries: Vec<Entry>,
        schema: &Arc<Schema>,
    ) -> Result<(), RunError> {
        let spec = self.spec;
        let uri = &spec.target_uri;
        self.a.failpoint(Point::Before(Phase::Commit))?;
        self.c.ingested_at = Some(self.now);
        let mut extra = serde_json::Map::new();
        extra.insert(
            lake::TXN_APPS.into(),
            vec![super::record::run_app(&self.p.name)].into(),
        );
        let facts = self.a.facts(&self.c, extra);
        let run = plan.book.next_run();
        let (txn, files) = super::record::commit_parts(
            &self.p.name,
            run,
            self.now.timestamp_millis(),
            entries.clone(),
        )?;
        let props = CommitProperties::default()
            .with_metadata([(COMMIT_INFO_KEY.to_string(), facts), files])
            .with_application_transactions(vec![txn]);
        let adds: Vec<Action> = sink.adds.iter().cloned().map(Action::Add).collect();
        let committed = match &plan.target {
            Some(t) => append(t, uri, props, adds).await,
            None => create(uri, &self.p.name, schema, props, adds).await,
        };
        let table = match committed {
            Ok(t) => t,
            Err(e) => {
                sink.abandon().await;
                return Err(e);
            }
        };
        let version = table.version().unwrap_or(0);
        self.a.summary.target_version = Some(version);
        self.a.summary.num_files_added = sink.adds.len() as u64;
        self.a.failpoint(Point::Committed(Table::Target))?;
        let written = Written {
            table,
            version,
            run,
            entries,
            files_added: sink.adds.len() as u64,
            files_removed: 0,
        };
        self.index(plan.book, written).await;
        self.end_phase(Phase::Commit)
    }
}

/// Tests only: the wave size instead of [`WAVE_BYTES`], so small files cross waves.
const WAVE_BYTES_ENV: &str = "TIDEMARK_INGEST_WAVE_BYTES";

/// The planned files in waves of about [`WAVE_BYTES`] (at least one file each).
fn waves(files: &[LandingFile]) -> Vec<&[LandingFile]> {
    let wave = std::env::var(WAVE_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(WAVE_BYTES);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, f) in files.iter().enumerate() {
        if i > start && bytes + f.size > wave {
            out.push(&files[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += f.size;
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// A file's record entry: it arrives now.
fn entry(f: &LandingFile, now_ms: i64) -> Entry {
    Entry {
        file: f.rel.clone(),
        fingerprint: f.fingerprint,
        ingested_ms: now_ms,
        content: f.content,
    }
}

/// Appends the data files to bronze with the run's `txn` (a lost race is retried by delta-rs,
/// which refuses it when the winner wrote the same `txn` app: the run plans again).
async fn append(
    t: &DeltaTable,
    uri: &str,
    props: CommitProperties,
    adds: Vec<Action>,
) -> Result<DeltaTable, RunError> {
    let d = |e| RunError::write(Phase::Commit, uri)(e);
    let snapshot = t.snapshot().map_err(d)?;
    let commit = CommitBuilder::from(props)
        .with_actions(adds)
        .build(
            Some(snapshot),
            t.log_store(),
            DeltaOperation::Write {
                mode: SaveMode::Append,
                partition_by: None,
                predicate: None,
            },
        )
        .await
        .map_err(d)?;
    // (bronze as of this commit: the record's index reads its version)
    let mut table = t.clone();
    table.load_version(commit.version()).await.map_err(d)?;
    Ok(table)
}

/// Creates bronze with the data files in its first commit. Another run that created it first
/// is a lost race: the run plans again.
async fn create(
    uri: &str,
    name: &str,
    schema: &Arc<Schema>,
    props: CommitProperties,
    adds: Vec<Action>,
) -> Result<DeltaTable, RunError> {
    use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
    let d = |e| RunError::write(Phase::Commit, uri)(e);
    let new_dirs = lake::NewDirs::before_create(uri);
    let table = commit::created(uri, Phase::Commit)?;
    let normalized = deltalake::kernel::schema::cast::normalize_for_delta(&Arc::new(
        lake::storage::storage_schema(schema),
    ));
    let columns: deltalake::kernel::StructType = normalized
        .as_ref()
        .try_into_kernel()
        .map_err(|e| d(e.into()))?;
    let created = deltalake::operations::create::CreateBuilder::new()
        .with_log_store(table.log_store())
        .with_columns(columns.fields().cloned())
        .with_table_name(name)
        .with_actions(adds)
        .with_commit_properties(lake::no_blind_retry(props))
        .await;
    match created {
        Ok(t) => Ok(t),
        Err(e) => {
            let raced = table
                .log_store()
                .is_delta_table_location()
                .await
                .unwrap_or(false);
            if raced {
                return Err(d(deltalake::DeltaTableError::VersionAlreadyExists(0)));
            }
            new_dirs.remove_empty();
            Err(d(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_hold_about_the_budget_and_at_least_one_file_each() {
        let f = |rel: &str, size: u64| super::super::landing::listed_for_test(rel, size, 0);
        let files = vec![
            f("a", WAVE_BYTES / 2),
            f("b", WAVE_BYTES / 2),
            f("c", 1),
            f("d", 3 * WAVE_BYTES),
            f("e", 1),
        ];
        let cut: Vec<Vec<&str>> = waves(&files)
            .iter()
            .map(|w| w.iter().map(|f| f.rel.as_str()).collect())
            .collect();
        assert_eq!(cut, vec![vec!["a", "b"], vec!["c"], vec!["d"], vec!["e"]]);
        assert!(waves(&[]).is_empty());
    }
}
