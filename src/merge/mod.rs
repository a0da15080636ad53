//! The `cdc_merge` kind: change records (bronze) merged into one row per key (silver).
//!
//! plan → read → validate → dedup → compare → commit. The incremental run reads two things from
//! a source snapshot pinned for the whole run: the rows with `sequence > watermark - overlap`
//! (pushed into the scan, so files whose statistics exclude it are never opened), and every row
//! in the files that landed since the source version the previous run recorded (whatever its
//! sequence: late rows are never lost). A full reload reads the whole source and replaces the
//! target in one commit.

mod changes;
mod counters;
mod cow;
mod decide;
mod error;
pub(crate) mod feed;
mod full;
mod horizon;
mod incremental;
mod partial;
mod plan;
mod thin;
pub mod tombstones;
mod write;

use arrow::array::RecordBatch;
use chrono::{DateTime, TimeZone, Utc};
use datafusion::prelude::DataFrame;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::DeltaTable;
use tracing::{info, info_span, Instrument};

use crate::config::pipeline::CdcMerge;
use crate::config::pipeline::Kind;
use crate::config::Pipeline;
use crate::keyed::roles::{self, ColumnRoles};
use crate::keyed::{dedup, validate, DedupCounts, Deduper};
use crate::lake::datafile::FastPath;
use crate::lake::{self, storage, StatsMax};
use crate::report::RunMode;
use crate::run::definition::Definition;
use crate::run::render::row_count;
use crate::run::{Attempt, Phase, RunKind, Table};
use crate::run::{RunError, RunOptions};
pub use counters::MergeCounters;
pub use error::MergeError;

/// What comparing the winners with the target decided, per row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    inserted: u64,
    updated: u64,
    deleted: u64,
    unchanged: u64,
    /// Keys where the slice and the target hold different rows with the same tuple.
    conflicts: u64,
}

impl Counts {
    /// Whether any row changes the target.
    fn changes_anything(&self) -> bool {
        self.inserted + self.updated + self.deleted > 0
    }
}

const LATE_COLUMN: &str = "__tidemark_late";

impl RunKind for CdcMerge {
    const KIND: Kind = Kind::CdcMerge;
    type Counters = MergeCounters;

    fn uris(&self) -> (&str, &str) {
        (&self.source_uri, &self.target_uri)
    }

    fn tables(&self) -> Vec<(Table, &str)> {
        vec![
            (Table::Target, &self.target_uri),
            (Table::Quarantine, &self.quarantine.uri),
        ]
    }

    /// The keys, what orders a key's versions, and what a delete is: change one and the rows
    /// silver holds mean something else.
    fn definition(&self) -> Definition {
        let deletes = self.deletes.as_ref().map_or(String::new(), |d| {
            let mode = match d.mode {
                crate::config::DeleteMode::Soft => "soft",
                crate::config::DeleteMode::Hard => "hard",
            };
            format!("{}\u{1f}{}\u{1f}{mode}", d.column, d.values.join("\u{1f}"))
        });
        Definition::default()
            .with("keys", self.keys.join("\u{1f}"))
            .with("sequence_by", self.sequence_by.as_str())
            .with("tie_breakers", self.tie_breakers.join("\u{1f}"))
            .with("deletes", deletes)
            .with_newer("ignore_null_updates", self.partial.ignore_nulls_text())
            .with_newer(
                "unavailable_marker",
                self.partial.marker.clone().unwrap_or_default(),
            )
    }

    async fn execute(&self, a: &mut Attempt<'_>) -> Result<MergeCounters, RunError> {
        Run::new(a, self).execute().await
    }
}

struct Run<'r, 'a> {
    /// The attempt: the pipeline's header, session, timer and warnings.
    a: &'r mut Attempt<'a>,
    p: &'a Pipeline,
    m: &'r CdcMerge,
    opts: &'a RunOptions,
    now: DateTime<Utc>,
    /// What this merge counts; moved into the summary when the run finishes.
    c: MergeCounters,
    /// Source rows per the log's statistics (a full reload reads them all).
    source_rows: Option<u64>,
    /// Per the log's statistics, no source row has a null key or sequence, and none has a
    /// sequence after this (µs): see [`lake::valid_until`].
    source_valid_until: Option<i64>,
    /// The source's table id (`metaData.id`), recorded (as a fingerprint) with the version.
    source_table_id: Option<String>,
    /// Smallest sequence (µs) among the rows this run deferred, recorded so later runs read
    /// them again until they are due.
    deferred_floor: Option<i64>,
    /// Set when the run read whole files behind the slice without knowing which rows landed
    /// since the previous run: late rows are then the changed rows with a sequence up to it.
    late_bound: Option<i64>,
    /// What the target recorded about the source, once read.
    record: Option<lake::SourceRecord>,
}

