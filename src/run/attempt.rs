//! The attempt harness: what every run of every kind has, kept once.
//!
//! # The kind contract
//!
//! A kind implements [`RunKind`] and is run by [`attempt`]; the dispatcher above the kinds
//! (`crate::pipeline`) plans an attempt again when it lost a commit race. Every kind:
//!
//! 1. plans from the logs of the tables it reads and writes, and chooses its [`RunMode`] with
//!    [`Attempt::mode_for`] (no target: bootstrap; `--full-reload`: full reload; otherwise
//!    incremental);
//! 2. records its source's identity and the version it read, and refuses a source that was
//!    recreated, restored or rewritten under it (or rebuilds, where its option says so);
//! 3. records the fingerprint of its definition ([`crate::run::definition`]) and refuses a run
//!    under a changed one with exit 65 until `--full-reload`;
//! 4. makes at most one commit per table it owns ([`RunKind::tables`]), each carrying the
//!    run's facts ([`Attempt::facts`]: the summary's header and the kind's counters, always
//!    with `kind`), so `history`, `restore` and the ledger read them back without knowing the
//!    kind;
//! 5. times its phases and reaches its failpoints through [`Attempt::end_phase`] and
//!    [`Attempt::failpoint`] (names built from the kind, the mode and the phase: no strings);
//! 6. stores rejected rows through [`Attempt::quarantine`];
//! 7. on a dry run counts everything and writes nothing;
//! 8. returns its typed counters; the harness finishes the summary.
//!
//! A rerun after any failure is harmless: nothing is committed until the last step, and the
//! source record in the commit says what was read.

use std::future::Future;

use arrow::array::RecordBatch;
use chrono::{DateTime, Utc};
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;

use super::definition::Definition;
use super::phase::{Path, Timer};
use super::{Engine, Phase, RunError, RunOptions};
use crate::config::pipeline::Kind;
use crate::config::Pipeline;
use crate::lake::{SourceRecord, COMMIT_INFO_KEY, TXN_APPS};
use crate::report::{Counters, KindCounters, RunMode, RunSummary};

/// A table a kind owns, by the part it plays: what `restore`, `maintain` and `history` act on
/// together, and the name of the failpoint after its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The table the pipeline keeps (`target.uri`).
    Target,
    /// An aggregate's day status.
    Status,
    /// An aggregate's adjustments.
    Adjustments,
    /// An ingest's record of the landing files it read.
    Record,
    /// Rows validation rejected.
    Quarantine,
    /// An aggregate's late rows: source rows that reached a final day or window after gold
    /// published it (`late_rows:`).
    LateRows,
}

impl Table {
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Target => "target",
            Table::Status => "status",
            Table::Adjustments => "adjustments",
            Table::Record => "record",
            Table::Quarantine => "quarantine",
            Table::LateRows => "late_rows",
        }
    }
}

/// Where in a run a failpoint sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Just before a phase starts (`<kind>.<path>.before_<phase>`).
    Before(Phase),
    /// Just after a table's commit landed (`<kind>.<path>.committed_<table>`), before the
    /// run's other tables are committed.
    Committed(Table),
}

/// The failpoint name of `point` in a run of `kind` on `path`.
pub fn failpoint_name(kind: Kind, path: Path, point: Point) -> String {
    match point {
        Point::Before(p) => format!("{}.{}", kind.as_str(), path.before(p)),
        Point::Committed(t) => format!(
            "{}.{}.committed_{}",
            kind.as_str(),
            path.as_str(),
            t.as_str()
        ),
    }
}

/// One kind of pipeline, run by [`attempt`]. Implemented by the kind's validated settings.
pub trait RunKind: Sync {
    /// The kind, as `kind:` names it.
    const KIND: Kind;
    /// What the kind counts (its lines of text come with it).
    type Counters: KindCounters + Default;

    /// The summary's `source_uri` and `target_uri`.
    fn uris(&self) -> (&str, &str);

    /// Every table the pipeline writes, with the part it plays (the target first).
    fn tables(&self) -> Vec<(Table, &str)>;

    /// The settings that give the target's rows their meaning (recorded in every commit;
    /// an incremental run under a changed one is refused, see [`Attempt::check_definition`]).
    fn definition(&self) -> Definition {
        Definition::default()
    }

    /// The attempt's session (a kind may tune the engine's).
    fn context(&self, engine: &Engine) -> SessionContext {
        engine.context()
    }

    /// The run's clock reading (a kind may round it to what it records).
    fn now(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now
    }

