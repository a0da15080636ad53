//! Step 2: which of a candidate file's rows hold a slice key, read from its footer and the key
//! and ordering columns of the row groups its statistics admit.

use super::*;

/// Where a slice key found in a probed file stands.
#[derive(Clone, Copy)]
pub(super) enum Match {
    /// The target's version is newer: nothing to do.
    Older,
    /// Decided when its row group is read whole (an equal tuple compares contents; the change
    /// data feed needs the old row).
    Decide(usize),
    /// Merge-on-read without a feed: the winner's tuple is newer, which decides it here; the
    /// row is marked at `pos` (its position in the file).
    Newer { pos: u64, target_deleted: bool },
}

/// Reads the footer of a candidate file and the key and ordering columns of the row groups
/// that can hold a slice key (and `_deleted`, when the probe decides). Returns, in row order,
/// each slice key found and where it stands.
pub(super) async fn probe_file(s: &Slice, path: &str, size: u64) -> Result<Probed, RunError> {
    let read = |e| s.read_err(e);
    let file = DataFile::open(&s.fast.store, path, size)
        .await
        .map_err(read)?;
    let dead = match s.fast.deletion_vectors.get(path) {
        Some(d) => Some(crate::lake::dv::read(&s.fast.store, d).await.map_err(|e| {
            read(deltalake::DeltaTableError::GenericError {
                source: Box::new(e),
            })
        })?),
        None => None,
    };
    let starts = file::row_group_starts(&file);
    let admitted = admitted_row_groups(&file, &s.roles.keys[0], &s.keys)?;
    // Rows arrive in the order of `admitted`: cumulative counts map a row to its group.
    let mut bounds = Vec::with_capacity(admitted.len());
    let mut end = 0u64;
    for a in &admitted {
        let rows = file.row_groups()[a.group].num_rows() as u64;
        end += rows;
        bounds.push(Bounds {
            end,
            group: a.group,
            file_end: starts[a.group] + rows,
        });
    }
    let groups = admitted.iter().map(|a| a.group).collect();
    let nk = s.roles.keys.len();
    let mut matches = Vec::new();
    let mut row = 0u64;
    // (a file from before soft deletes has no `_deleted`: its rows are live)
    let with_deleted =
        s.direct && !s.roles.hard_deletes() && file.meta.schema().index_of(DELETED_COLUMN).is_ok();
    let mut cols = s.probe_cols.clone();
    if with_deleted {
        cols.push(DELETED_COLUMN.to_string());
    }
    let arrow = |e| RunError::arrow(Phase::Compare)(e);
    for batch in file
        .read(&s.fast.store, groups, &cols)
        .await
        .map_err(read)?
    {
        let first = row;
        row += batch.num_rows() as u64;
        let deleted = match batch.column_by_name(DELETED_COLUMN) {
            Some(c) if with_deleted => {
                Some(arrow::compute::cast(c, &DataType::Boolean).map_err(&arrow)?)
            }
            _ => None,
        };
        let batch = cast_to(&batch, &s.probe_schema).map_err(&arrow)?;
        let picked = rows_to_look_up(s, path, &batch, first, &bounds, &admitted)?;
        if picked.is_empty() {
            continue;
        }
        let rows = UInt32Array::from_iter_values(picked.iter().map(|&(r, _)| r));
        let few = arrow::compute::take_record_batch(&batch, &rows).map_err(&arrow)?;
        let keys = s
            .key_conv
            .convert_columns(&few.columns()[..nk])
            .map_err(&arrow)?;
        let tuples = s
            .tuple_conv
            .convert_columns(&few.columns()[nk..])
            .map_err(&arrow)?;
        for (j, &(r, at)) in picked.iter().enumerate() {
            let b = &bounds[at];
            let pos = b.file_end - (b.end - (first + r as u64));
            // A row the file's deletion vector deletes is not in the table.
            if dead.as_ref().is_some_and(|d| d.contains(pos)) {
                continue;
            }
            let Some(&i) = s.index.get(keys.row(j).as_ref()) else {
                continue;
            };
            let r = r as usize;
            let m = match s.w.tuples.row(i).cmp(&tuples.row(j)) {
                Ordering::Less => Match::Older,
                Ordering::Greater if s.direct => Match::Newer {
                    pos,
                    target_deleted: deleted
                        .as_ref()
                        .is_some_and(|d| d.as_boolean().value(r) && d.is_valid(r)),
                },
                _ => Match::Decide(b.group),
            };
            matches.push((i, m));
        }
    }
    Ok(Probed {
        file,
        dead,
        matches,
    })
}

/// A probed candidate: its footer, the rows its deletion vector deletes, and the slice keys
/// found in it (see [`probe_file`]).
pub(super) struct Probed {
    pub(super) file: DataFile,
    pub(super) dead: Option<roaring::RoaringTreemap>,
    pub(super) matches: Vec<(usize, Match)>,
}

/// Where an admitted row group's rows end among the rows read, which group it is, and where its
/// rows end in the file.
struct Bounds {
    end: u64,
    group: usize,
    file_end: u64,
}

/// At most this many slice keys inside a row group's bounds are looked for by comparing its
/// first key column with each; more, and every row's key is looked up in the slice's index.
const FEW_KEYS: usize = 16;

/// The rows of `batch` (its first row is `first` among the rows read) whose key can be one of
/// the slice's, in order, each with its row group's index in `bounds`. A row group's statistics say which few slice keys it can hold (an
/// old file's group typically holds one late refund among its 4,096 rows): its first key
/// column is compared with those alone, so the row encoding and the index lookup run for the
/// rows that match rather than for every row read.
fn rows_to_look_up(
    s: &Slice,
    path: &str,
    batch: &RecordBatch,
    first: u64,
    bounds: &[Bounds],
    admitted: &[super::prune::Admitted],
) -> Result<Vec<(u32, usize)>, RunError> {
    let arrow = |e| RunError::arrow(Phase::Compare)(e);
    let n = batch.num_rows() as u64;
    let mut picked = Vec::new();
    let mut at = bounds.partition_point(|b| b.end <= first);
    let mut start = first;
    while start < first + n && at < bounds.len() {
        let stop = bounds[at].end.min(first + n);
        let (lo, len) = ((start - first) as usize, (stop - start) as usize);
        let keys = &admitted[at].keys;
        if keys.len() > FEW_KEYS {
            picked.extend((lo as u32..(lo + len) as u32).map(|r| (r, at)));
        } else {
            let column = batch.column(0).slice(lo, len);
            let column = if column.data_type() == &s.keys.key_type {
                column
            } else {
                arrow::compute::cast(&column, &s.keys.key_type).map_err(&arrow)?
            };
            let mut hit: Option<BooleanArray> = None;
            for k in keys.clone() {
                let one = arrow::array::Scalar::new(s.keys.values.slice(k, 1));
                let eq = arrow::compute::kernels::cmp::eq(&column, &one).map_err(&arrow)?;
                hit = Some(match hit {
                    Some(h) => arrow::compute::or(&h, &eq).map_err(&arrow)?,
                    None => eq,
                });
            }
            if let Some(hit) = hit {
                picked.extend(
                    (0..len)
                        .filter(|&i| hit.is_valid(i) && hit.value(i))
                        .map(|i| ((lo + i) as u32, at)),
                );
            }
        }
        start = stop;
        at += 1;
    }
    if start < first + n {
        return Err(s.read_err(deltalake::DeltaTableError::Generic(format!(
            "{path} returned more rows than its row groups hold"
        ))));
    }
    Ok(picked)
}
