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
#[derive(Debug, Clone, Default)]
pub struct Compacted {
    pub files_removed: u64,
    pub files_added: u64,
    /// Of the files removed, those rewritten for the rows their deletion vectors delete (not
    /// for being small).
    pub files_purged: u64,
    /// In a dry run, the deletion-vector files (relative to the table root) that only removed
    /// files use: no live file references them after the compaction. Empty otherwise.
    pub dv_files_released: Vec<String>,
}

fn external<E: std::error::Error + Send + Sync + 'static>(e: E) -> DeltaTableError {
    DeltaTableError::GenericError {
        source: Box::new(e),
    }
}

/// The small files of one partition (all of them in an unpartitioned table), and how their rows
/// are cut into output files: decided from the log alone, so a dry run reports exactly what
/// the real run then writes.
struct Group {
    files: Vec<(String, deltalake::kernel::Remove)>,
    /// Rows per output file; the last may hold fewer.
    rows_per_file: usize,
    outputs: u64,
    /// Files in the group for their deletion vectors, not their size.
    purged: u64,
}

/// A file whose deletion vector deletes at least this share of its rows is rewritten by the
/// compaction without them (a *purge*): readers stop skipping them and their bytes go.
pub const PURGE_DELETED_SHARE: f64 = 0.05;

/// Plans the compaction: files smaller than half of `target_size`, and files whose deletion
/// vector deletes at least [`PURGE_DELETED_SHARE`] of their rows, grouped by partition, at most
/// [`MAX_BYTES_PER_COMPACTION`] in all; a group of fewer than two files is left alone unless it
/// purges one. Each group becomes `ceil(bytes / target_size)` files of equal row counts (from
/// the files' `numRecords` statistics less the rows their deletion vectors delete; a group
/// without them becomes one file).
fn plan(table: &DeltaTable, target_size: u64) -> Result<Vec<Group>, DeltaTableError> {
    let snapshot = table.snapshot()?;
    let mut small: Vec<(
        String,
        i64,
        Option<usize>,
        String,
        deltalake::kernel::Remove,
        bool,
    )> = snapshot
        .log_data()
        .iter()
        .filter(|f| (f.size() as u64) < target_size / 2 || purge(f))
        .map(|f| {
            let mut partition: Vec<(String, Option<String>)> =
                f.partition_values_map().into_iter().collect();
            partition.sort();
            let deleted = f
                .deletion_vector_descriptor()
                .map_or(0, |d| d.cardinality.max(0) as usize);
            (
                f.path().to_string(),
                f.size(),
                f.num_records().map(|n| n.saturating_sub(deleted)),
                format!("{partition:?}"),
                f.remove_action(false),
                (f.size() as u64) >= target_size / 2,
            )
        })
        .collect();
    small.sort_by(|a, b| a.0.cmp(&b.0));
    let mut budget = MAX_BYTES_PER_COMPACTION;
    small.retain(|f| {
        budget -= f.1;
        budget >= 0
    });
    let mut by_partition: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    for f in small {
        by_partition.entry(f.3.clone()).or_default().push(f);
    }
    let mut groups = Vec::new();
    for files in by_partition
        .into_values()
        .filter(|g| g.len() >= 2 || g.iter().any(|f| f.4.deletion_vector.is_some()))
    {
        let bytes: u64 = files.iter().map(|f| f.1.max(0) as u64).sum();
        let rows: Option<usize> = files.iter().map(|f| f.2).sum();
        let wanted = bytes.div_ceil(target_size.max(1)).max(1) as usize;
        let (rows_per_file, outputs) = match rows {
            Some(0) => (usize::MAX, 0),
            Some(rows) => {
                let per = rows.div_ceil(wanted).max(1);
                (per, rows.div_ceil(per) as u64)
            }
            None => (usize::MAX, 1),
        };
        groups.push(Group {
            purged: files.iter().filter(|f| f.5).count() as u64,
            files: files.into_iter().map(|f| (f.0, f.4)).collect(),
            rows_per_file,
            outputs,
        });
    }
    Ok(groups)
}

/// Whether the compaction rewrites `file` for the rows its deletion vector deletes.
fn purge(file: &deltalake::kernel::LogicalFileView) -> bool {
    match (file.deletion_vector_descriptor(), file.num_records()) {
        (Some(d), Some(n)) if n > 0 => d.cardinality as f64 >= PURGE_DELETED_SHARE * n as f64,
        (Some(_), _) => true,
        _ => false,
    }
}