    /// Plans, reads and commits one attempt; returns the kind's counters. On error nothing was
    /// committed to the target.
    fn execute(
        &self,
        a: &mut Attempt<'_>,
    ) -> impl Future<Output = Result<Self::Counters, RunError>> + Send;
}

/// Runs one attempt of `spec`: on success the summary, with at most one commit per table.
pub async fn attempt<K: RunKind>(
    spec: &K,
    p: &Pipeline,
    opts: &RunOptions,
    now: DateTime<Utc>,
    engine: &Engine,
    run_id: String,
) -> Result<RunSummary, RunError> {
    let (source, target) = spec.uris();
    let mut a = Attempt {
        p,
        opts,
        now: spec.now(now),
        ctx: spec.context(engine),
        kind: K::KIND,
        summary: RunSummary::new(
            run_id,
            &p.name,
            K::KIND,
            opts.dry_run,
            (source, target),
            Counters::new(K::Counters::default()),
        ),
        timer: Timer::default(),
        definition: spec.definition(),
    };
    let counters = spec.execute(&mut a).await?;
    Ok(a.finish(counters))
}

/// What every attempt has: the pipeline, the options, the clock reading, the engine session,
/// the phase timer and the summary's header (counters are the kind's until the finish).
pub struct Attempt<'a> {
    pub p: &'a Pipeline,
    pub opts: &'a RunOptions,
    pub now: DateTime<Utc>,
    pub ctx: SessionContext,
    pub summary: RunSummary,
    kind: Kind,
    timer: Timer,
    definition: Definition,
}

