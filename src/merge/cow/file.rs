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
    let hard = s.roles.hard_deletes();
    let bytes = file.fetch(&s.fast.store).await.map_err(read)?;
    let mut new = NewFile::new(
        s.fast.schema.clone(),
        r.row_group_rows,
        bytes.len() + (bytes.len() >> 4),
    )
    .map_err(d)?;
    let copy = new.can_copy_from(file);
    let mut o = FileOutcome {
        path: file.path.clone(),
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
    };
    let w = &s.w;
    for g in 0..file.row_groups().len() {
        if copy && !groups.contains(&g) {
            new.copy_row_group(file, &bytes, g).map_err(read)?;
            o.copied += file.row_groups()[g].num_rows() as u64;
            continue;
        }
        let batch = file.decode(&bytes, g).map_err(read)?;
        o.reencoded += batch.num_rows() as u64;
        let batch = canonical_rows(&s.roles, &batch)?;
        let t = s
            .enc
            .encode(&batch)
            .map_err(RunError::arrow(Phase::Compare))?;
        // For each row: keep it, or take winner i in its place, or drop it (hard delete).
        let mut pieces: Vec<(bool, u32)> = Vec::with_capacity(batch.num_rows());
        let mut feed = FeedRows::default();
        for row in 0..batch.num_rows() {
            let Some(&i) = s.index.get(t.keys.row(row).as_ref()) else {
                pieces.push((false, row as u32));
                continue;
            };
            if r.found[i] != Found::Decide(f) {
                pieces.push((false, row as u32));
                continue;
            }
            let deleted = w.is_deleted(i);
            let target_deleted = t.is_deleted(row);
            let (verdict, conflict) = decide::matched(
                w.tuples.row(i).cmp(&t.tuples.row(row)),
                w.contents.row(i).cmp(&t.contents.row(row)),
                deleted,
                target_deleted,
                r.already_conflicting.contains(w.keys.row(i).as_ref()),
            );
            o.conflicts += u64::from(conflict);
            match verdict {
                Verdict::Unchanged => {
                    o.lost.push(i);
                    pieces.push((false, row as u32));
                    continue;
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
            if decide::stays(deleted, hard) {
                o.max_sequence = o.max_sequence.max(w.sequence_micros(i));
                pieces.push((true, i as u32));
            }
            o.changed_sequences.extend(w.sequence_micros(i));
            o.replaced += 1;
        }
        o.copied += pieces.iter().filter(|(w, _)| !w).count() as u64;
        o.feed
            .extend(feed.batch(&batch, &s.winners, &s.fast.schema)?);
        new.write(&assemble(&batch, &s.winners, &pieces, &s.fast.schema)?)
            .map_err(d)?;
    }
    if o.replaced > 0 && !r.dry_run {
        o.add = new
            .put(&s.fast)
            .await
            .map_err(RunError::write(Phase::Compare, &s.uri))?;
    }
    Ok(o)
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