fn micros_to_time(us: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_micros(us).single()
}

impl<'r, 'a> Run<'r, 'a> {
    fn new(a: &'r mut Attempt<'a>, m: &'r CdcMerge) -> Self {
        let (p, opts, now) = (a.p, a.opts, a.now);
        Run {
            a,
            p,
            m,
            opts,
            now,
            c: MergeCounters::default(),
            source_rows: None,
            source_valid_until: None,
            source_table_id: None,
            deferred_floor: None,
            late_bound: None,
            record: None,
        }
    }

    /// Records a phase's time; its end is where fault-injection tests stop a run.
    pub(super) fn end_phase(&mut self, phase: Phase) -> Result<(), RunError> {
        self.a.end_phase(phase)
    }

    pub(super) fn source_fingerprint(&self) -> Option<i64> {
        self.source_table_id
            .as_deref()
            .map(lake::record::table_fingerprint)
    }

    pub(super) fn warn(&mut self, message: String) {
        self.a.warn(message);
    }

    async fn execute(mut self) -> Result<MergeCounters, RunError> {
        // plan
        // (both logs read at once: on an object store each is a few requests one after another)
        let (source, target) = async {
            Ok::<_, RunError>(tokio::try_join!(
                lake::open_required(&self.m.source_uri, "source"),
                lake::open_if_exists(&self.m.target_uri),
            )?)
        }
        .instrument(info_span!("plan"))
        .await?;
        let source_version = source.version().unwrap_or(0);
        self.a.summary.source_version = Some(source_version);
        let table_id = lake::record::table_id(&source)
            .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        self.source_table_id = Some(table_id);
        source
            .update_datafusion_session(&self.a.ctx.state())
            .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        let source_provider = source
            .table_provider()
            .await
            .map_err(RunError::query(Phase::Plan))?;
        let source_schema = source_provider.schema();
        let roles = ColumnRoles::new(self.p, self.m, &source_schema)?;
        let seq_type = source_schema
            .field_with_name(roles.sequence())
            .map(|f| f.data_type().clone())
            .map_err(|e| RunError::query(Phase::Plan)(e.into()))?;
        let live =
            lake::live_files(&source).map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        self.source_rows =
            lake::row_count(&live).map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        // (a float key may be NaN, which statistics cannot rule out: no proof then)
        let float_key = roles.keys.iter().any(|k| {
            roles
                .canonical
                .field_with_name(k)
                .is_ok_and(|f| f.data_type().is_floating())
        });
        if matches!(seq_type, arrow::datatypes::DataType::Timestamp(..)) && !float_key {
            let mut not_null: Vec<&str> = roles.keys.iter().map(String::as_str).collect();
            not_null.push(roles.sequence());
            self.source_valid_until = lake::valid_until(&live, &not_null, roles.sequence())
                .map_err(RunError::delta(Phase::Plan, &self.m.source_uri))?;
        }

        let target = match target {
            Some(t) if self.opts.full_reload || self.has_run_before(&t).await? => Some(t),
            Some(t)
                if t.get_file_uris()
                    .map(|mut f| f.next().is_some())
                    .unwrap_or(false) =>
            {
                Some(t)
            }
            Some(t) => {
                // An empty table tidemark never wrote is bootstrapped like a missing one; keep
                // the handle so the overwrite becomes its next version.
                self.a.set_mode(RunMode::Bootstrap);
                return self.full(source_provider, Some(t), &roles, &seq_type).await;
            }
            None => None,
        };
        let target = match target {
            Some(t) => {
                let t = self.enable_change_data_feed(t).await?;
                Some(self.enable_deletion_vectors(t).await?)
            }
            None => None,
        };
        if let Some(t) = &target {
            t.update_datafusion_session(&self.a.ctx.state())
                .map_err(RunError::delta(Phase::Plan, &self.m.target_uri))?;
        }
        let Some(target) = target else {
            self.a.set_mode(RunMode::Bootstrap);
            return self.full(source_provider, None, &roles, &seq_type).await;
        };
        if self.opts.full_reload {
            self.a.set_mode(RunMode::FullReload);
            self.c.watermark_before = self.watermark(&target, &roles).await?;
            return self
                .full(source_provider, Some(target), &roles, &seq_type)
                .await;
        }
        self.a.set_mode(RunMode::Incremental);
        self.a.check_definition(&target, &self.m.target_uri).await?;
        self.incremental(source, source_provider, target, &roles, &seq_type)
            .await
    }

