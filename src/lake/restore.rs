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

/// What a restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreOutcome {
    pub restored_version: u64,
    pub new_version: u64,
    pub files_restored: u64,
    pub files_removed: u64,
    /// `(app id, source version)` pairs re-recorded in the restore commit.
    pub source_versions: Vec<(String, i64)>,
}

/// Restores `table` to `version` in one new commit.
pub async fn restore(table: DeltaTable, version: u64) -> Result<RestoreOutcome, DeltaTableError> {
    let mut at_version = table.clone();
    at_version.load_version(version).await?;
    let mut apps = BTreeSet::new();
    for t in [&table, &at_version] {
        for entry in read_commits(t, PIPELINE_SEARCH_DEPTH).await? {
            if let Some(name) = entry
                .run
                .as_ref()
                .and_then(|r| r.get("pipeline"))
                .and_then(|p| p.as_str())
            {
                apps.insert(format!("tidemark/{name}"));
            }
        }
    }
    let mut txns: Vec<Transaction> = Vec::new();
    let mut source_versions = Vec::new();
    for app in apps {
        // No record at the restored version means no source row had been applied: -1 makes the
        // next run read every source commit again. The source's table id and the floor of the
        // rows deferred then come back with it.
        let mut recorded = super::record::read(&at_version, &app).await?;
        let v = *recorded.version.get_or_insert(-1);
        txns.extend(super::record::transactions(&app, &recorded));
        source_versions.push((app, v));
    }
    let props = CommitProperties::default().with_application_transactions(txns);
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
    })
}
