//! Copy-on-write rewrite for incremental runs: touch only the row groups that hold a changed key.
//!
//! A MERGE by key scans every target file whose key range overlaps the slice's; with a thin tail
//! of old keys (refunds, chargebacks) that is most of the table. Here the run decides itself:
//!
//! 1. **Candidates** — files whose key statistics can hold one of the slice's keys (a binary
//!    search of the sorted slice keys per file, from the log, no data read).
//! 2. **Probe** — per candidate, the footer, then only the key and ordering columns of the row
//!    groups whose statistics admit a slice key: a slice row whose tuple is older than the
//!    target's is settled here; row groups holding a newer (or equal-tuple) version are
//!    "touched".
//! 3. **Rewrite** — each file with a touched row group is written again: untouched row groups
//!    are copied as bytes, touched ones decoded, patched with the winning rows and encoded; new
//!    keys go to one new file.
//! 4. **Commit** — the removes and adds, the run facts and the source version, in one commit.
//!
//! Files are independent (a key lives in one file), so steps 2 and 3 run `parallelism` files at
//! a time and their outcomes are merged in file order. Memory holds the slice plus one target
//! file (and its rewrite) per task.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use deltalake::kernel::Action;
use deltalake::DeltaTable;

use futures::StreamExt;

mod apply;
mod commit;
mod feed;
mod file;
mod mark;
mod probe;
mod prune;

pub use commit::commit;
use feed::{Change, FeedRows};
use file::rewrite_file;
use mark::Grown;
use probe::{probe_file, Match, Probed};
use prune::{
    admitted_row_groups, candidates, key_converter, sorted_first_keys, sub_schema, SortedKeys,
};

use super::decide::{self, Verdict};
use crate::config::pipeline::{Apply, DELETED_COLUMN};
use crate::keyed::dedup::{EncodedBatch, RowEncoders};
use crate::keyed::roles::ColumnRoles;
use crate::lake::datafile::{DataFile, FastPath, NewFile};
use crate::lake::storage::cast_to;
use crate::run::render::render_key;
use crate::run::{Phase, RunError};

/// Files probed, rewritten or marked at the same time, at least (each holds one target file and
/// its rewrite in memory: 2 MiB files by default).
const IO_CONCURRENCY: usize = 16;

/// What applying the slice did (or would do).
#[derive(Debug, Default)]
pub struct Rewritten {
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub unchanged: u64,
    pub conflicts: u64,
    /// Largest sequence among the changed rows that stay live (soft deletes: all of them).
    pub max_sequence: Option<i64>,
    /// Sequence of every row that changed the target (inserted, updated or deleted), µs.
    pub changed_sequences: Vec<i64>,
    pub files_candidate: u64,
    pub files_rewritten: u64,
    pub files_added: u64,
    pub files_removed: u64,
    /// Rows copied unchanged into rewritten files: the cost of copy-on-write.
    pub rows_copied: u64,
    /// Rows decoded and encoded again: those of the row groups holding a changed key (the rest
    /// of a rewritten file is copied as bytes).
    pub rows_reencoded: u64,
    /// Rows written to the change data feed (0 when the target keeps none).
    pub feed_rows: u64,
    /// Files whose deletion vector grew (`target.apply: deletion_vectors`).
    pub files_marked: u64,
    /// Rows this run marked deleted in deletion vectors: the old versions of changed keys.
    pub rows_marked: u64,
    /// Rows written into data files: rewritten files (copied and re-encoded) and the new file.
    pub rows_written: u64,
    actions: Vec<Action>,
}

impl Rewritten {
    /// Whether the commit would change anything.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// Everything the copy-on-write rewrite needs besides the slice.
pub struct Target<'a> {
    pub table: &'a DeltaTable,
    pub uri: &'a str,
    pub fast: &'a FastPath,
    pub row_group_rows: usize,
    /// Files rewritten at the same time (the run's `--threads`).
    pub parallelism: usize,
    /// How a changed key in an old file is applied (`target.apply`).
    pub apply: Apply,
}

struct FileInfo {
    path: String,
    size: u64,
}

/// Where each winner stands after the probe.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Not in the target (yet): an insert, unless a hard delete.
    Absent,
    /// In this file, and the target's version is newer: nothing to do.
    Older,
    /// In this file, with an older or equal tuple: decided while rewriting the file.
    Decide(usize),
    /// In this file, with an older tuple: decided by the probe (merge-on-read).
    Direct(usize),
}

