//! The phases of [`super::rewrite`], each a function with named inputs and outputs: the slice
//! the probe reads, the probe of every candidate file, the rewrite (or marking) of the touched
//! files, the outcomes merged in file order, the new keys, and the writes that make the commit's
//! actions.

use super::*;
use crate::merge::MergeError;

/// What the probe of every candidate file found.
pub(super) struct Probes {
    /// Per winner, where it stands.
    pub(super) found: Vec<Found>,
    /// The probed files the rewrite or mark step reads again (others dropped once probed).
    files: Vec<Option<DataFile>>,
    /// Per file, the row groups holding a key decided while rewriting.
    pub(super) touched: BTreeMap<usize, BTreeSet<usize>>,
    /// Per file, the rows its deletion vector already deletes.
    pub(super) dead: HashMap<usize, roaring::RoaringTreemap>,
    /// Per file: its path and row count.
    pub(super) probed: Vec<(String, u64)>,
    /// Per file, the keys the probe decided in it (winner, position, target row deleted).
    direct: BTreeMap<usize, Vec<(usize, u64, bool)>>,
}

/// What merging the files' outcomes left for the commit.
pub(super) struct Applied {
    marked: Vec<Grown>,
    moved: Vec<u32>,
    adds: Vec<Action>,
    removes: Vec<Action>,
    feed_batches: Vec<RecordBatch>,
}

/// Step 1: the winners encoded and indexed, and the candidate files by the log's statistics
/// (the probe then reads the key and ordering columns of their admitted row groups only).
pub(super) fn slice(
    target: &Target<'_>,
    roles: &ColumnRoles,
    winners: &RecordBatch,
    mark: bool,
) -> Result<(Arc<Slice>, Vec<FileInfo>), RunError> {
    let enc = RowEncoders::new(roles).map_err(RunError::arrow(Phase::Compare))?;
    let w = enc
        .encode(winners)
        .map_err(RunError::arrow(Phase::Compare))?;
    let mut index: HashMap<Box<[u8]>, usize> = HashMap::with_capacity(winners.num_rows());
    for i in 0..winners.num_rows() {
        index.insert(w.keys.row(i).as_ref().into(), i);
    }
    let keys = sorted_first_keys(roles, winners)?;
    let listed = candidates(target.table, target.uri, roles, &keys)?;
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
        uri: target.uri.to_string(),
        direct: mark && !target.fast.change_data_feed,
    });
    Ok((slice, listed))
}

/// Step 2: every candidate file probed, many at a time; a key held by two files (or twice in
/// one) stops the run.
pub(super) async fn probe_all(
    slice: &Arc<Slice>,
    listed: &[FileInfo],
    winners: &RecordBatch,
    roles: &ColumnRoles,
    parallelism: usize,
) -> Result<Probes, RunError> {
    let jobs: Vec<(String, u64)> = listed.iter().map(|i| (i.path.clone(), i.size)).collect();
    let for_probes = slice.clone();
    let mut stream = futures::stream::iter(jobs)
        .map(move |(path, size)| {
            let slice = for_probes.clone();
            tokio::spawn(async move { probe_file(&slice, &path, size).await })
        })
        .buffered(parallelism);
    let mut p = Probes {
        found: vec![Found::Absent; winners.num_rows()],
        files: Vec::with_capacity(listed.len()),
        touched: BTreeMap::new(),
        dead: HashMap::new(),
        probed: Vec::with_capacity(listed.len()),
        direct: BTreeMap::new(),
    };
    let mut seen_in: HashMap<usize, usize> = HashMap::new();
    let mut f = 0usize;
    while let Some(joined) = stream.next().await {
        let Probed {
            file,
            dead: file_dead,
            matches,
        } = joined_or_panic(joined)??;
        if let Some(d) = file_dead {
            p.dead.insert(f, d);
        }
        for (i, m) in matches {
            if let Some(prev) = seen_in.insert(i, f) {
                let key = render_key(winners, &roles.keys, i);
                return Err(MergeError::DuplicateTargetKeys {
                    uri: slice.uri.clone(),
                    count: 1,
                    first: if prev == f {
                        format!("{key} (twice in {})", file.path)
                    } else {
                        format!("{key} (in {} and {})", listed[prev].path, file.path)
                    },
                }
                .into());
            }
            p.found[i] = match m {
                Match::Older => Found::Older,
                Match::Decide(g) => {
                    p.touched.entry(f).or_default().insert(g);
                    Found::Decide(f)
                }
                Match::Newer {
                    pos,
                    target_deleted,
                } => {
                    p.direct
                        .entry(f)
                        .or_default()
                        .push((i, pos, target_deleted));
                    Found::Direct(f)
                }
            };
        }
        let rows = file.row_groups().iter().map(|g| g.num_rows() as u64).sum();
        p.probed.push((file.path.clone(), rows));
        p.files.push(p.touched.contains_key(&f).then_some(file));
        f += 1;
    }
    Ok(p)
}

