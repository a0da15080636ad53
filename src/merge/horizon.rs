//! What an incremental run must read, and whether the source still is what the target saw.
//!
//! The run reads a slice (`sequence > lo`) and every file the source added since the version
//! the previous run recorded. That is only complete when three things hold, checked here from
//! the target's records ([`crate::lake::record`]) and the source's log, before anything is read:
//!
//! 1. The source is the same table: its `metaData.id` matches the recorded fingerprint. A
//!    source deleted and recreated at the same location restarts its version numbers, so
//!    "files added since version N" would skip rows. Refused unless `source.on_recreate:
//!    read_all`, which reads the whole new table.
//! 2. The source only appended since then: a commit that removed files as a data change (a
//!    DELETE, an overwrite, a RESTORE by someone else) took rows away that the target may hold.
//!    Refused, naming the commit; `--full-reload` repairs it. Compaction (`dataChange = false`)
//!    is fine.
//! 3. `lo` is low enough: it never exceeds `now + max_future_skew - overlap` (a watermark in the
//!    future — a foreign row dated 2030, a run whose clock was ahead — is clamped, with a
//!    warning), nor the smallest sequence of a row deferred by an earlier run (so a deferred row
//!    is read again until it is due, whatever the clock did since).

use chrono::{DateTime, Utc};
use deltalake::kernel::Add;
use deltalake::DeltaTable;

use crate::config::pipeline::CdcMerge;
use crate::config::{Pipeline, SourceRecreate};
use crate::lake::{self, record, SourceRecord};
use crate::run::{Phase, RunError};

/// Which source files, besides the slice, the run reads in full behind `lo`.
#[derive(Debug)]
pub(super) enum Landed {
    /// Nothing: no recorded version (or nothing new), or the slice already is the whole source.
    Nothing,
    /// The files the source added since the recorded version.
    Files(Vec<Add>),
    /// Every file: the recorded version cannot be trusted to find the new rows.
    WholeSource,
}

/// The read an incremental run does.
#[derive(Debug)]
pub(super) struct ReadPlan {
    /// The watermark the run plans with: the target's largest sequence, clamped to
    /// `now + max_future_skew`.
    pub watermark: Option<DateTime<Utc>>,
    /// The slice is `sequence > lo`; `None` reads the whole source.
    pub lo: Option<i64>,
    pub landed: Landed,
    /// Landed files hold rows that did not land since the previous run (a log-gap fallback, a
    /// recreated source, a compaction's output): `num_late_rows` then counts only the rows
    /// behind the slice that changed something.
    pub late_is_approximate: bool,
    pub warnings: Vec<String>,
}

pub(super) struct Inputs<'a> {
    pub p: &'a Pipeline,
    pub m: &'a CdcMerge,
    pub source: &'a DeltaTable,
    pub source_version: u64,
    /// The source's table id (`metaData.id`).
    pub source_table_id: &'a str,
    pub record: SourceRecord,
    /// The target's largest sequence, from its statistics.
    pub watermark: Option<DateTime<Utc>>,
    pub now: DateTime<Utc>,
}

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Plans the read of an incremental run, or refuses when the source changed under the target.
pub(super) async fn plan(i: Inputs<'_>) -> Result<ReadPlan, RunError> {
    let (p, m) = (i.p, i.m);
    let mut warnings = Vec::new();
    let horizon = i
        .now
        .timestamp_micros()
        .saturating_add(micros(m.max_future_skew));
    let watermark = match i.watermark {
        Some(w) if w.timestamp_micros() > horizon => {
            let clamped = DateTime::<Utc>::from_timestamp_micros(horizon);
            warnings.push(format!(
                "the target's largest `{}` is {} — later than now + max_future_skew ({}): a row dated in the future reached the target (another writer, or a run whose clock was ahead). Planning from {} instead, so no row due now is skipped",
                m.sequence_by,
                w.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                clamped.map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)).unwrap_or_default(),
                clamped.map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)).unwrap_or_default(),
            ));
            clamped
        }
        w => w,
    };
    let mut lo = watermark.map(|w| w.timestamp_micros().saturating_sub(micros(m.overlap)));
    if let (Some(l), Some(floor)) = (lo, i.record.deferred_floor) {
        // Rows an earlier run deferred have sequences >= floor: read them again.
        lo = Some(l.min(floor.saturating_sub(1)));
    }
    let mut plan = ReadPlan {
        watermark,
        lo,
        landed: Landed::Nothing,
        late_is_approximate: false,
        warnings,
    };
    if lo.is_none() {
        return Ok(plan); // the slice is the whole source
    }

    let replaced = i
        .record
        .table
        .is_some_and(|t| t != record::table_fingerprint(i.source_table_id));
    if replaced {
        let id = i.source_table_id.to_string();
        match m.source_on_recreate {
            SourceRecreate::Fail => {
                return Err(RunError::SourceReplaced {
                    uri: m.source_uri.clone(),
                    table_id: id,
                    on_recreate: true,
                    pipeline: p.name.clone(),
                    path: p.path.display().to_string(),
                })
            }
            SourceRecreate::ReadAll => {
                plan.warnings.push(format!(
                    "the source {} is a new table (id {id}) since the target's last run; reading all of it (source.on_recreate: read_all)",
                    m.source_uri
                ));
                plan.landed = Landed::WholeSource;
                plan.late_is_approximate = true;
                return Ok(plan);
            }
        }
    }

    let Some(prev) = i.record.version else {
        plan.warnings.push(format!(
            "the target has no record of the source version tidemark last read (app id {}); rows landing behind the overlap cannot be found until a run commits. Run once with --full-reload to start tracking",
            p.app_id()
        ));
        return Ok(plan);
    };
    if prev > i.source_version as i64 {
        return Err(RunError::SourceWentBack {
            uri: m.source_uri.clone(),
            recorded: prev,
            found: i.source_version,
            pipeline: p.name.clone(),
        });
    }
    if prev == i.source_version as i64 {
        return Ok(plan);
    }
    if prev < 0 {
        // Restored to a version that had applied no source commit: every row is new to it.
        plan.landed = Landed::WholeSource;
        plan.late_is_approximate = true;
        return Ok(plan);
    }
    let added = lake::files_added_between(i.source, prev.max(0) as u64, i.source_version)
        .await
        .map_err(RunError::delta(Phase::Read, &m.source_uri))?;
    if let Some(first) = added.rewrites.first() {
        return Err(RunError::SourceRewritten {
            uri: m.source_uri.clone(),
            version: first.version,
            operation: first.operation.clone().unwrap_or_else(|| "unknown".into()),
            files_removed: first.files_removed,
            more: added.rewrites.len() - 1,
            recorded: prev,
            pipeline: p.path.display().to_string(),
        });
    }
    if added.complete {
        // A compaction in the range re-adds rows that landed long ago: they are read again
        // (they may hold rows landed in the range) but are not late arrivals.
        plan.late_is_approximate = added.adds.iter().any(|a| !a.data_change);
        plan.landed = Landed::Files(added.adds);
    } else {
        plan.warnings.push(format!(
            "source commits after version {prev} are no longer in the log; read the whole source behind the overlap to find late rows (slower, still correct). Whether those commits only appended cannot be checked: if the source was rewritten in that time, run --full-reload"
        ));
        plan.landed = Landed::WholeSource;
        plan.late_is_approximate = true;
    }
    Ok(plan)
}
