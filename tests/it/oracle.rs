//! The correctness oracle: after any sequence of incremental runs, reruns and full reloads over
//! a source with late, out-of-order, duplicated, conflicting, deleted, future-dated and invalid
//! rows, the target equals "newest version per key" computed independently over every valid,
//! due row the source holds — and a rerun changes nothing.

use crate::common;

use chrono::{TimeZone, Utc};
use common::delta_fixture::has_deletion_vectors;
use common::*;
use proptest::prelude::*;
use tidemark::clock::FixedClock;
use tidemark::config::{Pipeline, Vars};
use tidemark::merge::MergeCounters;
use tidemark::pipeline::run;
use tidemark::report::RunSummary;
use tidemark::run::{Engine, RunOptions};

/// What to do after a batch lands.
#[derive(Debug, Clone, Copy)]
enum Action {
    Incremental,
    IncrementalTwice,
    FullReload,
}

#[derive(Debug, Clone)]
struct Event {
    key: Option<u8>,
    /// Minutes after T0; None = null sequence.
    seq_min: Option<i64>,
    /// Arrival batch.
    batch: usize,
    /// Minutes before the batch's time that the row was ingested (0 = exactly on the hour, so
    /// rows of one batch often share the tie-breaker and can conflict).
    ing_back_min: i64,
    val: Option<i64>,
    delete: bool,
    /// Delivered twice (identical row in the same batch).
    duplicated: bool,
}

fn event(batches: usize) -> impl Strategy<Value = Event> {
    (
        prop::option::weighted(0.96, 0u8..6),
        prop::option::weighted(0.97, 0i64..(batches as i64 * 60 + 30)),
        0..batches,
        prop_oneof![3 => Just(0i64), 2 => 0i64..45],
        prop::option::weighted(0.9, 0i64..3),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(key, seq_min, batch, ing_back_min, val, delete, duplicated)| Event {
                key,
                seq_min,
                batch,
                ing_back_min,
                val,
                delete,
                duplicated,
            },
        )
}

fn scenario() -> impl Strategy<Value = (Vec<Event>, Vec<Action>)> {
    (2usize..6).prop_flat_map(|batches| {
        (
            prop::collection::vec(event(batches), 1..40),
            prop::collection::vec(
                prop_oneof![6 => Just(Action::Incremental), 2 => Just(Action::IncrementalTwice), 1 => Just(Action::FullReload)],
                batches,
            ),
        )
    })
}

/// The time batch `b` lands and is processed.
fn batch_time(b: usize) -> i64 {
    T0 + (b as i64 + 1) * HOUR
}

/// A key 71 characters long whose first 70 every key shares: Parquet's writer shortens the
/// statistics of such strings (to 64 bytes), so row groups' key bounds only enclose their keys.
fn long_key(k: u8) -> String {
    format!("{}{k}", "k".repeat(70))
}

fn to_change(e: &Event, long_keys: bool) -> Change {
    let now = batch_time(e.batch);
    Change {
        id: e.key.map(|k| {
            if long_keys {
                long_key(k)
            } else {
                format!("k{k}")
            }
        }),
        seq: e.seq_min.map(|m| T0 + m * MIN),
        ing: now - e.ing_back_min * MIN,
        val: e.val,
        op: if e.delete { "D".into() } else { "U".into() },
    }
}

async fn run_once(p: &Pipeline, now: i64, full_reload: bool) -> RunSummary {
    let clock = FixedClock(Utc.timestamp_micros(now).single().expect("time"));
    let opts = RunOptions {
        full_reload,
        ..RunOptions::default()
    };
    run(p, &opts, &clock, &Engine::default())
        .await
        .unwrap_or_else(|e| panic!("run failed: {e}"))
}

/// The expectation some scenarios add: rows with `val = 2` are quarantined (a delete, whose
/// `val` is null, passes).
const RULE: &str =
    "expectations:\n  - { name: not_two, sql: \"val IS NULL OR val <> 2\", on_fail: quarantine }\n";

/// What a scenario turns on besides the merge itself.
#[derive(Debug, Clone, Copy, Default)]
struct Extras {
    change_data_feed: bool,
    expectation: bool,
    /// `target.apply: deletion_vectors` (merge-on-read) instead of copy-on-write.
    deletion_vectors: bool,
    /// Keys longer than the Parquet statistics keep ([`long_key`]).
    long_keys: bool,
}