impl Attempt<'_> {
    /// The mode of a run whose target exists (`Some(true)`), is missing or empty (`Some(false)`
    /// or `None`): bootstrap, full reload on request, otherwise incremental. Sets it in the
    /// summary (it names the failpoints from now on).
    pub fn mode_for(&mut self, target_exists: bool) -> RunMode {
        let mode = match (target_exists, self.opts.full_reload) {
            (false, _) => RunMode::Bootstrap,
            (true, true) => RunMode::FullReload,
            (true, false) => RunMode::Incremental,
        };
        self.summary.mode = mode;
        mode
    }

    /// Sets the mode chosen by a kind with a rule of its own.
    pub fn set_mode(&mut self, mode: RunMode) {
        self.summary.mode = mode;
    }

    /// Which failpoints the run hits: the whole-source path or the incremental one.
    pub fn path(&self) -> Path {
        match self.summary.mode {
            RunMode::Incremental => Path::Incremental,
            RunMode::Bootstrap | RunMode::FullReload => Path::FullReload,
        }
    }

    /// Records `phase`'s time; its end is where fault-injection tests stop a run
    /// (`<kind>.<path>.after_<phase>`).
    pub fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        let path = self.path();
        self.timer.end(phase, self.kind, path)
    }

    /// A failpoint at `point` (see [`failpoint_name`]).
    pub fn failpoint(&self, point: Point) -> Result<(), RunError> {
        crate::failpoint::hit(&failpoint_name(self.kind, self.path(), point))?;
        Ok(())
    }

    /// A warning, listed in the summary (which is where a person reads it, once: the command
    /// logs it on stderr only when the summary is JSON; see `crate::app`).
    pub fn warn(&mut self, message: String) {
        tracing::debug!("warning recorded: {message}");
        self.summary.warnings.push(message);
    }

    /// Stores the rows validation rejected (each once) and enforces the quarantine limits
    /// against the rows read so far.
    pub async fn quarantine(
        &mut self,
        spec: &crate::config::Quarantine,
        rejected: Vec<RecordBatch>,
    ) -> Result<(), RunError> {
        let (outcome, warning) = super::quarantine::stage(
            &self.ctx,
            spec,
            rejected,
            &self.summary.run_id,
            self.now,
            self.opts.dry_run,
            self.summary.num_source_rows_read,
        )
        .await?;
        self.summary.num_quarantined = outcome.rejected;
        self.summary.num_quarantined_new = outcome.new;
        if let Some(w) = warning {
            self.warn(w);
        }
        Ok(())
    }

    /// The facts a commit carries: the summary's header as it stands (without what only the
    /// end of the run knows: the version, timings, warnings) and `counters`, flattened, always
    /// with `kind`; then `extra` (what a kind records beside its counters).
    pub fn facts(
        &self,
        counters: &dyn KindCounters,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> serde_json::Value {
        let mut facts = match serde_json::to_value(&self.summary) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        for k in [
            "target_version",
            "num_replans",
            "duration_ms",
            "phases_ms",
            "warnings",
            "num_files_added",
            "num_files_removed",
        ] {
            facts.remove(k);
        }
        if let serde_json::Value::Object(c) = counters.to_json() {
            facts.extend(c);
        }
        facts.extend(extra);
        serde_json::Value::Object(facts)
    }

    /// A commit's properties: [`Attempt::facts`] and the application transactions that record
    /// what the run read ([`SourceRecord`]), the definition it ran under, and `more` (a kind's
    /// own, listed in the facts so a restore re-records them).
    pub fn commit_properties(
        &self,
        counters: &dyn KindCounters,
        extra: serde_json::Map<String, serde_json::Value>,
        record: &SourceRecord,
        more: Vec<Transaction>,
    ) -> CommitProperties {
        let app = self.p.app_id();
        let mut txns = crate::lake::record::transactions(&app, record);
        let mut named: Vec<String> = Vec::new();
        for t in self.definition.transactions(&app).into_iter().chain(more) {
            named.push(t.app_id.clone());
            txns.push(t);
        }
        let mut facts = self.facts(counters, extra);
        if !named.is_empty() {
            facts[TXN_APPS] = named.into();
        }
        CommitProperties::default()
            .with_metadata([(COMMIT_INFO_KEY.to_string(), facts)])
            .with_application_transactions(txns)
    }

    /// Refuses to read a source that is not the table the target recorded (deleted and
    /// recreated, or replaced: a new table id), or whose version went back (its log truncated,
    /// or the table replaced): version numbers then say nothing about what the target has seen.
    /// A target that recorded no table id (written before it was recorded) is not refused.
    pub fn check_source(
        &self,
        recorded: &SourceRecord,
        source: &deltalake::DeltaTable,
        source_uri: &str,
    ) -> Result<(), RunError> {
        let table_id = crate::lake::record::table_id(source)
            .map_err(RunError::delta(Phase::Plan, source_uri))?;
        if recorded
            .table
            .is_some_and(|t| t != crate::lake::record::table_fingerprint(&table_id))
        {
            return Err(RunError::SourceReplaced {
                uri: source_uri.to_string(),
                table_id,
                on_recreate: false,
                pipeline: self.p.name.clone(),
                path: self.p.path.display().to_string(),
            });
        }
        let found = source.version().unwrap_or(0);
        match recorded.version {
            Some(v) if v > found as i64 => Err(RunError::SourceWentBack {
                uri: source_uri.to_string(),
                recorded: v,
                found,
                pipeline: self.p.name.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses an incremental run when a setting of the kind's definition changed since
    /// `target` recorded it: one table never holds rows of two definitions. Exit 65, naming the
    /// settings and the `--full-reload` that rebuilds the target under the new one.
    pub async fn check_definition(
        &self,
        target: &deltalake::DeltaTable,
        target_uri: &str,
    ) -> Result<(), RunError> {
        let changed = self
            .definition
            .changed(target, &self.p.app_id())
            .await
            .map_err(RunError::delta(Phase::Plan, target_uri))?;
        if changed.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = changed.iter().map(|s| format!("`{s}`")).collect();
        Err(RunError::DefinitionChanged {
            settings: named.join(", "),
            pipeline: self.p.name.clone(),
            uri: target_uri.to_string(),
            path: self.p.path.display().to_string(),
            var_args: self.opts.var_args.clone(),
        })
    }

    /// The summary: the header, the phases' times and the kind's counters.
    fn finish<C: KindCounters>(mut self, counters: C) -> RunSummary {
        self.summary.duration_ms = self.timer.elapsed_ms();
        self.summary.phases_ms = std::mem::take(&mut self.timer).into_ms();
        tracing::info!(
            kind = self.kind.as_str(),
            mode = %self.summary.mode,
            target_version = ?self.summary.target_version,
            "run finished"
        );
        self.summary.counters = Counters::new(counters);
        self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failpoint_names_carry_the_kind() {
        assert_eq!(
            failpoint_name(
                Kind::Ingest,
                Path::Incremental,
                Point::Before(Phase::Commit)
            ),
            "ingest.incremental.before_commit"
        );
        assert_eq!(
            failpoint_name(
                Kind::Aggregate,
                Path::Incremental,
                Point::Committed(Table::Adjustments)
            ),
            "aggregate.incremental.committed_adjustments"
        );
    }
}