    /// `target.change_data_feed: true` on a target without the feed: turns it on, in a commit of
    /// its own (a table property, like `ALTER TABLE … SET TBLPROPERTIES`), before the run plans.
    async fn enable_change_data_feed(&mut self, t: DeltaTable) -> Result<DeltaTable, RunError> {
        if !self.m.change_data_feed || lake::datafile::change_data_feed(&t) || self.opts.dry_run {
            return Ok(t);
        }
        let t = t
            .set_tbl_properties()
            .with_properties(std::collections::HashMap::from([(
                lake::datafile::CHANGE_DATA_FEED.to_string(),
                "true".to_string(),
            )]))
            .await
            .map_err(RunError::write(Phase::Plan, &self.m.target_uri))?;
        self.warn(format!(
            "turned on the change data feed of {} (delta.enableChangeDataFeed = true, in a commit of its own, version {}): runs from now on write it",
            self.m.target_uri,
            t.version().unwrap_or_default()
        ));
        Ok(t)
    }

    /// `target.apply: deletion_vectors` on a target without the feature: upgrades the table to
    /// it (`delta.enableDeletionVectors = true`, protocol reader 3 / writer 7 with the
    /// `deletionVectors` feature), in a commit of its own, before the run plans. A full reload
    /// writes new files and needs no upgrade yet.
    async fn enable_deletion_vectors(&mut self, t: DeltaTable) -> Result<DeltaTable, RunError> {
        if self.m.target_apply != crate::config::pipeline::Apply::DeletionVectors
            || lake::dv::enabled(&t)
            || self.opts.full_reload
        {
            return Ok(t);
        }
        if self.opts.dry_run {
            self.warn(format!(
                "a real run would first upgrade {} to deletion vectors (delta.enableDeletionVectors = true; Delta reader version 3 / writer version 7, in a commit of its own); this dry run counts what it would then mark",
                self.m.target_uri
            ));
            return Ok(t);
        }
        let t = lake::dv::enable(t)
            .await
            .map_err(RunError::write(Phase::Plan, &self.m.target_uri))?;
        self.warn(lake::dv::upgraded(&self.m.target_uri, t.version()));
        Ok(t)
    }

    /// The pipeline's expectations compiled against the source rows (none without
    /// `expectations:`; the built-in rules need no compiling).
    pub(super) fn compile_expectations(
        &self,
        input: &DataFrame,
    ) -> Result<Vec<crate::keyed::expect::Compiled>, RunError> {
        crate::keyed::expect::compile(self.p, &self.m.expectations, input)
    }