async fn check_scenario(
    events: Vec<Event>,
    actions: Vec<Action>,
    row_group_rows: usize,
    extras: Extras,
) -> Result<bool, TestCaseError> {
    let mut saw_deletion_vectors = false;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), "10m", "soft", "");
    if extras.expectation {
        let mut text = std::fs::read_to_string(&path).expect("read");
        text.push_str(RULE);
        std::fs::write(&path, text).expect("write");
    }
    let mut pipeline = Pipeline::load(&path, &Vars::new()).expect("pipeline");
    // Tiny row groups make every rewrite mix copied and re-encoded row groups.
    let tidemark::config::pipeline::Spec::CdcMerge(merge) = &mut pipeline.spec else {
        panic!("write_pipeline writes a cdc_merge pipeline");
    };
    merge.target_row_group_rows = row_group_rows;
    merge.change_data_feed = extras.change_data_feed;
    if extras.deletion_vectors {
        merge.target_apply = tidemark::config::pipeline::Apply::DeletionVectors;
    }
    let mut landed: Vec<Change> = Vec::new();
    let mut last_watermark: Option<i64> = None;
    for (b, action) in actions.iter().enumerate() {
        let now = batch_time(b);
        let mut batch: Vec<Change> = Vec::new();
        for e in events.iter().filter(|e| e.batch == b) {
            let c = to_change(e, extras.long_keys);
            if e.duplicated {
                batch.push(c.clone());
            }
            batch.push(c);
        }
        if !batch.is_empty() {
            append(&bronze(dir.path()), &batch).await;
            landed.extend(batch);
        }
        if version(&bronze(dir.path())).await.is_none() {
            continue; // nothing has landed yet: there is no source table to run on
        }
        let before = match version(&silver(dir.path())).await {
            Some(_) => Some(read_target(&silver(dir.path())).await),
            None => None,
        };
        let summary = run_once(&pipeline, now, matches!(action, Action::FullReload)).await;
        let kept: Vec<Change> = landed
            .iter()
            .filter(|c| !extras.expectation || c.val != Some(2))
            .cloned()
            .collect();
        let expected = oracle(&kept, now, false);
        let actual = read_target(&silver(dir.path())).await;
        let dvs = has_deletion_vectors(&silver(dir.path()));
        prop_assert!(
            extras.deletion_vectors || !dvs,
            "copy-on-write wrote a deletion vector"
        );
        saw_deletion_vectors |= dvs;
        if let (true, Some(before), Some(v)) =
            (extras.change_data_feed, before, summary.target_version)
        {
            // The run's feed applied to the target's live rows before it gives those after it.
            let mut state = live_rows(before);
            let feed = feed_rows(&silver(dir.path()), v, v).await;
            let rows: Vec<(&str, &TargetRow)> =
                feed.iter().map(|(_, k, r)| (k.as_str(), r)).collect();
            if let Err(e) = apply_feed_version(&mut state, &rows) {
                prop_assert!(false, "version {} ({:?}): {}", v, action, e);
            }
            let replayed: Vec<TargetRow> = state.into_values().collect();
            let actual_live: Vec<TargetRow> = live_rows(actual.clone()).into_values().collect();
            prop_assert_eq!(
                &replayed,
                &actual_live,
                "the feed of version {} replayed; summary: {}",
                v,
                summary.to_json()
            );
        }
        prop_assert_eq!(
            &actual,
            &expected,
            "after batch {} ({:?}); summary: {}",
            b,
            action,
            summary.to_json()
        );
        let mut ids: Vec<&str> = actual.iter().map(|r| r.id.as_str()).collect();
        ids.dedup();
        prop_assert_eq!(ids.len(), actual.len(), "duplicate keys in the target");
        let wm = summary
            .counters
            .get::<MergeCounters>()
            .and_then(|c| c.watermark_after)
            .map(|t| t.timestamp_micros());
        prop_assert!(
            wm >= last_watermark.map(|w| w - 1000),
            "watermark went backwards: {:?} -> {:?}",
            last_watermark,
            wm
        );
        last_watermark = wm.or(last_watermark);

        if matches!(action, Action::IncrementalTwice) {
            let before = version(&silver(dir.path())).await;
            let again = run_once(&pipeline, now, false).await;
            prop_assert_eq!(
                again.target_version,
                None,
                "a rerun committed: {}",
                again.to_json()
            );
            prop_assert_eq!(version(&silver(dir.path())).await, before);
            prop_assert_eq!(read_target(&silver(dir.path())).await, expected);
        }
    }
    Ok(saw_deletion_vectors)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        max_shrink_iters: 64,
        .. ProptestConfig::default()
    })]

    #[test]
    fn target_equals_newest_per_key_after_any_sequence_of_runs(
        (events, actions) in scenario(),
        row_group_rows in prop_oneof![Just(1usize), Just(2), Just(8192)],
        change_data_feed in prop::bool::weighted(0.3),
        expectation in prop::bool::weighted(0.3),
        deletion_vectors in prop::bool::weighted(0.5),
        long_keys in prop::bool::weighted(0.2),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(check_scenario(events, actions, row_group_rows, Extras { change_data_feed, expectation, deletion_vectors, long_keys }))?;
    }
}