/// A row group decoded from a target file, in the canonical row (hard-delete targets get an
/// all-false `_deleted`, files from before a schema change get nulls for the newer columns).
fn canonical_rows(roles: &ColumnRoles, batch: &RecordBatch) -> Result<RecordBatch, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let columns = roles
        .canonical
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => arrow::compute::cast(c, f.data_type()),
            None if f.name() == DELETED_COLUMN => {
                Ok(Arc::new(BooleanArray::from(vec![false; batch.num_rows()])) as ArrayRef)
            }
            None => Ok(arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(&a)?;
    RecordBatch::try_new_with_options(
        roles.canonical.clone(),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(a)
}

/// The slice and how to look its keys up, shared (read only) by the probe and rewrite tasks.
struct Slice {
    roles: ColumnRoles,
    winners: RecordBatch,
    /// Encoded key → winner row.
    index: HashMap<Box<[u8]>, usize>,
    enc: RowEncoders,
    /// The winners, encoded.
    w: EncodedBatch,
    /// First key column: its storage type and the slice's values, sorted.
    keys: SortedKeys,
    probe_cols: Vec<String>,
    probe_schema: SchemaRef,
    key_conv: RowConverter,
    tuple_conv: RowConverter,
    /// The target's store, schema and statistics settings.
    fast: FastPath,
    uri: String,
    /// Merge-on-read without a change data feed: a winner with a newer tuple is decided by the
    /// probe, its row group never read whole.
    direct: bool,
}

impl Slice {
    fn delta_err(&self, source: deltalake::DeltaTableError) -> RunError {
        RunError::delta(Phase::Compare, &self.uri)(source)
    }

    /// A target data file could not be read (missing, cut short, not Parquet, refused).
    fn read_err(&self, source: deltalake::DeltaTableError) -> RunError {
        RunError::TargetRead {
            uri: self.uri.clone(),
            source: Box::new(source),
        }
    }
}

/// A spawned task's result; a panic inside it goes on unwinding here, as it would have
/// without the task.
fn joined_or_panic<T>(joined: Result<T, tokio::task::JoinError>) -> Result<T, RunError> {
    match joined {
        Ok(v) => Ok(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(RunError::Internal {
            phase: Phase::Compare,
            message: format!("a file task was cancelled: {e}"),
        }),
    }
}

/// What the rewrite of every touched file shares (read only).
struct Rewrite {
    slice: Arc<Slice>,
    found: Vec<Found>,
    already_conflicting: HashSet<Box<[u8]>>,
    row_group_rows: usize,
    dry_run: bool,
    /// The target keeps a change data feed: collect the changed rows' feed.
    feed: bool,
    /// Per probed file, the rows its deletion vector already deletes.
    dead: HashMap<usize, roaring::RoaringTreemap>,
}

/// What rewriting one file decided (and wrote, unless a dry run).
struct FileOutcome {
    path: String,
    replaced: u64,
    copied: u64,
    reencoded: u64,
    updated: u64,
    deleted: u64,
    conflicts: u64,
    max_sequence: Option<i64>,
    changed_sequences: Vec<i64>,
    /// Winners whose target version turned out newer by content (equal tuples): unchanged.
    lost: Vec<usize>,
    add: Option<deltalake::kernel::Add>,
    /// The file's rows in the change data feed (when the target keeps one).
    feed: Vec<RecordBatch>,
    /// Rows written into the rewritten file.
    written: u64,
    /// Merge-on-read: rows decoded to decide, the positions to mark deleted and the winners
    /// that take their place in the run's new file.
    decoded: u64,
    marks: roaring::RoaringTreemap,
    moved: Vec<usize>,
    /// The file's physical row count.
    file_rows: u64,
}

impl FileOutcome {
    fn new(path: &str) -> Self {
        FileOutcome {
            path: path.to_string(),
            replaced: 0,
            copied: 0,
            reencoded: 0,
            updated: 0,
            deleted: 0,
            conflicts: 0,
            max_sequence: None,
            changed_sequences: Vec::new(),
            lost: Vec::new(),
            add: None,
            feed: Vec::new(),
            written: 0,
            decoded: 0,
            marks: roaring::RoaringTreemap::new(),
            moved: Vec::new(),
            file_rows: 0,
        }
    }
}

/// Decides and (unless `dry_run`) writes the changes of `winners` against the target:
/// slice → probe → rewrite or mark the touched files → new keys → write and list the actions.
pub async fn rewrite(
    target: &Target<'_>,
    roles: &ColumnRoles,
    winners: &RecordBatch,
    already_conflicting: &HashSet<Box<[u8]>>,
    dry_run: bool,
) -> Result<Rewritten, RunError> {
    let mut out = Rewritten::default();
    if winners.num_rows() == 0 {
        return Ok(out);
    }
    let started = std::time::Instant::now();
    // Merge-on-read only where the table takes deletion vectors (the run turned the feature on
    // before planning; a dry run of a table without it shows copy-on-write's costs).
    // (a dry run shows what the real run would do: it upgrades the table first)
    let mark = target.apply == Apply::DeletionVectors && (target.fast.dv_enabled || dry_run);
    let (slice, listed) = apply::slice(target, roles, winners, mark)?;
    out.files_candidate = listed.len() as u64;
    // Files are probed and rewritten many at a time whatever `--threads` says: on an object
    // store each is a few requests that mostly wait (the tasks' CPU work still runs on the
    // runtime's `--threads` workers).
    let parallelism = target.parallelism.max(IO_CONCURRENCY);
    let mut probes = apply::probe_all(&slice, &listed, winners, roles, parallelism).await?;
    tracing::debug!(
        files = probes.probed.len(),
        row_groups = probes.touched.values().map(BTreeSet::len).sum::<usize>(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "probed"
    );
    let rewrite = Arc::new(Rewrite {
        slice: slice.clone(),
        found: probes.found.clone(),
        already_conflicting: already_conflicting.clone(),
        row_group_rows: target.row_group_rows,
        dry_run,
        feed: target.fast.change_data_feed,
        dead: std::mem::take(&mut probes.dead),
    });
    let done = apply::rewrite_touched(&rewrite, &mut probes, mark, parallelism).await?;
    let applied = apply::merge_outcomes(target, &rewrite, done, &mut probes, mark, &mut out)?;
    tracing::debug!(
        files = out.files_rewritten,
        rows_reencoded = out.rows_reencoded,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "rewritten"
    );
    let (inserts, feed) = apply::new_keys(&slice, &probes.found, roles.hard_deletes(), &mut out);
    out.actions = apply::write_actions(
        target, roles, winners, &slice, applied, inserts, feed, dry_run, &mut out,
    )
    .await?;
    Ok(out)
}
