//! The one commit of a run's rewrite: its removes, deletion-vector re-adds and adds.

use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;

use super::Rewritten;
use crate::lake;
use crate::run::{Phase, RunError};

/// Commits the removes and adds of `rewrite` in one commit with `props`.
pub async fn commit(
    target: &DeltaTable,
    uri: &str,
    rewrite: Rewritten,
    props: CommitProperties,
) -> Result<u64, RunError> {
    let d = RunError::delta(Phase::Commit, uri);
    let snapshot = target.snapshot().map_err(d)?;
    let operation = DeltaOperation::Merge {
        predicate: None,
        merge_predicate: Some(
            if rewrite.files_marked > 0 {
                "key match (tidemark deletion vectors)"
            } else {
                "key match (tidemark copy-on-write)"
            }
            .to_string(),
        ),
        matched_predicates: vec![],
        not_matched_predicates: vec![],
        not_matched_by_source_predicates: vec![],
    };
    let props = lake::cleanup_at_checkpoints(props, snapshot);
    let finalized = CommitBuilder::from(props)
        .with_actions(rewrite.actions)
        .build(Some(snapshot), target.log_store(), operation)
        .await
        .map_err(RunError::write(Phase::Commit, uri))?;
    Ok(finalized.version())
}
