//! Compaction that keeps the key clustering.
//!
//! Hourly copy-on-write runs add one small file of new keys per hour. Delta's bin-packing
//! compaction would glue them together in arbitrary order, so every compacted file would span a
//! wide key range and every later hour would have to probe it. This compaction reads the small
//! files, sorts their rows by the business key and writes files of the target size, so each
//! output covers a narrow key range. The commit carries `dataChange = false`: readers and
//! incremental consumers know no row changed.

use deltalake::delta_datafusion::FileSelection;
use deltalake::kernel::transaction::CommitBuilder;
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError};
use futures::StreamExt;

/// Most bytes of small files rewritten in one compaction commit (keeps memory and the time a
/// concurrent hourly run may have to re-plan bounded; the next `maintain` continues).
const MAX_BYTES_PER_COMPACTION: i64 = 2 << 30;

/// Files compacted and written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Compacted {
    pub files_removed: u64,
    pub files_added: u64,
}

fn external<E: std::error::Error + Send + Sync + 'static>(e: E) -> DeltaTableError {
    DeltaTableError::GenericError {
        source: Box::new(e),
    }
}

/// Rewrites the files smaller than half of `target_size`, sorted by `keys`, in one commit.
pub async fn compact_clustered(
    table: &DeltaTable,
    keys: &[String],
    target_size: u64,
    row_group_rows: usize,
    dry_run: bool,
) -> Result<(Compacted, Option<u64>), DeltaTableError> {
    let snapshot = table.snapshot()?;
    let mut small: Vec<(String, i64, deltalake::kernel::Remove)> = snapshot
        .log_data()
        .iter()
        .filter(|f| (f.size() as u64) < target_size / 2)
        .map(|f| (f.path().to_string(), f.size(), f.remove_action(false)))
        .collect();
    small.sort_by(|a, b| a.0.cmp(&b.0));
    let mut budget = MAX_BYTES_PER_COMPACTION;
    small.retain(|(_, size, _)| {
        budget -= size;
        budget >= 0
    });
    if small.len() < 2 {
        return Ok((Compacted::default(), None));
    }
    let mut out = Compacted {
        files_removed: small.len() as u64,
        files_added: 0,
    };
    if dry_run {
        return Ok((out, None));
    }
    let ctx = deltalake::delta_datafusion::DeltaSessionContext::new().into_inner();
    table.update_datafusion_session(&ctx.state())?;
    let provider = table
        .table_provider()
        .with_file_selection(FileSelection::from_file_paths(
            small.iter().map(|s| s.0.clone()),
        ))
        .await
        .map_err(external)?;
    let order = keys
        .iter()
        .map(|k| datafusion::prelude::ident(k).sort(true, true))
        .collect();
    let mut stream = ctx
        .read_table(provider)
        .and_then(|df| df.sort(order))
        .map_err(external)?
        .execute_stream()
        .await
        .map_err(external)?;
    let mut writer = RecordBatchWriter::for_table(table)?
        .with_target_file_size(target_size)
        .with_writer_properties(super::datafile::writer_properties(row_group_rows));
    while let Some(batch) = stream.next().await {
        let batch = super::storage::storage_batch(&batch.map_err(external)?).map_err(external)?;
        writer.write(batch).await?;
    }
    let adds = writer.flush().await?;
    out.files_added = adds.len() as u64;
    let actions: Vec<Action> = small
        .into_iter()
        .map(|(_, _, r)| Action::Remove(r))
        .chain(adds.into_iter().map(|mut a| {
            a.data_change = false;
            Action::Add(a)
        }))
        .collect();
    let commit = CommitBuilder::default()
        .with_actions(actions)
        .build(
            Some(table.snapshot()?),
            table.log_store(),
            DeltaOperation::Optimize {
                predicate: None,
                target_size: target_size as i64,
            },
        )
        .await?;
    Ok((out, Some(commit.version())))
}
