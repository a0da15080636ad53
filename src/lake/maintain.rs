//! Table maintenance: hourly merges leave small files and a growing log; crashes leave orphan
//! data files that no commit references. `maintain` compacts, checkpoints and vacuums — never
//! below the retention that readers and `restore` rely on.

use std::num::NonZeroU64;
use std::time::Duration;

use deltalake::operations::vacuum::VacuumMode;
use deltalake::table::config::TablePropertiesExt;
use deltalake::{DeltaTable, DeltaTableError};

/// What to do.
#[derive(Debug, Clone)]
pub struct MaintainOptions {
    /// Compact files smaller than the target size into files of that size.
    pub compact: bool,
    /// Target file size for compaction; `None` = the table's `delta.targetFileSize`.
    pub target_file_size: Option<u64>,
    /// Business key columns: compaction then sorts small files by key (keeping the clustering
    /// incremental runs rely on); without them, Delta's bin-packing compaction is used.
    pub cluster_keys: Option<Vec<String>>,
    /// Rows per row group in compacted files (the pipeline's `target.row_group_rows`).
    pub row_group_rows: usize,
    /// Vacuum files unreferenced for longer than this; `None` = the table's
    /// `delta.deletedFileRetentionDuration` (7 days by default), which is also the minimum.
    pub retention: Option<Duration>,
    /// Report what would be done; change nothing.
    pub dry_run: bool,
}

/// Why maintenance refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum MaintainError {
    /// The requested retention would delete files that readers or `restore` may still need.
    #[error("retention {requested} is shorter than the table's delta.deletedFileRetentionDuration ({minimum}): vacuuming that early can delete files that running readers, a running writer or `restore` still need. Use --retention {minimum} or longer")]
    UnsafeRetention { requested: String, minimum: String },
    #[error(transparent)]
    Delta(#[from] Box<DeltaTableError>),
}

impl crate::error::Classify for MaintainError {
    fn class(&self) -> crate::error::ErrorClass {
        match self {
            MaintainError::UnsafeRetention { .. } => crate::error::ErrorClass::Usage,
            MaintainError::Delta(e) => crate::lake::classify_delta(e),
        }
    }
}

impl From<DeltaTableError> for MaintainError {
    fn from(e: DeltaTableError) -> Self {
        MaintainError::Delta(Box::new(e))
    }
}