/// A fixed scenario that exercises every path at once, so a regression shows even with
/// PROPTEST_CASES=0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_deleted_conflicting_and_future_rows_converge() {
    let e = |key, seq_min, batch, ing_back_min, val, delete, duplicated| Event {
        key,
        seq_min,
        batch,
        ing_back_min,
        val,
        delete,
        duplicated,
    };
    let events = vec![
        e(Some(1), Some(10), 0, 5, Some(1), false, true), // re-delivered
        e(Some(1), Some(50), 0, 0, Some(2), false, false), // newer version
        e(Some(2), Some(55), 0, 0, Some(1), false, false),
        e(Some(2), Some(55), 0, 0, Some(2), false, false), // conflict: same tuple, other val
        e(Some(3), Some(200), 0, 0, Some(1), false, false), // future: deferred until batch 2
        e(None, Some(20), 0, 0, Some(1), false, false),    // null key: quarantined
        e(Some(4), None, 1, 0, Some(1), false, false),     // null sequence: quarantined
        e(Some(1), Some(5), 2, 0, Some(9), false, false),  // late and older: ignored
        e(Some(5), Some(1), 2, 0, Some(7), false, false),  // late, new key behind the overlap
        e(Some(2), Some(100), 1, 0, None, true, false),    // delete
        e(Some(2), Some(90), 3, 0, Some(5), false, false), // older than the delete, late: no resurrection
    ];
    let actions = vec![
        Action::Incremental,
        Action::IncrementalTwice,
        Action::Incremental,
        Action::FullReload,
    ];
    for row_group_rows in [1, 8192] {
        for deletion_vectors in [false, true] {
            let extras = Extras {
                deletion_vectors,
                ..Extras::default()
            };
            let saw = check_scenario(events.clone(), actions.clone(), row_group_rows, extras)
                .await
                .unwrap_or_else(|e| {
                    panic!("converges (deletion vectors: {deletion_vectors}): {e}")
                });
            assert_eq!(saw, deletion_vectors, "row groups of {row_group_rows}");
        }
    }
    // Row groups holding more of the slice's keys than the probe compares one by one: it looks
    // every row of them up instead.
    let mut many = events.clone();
    for k in 10..40 {
        many.push(e(Some(k), Some(5), 0, 0, Some(1), false, false));
        if k % 3 != 0 {
            many.push(e(Some(k), Some(130), 2, 0, Some(3), k % 2 == 0, false));
        }
    }
    for deletion_vectors in [false, true] {
        let extras = Extras {
            deletion_vectors,
            ..Extras::default()
        };
        let saw = check_scenario(many.clone(), actions.clone(), 8192, extras)
            .await
            .unwrap_or_else(|e| panic!("converges with many keys per row group (deletion vectors: {deletion_vectors}): {e}"));
        assert_eq!(saw, deletion_vectors);
    }
    // Keys whose row-group statistics are shortened: the probe cannot trust the bounds to
    // say which keys a row group holds.
    for deletion_vectors in [false, true] {
        let extras = Extras {
            deletion_vectors,
            long_keys: true,
            ..Extras::default()
        };
        let saw = check_scenario(events.clone(), actions.clone(), 2, extras)
            .await
            .unwrap_or_else(|e| {
                panic!("converges with long keys (deletion vectors: {deletion_vectors}): {e}")
            });
        assert_eq!(saw, deletion_vectors);
    }
    // The same with the change data feed (each run's feed replayed) and an expectation.
    for deletion_vectors in [false, true] {
        let extras = Extras {
            change_data_feed: true,
            expectation: true,
            deletion_vectors,
            long_keys: false,
        };
        let saw = check_scenario(events.clone(), actions.clone(), 2, extras)
            .await
            .unwrap_or_else(|e| panic!("converges with the feed and an expectation (deletion vectors: {deletion_vectors}): {e}"));
        assert_eq!(saw, deletion_vectors);
    }
}

