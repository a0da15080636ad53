//! Run facts that are only known once a streamed write has finished, put into its commit.
//!
//! A full reload streams the whole source through the dedup into delta-rs' writer, and delta-rs
//! takes the commit's metadata before the first row is read; the counts (rows inserted,
//! tombstones, versions collapsed, conflicts, the new watermark) are known only when the last
//! data file is written — which is before the commit file is. [`with_final_facts`] wraps a
//! table's log store so that, when the commit file is written, tidemark's facts in its
//! `commitInfo` are completed from a callback; every other byte of the commit is unchanged (the
//! way delta-rs itself updates `operationMetrics.num_retries` in the bytes of a retried commit).
//! So `history`, the ledger and the run summary show the same numbers for every kind of run.
//! (delta-rs hands the commit over as bytes to conditional-put stores — local files, S3 — which
//! are the ones tidemark configures; a store that commits through a temporary file would keep
//! the facts known before the write.)

use std::sync::Arc;

use bytes::Bytes;
use deltalake::kernel::transaction::TransactionError;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::{DeltaResult, DeltaTable, ObjectStore};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::COMMIT_INFO_KEY;

/// Called when the commit file is written: the facts to merge into `commitInfo.tidemark`
/// (`None` leaves the commit as it is).
pub type FinalFacts = Arc<dyn Fn() -> Option<Map<String, Value>> + Send + Sync>;

/// `table` with a log store that completes tidemark's commit facts from `facts`.
pub fn with_final_facts(table: DeltaTable, facts: FinalFacts) -> DeltaTable {
    let inner = table.log_store();
    let mut wrapped = DeltaTable::new(Arc::new(FactsLogStore { inner, facts }));
    wrapped.state = table.state;
    wrapped
}

struct FactsLogStore {
    inner: LogStoreRef,
    facts: FinalFacts,
}

impl std::fmt::Debug for FactsLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FactsLogStore").finish_non_exhaustive()
    }
}

/// The commit bytes with the `commitInfo` line's tidemark facts updated.
fn patch(bytes: &Bytes, facts: &Map<String, Value>) -> Result<Bytes, TransactionError> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(bytes.clone());
    };
    let mut lines = Vec::new();
    for line in text.split('\n') {
        if !line.contains("\"commitInfo\"") {
            lines.push(line.to_string());
            continue;
        }
        let mut action: Value = serde_json::from_str(line)
            .map_err(|e| TransactionError::SerializeLogJson { json_err: e })?;
        if let Some(Value::Object(info)) = action.get_mut("commitInfo") {
            let entry = info
                .entry(COMMIT_INFO_KEY.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(existing) = entry {
                for (k, v) in facts {
                    existing.insert(k.clone(), v.clone());
                }
            }
        }
        lines.push(
            serde_json::to_string(&action)
                .map_err(|e| TransactionError::SerializeLogJson { json_err: e })?,
        );
    }
    Ok(Bytes::from(lines.join("\n")))
}

#[async_trait::async_trait]
impl LogStore for FactsLogStore {
    // The name decides how delta-rs hands over the commit (bytes for conditional-put stores):
    // it must stay the wrapped store's.
    fn name(&self) -> String {
        self.inner.name()
    }

    async fn refresh(&self) -> DeltaResult<()> {
        self.inner.refresh().await
    }

    async fn read_commit_entry(
        &self,
        version: deltalake::kernel::Version,
    ) -> DeltaResult<Option<Bytes>> {
        self.inner.read_commit_entry(version).await
    }

    async fn write_commit_entry(
        &self,
        version: deltalake::kernel::Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        let commit_or_bytes = match (commit_or_bytes, (self.facts)()) {
            (CommitOrBytes::LogBytes(bytes), Some(facts)) => {
                CommitOrBytes::LogBytes(patch(&bytes, &facts)?)
            }
            (other, _) => other,
        };
        self.inner
            .write_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn abort_commit_entry(
        &self,
        version: deltalake::kernel::Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner
            .abort_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn get_latest_version(
        &self,
        start_version: deltalake::kernel::Version,
    ) -> DeltaResult<deltalake::kernel::Version> {
        self.inner.get_latest_version(start_version).await
    }

    fn object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.object_store(operation_id)
    }

    fn root_object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.root_object_store(operation_id)
    }

    fn config(&self) -> &LogStoreConfig {
        self.inner.config()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_commit_info_facts_change() {
        let add = r#"{"add":{"path":"a.parquet","size":1}}"#;
        let info =
            r#"{"commitInfo":{"operation":"WRITE","tidemark":{"num_inserted":0,"run_id":"r"}}}"#;
        let bytes = Bytes::from(format!("{info}\n{add}"));
        let mut facts = Map::new();
        facts.insert("num_inserted".into(), Value::from(19976));
        let patched = patch(&bytes, &facts).expect("patch");
        let text = std::str::from_utf8(&patched).expect("utf8");
        let mut lines = text.split('\n');
        let info: Value = serde_json::from_str(lines.next().expect("info")).expect("json");
        assert_eq!(info["commitInfo"]["tidemark"]["num_inserted"], 19976);
        assert_eq!(info["commitInfo"]["tidemark"]["run_id"], "r");
        assert_eq!(info["commitInfo"]["operation"], "WRITE");
        assert_eq!(lines.next(), Some(add));
    }
}
