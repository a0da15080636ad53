//! Restore that keeps tidemark's bookkeeping consistent with the restored data.
//!
//! A Delta restore brings back version N's files, but not its application transactions: the
//! table would still claim that the newest source version had been applied, and the next
//! incremental run would skip rows that landed after version N's run — late rows would be lost.
//! So the restore commit also re-records, for every tidemark pipeline writing this table, the
//! source version that version N had read (with the source's table id and the floor of the rows
//! then deferred: `super::record`).

use std::collections::BTreeSet;

use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::{DeltaTable, DeltaTableError};

use super::read_commits;

/// How many recent commits (at the latest version and at the restored one) are searched for the
/// pipelines that write a table.
const PIPELINE_SEARCH_DEPTH: usize = 100;

/// The key of a run's facts listing the other `txn` app ids its commit records (a restore
/// re-records them as of the restored version).
pub const TXN_APPS: &str = "txn_apps";

/// What a restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreOutcome {
    pub restored_version: u64,
    pub new_version: u64,
    pub files_restored: u64,
    pub files_removed: u64,
    /// `(app id, source version)` pairs re-recorded in the restore commit.
    pub source_versions: Vec<(String, i64)>,
    /// `(pipeline, run number)` of the ingests writing the table, as of the restored version:
    /// the files their later runs ingested are ingested again.
    pub ingest_runs: Vec<(String, i64)>,
}

/// Restores `table` to `version` in one new commit. When the table keeps a change data feed,
/// the commit carries the feed of what it changed (keyed by `keys`, when known: see
/// `lake/restore_feed.rs`).
pub async fn restore(
    table: DeltaTable,
    version: u64,
    keys: &[String],
) -> Result<RestoreOutcome, DeltaTableError> {
    let mut at_version = table.clone();
    at_version.load_version(version).await?;
    let table = match super::restore_feed::changes(&table, &at_version, keys).await? {
        Some(rows) => {
            let schema = match rows.first() {
                Some(b) => b.schema(),
                None => feed_schema(&table).await?,
            };
            let patch = super::restore_feed::RestoreFeed::new(rows, schema);
            super::facts::with_patches(table, vec![patch])
        }
        None => table,
    };
    let mut apps = BTreeSet::new();
    // (an ingest reads landing files, not a source table: its run number is what comes back)
    let mut ingests = BTreeSet::new();
    // Other transactions the pipelines' commits name (`txn_apps`: an aggregate's definition and
    // newest logical date): they come back as of `version` too.
    let mut named = BTreeSet::new();
    for t in [&table, &at_version] {
        for entry in read_commits(t, PIPELINE_SEARCH_DEPTH).await? {
            let Some(run) = entry.run.as_ref() else {
                continue;
            };
            if let Some(name) = run.get("pipeline").and_then(|p| p.as_str()) {
                match run.get("kind").and_then(|k| k.as_str()) {
                    Some("ingest") => ingests.insert(name.to_string()),
                    _ => apps.insert(format!("tidemark/{name}")),
                };
            }
            if let Some(list) = run.get(TXN_APPS).and_then(|a| a.as_array()) {
                named.extend(list.iter().filter_map(|a| a.as_str()).map(str::to_string));
            }
        }
    }
    let mut txns: Vec<Transaction> = Vec::new();
    let mut source_versions = Vec::new();
    for app in apps.into_iter().filter(|a| {
        !ingests
            .iter()
            .any(|name| a.strip_prefix("tidemark/") == Some(name.as_str()))
    }) {
        // No record at the restored version means no source row had been applied: -1 makes the
        // next run read every source commit again. The source's table id and the floor of the
        // rows deferred then come back with it.
        let mut recorded = super::record::read(&at_version, &app).await?;
        let v = *recorded.version.get_or_insert(-1);
        txns.extend(super::record::transactions(&app, &recorded));
        source_versions.push((app, v));
    }
    let snapshot = at_version.snapshot()?;
    let mut ingest_runs = Vec::new();
    for app in named {
        let v = snapshot
            .transaction_version(at_version.log_store().as_ref(), &app)
            .await?;
        let ingest = app
            .strip_prefix("tidemark/")
            .and_then(|a| a.strip_suffix("/ingest"))
            .filter(|name| ingests.contains(*name));
        if let Some(name) = ingest {
            ingest_runs.push((name.to_string(), v.unwrap_or(0)));
        }
        if let Some(v) = v {
            txns.push(Transaction::new(app, v));
        }
    }
    // (marked as tidemark's: an ingest tells its own restore, which re-records the run
    // numbers above, from another writer's, which does not)
    let mine = serde_json::json!({ "operation": "restore", "restored_version": version });
    let props = CommitProperties::default()
        .with_metadata([(super::COMMIT_INFO_KEY.to_string(), mine)])
        .with_application_transactions(txns);
    let latest = table.version().unwrap_or(0);
    let (table, metrics) = table
        .restore()
        .with_version_to_restore(version)
        .with_commit_properties(props)
        .await?;
    Ok(RestoreOutcome {
        restored_version: version,
        new_version: table.version().unwrap_or(latest + 1),
        files_restored: metrics.num_restored_file as u64,
        files_removed: metrics.num_removed_file as u64,
        source_versions,
        ingest_runs,
    })
}

