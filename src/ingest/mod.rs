//! The `ingest` kind: landing files appended to a bronze table with their arrival time.
//!
//! plan → read → validate → commit. The plan lists the landing location, looks the listed files
//! up in the ingest record (`record.rs`: each file's fingerprint — size and modification time or
//! ETag — and `_ingested_at`), and picks the files not recorded yet, oldest first, within the
//! run's limits.
//! The read parses them (JSON lines, CSV, Parquet) into the schema; records that do not fit go
//! to the quarantine table with their file, line and reason. The commit appends the rows, each
//! with `_ingested_at` (the run's time, one per run) and `_source_file`, together with the run's
//! number and its files: rows and record land in one commit or not at all, so a file is
//! ingested exactly once across crashes and reruns. The record's index beside bronze is
//! appended after that commit (and completed from bronze's log by the next run after a crash). A full reload replaces the rows of this
//! landing location in one commit, each file keeping the `_ingested_at` it was first given.

mod chunked;
mod commit;
mod compare;
mod counters;
mod csv;
mod debezium;
pub mod decimal;
mod delivery;
mod error;
mod json;
mod kafka;
pub mod landing;
mod parquet;
mod parse;
mod plan;
pub mod record;
mod rows;
pub mod schema;
mod schema_of;
mod stream;
#[cfg(test)]
mod test_support;
#[cfg(test)]
pub(crate) use test_support::{test_cols, test_column, test_rejects, test_shape};

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use futures::{StreamExt, TryStreamExt};
use tracing::info;

pub use counters::IngestCounters;
pub use error::IngestError;

use crate::config::pipeline::ingest::{ColumnType, CsvOptions, FileChange, Format, Ingest};
use crate::config::pipeline::{Kind, SchemaChange};
use crate::config::Pipeline;
use crate::lake;
use crate::report::RunMode;
use crate::run::{Attempt, Phase, Point, RunError, RunKind, RunOptions, Table};
use delivery::with_cut_tail;
use landing::{Landing, LandingFile};
use parse::Parser;
use rows::Parsed;
use schema::Col;

/// Records read to infer a schema (from the first files of the first run).
const INFER_RECORDS: usize = 1000;

/// How a file is parsed: the columns, and the pipeline's parsing options.
pub struct Shape<'a> {
    pub cols: &'a [Col],
    pub rescue: bool,
    pub max_record_bytes: u64,
    pub csv: CsvOptions,
}

impl RunKind for Ingest {
    const KIND: Kind = Kind::Ingest;
    type Counters = IngestCounters;

    fn uris(&self) -> (&str, &str) {
        (&self.landing_uri, &self.target_uri)
    }

    fn tables(&self) -> Vec<(Table, &str)> {
        match self.kafka {
            // (a Kafka ingest keeps its offsets in bronze's log: no record beside it)
            Some(_) => vec![
                (Table::Target, &self.target_uri),
                (Table::Quarantine, &self.quarantine.uri),
            ],
            None => vec![
                (Table::Target, &self.target_uri),
                (Table::Record, &self.record_uri),
                (Table::Quarantine, &self.quarantine.uri),
            ],
        }
    }

    /// One `_ingested_at` per run, in milliseconds: the precision the ingest record keeps it in.
    fn now(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(now.timestamp_millis())
            .single()
            .unwrap_or(now)
    }

    async fn execute(&self, a: &mut Attempt<'_>) -> Result<IngestCounters, RunError> {
        let (p, opts, now) = (a.p, a.opts, a.now);
        let mut run = Run {
            a,
            p,
            spec: self,
            opts,
            now,
            c: IngestCounters::default(),
        };
        match &self.kafka {
            Some(k) => run.execute_kafka(k).await?,
            None => run.execute().await?,
        }
        info!(
            files = run.c.num_files_ingested,
            rows = run.c.num_rows_written,
            "ingest finished"
        );
        Ok(run.c)
    }
}

struct Run<'r, 'a> {
    a: &'r mut Attempt<'a>,
    p: &'a Pipeline,
    spec: &'r Ingest,
    opts: &'a RunOptions,
    now: DateTime<Utc>,
    c: IngestCounters,
}

