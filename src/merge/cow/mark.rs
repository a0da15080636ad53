//! Merge-on-read (`target.apply: deletion_vectors`): a changed key's old row is marked deleted
//! in its file's deletion vector and its new version goes into the run's new file, so no
//! unchanged row is written. The touched row groups are read by range (every column: the
//! verdict compares contents on equal tuples, and the change data feed needs the pre-image);
//! nothing is re-encoded.

use roaring::RoaringTreemap;

pub(super) use crate::lake::dv::Grown;

use super::file::{replace, row_group_starts};
use super::*;

/// Decides file `f`'s touched row groups: the rows to mark deleted (`o.marks`, physical
/// positions in the file) and the winners that take their place in the new file (`o.moved`).
pub(super) async fn mark_file(
    r: &Rewrite,
    f: usize,
    file: &DataFile,
    groups: &BTreeSet<usize>,
) -> Result<FileOutcome, RunError> {
    let s = &r.slice;
    let read = |e| s.read_err(e);
    let mut o = FileOutcome::new(&file.path);
    o.file_rows = file.row_groups().iter().map(|g| g.num_rows() as u64).sum();
    let dead = r.dead.get(&f);
    let starts = row_group_starts(file);
    let columns: Vec<String> = file
        .meta
        .schema()
        .fields()
        .iter()
        .map(|c| c.name().clone())
        .collect();
    let order: Vec<usize> = groups.iter().copied().collect();
    let batches = file
        .read(&s.fast.store, order.clone(), &columns)
        .await
        .map_err(read)?;
    // Rows arrive row group after row group, in `order`.
    let (mut at, mut in_group) = (0usize, 0u64);
    let mut marks = RoaringTreemap::new();
    for batch in batches {
        o.decoded += batch.num_rows() as u64;
        let batch = canonical_rows(&s.roles, &batch)?;
        let t = s
            .enc
            .encode(&batch)
            .map_err(RunError::arrow(Phase::Compare))?;
        let mut feed = FeedRows::default();
        for row in 0..batch.num_rows() {
            while at < order.len() && in_group >= file.row_groups()[order[at]].num_rows() as u64 {
                at += 1;
                in_group = 0;
            }
            let g = *order.get(at).ok_or_else(|| {
                read(deltalake::DeltaTableError::Generic(format!(
                    "{} returned more rows than its row groups hold",
                    file.path
                )))
            })?;
            let pos = starts[g] + in_group;
            in_group += 1;
            if dead.is_some_and(|d| d.contains(pos)) {
                continue;
            }
            if let Some((i, stays)) = replace(r, f, &t, row, &mut o, &mut feed) {
                marks.insert(pos);
                if stays {
                    o.moved.push(i);
                }
            }
        }
        o.feed
            .extend(feed.batch(&batch, &s.winners, &s.fast.schema)?);
    }
    o.marks = marks;
    Ok(o)
}

/// Applies the keys the probe decided in file `o` (`hits`: winner, position, whether the
/// target's row is a tombstone; each winner's tuple is newer than the row's): the row is
/// marked and, unless the winner is a hard delete, the winner moves to the new file.
pub(super) fn direct(s: &Slice, hits: &[(usize, u64, bool)], o: &mut FileOutcome) {
    let w = &s.w;
    let hard = s.roles.hard_deletes();
    for &(i, pos, target_deleted) in hits {
        let deleted = w.is_deleted(i);
        let (verdict, _) = decide::matched(
            Ordering::Greater,
            Ordering::Equal,
            deleted,
            target_deleted,
            false,
            false,
        );
        match verdict {
            Verdict::Unchanged => continue,
            Verdict::Delete => o.deleted += 1,
            Verdict::Update | Verdict::Insert => o.updated += 1,
        }
        o.marks.insert(pos);
        if decide::stays(deleted, hard) {
            o.max_sequence = o.max_sequence.max(w.sequence_micros(i));
            o.moved.push(i);
        }
        o.changed_sequences.extend(w.sequence_micros(i));
        o.replaced += 1;
    }
}

/// The actions of the files whose deletion vectors grow (see [`crate::lake::dv::grow`]),
/// and how many of them leave whole.
pub(super) async fn mark_files(
    s: &Slice,
    marked: Vec<Grown>,
) -> Result<(Vec<Action>, u64), RunError> {
    crate::lake::dv::grow(&s.fast.store, marked)
        .await
        .map_err(|e| RunError::Write {
            phase: Phase::Compare,
            uri: s.uri.clone(),
            source: Box::new(deltalake::DeltaTableError::GenericError {
                source: Box::new(e),
            }),
        })
}