/// What maintenance did (or would do, in a dry run).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MaintainReport {
    pub dry_run: bool,
    pub version_before: Option<u64>,
    pub version_after: Option<u64>,
    pub files_before: usize,
    pub files_compacted: u64,
    /// Of the files compacted, those rewritten because their deletion vectors delete at least
    /// 5% of their rows (a purge), not for their size.
    pub files_purged: u64,
    pub files_written: u64,
    pub checkpoint_version: Option<u64>,
    pub retention_hours: u64,
    /// Files no version within the retention references (removed long ago, or orphans of
    /// crashed writes): deleted by the vacuum.
    pub files_vacuumed: usize,
    /// Unreferenced files kept because they are inside the retention window: removed by
    /// recent commits (time travel and `restore` still need them), or orphans of recent crashes
    /// (which could also be a concurrent writer's in-flight files). Harmless; a later
    /// `maintain` removes them once they are old enough.
    pub files_unreferenced_within_retention: usize,
    pub sample_vacuumed: Vec<String>,
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Runs compaction, a checkpoint and a full vacuum on `table`.
pub async fn maintain(
    table: DeltaTable,
    opts: &MaintainOptions,
) -> Result<MaintainReport, MaintainError> {
    let config = table.snapshot()?.table_config().clone();
    let minimum = config.deleted_file_retention_duration();
    let retention = opts.retention.unwrap_or(minimum);
    if retention < minimum {
        return Err(MaintainError::UnsafeRetention {
            requested: human(retention),
            minimum: human(minimum),
        });
    }
    let version_before = table.version();
    let files_before = table.snapshot()?.log_data().num_files();
    let mut table = table;
    let size = opts
        .target_file_size
        .and_then(NonZeroU64::new)
        .unwrap_or_else(|| config.target_file_size());
    let done = match opts.compact {
        true => compact(&mut table, opts, size.get()).await?,
        false => Default::default(),
    };
    let (files_compacted, files_purged, files_written) =
        (done.files_removed, done.files_purged, done.files_added);
    let dv_files_released = done.dv_files_released;
    // A dry run predicts the versions the real run creates: one for the compaction's commit.
    let compaction_commits = u64::from(opts.dry_run && files_written + files_compacted > 0);
    let checkpoint_version = match opts.dry_run {
        true => table.version().map(|v| v + compaction_commits),
        false => checkpoint(&mut table).await?,
    };
    // delta-rs lists expired tombstones whether or not their files still exist (after an
    // earlier vacuum or a hand clean-up): only files on disk are counted...
    let on_disk = data_files_on_disk(&table).await?;
    let chrono_retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    let (table, unreferenced) = table
        .vacuum()
        .with_mode(VacuumMode::Full)
        .with_retention_period(chrono::Duration::zero())
        .with_enforce_retention_duration(false)
        .with_dry_run(true)
        .await?;
    let (table, vacuumed) = table
        .vacuum()
        .with_mode(VacuumMode::Full)
        .with_retention_period(chrono_retention)
        .with_dry_run(opts.dry_run)
        .await?;
    // delta-rs commits VACUUM START and VACUUM END when its list is not empty.
    let vacuum_commits = if opts.dry_run && !vacuumed.files_deleted.is_empty() {
        2
    } else {
        0
    };
    // ... and each once: a file removed, restored and removed again has two tombstones.
    let existing = |files: &[String]| -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        files
            .iter()
            .filter(|f| on_disk.contains(f.as_str()) && seen.insert(f.as_str()))
            .cloned()
            .collect()
    };
    let deleted = existing(&vacuumed.files_deleted);
    let files_vacuumed = deleted.len();
    // The files the compaction removes become unreferenced (and are kept: just removed).
    let compacted_now_unreferenced = if opts.dry_run {
        // (the deletion-vector files only the compacted files used go with them)
        files_compacted as usize
            + dv_files_released
                .iter()
                .filter(|f| on_disk.contains(f.as_str()))
                .count()
    } else {
        0
    };
    let files_unreferenced_within_retention = (existing(&unreferenced.files_deleted).len()
        + compacted_now_unreferenced)
        .saturating_sub(files_vacuumed);
    let version_after = table
        .version()
        .map(|v| v + compaction_commits + vacuum_commits);
    Ok(MaintainReport {
        dry_run: opts.dry_run,
        version_before,
        version_after,
        files_before,
        files_compacted,
        files_purged,
        files_written,
        checkpoint_version,
        retention_hours: retention.as_secs() / 3600,
        files_vacuumed,
        files_unreferenced_within_retention,
        sample_vacuumed: deleted.into_iter().take(20).collect(),
    })
}

/// Compacts the table's files (clustered by the keys; without keys, a table named by URI, in
/// path order), and moves the handle to the compaction's commit.
async fn compact(
    table: &mut DeltaTable,
    opts: &MaintainOptions,
    size: u64,
) -> Result<super::Compacted, MaintainError> {
    let keys = opts.cluster_keys.clone().unwrap_or_default();
    let (done, version) =
        super::compact_clustered(table, &keys, size, opts.row_group_rows, opts.dry_run).await?;
    if let Some(v) = version {
        table.update_incremental(Some(v)).await?;
    }
    Ok(done)
}

/// Writes a checkpoint; log files past `delta.logRetentionDuration` that it makes unnecessary
/// go now, as Delta clients do after a checkpoint (hourly merges leave this to checkpoints: see
/// `lake::cleanup_at_checkpoints`), unless the table turns it off. The checkpoint's version.
async fn checkpoint(table: &mut DeltaTable) -> Result<Option<u64>, MaintainError> {
    deltalake::checkpoints::create_checkpoint(table, None).await?;
    if table
        .snapshot()?
        .table_config()
        .enable_expired_log_cleanup()
        && deltalake::checkpoints::cleanup_metadata(table, None).await? > 0
    {
        // (the handle's log segment still names the deleted commits: read it again, from the
        // new checkpoint)
        table.load().await?;
    }
    Ok(table.version())
}

/// Paths (relative to the table root, as delta-rs' vacuum names them) of every object under the
/// table outside `_delta_log`.
async fn data_files_on_disk(
    table: &DeltaTable,
) -> Result<std::collections::HashSet<String>, MaintainError> {
    use futures::TryStreamExt;
    let files: Vec<_> = table
        .object_store()
        .list(None)
        .try_collect()
        .await
        .map_err(DeltaTableError::from)?;
    Ok(files
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|p| !p.starts_with("_delta_log/"))
        .collect())
}