/// The DV files the removed files of `groups` use and no other live file does.
fn released_dv_files(table: &DeltaTable, groups: &[Group]) -> Result<Vec<String>, DeltaTableError> {
    use deltalake::kernel::StorageType;
    let name = |d: &deltalake::kernel::DeletionVectorDescriptor| {
        (d.storage_type == StorageType::UuidRelativePath)
            .then(|| super::dv::file_name(d).map_err(external))
            .transpose()
    };
    let mut removed = std::collections::HashSet::new();
    let mut released = std::collections::BTreeSet::new();
    for (path, r) in groups.iter().flat_map(|g| &g.files) {
        removed.insert(path.as_str());
        if let Some(d) = &r.deletion_vector {
            released.extend(name(d)?);
        }
    }
    if released.is_empty() {
        return Ok(Vec::new());
    }
    for f in table.snapshot()?.log_data().iter() {
        if removed.contains(f.path().as_ref()) {
            continue;
        }
        if let Some(d) = f.deletion_vector_descriptor() {
            if let Some(n) = name(&d)? {
                released.remove(&n);
            }
        }
    }
    Ok(released.into_iter().collect())
}

/// Rewrites the files smaller than half of `target_size`, sorted by `keys` (none: in file
/// order), in one commit. A dry run returns the same counts without reading or writing.
pub async fn compact_clustered(
    table: &DeltaTable,
    keys: &[String],
    target_size: u64,
    row_group_rows: usize,
    dry_run: bool,
) -> Result<(Compacted, Option<u64>), DeltaTableError> {
    let groups = plan(table, target_size)?;
    let planned = Compacted {
        files_removed: groups.iter().map(|g| g.files.len() as u64).sum(),
        files_added: groups.iter().map(|g| g.outputs).sum(),
        files_purged: groups.iter().map(|g| g.purged).sum(),
        // (only a dry run reports them: the real run's vacuum sees the files themselves)
        dv_files_released: if dry_run {
            released_dv_files(table, &groups)?
        } else {
            Vec::new()
        },
    };
    if dry_run || groups.is_empty() {
        return Ok((planned, None));
    }
    let ctx = super::session::context();
    table.update_datafusion_session(&ctx.state())?;
    let mut actions: Vec<Action> = Vec::new();
    let mut out = Compacted::default();
    for group in groups {
        let provider = table
            .table_provider()
            .with_file_selection(FileSelection::from_file_paths(
                group.files.iter().map(|s| s.0.clone()),
            ))
            .await
            .map_err(external)?;
        let order: Vec<_> = keys
            .iter()
            .map(|k| datafusion::prelude::ident(k).sort(true, true))
            .collect();
        let df = ctx.read_table(provider).map_err(external)?;
        let df = if order.is_empty() {
            df
        } else {
            df.sort(order).map_err(external)?
        };
        let mut stream = df.execute_stream().await.map_err(external)?;
        // No size-based rolling: the plan's row counts decide where a file ends.
        let mut writer = RecordBatchWriter::for_table(table)?
            .with_writer_properties(super::datafile::writer_properties(row_group_rows));
        let mut in_file = 0usize;
        let mut adds = Vec::new();
        while let Some(batch) = stream.next().await {
            let mut batch =
                super::storage::storage_batch(&batch.map_err(external)?).map_err(external)?;
            while batch.num_rows() > 0 {
                let take = (group.rows_per_file - in_file).min(batch.num_rows());
                writer.write(batch.slice(0, take)).await?;
                in_file += take;
                batch = batch.slice(take, batch.num_rows() - take);
                if in_file == group.rows_per_file {
                    adds.extend(writer.flush().await?);
                    in_file = 0;
                }
            }
        }
        adds.extend(writer.flush().await?);
        out.files_removed += group.files.len() as u64;
        out.files_purged += group.purged;
        out.files_added += adds.len() as u64;
        actions.extend(group.files.into_iter().map(|(_, r)| Action::Remove(r)));
        actions.extend(adds.into_iter().map(|mut a| {
            a.data_change = false;
            Action::Add(a)
        }));
    }
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