/// What the plan chose, for the read and the commit.
struct Planned {
    target: Option<deltalake::DeltaTable>,
    book: record::Record,
    landing: Landing,
    record: std::collections::HashMap<String, record::Recorded>,
    files: Vec<LandingFile>,
    whole: bool,
    scope: Vec<String>,
    arrived: std::collections::HashMap<String, i64>,
}

pub use record::Recorded;

impl Run<'_, '_> {
    fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.a.end_phase(phase)
    }

    fn warn(&mut self, message: String) {
        self.a.warn(message);
    }

    /// plan → read → validate → commit: streamed wave by wave when the run appends (see
    /// [`stream`]), else read whole first.
    async fn execute(&mut self) -> Result<(), RunError> {
        let Some(plan) = self.plan().await? else {
            return Ok(());
        };
        let plan = if !plan.whole && !self.opts.dry_run && plan.book.stale_after.is_none() {
            match self.stream(plan).await? {
                stream::Streamed::Done => return Ok(()),
                stream::Streamed::Fallback(plan) => {
                    self.reset_read_counts();
                    *plan
                }
            }
        } else {
            plan
        };
        let (cols, parsed) = self.read_planned(&plan).await?;
        if parsed.is_empty() && !plan.whole && plan.target.is_some() {
            // Every file planned is still being written (left for a later run): no commit.
            if !self.opts.dry_run {
                plan.book.append(&self.a.ctx, None).await?;
            }
            return Ok(());
        }
        self.validate(&parsed).await?;
        self.commit(plan, cols, parsed).await
    }

    /// Opens bronze and its record, lists the landing files and picks those to read; `None`
    /// when there is nothing to read.
    async fn plan(&mut self) -> Result<Option<Planned>, RunError> {
        let spec = self.spec;
        let started = std::time::Instant::now();
        let target = lake::open_if_exists(&spec.target_uri).await?;
        let opened_ms = started.elapsed().as_millis();
        if let Some(t) = &target {
            commit::check_retention(t, &spec.target_uri)?;
            if !self.opts.full_reload {
                let path = self.p.path.display().to_string();
                commit::check_foreign(t, &spec.target_uri, &self.p.name, &path).await?;
            }
        }
        let book = record::Record::open(
            &spec.record_uri,
            target.as_ref(),
            &spec.target_uri,
            &self.p.name,
            self.opts.full_reload,
        )
        .await?;
        info!(
            opened_ms,
            record_ms = started.elapsed().as_millis() - opened_ms,
            "bronze opened and its ingest record read"
        );
        if let Some(runs) = book.rebuilt {
            self.warn(format!(
                "the ingest record {} held nothing of bronze's {runs} ingest run(s) (deleted?); it is rebuilt from bronze's log{}",
                spec.record_uri,
                if self.opts.dry_run { " (not written: dry run)" } else { "" }
            ));
        }
        if let Some(latest) = book.latest_ms {
            if latest > self.now.timestamp_millis() {
                self.warn(format!(
                    "the clock is behind this pipeline's latest arrival ({}): files ingested now are stamped earlier than files ingested before, which makes their lateness look shorter; check the machine's clock (and TIDEMARK_FAKE_NOW)",
                    crate::report::rfc3339_ms(latest).unwrap_or_default()
                ));
            }
        }
        let landing = Landing::open(&spec.landing_uri, &self.p.path.display().to_string())?;
        let glob = glob::Pattern::new(&spec.glob).map_err(|e| RunError::Internal {
            phase: Phase::Plan,
            message: format!("the glob was checked when the pipeline loaded: {e}"),
        })?;
        let listing = std::time::Instant::now();
        let listed = landing.list(&glob).await?;
        info!(
            listed = listed.len(),
            ms = listing.elapsed().as_millis(),
            "landing listed"
        );
        let whole = self.a.mode_for(target.is_some()) == RunMode::FullReload;
        let record = if whole {
            book.lookup(&self.a.ctx, None).await?
        } else {
            let names: Vec<&str> = listed.iter().map(|f| f.rel.as_str()).collect();
            book.lookup(&self.a.ctx, Some(&names)).await?
        };
        let mut plan = plan::choose(listed, &record, spec, whole);
        // A file whose modification time changed but whose contents did not (a copied folder,
        // a restored backup) is the file that was ingested.
        let same = self.same_contents(&landing, &plan.changed, &record).await?;
        if !same.is_empty() {
            plan.changed.retain(|f| !same.contains(&f.rel));
            if !whole {
                plan.files.retain(|f| !same.contains(&f.rel));
                plan.skipped += same.len() as u64;
            }
        }
        self.c.num_files_listed = plan.listed;
        self.c.num_files_skipped = plan.skipped;
        self.c.num_files_pending = plan.pending;
        self.c.num_files_changed = plan.changed.len() as u64;
        // A full reload too: it would replace the rows a file delivered with its new contents.
        if !plan.changed.is_empty() && spec.on_file_change == FileChange::Fail {
            let first = &plan.changed[0];
            let at = record
                .get(&first.rel)
                .and_then(|r| crate::report::rfc3339_ms(r.ingested_ms))
                .unwrap_or_else(|| "an unknown time".to_string());
            return Err(IngestError::FileChanged {
                count: plan.changed.len(),
                first: first.uri.clone(),
                ingested_at: at,
                pipeline: self.p.path.display().to_string(),
            }
            .into());
        }
        if plan.pending > 0 {
            self.warn(format!(
                "{} landing file(s) left for the next run (max_files_per_run / max_bytes_per_run)",
                plan.pending
            ));
        }
        let (scope, arrived) = match (&target, whole) {
            (Some(t), true) => {
                commit::reload_scope(&self.a.ctx, t, spec, &landing, &plan.files, &record).await?
            }
            _ => Default::default(),
        };
        self.end_phase(Phase::Plan)?;
        if plan.listed == 0 && book.has_history() {
            // Nothing matches, yet this pipeline ingested before: a glob edited wrong looks
            // exactly like a quiet hour, unless the folder holds files it no longer matches.
            let everything = glob::Pattern::new("**/*").map_err(|e| RunError::Internal {
                phase: Phase::Plan,
                message: format!("the match-all glob: {e}"),
            })?;
            let others = landing.list(&everything).await?;
            if let Some(first) = others.first() {
                self.warn(format!(
                    "none of the {} file(s) under {} matches `landing.glob: {}` (first: {}), though this pipeline has ingested files before: check `landing.glob` in {}",
                    others.len(),
                    spec.landing_uri,
                    spec.glob,
                    first.rel,
                    self.p.path.display()
                ));
            }
        }
        // (a first run with nothing landed yet still creates bronze, empty: the pipelines reading
        // it — a continuous job's merge on its first tick — find a table, not an error)
        if plan.files.is_empty() && !whole && target.is_some() {
            if !self.opts.dry_run {
                // Runs a crash kept out of the index: complete it (bronze already holds them).
                book.append(&self.a.ctx, None).await?;
            }
            info!(
                listed = plan.listed,
                skipped = plan.skipped,
                "no new landing files"
            );
            return Ok(None);
        }
        Ok(Some(Planned {
            target,
            book,
            landing,
            record,
            files: plan.files,
            whole,
            scope,
            arrived,
        }))
    }

    /// Parses the planned files into bronze's columns (adding new ones where allowed).
    async fn read_planned(
        &mut self,
        plan: &Planned,
    ) -> Result<(Vec<Col>, Vec<(LandingFile, Parsed)>), RunError> {
        let spec = self.spec;
        let (landing, files) = (&plan.landing, &plan.files);
        let bronze_schema = match &plan.target {
            Some(t) => Some(commit::table_schema(t, &spec.target_uri)?),
            None => None,
        };
        let mut cols = self
            .columns(bronze_schema.as_deref(), Some((landing, files)))
            .await?;
        let (mut parsed, deferred) = self.read(landing, files, &cols).await?;
        self.warn_pending(&deferred);
        let unknown: BTreeMap<String, (ColumnType, String)> = parsed
            .iter()
            .flat_map(|(f, p)| {
                p.unknown
                    .iter()
                    .map(move |(k, t)| (k.clone(), (*t, f.uri.clone())))
            })
            .collect();
        if !unknown.is_empty() {
            let names: Vec<String> = unknown.keys().map(|k| format!("`{k}`")).collect();
            // A header read with the wrong delimiter is one field named after all the columns.
            if let Some(joined) = unknown
                .keys()
                .find(|k| spec.format == Format::Csv && k.contains([';', '\t', '|', ',']))
            {
                return Err(IngestError::Schema {
                    pipeline: self.p.path.display().to_string(),
                    message: format!(
                        "the header has a field named `{joined}`: the files look delimited by another character than `{}`; set `csv: {{ delimiter: \"…\" }}` in the pipeline (nothing was written)",
                        char::from(spec.csv.delimiter)
                    ),
                }
                .into());
            }
            if spec.on_schema_change != SchemaChange::AddNewColumns {
                let first_file = unknown
                    .values()
                    .next()
                    .map(|(_, f)| f.clone())
                    .unwrap_or_default();
                return Err(IngestError::Schema {
                    pipeline: self.p.path.display().to_string(),
                    message: format!(
                        "the records carry field(s) bronze does not have: {} (first seen in {first_file}); nothing was written. Add them with `on_schema_change: add_new_columns`, keep them as JSON text with `rescue: true` (in `_rescued_data`), or fix the producer",
                        names.join(", ")
                    ),
                }
                .into());
            }
            for (name, (ty, _)) in &unknown {
                cols.push(Col {
                    name: name.clone(),
                    ty: *ty,
                    required: false,
                });
                self.c.columns_added.push(name.clone());
            }
            // The first pass could not keep the new fields' values: parse again with them.
            parsed = self.read(landing, files, &cols).await?.0;
        }
        let copies = self
            .redelivered(
                &plan.book,
                &plan.record,
                &mut parsed,
                &mut Default::default(),
            )
            .await?;
        self.warn_copies(&copies);
        self.a.summary.num_source_rows_read = parsed.iter().map(|(_, p)| p.records).sum();
        self.c.num_bytes_read = parsed.iter().map(|(f, _)| f.size).sum();
        self.c.num_rescued = parsed.iter().map(|(_, p)| p.rescued).sum();
        self.end_phase(Phase::Read)?;
        Ok((cols, parsed))
    }

    /// Stores the records that did not parse in the quarantine table.
    async fn validate(&mut self, parsed: &[(LandingFile, Parsed)]) -> Result<(), RunError> {
        let rejected = commit::rejects_batch(parsed).map_err(RunError::arrow(Phase::Validate))?;
        self.a
            .quarantine(&self.spec.quarantine, rejected.into_iter().collect())
            .await?;
        self.end_phase(Phase::Validate)
    }

    /// Appends the rows and the record of their files in one commit, then the record's index.
    async fn commit(
        &mut self,
        plan: Planned,
        cols: Vec<Col>,
        parsed: Vec<(LandingFile, Parsed)>,
    ) -> Result<(), RunError> {
        let spec = self.spec;
        let Planned {
            target,
            mut book,
            record,
            whole,
            scope,
            arrived,
            ..
        } = plan;
        self.c.num_files_ingested = parsed.len() as u64;
        self.c.num_rows_written = parsed.iter().map(|(_, p)| p.batch.num_rows() as u64).sum();
        if self.opts.dry_run {
            // (a dry full reload says which rows it would change: what `reconcile` reads)
            if let (true, Some(t)) = (whole, &target) {
                let (n, files) =
                    compare::differing(&self.a.ctx, t, &spec.target_uri, &scope, &parsed).await?;
                self.c.num_rows_differing = Some(n);
                self.c.files_differing = files;
            }
            return Ok(());
        }
        let write_phase = if whole { Phase::Write } else { Phase::Commit };
        self.a.failpoint(Point::Before(write_phase))?;
        if book.stale_after.is_some() {
            self.warn(format!(
                "the ingest record {} held runs bronze no longer has (bronze restored to an earlier version?): they are dropped, and their files ingested again",
                spec.record_uri
            ));
            book.drop_stale(&self.a.ctx).await?;
        }
        self.c.ingested_at = Some(self.now);
        // (the run-number `txn` is listed, so a restore of bronze brings it back as of then)
        let mut extra = serde_json::Map::new();
        extra.insert(
            lake::TXN_APPS.into(),
            vec![record::run_app(&self.p.name)].into(),
        );
        let facts = self.a.facts(&self.c, extra);
        let written = commit::write(commit::Write {
            ctx: &self.a.ctx,
            target,
            spec,
            pipeline: &self.p.name,
            cols: &cols,
            parsed,
            record: &record,
            arrived: &arrived,
            run: book.next_run(),
            now: self.now,
            whole,
            scope,
            facts,
        })
        .await?;
        self.a.summary.target_version = Some(written.version);
        self.a.failpoint(Point::Committed(Table::Target))?;
        let (files_added, files_removed) = (written.files_added, written.files_removed);
        self.index(book, written).await;
        if whole && files_removed > 0 {
            self.warn(format!(
                "bronze was rewritten ({} data file(s) replaced): a cdc_merge reading {} refuses its next incremental run (its source is no longer append-only); rebuild it with `--full-reload`",
                files_removed, spec.target_uri
            ));
        }
        self.a.summary.num_files_added = files_added;
        self.a.summary.num_files_removed = files_removed;
        self.end_phase(write_phase)?;
        Ok(())
    }

    /// Records the committed files in the record's index (a failure only warns: bronze holds
    /// the rows and the record of their files, and the next run completes the index from
    /// bronze's commit).
    async fn index(&mut self, book: record::Record, written: commit::Written) {
        let version = written.version;
        if let Err(e) = book
            .append(
                &self.a.ctx,
                Some((&written.table, written.run, written.entries)),
            )
            .await
        {
            self.warn(format!(
                "bronze committed version {version}, but its ingest record's index {} was not updated ({e}); the next run completes it from bronze's log",
                self.spec.record_uri
            ));
        }
    }

    /// What parsing needs of the pipeline.
    fn parser(&self) -> Parser {
        Parser {
            format: self.spec.format,
            rescue: self.spec.rescue,
            max_record_bytes: self.spec.max_record_bytes,
            csv: self.spec.csv,
        }
    }

    fn shape<'c>(&self, cols: &'c [Col]) -> Shape<'c> {
        Shape {
            cols,
            rescue: self.spec.rescue,
            max_record_bytes: self.spec.max_record_bytes,
            csv: self.spec.csv,
        }
    }

    /// Reads and parses `files`, a few at a time (parsing runs off the async threads). A text
    /// file whose last line has no line end is being written: left for a later run while it was
    /// modified within [`CUT_FILE_GRACE`] (returned second), after that read without that line,
    /// which goes to the quarantine.
    async fn read(
        &self,
        landing: &Landing,
        files: &[LandingFile],
        cols: &[Col],
    ) -> Result<(Vec<(LandingFile, Parsed)>, Vec<LandingFile>), RunError> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let cols = std::sync::Arc::new(cols.to_vec());
        let (format, now, parser) = (self.spec.format, self.now, self.parser());
        let read: Vec<(LandingFile, Option<Parsed>)> = futures::stream::iter(files.iter().cloned())
            .map(|f| {
                let cols = cols.clone();
                async move {
                    let loaded = match delivery::load(landing, f, format, now).await? {
                        Ok(l) => l,
                        Err(later) => return Ok((later, None)),
                    };
                    let delivery::Loaded { f, body, tail } = loaded;
                    let parsed = parser.parse(body, cols).await?;
                    let parsed = delivery::checked(parsed, &f)?;
                    Ok::<_, RunError>((f, Some(with_cut_tail(parsed, tail))))
                }
            })
            .buffered(workers)
            .try_collect()
            .await?;
        let mut parsed = Vec::new();
        let mut deferred = Vec::new();
        for (f, p) in read {
            match p {
                Some(p) => parsed.push((f, p)),
                None => deferred.push(f),
            }
        }
        Ok((parsed, deferred))
    }
}