/// The version of a companion table (an aggregate's status or adjustments table) that goes with
/// its pipeline's main table restored to `version`: the newest of its commits made before the
/// first commit undone (the run that made `version + 1` started, or for a commit of no run, was
/// made). `None` when every commit of it comes later (it must be emptied), and `Some(latest)`
/// when nothing of it is undone.
pub async fn companion_version(
    main: &DeltaTable,
    version: u64,
    companion: &DeltaTable,
) -> Result<Option<u64>, DeltaTableError> {
    let Some(cutoff) = undo_cutoff(main, version + 1).await? else {
        return Ok(companion.version());
    };
    let mut next = companion.version();
    while let Some(v) = next {
        let Some(actions) = super::commit_actions(companion, v).await? else {
            // (its older commits were cleaned up: the oldest one read is the best there is)
            return Ok(Some(v + 1).filter(|v| Some(*v) <= companion.version()));
        };
        let at = actions.iter().find_map(|a| match a {
            deltalake::kernel::Action::CommitInfo(ci) => ci.timestamp,
            _ => None,
        });
        if at.is_some_and(|t| t < cutoff) {
            return Ok(Some(v));
        }
        next = v.checked_sub(1);
    }
    Ok(None)
}

/// When the first commit to undo (`first`) began: its run's start (the time in its UUIDv7 run
/// id), or its commit time. `None` when `first` is not in the log.
async fn undo_cutoff(main: &DeltaTable, first: u64) -> Result<Option<i64>, DeltaTableError> {
    let Some(actions) = super::commit_actions(main, first).await? else {
        return Ok(None);
    };
    let Some(info) = actions.iter().find_map(|a| match a {
        deltalake::kernel::Action::CommitInfo(ci) => Some(ci.clone()),
        _ => None,
    }) else {
        return Ok(None);
    };
    let started = info
        .info
        .get(super::COMMIT_INFO_KEY)
        .and_then(|f| f.get("run_id"))
        .and_then(|r| r.as_str())
        .and_then(|r| uuid::Uuid::parse_str(r).ok())
        .and_then(|u| u.get_timestamp())
        .map(|t| {
            let (secs, nanos) = t.to_unix();
            secs as i64 * 1000 + i64::from(nanos / 1_000_000)
        });
    Ok(started.or(info.timestamp))
}

/// The schema of an empty change data file of `table`: its columns and `_change_type`.
async fn feed_schema(table: &DeltaTable) -> Result<arrow::datatypes::SchemaRef, DeltaTableError> {
    let provider = table.table_provider().await?;
    let mut fields: Vec<arrow::datatypes::FieldRef> =
        provider.schema().fields().iter().cloned().collect();
    fields.push(std::sync::Arc::new(arrow::datatypes::Field::new(
        "_change_type",
        arrow::datatypes::DataType::Utf8,
        true,
    )));
    Ok(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)))
}
