//! One touched file written again: untouched row groups copied as bytes, touched ones decoded,
//! patched with the winning rows and encoded.

use super::*;

/// Rewrites file `f`: row groups outside `groups` are copied as bytes, the others decoded,
/// patched with the winning rows and encoded again.
pub(super) async fn rewrite_file(
    r: &Rewrite,
    f: usize,
    file: &DataFile,
    groups: &BTreeSet<usize>,
) -> Result<FileOutcome, RunError> {
    let s = &r.slice;
    let d = |e| s.delta_err(e);
    let read = |e| s.read_err(e);
    let bytes = file.fetch(&s.fast.store).await.map_err(read)?;
    let mut new = NewFile::keyed(
        s.fast.schema.clone(),
        r.row_group_rows,
        bytes.len() + (bytes.len() >> 4),
        &s.roles.keys,
    )
    .map_err(d)?;
    let copy = new.can_copy_from(file);
    let mut o = FileOutcome::new(&file.path);
    let dead = r.dead.get(&f);
    let starts = row_group_starts(file);
    for (g, &start) in starts.iter().enumerate() {
        let rows = file.row_groups()[g].num_rows() as u64;
        let holds_dead = dead.is_some_and(|d| d.range_cardinality(start..start + rows) > 0);
        if copy && !groups.contains(&g) && !holds_dead {
            new.copy_row_group(file, &bytes, g).map_err(read)?;
            o.copied += rows;
            continue;
        }
        let batch = file.decode(&bytes, g).map_err(read)?;
        o.reencoded += batch.num_rows() as u64;
        let batch = canonical_rows(&s.roles, &batch)?;
        let t = s
            .enc
            .encode(&batch)
            .map_err(RunError::arrow(Phase::Compare))?;
        // For each row: keep it, or take winner i in its place, or drop it (hard delete, or
        // already deleted by the file's deletion vector).
        let mut pieces: Vec<(bool, u32)> = Vec::with_capacity(batch.num_rows());
        let mut feed = FeedRows::default();
        for row in 0..batch.num_rows() {
            if dead.is_some_and(|d| d.contains(start + row as u64)) {
                continue;
            }
            match replace(r, f, &t, row, &mut o, &mut feed) {
                None => pieces.push((false, row as u32)),
                Some((i, true)) => pieces.push((true, i as u32)),
                Some((_, false)) => {}
            }
        }
        o.copied += pieces.iter().filter(|(w, _)| !w).count() as u64;
        o.feed
            .extend(feed.batch(&batch, &s.winners, &s.fast.schema)?);
        new.write(&assemble(&batch, &s.winners, &pieces, &s.fast.schema)?)
            .map_err(d)?;
    }
    o.written = new.rows;
    if o.replaced > 0 && !r.dry_run {
        o.add = new
            .put(&s.fast)
            .await
            .map_err(RunError::write(Phase::Compare, &s.uri))?;
    }
    Ok(o)
}

/// The physical index of each row group's first row in `file`.
pub(super) fn row_group_starts(file: &DataFile) -> Vec<u64> {
    let mut at = 0u64;
    file.row_groups()
        .iter()
        .map(|g| {
            let start = at;
            at += g.num_rows() as u64;
            start
        })
        .collect()
}

/// Decides target row `row` of file `f` (`t`: its row group, encoded) against the slice: `None`
/// when the row stays as it is, else the winner that replaces it and whether that winner stays
/// in the target (every winner but a hard delete). Counts the outcome and its feed rows.
pub(super) fn replace(
    r: &Rewrite,
    f: usize,
    t: &EncodedBatch,
    row: usize,
    o: &mut FileOutcome,
    feed: &mut FeedRows,
) -> Option<(usize, bool)> {
    let s = &r.slice;
    let w = &s.w;
    let &i = s.index.get(t.keys.row(row).as_ref())?;
    if r.found[i] != Found::Decide(f) {
        return None;
    }
    let deleted = w.is_deleted(i);
    let target_deleted = t.is_deleted(row);
    let (verdict, conflict) = decide::matched(
        w.tuples.row(i).cmp(&t.tuples.row(row)),
        w.contents.row(i).cmp(&t.contents.row(row)),
        deleted,
        target_deleted,
        r.already_conflicting.contains(w.keys.row(i).as_ref()),
        s.roles.partial.is_some(),
    );
    o.conflicts += u64::from(conflict);
    match verdict {
        Verdict::Unchanged => {
            o.lost.push(i);
            return None;
        }
        Verdict::Delete => o.deleted += 1,
        // (a held key is never an insert)
        Verdict::Update | Verdict::Insert => o.updated += 1,
    }
    if r.feed {
        for &(change, from_winner) in Change::of_update(!target_deleted, !deleted) {
            feed.push(change, from_winner, row, i);
        }
    }
    let stays = decide::stays(deleted, s.roles.hard_deletes());
    if stays {
        o.max_sequence = o.max_sequence.max(w.sequence_micros(i));
    }
    o.changed_sequences.extend(w.sequence_micros(i));
    o.replaced += 1;
    Some((i, stays))
}

/// Builds the rewritten batch: `(false, r)` keeps row `r` of `batch`, `(true, i)` takes winner `i`.
pub(super) fn assemble(
    batch: &RecordBatch,
    winners: &RecordBatch,
    pieces: &[(bool, u32)],
    schema: &SchemaRef,
) -> Result<RecordBatch, RunError> {
    let a = RunError::arrow(Phase::Compare);
    let batch = cast_to(batch, schema).map_err(RunError::arrow(Phase::Compare))?;
    let winners = cast_to(winners, schema).map_err(RunError::arrow(Phase::Compare))?;
    let columns = (0..schema.fields().len())
        .map(|c| {
            let sources: [&dyn Array; 2] = [batch.column(c).as_ref(), winners.column(c).as_ref()];
            let idx: Vec<(usize, usize)> = pieces
                .iter()
                .map(|(w, i)| (usize::from(*w), *i as usize))
                .collect();
            arrow::compute::interleave(&sources, &idx)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(a)?;
    RecordBatch::try_new(schema.clone(), columns).map_err(RunError::arrow(Phase::Compare))
}
