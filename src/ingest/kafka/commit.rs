//! The one bronze commit of a Kafka run: the rows, the run's number and every partition's next
//! offset, together.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use crate::lake::{self, COMMIT_INFO_KEY};
use crate::run::{Phase, RunError};

/// What the commit writes.
pub struct Write<'a> {
    pub ctx: &'a SessionContext,
    pub uri: &'a str,
    pub target: Option<DeltaTable>,
    pub pipeline: &'a str,
    pub batch: RecordBatch,
    /// Whether the batch has columns bronze lacks.
    pub grows: bool,
    /// The run-number `txn` and one `txn` per partition.
    pub txns: Vec<Transaction>,
    pub facts: serde_json::Value,
}

/// Appends the rows with the run's `txn`s in one commit; returns bronze after it.
pub async fn write(w: Write<'_>) -> Result<DeltaTable, RunError> {
    let props = CommitProperties::default()
        .with_metadata([(COMMIT_INFO_KEY.to_string(), w.facts)])
        .with_application_transactions(w.txns);
    let new_dirs = match &w.target {
        Some(_) => lake::NewDirs::default(),
        None => lake::NewDirs::before_create(w.uri),
    };
    let table = match w.target {
        Some(t) => t,
        None => match super::super::commit::created(w.uri, Phase::Commit) {
            Ok(t) => t,
            Err(e) => {
                new_dirs.remove_empty();
                return Err(e);
            }
        },
    };
    let fresh = table.version().is_none();
    // (a creation that loses the race plans again; an append is retried by delta-rs, which
    // refuses it when the winner wrote one of the same `txn` app ids: the run plans again)
    let props = if fresh {
        lake::no_blind_retry(props)
    } else {
        props
    };
    let mut builder = table
        .write(vec![w.batch])
        .with_commit_properties(props)
        .with_session_state(Arc::new(w.ctx.state()))
        .with_save_mode(SaveMode::Append);
    if w.grows {
        builder = builder.with_schema_mode(SchemaMode::Merge);
    }
    if fresh {
        builder = builder.with_table_name(w.pipeline);
    }
    match builder.await {
        Ok(t) => Ok(t),
        Err(e) => {
            new_dirs.remove_empty();
            Err(RunError::write(Phase::Commit, w.uri)(e))
        }
    }
}
