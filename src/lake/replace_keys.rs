//! Replacing every row of some keys, in one commit: the rows the table holds for them leave
//! and the new rows are written into one new file. The files holding such rows are found by
//! reading their key columns (the keys may have any number of columns), and then either
//!
//! * **marked** (`target.apply: deletion_vectors`, merge-on-read): the rows go into the files'
//!   deletion vectors, and no unchanged row is written however the keys are spread over the
//!   table (a dimension's hourly changes land in every file); or
//! * **rewritten** (copy-on-write): each such file is written again without them, its row
//!   groups that hold none copied as bytes.
//!
//! The table must be readable directly ([`FastPath`]); marking needs the `deletionVectors`
//! feature ([`super::dv::enabled`]).

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::{DeltaTable, DeltaTableError};
use futures::{StreamExt, TryStreamExt};
use roaring::RoaringTreemap;

use super::datafile::{DataFile, FastPath, NewFile};

/// What [`replace_keys`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Replaced {
    /// The version committed (`None`: nothing to commit).
    pub version: Option<u64>,
    pub files_marked: u64,
    pub files_removed: u64,
    pub files_added: u64,
    /// Rows marked deleted: those the table held for the keys.
    pub rows_marked: u64,
    /// Rows written: the new rows.
    pub rows_written: u64,
}

fn external<E: std::error::Error + Send + Sync + 'static>(e: E) -> DeltaTableError {
    DeltaTableError::GenericError {
        source: Box::new(e),
    }
}

/// The text of each row's key (its key columns as text, joined by U+001F after a non-empty
/// text; a null as U+0000): how `wanted` names keys, and what a dimension's durable key hashes.
pub fn key_text(batch: &RecordBatch, keys: &[String]) -> Result<Vec<String>, DeltaTableError> {
    let mut out = vec![String::new(); batch.num_rows()];
    for k in keys {
        let c = batch
            .column_by_name(k)
            .ok_or_else(|| DeltaTableError::Generic(format!("no key column `{k}`")))?;
        let c = arrow::compute::cast(c, &DataType::Utf8)?;
        let c = c.as_string::<i32>();
        for (i, o) in out.iter_mut().enumerate() {
            if !o.is_empty() {
                o.push('\u{1f}');
            }
            o.push_str(if c.is_valid(i) { c.value(i) } else { "\u{0}" });
        }
    }
    Ok(out)
}

/// One data file's rows of the wanted keys: its positions, added to the deletion vector it had.
struct Marked {
    path: String,
    deleted: RoaringTreemap,
    new_marks: u64,
    rows: u64,
    /// Copy-on-write: the file written again without the deleted rows (`None`: none left).
    rewritten: Option<Option<deltalake::kernel::Add>>,
    /// Copy-on-write: rows written into it.
    kept: u64,
}

async fn mark_file(
    fast: &FastPath,
    path: String,
    size: u64,
    keys: &[String],
    wanted: &HashSet<String>,
    rewrite: Option<usize>,
) -> Result<Option<Marked>, DeltaTableError> {
    // (a file's key column is decoded on its own task: `parallelism` files on as many cores)
    let file = DataFile::open(&fast.store, &path, size).await?;
    let mut deleted = match fast.deletion_vectors.get(&path) {
        Some(d) => super::dv::read(&fast.store, d).await.map_err(external)?,
        None => RoaringTreemap::new(),
    };
    let groups: Vec<usize> = (0..file.row_groups().len()).collect();
    let rows: u64 = file.row_groups().iter().map(|g| g.num_rows() as u64).sum();
    let mut pos = 0u64;
    let mut new_marks = 0u64;
    for batch in file.read(&fast.store, groups, keys).await? {
        let mut mark = |hit: bool| {
            if hit && deleted.insert(pos) {
                new_marks += 1;
            }
            pos += 1;
        };
        if let [key] = keys {
            // One key column: looked up as it is, without building each row's text.
            let c = batch
                .column_by_name(key)
                .ok_or_else(|| DeltaTableError::Generic(format!("no key column `{key}`")))?;
            let c = arrow::compute::cast(c, &DataType::Utf8)?;
            let c = c.as_string::<i32>();
            for i in 0..c.len() {
                mark(wanted.contains(if c.is_valid(i) { c.value(i) } else { "\u{0}" }));
            }
        } else {
            for text in key_text(&batch, keys)? {
                mark(wanted.contains(&text));
            }
        }
    }
    if new_marks == 0 {
        return Ok(None);
    }
    let (rewritten, kept) = match rewrite {
        Some(row_group_rows) => {
            let (add, kept) = rewrite_without(fast, &file, &deleted, row_group_rows).await?;
            (Some(add), kept)
        }
        None => (None, 0),
    };
    Ok(Some(Marked {
        path,
        deleted,
        new_marks,
        rows,
        rewritten,
        kept,
    }))
}

