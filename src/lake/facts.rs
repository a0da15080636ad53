//! Changes to a commit that delta-rs writes, made when its commit file is written.
//!
//! delta-rs' MERGE and WRITE build their commit themselves; two things tidemark needs are only
//! known, or only fixable, at the moment that commit is written:
//!
//! - **Run facts of a streamed write.** A full reload streams the whole source through the
//!   dedup into delta-rs' writer, and delta-rs takes the commit's metadata before the first row
//!   is read; the counts (rows inserted, tombstones, versions collapsed, conflicts, the new
//!   watermark) are known only when the last data file is written — which is before the commit
//!   file is. [`with_final_facts`] completes tidemark's facts in the `commitInfo` from a
//!   callback; every other byte is unchanged (the way delta-rs itself updates
//!   `operationMetrics.num_retries` in the bytes of a retried commit). So `history`, the ledger
//!   and the run summary show the same numbers for every kind of run.
//! - **The change data feed of a MERGE** (`crate::merge::live_feed`): delta-rs writes a soft
//!   delete as an update; tidemark's feed describes the live table.
//!
//! [`with_patches`] wraps a table's log store so that each [`CommitPatch`] sees and may change
//! the commit's actions (one JSON line each) before they are written. Conditional-put stores
//! (local files, S3) get the bytes; a store that commits through a temporary file has that file
//! rewritten first, so both routes commit the patched actions.

use std::sync::Arc;

use bytes::Bytes;
use deltalake::kernel::transaction::TransactionError;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::{DeltaResult, DeltaTable, ObjectStore};
use object_store::ObjectStoreExt;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::COMMIT_INFO_KEY;

/// Called when the commit file is written: the facts to merge into `commitInfo.tidemark`
/// (`None` leaves the commit as it is).
pub type FinalFacts = Arc<dyn Fn() -> Option<Map<String, Value>> + Send + Sync>;

/// A change to a commit's actions, made when its file is written. A commit that loses a race
/// is written again (delta-rs retries it at the next version): `patch` is then called again
/// and must give the same result without redoing its work.
#[async_trait::async_trait]
pub trait CommitPatch: Send + Sync {
    /// `lines`: the commit's actions, one JSON object each; `store`: the table root's store.
    async fn patch(
        &self,
        store: &Arc<dyn ObjectStore>,
        lines: Vec<String>,
    ) -> Result<Vec<String>, TransactionError>;
}

/// `table` with a log store that completes tidemark's commit facts from `facts`.
pub fn with_final_facts(table: DeltaTable, facts: FinalFacts) -> DeltaTable {
    with_patches(table, vec![Arc::new(Facts(facts))])
}

/// `table` with a log store that applies `patches`, in order, to the commit it writes.
pub fn with_patches(table: DeltaTable, patches: Vec<Arc<dyn CommitPatch>>) -> DeltaTable {
    let inner = table.log_store();
    let mut wrapped = DeltaTable::new(Arc::new(PatchedLogStore { inner, patches }));
    wrapped.state = table.state;
    wrapped
}

struct PatchedLogStore {
    inner: LogStoreRef,
    patches: Vec<Arc<dyn CommitPatch>>,
}

impl std::fmt::Debug for PatchedLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatchedLogStore").finish_non_exhaustive()
    }
}

impl PatchedLogStore {
    async fn patched(&self, bytes: &Bytes) -> Result<Bytes, TransactionError> {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Ok(bytes.clone());
        };
        let mut lines: Vec<String> = text
            .split('\n')
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect();
        let store = self.inner.object_store(None);
        for p in &self.patches {
            lines = p.patch(&store, lines).await?;
        }
        let mut text = lines.join("\n");
        if bytes.ends_with(b"\n") {
            text.push('\n');
        }
        Ok(Bytes::from(text))
    }
}

/// Completes tidemark's facts in the `commitInfo` line.
struct Facts(FinalFacts);

#[async_trait::async_trait]
impl CommitPatch for Facts {
    async fn patch(
        &self,
        _store: &Arc<dyn ObjectStore>,
        lines: Vec<String>,
    ) -> Result<Vec<String>, TransactionError> {
        match (self.0)() {
            Some(facts) => lines.into_iter().map(|l| patch_info(l, &facts)).collect(),
            None => Ok(lines),
        }
    }
}

/// A commit line with the `commitInfo`'s tidemark facts updated (other lines unchanged).
fn patch_info(line: String, facts: &Map<String, Value>) -> Result<String, TransactionError> {
    if !line.contains("\"commitInfo\"") {
        return Ok(line);
    }
    let mut action: Value = serde_json::from_str(&line)
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
    serde_json::to_string(&action).map_err(|e| TransactionError::SerializeLogJson { json_err: e })
}

#[async_trait::async_trait]
impl LogStore for PatchedLogStore {
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
        let commit_or_bytes = match commit_or_bytes {
            CommitOrBytes::LogBytes(bytes) => CommitOrBytes::LogBytes(self.patched(&bytes).await?),
            CommitOrBytes::TmpCommit(path) => {
                // The temporary file is renamed into place: patch it where it is.
                let store = self.inner.object_store(Some(operation_id));
                let bytes = store
                    .get(&path)
                    .await
                    .map_err(TransactionError::from)?
                    .bytes()
                    .await
                    .map_err(TransactionError::from)?;
                let patched = self.patched(&bytes).await?;
                if patched != bytes {
                    store
                        .put(&path, patched.into())
                        .await
                        .map_err(TransactionError::from)?;
                }
                CommitOrBytes::TmpCommit(path)
            }
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
        let mut facts = Map::new();
        facts.insert("num_inserted".into(), Value::from(19976));
        let mut lines = [info, add]
            .into_iter()
            .map(|l| patch_info(l.to_string(), &facts).expect("patch"));
        let info: Value = serde_json::from_str(&lines.next().expect("info")).expect("json");
        assert_eq!(info["commitInfo"]["tidemark"]["num_inserted"], 19976);
        assert_eq!(info["commitInfo"]["tidemark"]["run_id"], "r");
        assert_eq!(info["commitInfo"]["operation"], "WRITE");
        assert_eq!(lines.next().as_deref(), Some(add));
    }
}