    /// The deferred rows and the expectations' failures, counted in one pass over the rows
    /// validation saw; a `fail` rule with failing rows stops the run here, before anything is
    /// written (the quarantine table included).
    pub(super) async fn count_validation(
        &mut self,
        split: &mut validate::Split,
        roles: &ColumnRoles,
        rules: &[crate::keyed::expect::Compiled],
        stream_warns: bool,
    ) -> Result<(), RunError> {
        use crate::keyed::expect;
        let report = !self.m.expectations.is_empty() || split.resurrected.is_some();
        // When the log's statistics prove the built-in rules hold and none is due later, and
        // any expectation is a `warn` counted in the write's stream, there is nothing to count
        // here: a pass over the rows (a whole source, on a full reload) is saved.
        let proven = self
            .source_valid_until
            .is_some_and(|until| until <= split.due_micros)
            && split.resurrected.is_none()
            && rules
                .iter()
                .all(|r| stream_warns && r.on_fail == expect::OnFail::Warn);
        if proven {
            self.c.num_deferred = 0;
            self.deferred_floor = None;
            split.none_rejected()?;
            if report {
                let none = vec![0; expect::BUILT_IN.len() + rules.len()];
                self.c.expectations = expect::outcomes(rules, &none);
            }
            return Ok(());
        }
        let mut counted = if report {
            expect::conditions(roles, rules)
        } else {
            Vec::new()
        };
        if stream_warns && report {
            // `warn` rules are counted in the write's stream ([`Run::stream_warns`]).
            for (i, r) in rules.iter().enumerate() {
                if r.on_fail == expect::OnFail::Warn {
                    counted[expect::BUILT_IN.len() + i] = datafusion::logical_expr::lit(false);
                }
            }
        }
        counted.extend(split.resurrected.clone());
        let (deferred, floor, counts) = validate::summary(split, roles, &counted)
            .await
            .map_err(RunError::scan(Phase::Validate, &self.m.source_uri))?;
        self.c.num_deferred = deferred;
        self.deferred_floor = floor;
        if !report {
            return Ok(());
        }
        let mut outcomes = expect::outcomes(rules, &counts);
        if split.resurrected.is_some() {
            let failed = counts.last().copied().unwrap_or(0);
            outcomes.insert(
                expect::BUILT_IN.len(),
                expect::Outcome {
                    name: tombstones::RESURRECTION.to_string(),
                    on_fail: expect::OnFail::Quarantine.as_str(),
                    failed,
                },
            );
            if failed > 0 {
                self.warn(format!(
                    "{failed} source row(s) are versions of keys whose tombstones `maintain` removed, at or before their delete: quarantined as {} (the payment stays deleted)",
                    tombstones::RESURRECTION
                ));
            }
        }
        expect::enforce(split.input.clone(), roles, rules, &outcomes).await?;
        // Every rule that rejects rows counted none: the rows need not be checked again.
        if outcomes
            .iter()
            .filter(|o| o.on_fail == expect::OnFail::Quarantine.as_str())
            .all(|o| o.failed == 0)
        {
            split.none_rejected()?;
        }
        if !stream_warns {
            self.warn_failed(&outcomes);
        }
        self.c.expectations = outcomes;
        Ok(())
    }

    /// A warning per `warn` rule that rows failed.
    pub(super) fn warn_failed(&mut self, outcomes: &[crate::keyed::expect::Outcome]) {
        for o in outcomes
            .iter()
            .filter(|o| o.failed > 0 && o.on_fail == "warn")
        {
            self.warn(format!(
                "expectation `{}` failed for {} row(s) (on_fail: warn: kept)",
                o.name, o.failed
            ));
        }
    }

    /// Commit metadata and the application transaction recording the source version read.
    /// Stores the rows validation rejected and enforces the quarantine limits.
    pub(super) async fn quarantine(&mut self, rejected: DataFrame) -> Result<(), RunError> {
        let batches: Vec<RecordBatch> = rejected
            .collect()
            .await
            .map_err(RunError::scan(Phase::Validate, &self.m.source_uri))?;
        self.a.quarantine(&self.m.quarantine, batches).await
    }

    pub(super) fn commit_properties(&self) -> CommitProperties {
        let mut extra = serde_json::Map::new();
        extra.insert(
            "source_table_id".into(),
            self.source_table_id.clone().into(),
        );
        extra.insert(
            "deferred_floor".into(),
            self.deferred_floor
                .and_then(micros_to_time)
                .map(|t| crate::report::rfc3339(&t))
                .into(),
        );
        let record = lake::SourceRecord {
            version: self.a.summary.source_version.map(|v| v as i64),
            table: self.source_fingerprint(),
            deferred_floor: self.deferred_floor,
        };
        self.a
            .commit_properties(&self.c, extra, &record, Vec::new())
    }

    pub(super) fn finish(self) -> MergeCounters {
        info!(
            inserted = self.c.num_inserted,
            updated = self.c.num_updated,
            deleted = self.c.num_deleted,
            late = self.c.num_late_rows,
            "merge finished"
        );
        self.c
    }
}
