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
    let groups = admitted_row_groups(&file, &s.roles.keys[0], &s.key_type, &s.sorted)?;
    // Rows arrive in the order of `groups`: cumulative counts map a row to its group.
    let mut bounds = Vec::with_capacity(groups.len());
    let mut end = 0u64;
    for &g in &groups {
        let rows = file.row_groups()[g].num_rows() as u64;
        end += rows;
        // (end of the group in the rows read, the group, its first row's position in the file)
        bounds.push((end, g, starts[g] + rows));
    }
    let nk = s.roles.keys.len();
    let mut matches = Vec::new();
    let mut row = 0u64;
    let mut at = 0usize;
    // (a file from before soft deletes has no `_deleted`: its rows are live)
    let with_deleted =
        s.direct && !s.roles.hard_deletes() && file.meta.schema().index_of(DELETED_COLUMN).is_ok();
    let mut cols = s.probe_cols.clone();
    if with_deleted {
        cols.push(DELETED_COLUMN.to_string());
    }
    for batch in file
        .read(&s.fast.store, groups, &cols)
        .await
        .map_err(read)?
    {
        let deleted = match batch.column_by_name(DELETED_COLUMN) {
            Some(c) if with_deleted => Some(
                arrow::compute::cast(c, &DataType::Boolean)
                    .map_err(RunError::arrow(Phase::Compare))?,
            ),
            _ => None,
        };
        let batch = cast_to(&batch, &s.probe_schema).map_err(RunError::arrow(Phase::Compare))?;
        let keys = s
            .key_conv
            .convert_columns(&batch.columns()[..nk])
            .map_err(RunError::arrow(Phase::Compare))?;
        let tuples = s
            .tuple_conv
            .convert_columns(&batch.columns()[nk..])
            .map_err(RunError::arrow(Phase::Compare))?;
        for r in 0..batch.num_rows() {
            while at < bounds.len() && row >= bounds[at].0 {
                at += 1;
            }
            let &(end, g, file_end) = bounds.get(at).ok_or_else(|| {
                read(deltalake::DeltaTableError::Generic(format!(
                    "{path} returned more rows than its row groups hold"
                )))
            })?;
            let pos = file_end - (end - row);
            row += 1;
            // A row the file's deletion vector deletes is not in the table.
            if dead.as_ref().is_some_and(|d| d.contains(pos)) {
                continue;
            }
            let Some(&i) = s.index.get(keys.row(r).as_ref()) else {
                continue;
            };
            let m = match s.w.tuples.row(i).cmp(&tuples.row(r)) {
                Ordering::Less => Match::Older,
                Ordering::Greater if s.direct => Match::Newer {
                    pos,
                    target_deleted: deleted
                        .as_ref()
                        .is_some_and(|d| d.as_boolean().value(r) && d.is_valid(r)),
                },
                _ => Match::Decide(g),
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