/// After `restore` to an earlier version, the next incremental run must re-read everything that
/// landed after that version's run — including late rows behind the overlap — and converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_then_incremental_converges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), "10m", "soft", "");
    let pipeline = Pipeline::load(&path, &Vars::new()).expect("pipeline");
    let mut landed = Vec::new();
    let batches = [
        vec![
            Change::upsert("a", T0 + 50 * MIN, T0 + 55 * MIN, 1),
            Change::upsert("b", T0 + 55 * MIN, T0 + 56 * MIN, 1),
        ],
        // late: two hours behind the watermark, new key and an update
        vec![
            Change::upsert("c", T0 - HOUR, T0 + 2 * HOUR, 1),
            Change::upsert("a", T0 + 90 * MIN, T0 + 2 * HOUR, 2),
        ],
        vec![
            Change::upsert("d", T0 - 2 * HOUR, T0 + 3 * HOUR, 1),
            Change::upsert("b", T0 + 150 * MIN, T0 + 3 * HOUR, 2),
        ],
    ];
    for (i, b) in batches.iter().enumerate() {
        append(&bronze(dir.path()), b).await;
        landed.extend(b.clone());
        let s = run_once(&pipeline, T0 + (i as i64 + 1) * HOUR, false).await;
        if i > 0 {
            assert_eq!(
                s.counters.get::<MergeCounters>().map(|c| c.num_late_rows),
                Some(1),
                "{}",
                s.to_json()
            );
        }
    }
    let now = T0 + 3 * HOUR;
    assert_eq!(
        read_target(&silver(dir.path())).await,
        oracle(&landed, now, false)
    );

    let url =
        deltalake::table::builder::parse_table_uri(silver(dir.path()).to_str().expect("utf8"))
            .expect("url");
    let table = deltalake::open_table(url).await.expect("open");
    let outcome = tidemark::lake::restore(table, 0, &[])
        .await
        .expect("restore");
    assert_eq!(
        outcome.source_versions,
        vec![("tidemark/test".to_string(), 0)]
    );
    assert_eq!(
        read_target(&silver(dir.path())).await.len(),
        2,
        "restored to the first run's two rows"
    );

    let s = run_once(&pipeline, now, false).await;
    assert_eq!(
        read_target(&silver(dir.path())).await,
        oracle(&landed, now, false),
        "{}",
        s.to_json()
    );
}

/// Runs with clocks that are wrong by hours in either direction, then a right one (an NTP
/// step, a VM restore, a replay with `TIDEMARK_FAKE_NOW`). A row is in the target once
/// some run since it landed (and since the last full reload) found it due by that run's clock —
/// a run cannot take back what an earlier run merged — and no deferred row is ever lost.
async fn check_clocks(events: Vec<Event>, runs: Vec<(i64, bool)>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), "10m", "soft", "");
    let pipeline = Pipeline::load(&path, &Vars::new()).expect("pipeline");
    // (row, batch it landed in)
    let mut landed: Vec<(Change, usize)> = Vec::new();
    // clock of every run so far, and the index of the last full reload
    let mut clocks: Vec<(usize, i64)> = Vec::new();
    let mut last_full = 0usize;
    let batches = runs.len();
    for (b, (offset_h, full)) in runs.into_iter().enumerate() {
        let mut batch: Vec<Change> = Vec::new();
        for e in events.iter().filter(|e| e.batch == b) {
            batch.push(to_change(e, false));
        }
        if !batch.is_empty() {
            append(&bronze(dir.path()), &batch).await;
            landed.extend(batch.into_iter().map(|c| (c, b)));
        }
        if version(&bronze(dir.path())).await.is_none() {
            continue;
        }
        // the last run always has the right clock
        let offset = if b + 1 == batches { 0 } else { offset_h * HOUR };
        let clock = batch_time(b) + offset;
        let summary = run_once(&pipeline, clock, full).await;
        if full {
            last_full = b;
        }
        clocks.push((b, clock));
        let accepted: Vec<Change> = landed
            .iter()
            .filter(|(c, at)| {
                let since = (*at).max(last_full);
                clocks
                    .iter()
                    .filter(|(run, _)| *run >= since)
                    .any(|(_, clock)| c.seq.is_some_and(|s| s <= clock + SKEW))
            })
            .map(|(c, _)| c.clone())
            .collect();
        let expected = oracle(&accepted, i64::MAX / 2, false);
        let actual = read_target(&silver(dir.path())).await;
        prop_assert_eq!(
            &actual,
            &expected,
            "after batch {} (clock {:+} h, full {}); summary: {}",
            b,
            offset / HOUR,
            full,
            summary.to_json()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
        max_shrink_iters: 64,
        .. ProptestConfig::default()
    })]

    #[test]
    fn deferred_rows_survive_any_sequence_of_clocks(
        (events, runs) in (3usize..7).prop_flat_map(|batches| (
            prop::collection::vec(event(batches), 1..30),
            prop::collection::vec(
                (prop_oneof![2 => Just(0i64), 1 => Just(-10), 1 => Just(-2), 1 => Just(2), 1 => Just(10)],
                 prop::bool::weighted(0.1)),
                batches,
            ),
        )),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(check_clocks(events, runs))?;
    }
}
