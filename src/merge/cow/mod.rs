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

/// Decides and (unless `dry_run`) writes the changes of `winners` against the target.
pub async fn rewrite(
    target: &Target<'_>,
    roles: &ColumnRoles,
    winners: &RecordBatch,
    already_conflicting: &HashSet<Box<[u8]>>,
    dry_run: bool,
) -> Result<Rewritten, RunError> {
    let uri = target.uri;
    let d = |source| RunError::delta(Phase::Compare, uri)(source);
    let mut out = Rewritten::default();
    if winners.num_rows() == 0 {
        return Ok(out);
    }
    let enc = RowEncoders::new(roles).map_err(RunError::arrow(Phase::Compare))?;
    let w = enc
        .encode(winners)
        .map_err(RunError::arrow(Phase::Compare))?;
    let mut index: HashMap<Box<[u8]>, usize> = HashMap::with_capacity(winners.num_rows());
    for i in 0..winners.num_rows() {
        index.insert(w.keys.row(i).as_ref().into(), i);
    }
    let mut found = vec![Found::Absent; winners.num_rows()];
    let started = std::time::Instant::now();

    // 1-2: candidate files by the log's statistics, their row groups by the footers'; the
    // probe reads the key and ordering columns of those row groups only.
    let keys = sorted_first_keys(roles, winners)?;
    let listed = candidates(target.table, uri, roles, &keys)?;
    out.files_candidate = listed.len() as u64;
    // Merge-on-read only where the table takes deletion vectors (the run turned the feature on
    // before planning; a dry run of a table without it shows copy-on-write's costs).
    // (a dry run shows what the real run would do: it upgrades the table first)
    let mark = target.apply == Apply::DeletionVectors && (target.fast.dv_enabled || dry_run);
    let probe_cols: Vec<String> = roles
        .keys
        .iter()
        .chain(roles.order.iter())
        .cloned()
        .collect();
    let slice = Arc::new(Slice {
        probe_schema: sub_schema(roles, &probe_cols)?,
        key_conv: key_converter(roles, &roles.keys)?,
        tuple_conv: key_converter(roles, &roles.order)?,
        probe_cols,
        keys,
        roles: roles.clone(),
        winners: winners.clone(),
        index,
        enc,
        w,
        fast: target.fast.clone(),
        uri: uri.to_string(),
        direct: mark && !target.fast.change_data_feed,
    });
    // Files are probed and rewritten many at a time whatever `--threads` says: on an object
    // store each is a few requests that mostly wait (the tasks' CPU work still runs on the
    // runtime's `--threads` workers).
    let parallelism = target.parallelism.max(IO_CONCURRENCY);
    let jobs: Vec<(String, u64)> = listed.iter().map(|i| (i.path.clone(), i.size)).collect();
    let for_probes = slice.clone();
    let mut probes = futures::stream::iter(jobs)
        .map(move |(path, size)| {
            let slice = for_probes.clone();
            tokio::spawn(async move { probe_file(&slice, &path, size).await })
        })
        .buffered(parallelism);
    // The probed files the rewrite or mark step reads again (with the spans the probe fetched);
    // the others are dropped as soon as they are probed.
    let mut files: Vec<Option<DataFile>> = Vec::with_capacity(listed.len());
    let mut touched: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut seen_in: HashMap<usize, usize> = HashMap::new();
    let mut dead: HashMap<usize, roaring::RoaringTreemap> = HashMap::new();
    // Per file: its path and row count, and the keys the probe decided in it.
    let mut probed: Vec<(String, u64)> = Vec::with_capacity(listed.len());
    let mut direct: BTreeMap<usize, Vec<(usize, u64, bool)>> = BTreeMap::new();
    let mut f = 0usize;
    while let Some(joined) = probes.next().await {
        let Probed {
            file,
            dead: file_dead,
            matches,
        } = joined_or_panic(joined)??;
        if let Some(d) = file_dead {
            dead.insert(f, d);
        }
        for (i, m) in matches {
            if let Some(prev) = seen_in.insert(i, f) {
                let key = render_key(winners, &roles.keys, i);
                return Err(RunError::DuplicateTargetKeys {
                    uri: uri.to_string(),
                    count: 1,
                    first: if prev == f {
                        format!("{key} (twice in {})", file.path)
                    } else {
                        format!("{key} (in {} and {})", listed[prev].path, file.path)
                    },
                });
            }
            found[i] = match m {
                Match::Older => Found::Older,
                Match::Decide(g) => {
                    touched.entry(f).or_default().insert(g);
                    Found::Decide(f)
                }
                Match::Newer {
                    pos,
                    target_deleted,
                } => {
                    direct.entry(f).or_default().push((i, pos, target_deleted));
                    Found::Direct(f)
                }
            };
        }
        let rows = file.row_groups().iter().map(|g| g.num_rows() as u64).sum();
        probed.push((file.path.clone(), rows));
        files.push(touched.contains_key(&f).then_some(file));
        f += 1;
    }
    drop(probes);

    tracing::debug!(
        files = probed.len(),
        row_groups = touched.values().map(BTreeSet::len).sum::<usize>(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "probed"
    );

    // 3: rewrite the touched files: untouched row groups are copied as bytes.
    let hard = roles.hard_deletes();
    let schema = &target.fast.schema;
    let mut adds: Vec<Action> = Vec::new();
    let mut removes: Vec<Action> = Vec::new();
    let mut feed_batches: Vec<RecordBatch> = Vec::new();
    #[allow(deprecated)] // the log's own `add`, kept with a new deletion vector
    let views: HashMap<String, (deltalake::kernel::Remove, deltalake::kernel::Add)> =
        if touched.is_empty() && direct.is_empty() {
            HashMap::new()
        } else {
            target
                .table
                .snapshot()
                .map_err(RunError::delta(Phase::Compare, uri))?
                .log_data()
                .iter()
                .map(|v| {
                    (
                        v.path().to_string(),
                        (v.remove_action(true), v.add_action()),
                    )
                })
                .collect()
        };
    // Files are rewritten side by side (each is independent: keys are unique across files),
    // and their outcomes merged in file order, so the result does not depend on timing.
    let rewrite = Arc::new(Rewrite {
        slice: slice.clone(),
        found: found.clone(),
        already_conflicting: already_conflicting.clone(),
        row_group_rows: target.row_group_rows,
        dry_run,
        feed: target.fast.change_data_feed,
        dead,
    });
    let jobs: Vec<(usize, DataFile, BTreeSet<usize>)> = files
        .into_iter()
        .enumerate()
        .filter_map(|(f, file)| Some((f, file?, touched.remove(&f)?)))
        .collect();
    let shared = rewrite.clone();
    let mut outcomes = futures::stream::iter(jobs)
        .map(move |(f, file, groups)| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let o = if mark {
                    mark::mark_file(&shared, f, &file, &groups).await
                } else {
                    rewrite_file(&shared, f, &file, &groups).await
                };
                o.map(|o| (f, o))
            })
        })
        .buffered(parallelism);
    let view = |path: &str| {
        views.get(path).cloned().ok_or_else(|| RunError::Internal {
            phase: Phase::Compare,
            message: format!("rewrote {path}, which is not in the planned snapshot"),
        })
    };
    // Merge-on-read: (the file's `remove` and `add`, its rows, its new deletion vector).
    let mut marked: Vec<Grown> = Vec::new();
    let mut moved: Vec<u32> = Vec::new();
    let mut done: Vec<(usize, FileOutcome)> = Vec::new();
    while let Some(joined) = outcomes.next().await {
        done.push(joined_or_panic(joined)??);
    }
    drop(outcomes);
    // The files with keys only the probe decided have no outcome yet.
    for (&f, _) in direct.iter() {
        if !done.iter().any(|(g, _)| *g == f) {
            let mut o = FileOutcome::new(&probed[f].0);
            o.file_rows = probed[f].1;
            done.push((f, o));
        }
    }
    done.sort_by_key(|(f, _)| *f);
    for (f, mut o) in done {
        if let Some(hits) = direct.get(&f) {
            mark::direct(&slice, hits, &mut o);
        }
        for i in &o.lost {
            found[*i] = Found::Older;
        }
        out.conflicts += o.conflicts;
        out.updated += o.updated;
        out.deleted += o.deleted;
        out.max_sequence = out.max_sequence.max(o.max_sequence);
        out.changed_sequences.extend(o.changed_sequences);
        feed_batches.extend(o.feed);
        if o.replaced == 0 {
            continue;
        }
        if mark {
            out.files_marked += 1;
            out.rows_marked += o.marks.len();
            moved.extend(o.moved.iter().map(|&i| i as u32));
            let (remove, add) = view(&o.path)?;
            let mut deleted = rewrite.dead.get(&f).cloned().unwrap_or_default();
            deleted |= o.marks;
            marked.push(Grown {
                remove,
                add,
                deleted,
                rows: o.file_rows,
            });
            continue;
        }
        out.files_rewritten += 1;
        out.rows_copied += o.copied;
        out.rows_reencoded += o.reencoded;
        out.rows_written += o.written;
        if !dry_run {
            adds.extend(o.add.map(Action::Add));
            removes.push(Action::Remove(view(&o.path)?.0));
        }
    }
    let w = &slice.w;

    tracing::debug!(
        files = out.files_rewritten,
        rows_reencoded = out.rows_reencoded,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "rewritten"
    );

    // New keys: one new file, in key order.
    let mut inserts: Vec<u32> = Vec::new();
    let mut feed = FeedRows::default();
    // (winners arrive sorted by key from the dedup)
    for (i, _) in found
        .iter()
        .enumerate()
        .filter(|(_, f)| **f == Found::Absent)
    {
        match decide::absent(w.is_deleted(i), hard) {
            Verdict::Unchanged => {
                out.unchanged += 1;
                continue;
            }
            // (a soft delete's tombstone for a key never seen: no live row changes)
            Verdict::Delete => out.deleted += 1,
            Verdict::Insert | Verdict::Update => {
                out.inserted += 1;
                feed.winner(i, Change::Insert);
            }
        }
        out.max_sequence = out.max_sequence.max(w.sequence_micros(i));
        out.changed_sequences.extend(w.sequence_micros(i));
        inserts.push(i as u32);
    }
    out.unchanged += found.iter().filter(|f| **f == Found::Older).count() as u64;
    // Merge-on-read: the changed keys' new versions join the new keys, in key order.
    inserts.extend(moved);
    inserts.sort_unstable();
    out.rows_written += inserts.len() as u64;
    // The deletion vectors and the new file are written at the same time (on an object store,
    // each write is a request that mostly waits).
    let marking = async {
        if dry_run {
            return Ok((Vec::new(), 0));
        }
        mark::mark_files(&slice, marked).await
    };
    let adding = async {
        if inserts.is_empty() || dry_run {
            return Ok(None);
        }
        let rows = arrow::compute::take_record_batch(winners, &UInt32Array::from(inserts))
            .map_err(RunError::arrow(Phase::Compare))?;
        let rows = cast_to(&rows, schema).map_err(RunError::arrow(Phase::Compare))?;
        let mut new =
            NewFile::keyed(schema.clone(), target.row_group_rows, 0, &roles.keys).map_err(d)?;
        new.write(&rows).map_err(d)?;
        new.put(target.fast)
            .await
            .map_err(RunError::write(Phase::Compare, uri))
    };
    let ((marked_actions, emptied), added) = tokio::try_join!(marking, adding)?;
    out.files_removed += emptied;
    adds.extend(added.map(Action::Add));
    out.files_added = adds.len() as u64;
    out.files_removed += removes.len() as u64;
    let mut actions: Vec<Action> = removes
        .into_iter()
        .chain(marked_actions)
        .chain(adds)
        .collect();
    if target.fast.change_data_feed && !actions.is_empty() {
        feed_batches.extend(feed.batch(winners, winners, schema)?);
        let cdc = feed::put(target.fast, uri, &feed_batches).await?;
        out.feed_rows = feed_batches.iter().map(|b| b.num_rows() as u64).sum();
        actions.push(Action::Cdc(cdc));
    }
    out.actions = actions;
    Ok(out)
}