/// Step 3: the touched files rewritten (untouched row groups copied as bytes) or their rows
/// marked, side by side (keys are unique across files); the outcomes in file order, so the
/// result does not depend on timing, with an empty outcome for each file only the probe
/// decided.
pub(super) async fn rewrite_touched(
    rewrite: &Arc<Rewrite>,
    p: &mut Probes,
    mark: bool,
    parallelism: usize,
) -> Result<Vec<(usize, FileOutcome)>, RunError> {
    let jobs: Vec<(usize, DataFile, BTreeSet<usize>)> = std::mem::take(&mut p.files)
        .into_iter()
        .enumerate()
        .filter_map(|(f, file)| Some((f, file?, p.touched.remove(&f)?)))
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
    let mut done: Vec<(usize, FileOutcome)> = Vec::new();
    while let Some(joined) = outcomes.next().await {
        done.push(joined_or_panic(joined)??);
    }
    for &f in p.direct.keys() {
        if !done.iter().any(|(g, _)| *g == f) {
            let mut o = FileOutcome::new(&p.probed[f].0);
            o.file_rows = p.probed[f].1;
            done.push((f, o));
        }
    }
    done.sort_by_key(|(f, _)| *f);
    Ok(done)
}

/// The planned snapshot's `remove` and `add` of each file, for the files a run changes.
#[allow(deprecated)] // the log's own `add`, kept with a new deletion vector
fn planned_views(
    target: &Target<'_>,
    done: &[(usize, FileOutcome)],
) -> Result<HashMap<String, (deltalake::kernel::Remove, deltalake::kernel::Add)>, RunError> {
    if done.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(target
        .table
        .snapshot()
        .map_err(RunError::delta(Phase::Compare, target.uri))?
        .log_data()
        .iter()
        .map(|v| {
            (
                v.path().to_string(),
                (v.remove_action(true), v.add_action()),
            )
        })
        .collect())
}

/// Step 4: each file's outcome counted, in file order: a file whose rows were marked grows its
/// deletion vector; a rewritten one is replaced (`remove` + `add`).
pub(super) fn merge_outcomes(
    target: &Target<'_>,
    rewrite: &Rewrite,
    done: Vec<(usize, FileOutcome)>,
    p: &mut Probes,
    mark: bool,
    out: &mut Rewritten,
) -> Result<Applied, RunError> {
    let views = planned_views(target, &done)?;
    let view = |path: &str| {
        views.get(path).cloned().ok_or_else(|| RunError::Internal {
            phase: Phase::Compare,
            message: format!("rewrote {path}, which is not in the planned snapshot"),
        })
    };
    let mut a = Applied {
        marked: Vec::new(),
        moved: Vec::new(),
        adds: Vec::new(),
        removes: Vec::new(),
        feed_batches: Vec::new(),
    };
    for (f, mut o) in done {
        if let Some(hits) = p.direct.get(&f) {
            mark::direct(&rewrite.slice, hits, &mut o);
        }
        for i in &o.lost {
            p.found[*i] = Found::Older;
        }
        out.conflicts += o.conflicts;
        out.updated += o.updated;
        out.deleted += o.deleted;
        out.max_sequence = out.max_sequence.max(o.max_sequence);
        out.changed_sequences.extend(o.changed_sequences);
        a.feed_batches.extend(o.feed);
        if o.replaced == 0 {
            continue;
        }
        if mark {
            out.files_marked += 1;
            out.rows_marked += o.marks.len();
            a.moved.extend(o.moved.iter().map(|&i| i as u32));
            let (remove, add) = view(&o.path)?;
            let mut deleted = rewrite.dead.get(&f).cloned().unwrap_or_default();
            deleted |= o.marks;
            a.marked.push(Grown {
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
        if !rewrite.dry_run {
            a.adds.extend(o.add.map(Action::Add));
            a.removes.push(Action::Remove(view(&o.path)?.0));
        }
    }
    Ok(a)
}

/// Step 5: the keys the target does not hold, decided one by one (winners arrive sorted by key
/// from the dedup): the rows of the run's new file, and their feed.
pub(super) fn new_keys(
    slice: &Slice,
    found: &[Found],
    hard: bool,
    out: &mut Rewritten,
) -> (Vec<u32>, FeedRows) {
    let w = &slice.w;
    let mut inserts: Vec<u32> = Vec::new();
    let mut feed = FeedRows::default();
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
    (inserts, feed)
}

/// Step 6: the deletion vectors and the run's new file written at the same time (on an object
/// store each write is a request that mostly waits), then the commit's actions: removes, grown
/// deletion vectors, adds, and the change data feed.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_actions(
    target: &Target<'_>,
    roles: &ColumnRoles,
    winners: &RecordBatch,
    slice: &Slice,
    applied: Applied,
    mut inserts: Vec<u32>,
    feed: FeedRows,
    dry_run: bool,
    out: &mut Rewritten,
) -> Result<Vec<Action>, RunError> {
    let uri = target.uri;
    let schema = &target.fast.schema;
    let Applied {
        marked,
        moved,
        mut adds,
        removes,
        mut feed_batches,
    } = applied;
    // Merge-on-read: the changed keys' new versions join the new keys, in key order.
    inserts.extend(moved);
    inserts.sort_unstable();
    out.rows_written += inserts.len() as u64;
    let marking = async {
        if dry_run {
            return Ok((Vec::new(), 0));
        }
        mark::mark_files(slice, marked).await
    };
    let adding = async {
        if inserts.is_empty() || dry_run {
            return Ok(None);
        }
        let d = |source| RunError::delta(Phase::Compare, uri)(source);
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
    Ok(actions)
}