/// `file` written again without the rows in `deleted`: its row groups that hold none are
/// copied as bytes, the others decoded and filtered. `None` when no row is left.
async fn rewrite_without(
    fast: &FastPath,
    file: &DataFile,
    deleted: &RoaringTreemap,
    row_group_rows: usize,
) -> Result<(Option<deltalake::kernel::Add>, u64), DeltaTableError> {
    let bytes = file.fetch(&fast.store).await?;
    let mut new = NewFile::new(fast.schema.clone(), row_group_rows, bytes.len())?;
    let copy = new.can_copy_from(file);
    let mut start = 0u64;
    for (g, meta) in file.row_groups().iter().enumerate() {
        let n = meta.num_rows() as u64;
        let gone = deleted.range_cardinality(start..start + n);
        if copy && gone == 0 {
            new.copy_row_group(file, &bytes, g)?;
        } else if gone < n {
            let batch = file.decode(&bytes, g)?;
            let keep: arrow::array::BooleanArray =
                (0..n).map(|i| Some(!deleted.contains(start + i))).collect();
            let batch = arrow::compute::filter_record_batch(&batch, &keep)?;
            new.write(&super::storage::cast_to(&batch, &fast.schema)?)?;
        }
        start += n;
    }
    let kept = new.rows;
    Ok((new.put(fast).await?, kept))
}

/// Removes every row of `table` whose key (`keys`, as [`key_text`]) is in `wanted` — marked in
/// deletion vectors when `mark`, else by rewriting the files that hold them — and adds `rows`
/// (in the table's storage types), in one commit with `props`. Files are read `parallelism` at
/// a time (key columns first). Nothing is committed when no row leaves and `rows` is empty.
#[allow(clippy::too_many_arguments)]
pub async fn replace_keys(
    table: &DeltaTable,
    fast: &FastPath,
    keys: &[String],
    wanted: &HashSet<String>,
    rows: &RecordBatch,
    mark: bool,
    row_group_rows: usize,
    parallelism: usize,
    props: CommitProperties,
    operation: DeltaOperation,
) -> Result<Replaced, DeltaTableError> {
    let snapshot = table.snapshot()?;
    #[allow(deprecated)] // the log's own `add`, kept with a new deletion vector
    let files: Vec<(
        String,
        u64,
        deltalake::kernel::Remove,
        deltalake::kernel::Add,
    )> = snapshot
        .log_data()
        .iter()
        .map(|v| {
            (
                v.path().to_string(),
                v.size().max(0) as u64,
                v.remove_action(true),
                v.add_action(),
            )
        })
        .collect();
    let mut out = Replaced::default();
    let jobs: Vec<(String, u64)> = if wanted.is_empty() {
        Vec::new()
    } else {
        files.iter().map(|f| (f.0.clone(), f.1)).collect()
    };
    let shared = Arc::new((fast.clone(), keys.to_vec(), wanted.clone()));
    let rewrite = (!mark).then_some(row_group_rows);
    let marked: Vec<Marked> = futures::stream::iter(jobs)
        .map(|(path, size)| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let (fast, keys, wanted) = shared.as_ref();
                mark_file(fast, path, size, keys, wanted, rewrite).await
            })
        })
        .buffered(parallelism.max(1))
        .map(|joined| match joined {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(DeltaTableError::Generic(format!(
                "a file task was cancelled: {e}"
            ))),
        })
        .try_filter_map(|m| async move { Ok(m) })
        .try_collect()
        .await?;
    let mut actions: Vec<Action> = Vec::new();
    let entry = |path: &str| {
        files
            .iter()
            .find(|f| f.0 == path)
            .ok_or_else(|| DeltaTableError::Generic(format!("{path} left the snapshot")))
    };
    if mark {
        let mut grown = Vec::with_capacity(marked.len());
        for m in marked {
            out.rows_marked += m.new_marks;
            let (_, _, remove, add) = entry(&m.path)?;
            grown.push(super::dv::Grown {
                remove: remove.clone(),
                add: add.clone(),
                deleted: m.deleted,
                rows: m.rows,
            });
        }
        let files = grown.len() as u64;
        let (marking, emptied) = super::dv::grow(&fast.store, grown)
            .await
            .map_err(external)?;
        out.files_removed += emptied;
        out.files_marked += files - emptied;
        actions.extend(marking);
    } else {
        for m in marked {
            out.rows_marked += m.new_marks;
            out.rows_written += m.kept;
            out.files_removed += 1;
            actions.push(Action::Remove(entry(&m.path)?.2.clone()));
            if let Some(Some(add)) = m.rewritten {
                out.files_added += 1;
                actions.push(Action::Add(add));
            }
        }
    }
    if rows.num_rows() > 0 {
        let rows = super::storage::cast_to(rows, &fast.schema)?;
        let mut new = NewFile::new(fast.schema.clone(), row_group_rows, 0)?;
        new.write(&rows)?;
        out.rows_written += new.rows;
        if let Some(add) = new.put(fast).await? {
            out.files_added += 1;
            actions.push(Action::Add(add));
        }
    }
    if actions.is_empty() {
        return Ok(out);
    }
    let committed = CommitBuilder::from(super::cleanup_at_checkpoints(props, snapshot))
        .with_actions(actions)
        .build(Some(snapshot), table.log_store(), operation)
        .await?;
    out.version = Some(committed.version());
    Ok(out)
}
