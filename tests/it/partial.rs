//! Partial updates (`ignore_null_updates`, `unavailable_marker`) against their order-free
//! definition: after any sequence of incremental runs, reruns and full reloads over records
//! arriving late, out of order, duplicated and deleted, each key's row holds, column by column,
//! the value of its newest record since its last delete that carries one (not null, not the
//! marker) — else the newest record's own. For `cdc_merge` (soft and hard deletes, copy-on-write
//! and deletion vectors) and for an SCD1 `dimension`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::common;

use arrow::array::{
    Array, AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use chrono::{TimeZone, Utc};
use common::*;
use proptest::prelude::*;
use tidemark::clock::FixedClock;
use tidemark::config::{Pipeline, Vars};
use tidemark::pipeline::run;
use tidemark::run::{Engine, RunOptions};

const MARKER: &str = "__debezium_unavailable_value";

/// One change record of the partial feed.
#[derive(Debug, Clone, PartialEq)]
struct Rec {
    id: u8,
    seq: i64,
    ing: i64,
    amount: Option<i64>,
    note: Option<String>,
    delete: bool,
}

/// A key's row as the oracle and the tables say it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    id: String,
    seq: i64,
    amount: Option<i64>,
    note: Option<String>,
    deleted: bool,
}

#[derive(Debug, Clone)]
struct Event {
    key: u8,
    seq_min: i64,
    batch: usize,
    ing_back_min: i64,
    amount: Option<i64>,
    note: Option<&'static str>,
    delete: bool,
    duplicated: bool,
}

fn event(batches: usize) -> impl Strategy<Value = Event> {
    (
        0u8..5,
        0i64..(batches as i64 * 60 + 30),
        0..batches,
        prop_oneof![3 => Just(0i64), 2 => 0i64..45],
        prop::option::weighted(0.5, 0i64..4),
        prop::option::weighted(
            0.7,
            prop_oneof![Just(MARKER), Just("a"), Just("b"), Just("")],
        ),
        prop::bool::weighted(0.12),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(key, seq_min, batch, ing_back_min, amount, note, delete, duplicated)| Event {
                key,
                seq_min,
                batch,
                ing_back_min,
                amount,
                note,
                delete,
                duplicated,
            },
        )
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Incremental,
    IncrementalTwice,
    FullReload,
}

fn actions(batches: usize) -> impl Strategy<Value = Vec<Action>> {
    prop::collection::vec(
        prop_oneof![6 => Just(Action::Incremental), 2 => Just(Action::IncrementalTwice), 1 => Just(Action::FullReload)],
        batches,
    )
}

fn batch_time(b: usize) -> i64 {
    T0 + (b as i64 + 1) * HOUR
}

fn to_rec(e: &Event) -> Rec {
    Rec {
        id: e.key,
        seq: T0 + e.seq_min * MIN,
        ing: batch_time(e.batch) - e.ing_back_min * MIN,
        amount: e.amount,
        note: e.note.map(str::to_string),
        delete: e.delete,
    }
}

fn carries_amount(r: &Rec) -> bool {
    r.amount.is_some()
}

fn carries_note(r: &Rec) -> bool {
    r.note.as_deref().is_some_and(|n| n != MARKER)
}

/// The definition, independently: per key, records ordered by (sequence, ingestion, content as
/// the merge breaks ties: amount, note, deleted — nulls lowest); those after the newest delete;
/// each column from the newest of them that carries one, else the newest record's own.
fn oracle(all: &[Rec], now: i64, hard: bool) -> Vec<Row> {
    let mut by_key: BTreeMap<u8, Vec<&Rec>> = BTreeMap::new();
    for r in all.iter().filter(|r| r.seq <= now + SKEW) {
        by_key.entry(r.id).or_default().push(r);
    }
    let mut out = Vec::new();
    for (id, mut recs) in by_key {
        recs.sort_by(|a, b| {
            (a.seq, a.ing, a.amount, &a.note, a.delete)
                .cmp(&(b.seq, b.ing, b.amount, &b.note, b.delete))
        });
        let Some(newest) = recs.last() else { continue };
        if newest.delete {
            if !hard {
                out.push(row(id, newest, newest.amount, newest.note.clone(), true));
            }
            continue;
        }
        let since = recs.iter().rposition(|r| r.delete).map_or(0, |i| i + 1);
        let live = &recs[since..];
        let amount = live
            .iter()
            .rev()
            .find(|r| carries_amount(r))
            .map_or(newest.amount, |r| r.amount);
        let note = live
            .iter()
            .rev()
            .find(|r| carries_note(r))
            .map_or(newest.note.clone(), |r| r.note.clone());
        out.push(row(id, newest, amount, note, false));
    }
    out.sort();
    out
}

fn row(id: u8, r: &Rec, amount: Option<i64>, note: Option<String>, deleted: bool) -> Row {
    Row {
        id: format!("k{id}"),
        seq: r.seq,
        amount,
        note,
        deleted,
    }
}

fn schema() -> Arc<Schema> {
    let ts = |n: &str, null: bool| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            null,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        ts("updated_at", true),
        ts("_ingested_at", false),
        Field::new("amount", DataType::Int64, true),
        Field::new("note", DataType::Utf8, true),
        Field::new("op", DataType::Utf8, false),
    ]))
}

fn to_batch(recs: &[Rec]) -> RecordBatch {
    let ts = |v: Vec<i64>| TimestampMicrosecondArray::from(v).with_timezone("UTC");
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                recs.iter().map(|r| format!("k{}", r.id)),
            )),
            Arc::new(ts(recs.iter().map(|r| r.seq).collect())),
            Arc::new(ts(recs.iter().map(|r| r.ing).collect())),
            Arc::new(Int64Array::from_iter(recs.iter().map(|r| r.amount))),
            Arc::new(StringArray::from_iter(recs.iter().map(|r| r.note.clone()))),
            Arc::new(StringArray::from_iter_values(recs.iter().map(|r| {
                if r.delete {
                    "D"
                } else {
                    "U"
                }
            }))),
        ],
    )
    .expect("batch")
}

/// The rows of a merge target or an SCD1 dimension (`_deleted` false when absent).
async fn read_rows(path: &Path) -> Vec<Row> {
    rows_of_batches(&read_all(path).await)
}

/// The post-images (inserts and updates) of version `v`'s change data feed.
async fn post_images(path: &Path, v: u64) -> Vec<Row> {
    let table = open_table(path).await;
    let ctx = datafusion::prelude::SessionContext::new();
    let plan = table
        .scan_cdf()
        .with_starting_version(v)
        .with_ending_version(v)
        .build(&ctx.state(), None)
        .await
        .expect("cdf plan");
    let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .expect("cdf");
    let mut post = Vec::new();
    for b in batches {
        let kind = arrow::compute::cast(
            b.column_by_name("_change_type").expect("t"),
            &DataType::Utf8,
        )
        .expect("cast");
        let keep: arrow::array::BooleanArray = kind
            .as_string::<i32>()
            .iter()
            .map(|k| Some(matches!(k, Some("insert" | "update_postimage"))))
            .collect();
        post.push(arrow::compute::filter_record_batch(&b, &keep).expect("filter"));
    }
    rows_of_batches(&post)
}

fn rows_of_batches(batches: &[RecordBatch]) -> Vec<Row> {
    let mut rows = Vec::new();
    for b in batches {
        let text = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect("column"), &DataType::Utf8)
                .expect("cast")
                .as_string::<i32>()
                .clone()
        };
        let id = text("id");
        let seq = b
            .column_by_name("updated_at")
            .expect("updated_at")
            .as_primitive::<TimestampMicrosecondType>()
            .clone();
        let amount = b
            .column_by_name("amount")
            .expect("amount")
            .as_primitive::<arrow::datatypes::Int64Type>()
            .clone();
        let note = text("note");
        let del = b.column_by_name("_deleted").map(|c| c.as_boolean().clone());
        for i in 0..b.num_rows() {
            rows.push(Row {
                id: id.value(i).to_string(),
                seq: seq.value(i),
                amount: amount.is_valid(i).then(|| amount.value(i)),
                note: note.is_valid(i).then(|| note.value(i).to_string()),
                deleted: del.as_ref().is_some_and(|d| d.value(i)),
            });
        }
    }
    rows.sort();
    rows
}

fn merge_yaml(lake: &Path, mode: &str, apply: &str) -> String {
    format!(
        "name: partial\nkind: cdc_merge\nsource: {{ uri: \"{l}/bronze\" }}\ntarget: {{ uri: \"{l}/silver\", apply: {apply}, row_group_rows: 2 }}\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 10m\nmax_future_skew: 5m\ndeletes: {{ column: op, values: [D], mode: {mode} }}\ncolumns: {{ exclude: [op] }}\nignore_null_updates: true\nunavailable_marker: {MARKER}\nquarantine: {{ uri: \"{l}/quarantine\" }}\n",
        l = lake.display()
    )
}

async fn run_at(p: &Pipeline, now: i64, full_reload: bool) -> tidemark::report::RunSummary {
    let clock = FixedClock(Utc.timestamp_micros(now).single().expect("time"));
    let opts = RunOptions {
        full_reload,
        ..RunOptions::default()
    };
    run(p, &opts, &clock, &Engine::default())
        .await
        .unwrap_or_else(|e| panic!("run failed: {e}"))
}

async fn check_merge(
    events: Vec<Event>,
    actions: Vec<Action>,
    hard: bool,
    deletion_vectors: bool,
    feed: bool,
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("partial.yml");
    let mode = if hard { "hard" } else { "soft" };
    let apply = if deletion_vectors {
        "deletion_vectors"
    } else {
        "copy_on_write"
    };
    let mut yaml = merge_yaml(&lake, mode, apply);
    if feed {
        yaml = yaml.replace(
            "row_group_rows: 2",
            "row_group_rows: 2, change_data_feed: true",
        );
    }
    std::fs::write(&path, yaml).expect("write");
    let pipeline = Pipeline::load(&path, &Vars::new()).expect("pipeline");
    let mut landed: Vec<Rec> = Vec::new();
    for (b, action) in actions.iter().enumerate() {
        let mut batch = Vec::new();
        for e in events.iter().filter(|e| e.batch == b) {
            if e.duplicated {
                batch.push(to_rec(e));
            }
            batch.push(to_rec(e));
        }
        if !batch.is_empty() {
            append_batch(&lake.join("bronze"), to_batch(&batch)).await;
            landed.extend(batch);
        }
        if version(&lake.join("bronze")).await.is_none() {
            continue;
        }
        let now = batch_time(b);
        let summary = run_at(&pipeline, now, matches!(action, Action::FullReload)).await;
        let expected = oracle(&landed, now, hard);
        if let (true, Some(v), false) = (
            feed,
            summary.target_version,
            matches!(action, Action::FullReload),
        ) {
            // the feed's post-images are the rows as filled, not the records as sent
            for post in post_images(&lake.join("silver"), v).await {
                prop_assert!(
                    expected.contains(&post),
                    "version {}: post-image {:?} is not a row of {:?}",
                    v,
                    post,
                    expected
                );
            }
        }
        prop_assert_eq!(
            read_rows(&lake.join("silver")).await,
            expected.clone(),
            "after batch {} ({:?}); summary: {}",
            b,
            action,
            summary.to_json()
        );
        if matches!(action, Action::IncrementalTwice) {
            let again = run_at(&pipeline, now, false).await;
            prop_assert_eq!(
                again.target_version,
                None,
                "a rerun committed: {}",
                again.to_json()
            );
            prop_assert_eq!(read_rows(&lake.join("silver")).await, expected);
        }
    }
    Ok(())
}

fn scenario() -> impl Strategy<Value = (Vec<Event>, Vec<Action>)> {
    (2usize..6).prop_flat_map(|batches| {
        (
            prop::collection::vec(event(batches), 1..40),
            actions(batches),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
        max_shrink_iters: 64,
        .. ProptestConfig::default()
    })]

    #[test]
    fn merge_keeps_the_newest_carried_value_per_column_in_any_order(
        (events, actions) in scenario(),
        hard in prop::bool::weighted(0.3),
        deletion_vectors in prop::bool::weighted(0.4),
        feed in prop::bool::weighted(0.3),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(check_merge(events, actions, hard, deletion_vectors, feed))?;
    }
}

/// A fixed scenario covering each case at once, so a regression shows with PROPTEST_CASES=0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_partial_records_fill_and_are_filled_as_the_definition_says() {
    let e = |key, seq_min, batch, amount, note, delete| Event {
        key,
        seq_min,
        batch,
        ing_back_min: 0,
        amount,
        note,
        delete,
        duplicated: false,
    };
    let events = vec![
        // key 1: full row, then an update sending neither column (TOAST + null)
        e(1, 10, 0, Some(1), Some("a"), false),
        e(1, 50, 0, None, Some(MARKER), false),
        // ...then, hours late, a record between them carrying a new note only
        e(1, 30, 3, None, Some("b"), false),
        // key 2: a delete resets: the update after it keeps nothing from before
        e(2, 5, 0, Some(3), Some("a"), false),
        e(2, 70, 1, None, None, true),
        e(2, 80, 1, None, Some(MARKER), false),
        // key 3: never sent: keeps the feed's own values (null and the marker)
        e(3, 100, 1, None, Some(MARKER), false),
        // key 4: in-order partial updates across runs (the target fills them)
        e(4, 20, 0, Some(2), Some("a"), false),
        e(4, 90, 1, None, Some(MARKER), false),
        e(4, 150, 2, Some(3), None, false),
        // key 0: a late record older than a later delete brings nothing back
        e(0, 15, 0, Some(1), Some("a"), false),
        e(0, 60, 0, None, None, true),
        e(0, 40, 3, Some(2), Some("b"), false),
    ];
    let actions = vec![
        Action::Incremental,
        Action::IncrementalTwice,
        Action::Incremental,
        Action::Incremental,
    ];
    for hard in [false, true] {
        for dv in [false, true] {
            check_merge(events.clone(), actions.clone(), hard, dv, !hard)
                .await
                .unwrap_or_else(|e| panic!("hard {hard}, deletion vectors {dv}: {e}"));
        }
    }
    let mut reload = actions.clone();
    reload[3] = Action::FullReload;
    check_merge(events, reload, false, false, true)
        .await
        .unwrap_or_else(|e| panic!("full reload: {e}"));
}

/// A dimension's rows per the definition: each version of a key (SCD2) holds the values in
/// force once its opening record applied; SCD1 keeps the current ones. Records here never share
/// a sequence within a key (a dimension breaks such ties deletes-last, the merge by content).
fn dimension_oracle(all: &[Rec], scd2: bool) -> Vec<(Row, bool)> {
    let mut by_key: BTreeMap<u8, Vec<&Rec>> = BTreeMap::new();
    for r in all {
        by_key.entry(r.id).or_default().push(r);
    }
    let mut out = Vec::new();
    for (id, mut recs) in by_key {
        recs.sort_by_key(|r| (r.seq, r.ing));
        recs.dedup_by(|a, b| a == b);
        // (values in force, is it a version start) per record, folded oldest first
        let mut state: Option<(Option<i64>, Option<String>)> = None;
        let mut versions: Vec<(Row, bool)> = Vec::new();
        for r in &recs {
            if r.delete {
                state = None;
                if let Some(v) = versions.last_mut() {
                    v.1 = false;
                }
                continue;
            }
            let (amount, note) = match &state {
                Some((a, n)) => (
                    if carries_amount(r) { r.amount } else { *a },
                    if carries_note(r) {
                        r.note.clone()
                    } else {
                        n.clone()
                    },
                ),
                None => (r.amount, r.note.clone()),
            };
            // (SCD2: a change of the tracked columns — all of them here — opens a version)
            let opens = match &state {
                None => true,
                Some((a, n)) => scd2 && (*a, n) != (amount, &note),
            };
            state = Some((amount, note.clone()));
            let row = Row {
                id: format!("k{id}"),
                seq: r.seq,
                amount,
                note,
                deleted: false,
            };
            match versions.last_mut() {
                Some(v) if !opens && v.1 => v.0 = row,
                _ => {
                    if let Some(v) = versions.last_mut() {
                        v.1 = false;
                    }
                    versions.push((row, true));
                }
            }
        }
        out.extend(versions);
    }
    if !scd2 {
        out.retain(|v| v.1);
    }
    out.sort();
    out
}

fn dimension_yaml(lake: &Path, scd2: bool) -> String {
    let history = if scd2 { "scd2" } else { "scd1" };
    format!(
        "name: partial_dim\nkind: dimension\nsource: {{ uri: \"{l}/bronze\" }}\ntarget: {{ uri: \"{l}/dim\" }}\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\ndeletes: {{ column: op, values: [D] }}\ncolumns: {{ exclude: [op] }}\nhistory: {history}\nignore_null_updates: true\nunavailable_marker: {MARKER}\nquarantine: {{ uri: \"{l}/dim_quarantine\" }}\n",
        l = lake.display()
    )
}

/// A dimension's rows with whether each is current (SCD1: all are).
async fn read_versions(path: &Path) -> Vec<(Row, bool)> {
    let mut out = Vec::new();
    for b in read_all(path).await {
        let current = b
            .column_by_name("is_current")
            .map(|c| c.as_boolean().clone());
        let rows = {
            let mut rows = Vec::new();
            let text = |c: &str| {
                arrow::compute::cast(b.column_by_name(c).expect("column"), &DataType::Utf8)
                    .expect("cast")
                    .as_string::<i32>()
                    .clone()
            };
            let (id, note) = (text("id"), text("note"));
            let seq = b
                .column_by_name("updated_at")
                .expect("updated_at")
                .as_primitive::<TimestampMicrosecondType>()
                .clone();
            let amount = b
                .column_by_name("amount")
                .expect("amount")
                .as_primitive::<arrow::datatypes::Int64Type>()
                .clone();
            for i in 0..b.num_rows() {
                rows.push(Row {
                    id: id.value(i).to_string(),
                    seq: seq.value(i),
                    amount: amount.is_valid(i).then(|| amount.value(i)),
                    note: note.is_valid(i).then(|| note.value(i).to_string()),
                    deleted: false,
                });
            }
            rows
        };
        for (i, r) in rows.into_iter().enumerate() {
            out.push((r, current.as_ref().is_none_or(|c| c.value(i))));
        }
    }
    out.sort();
    out
}

async fn check_dimension(
    events: Vec<Event>,
    actions: Vec<Action>,
    scd2: bool,
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("dim.yml");
    std::fs::write(&path, dimension_yaml(&lake, scd2)).expect("write");
    let pipeline = Pipeline::load(&path, &Vars::new()).expect("pipeline");
    // one record per key and sequence (see `dimension_oracle`)
    let mut seen = std::collections::HashSet::new();
    let events: Vec<Event> = events
        .into_iter()
        .filter(|e| seen.insert((e.key, e.seq_min)))
        .collect();
    let mut landed: Vec<Rec> = Vec::new();
    for (b, action) in actions.iter().enumerate() {
        let mut batch = Vec::new();
        for e in events.iter().filter(|e| e.batch == b) {
            if e.duplicated {
                batch.push(to_rec(e));
            }
            batch.push(to_rec(e));
        }
        if !batch.is_empty() {
            append_batch(&lake.join("bronze"), to_batch(&batch)).await;
            landed.extend(batch);
        }
        if version(&lake.join("bronze")).await.is_none() {
            continue;
        }
        let summary = run_at(
            &pipeline,
            batch_time(b),
            matches!(action, Action::FullReload),
        )
        .await;
        prop_assert_eq!(
            read_versions(&lake.join("dim")).await,
            dimension_oracle(&landed, scd2),
            "after batch {} ({:?}); summary: {}",
            b,
            action,
            summary.to_json()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        max_shrink_iters: 64,
        .. ProptestConfig::default()
    })]

    #[test]
    fn dimension_versions_hold_the_values_in_force_in_any_order(
        (events, actions) in scenario(),
        scd2 in prop::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(check_dimension(events, actions, scd2))?;
    }
}

/// Through the binary: turning partial updates on for a merge target built without them is a
/// definition change — refused (65, nothing written) until a full reload rebuilds the rows,
/// after which the hourly runs fill as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_partial_updates_on_asks_for_a_full_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let path = dir.path().join("partial.yml");
    let plain = merge_yaml(&lake, "soft", "copy_on_write")
        .replace("ignore_null_updates: true\n", "")
        .replace(&format!("unavailable_marker: {MARKER}\n"), "");
    std::fs::write(&path, &plain).expect("write");
    let rec = |seq_min: i64, amount: Option<i64>, note: Option<&str>| Rec {
        id: 1,
        seq: T0 + seq_min * MIN,
        ing: T0 + seq_min * MIN,
        amount,
        note: note.map(str::to_string),
        delete: false,
    };
    append_batch(
        &lake.join("bronze"),
        to_batch(&[rec(10, Some(5), Some("a"))]),
    )
    .await;
    let p = path.to_str().expect("utf8");
    let first = exec(tidemark_at(T0 + HOUR).args(["run", p]));
    assert_eq!(first.code, 0, "{first:?}");
    append_batch(
        &lake.join("bronze"),
        to_batch(&[rec(70, None, Some(MARKER))]),
    )
    .await;
    std::fs::write(&path, merge_yaml(&lake, "soft", "copy_on_write")).expect("write");
    let before = version(&lake.join("silver")).await;
    let refused = exec(tidemark_at(T0 + 2 * HOUR).args(["run", p]));
    assert_eq!(refused.code, 65, "{refused:?}");
    assert!(
        refused.stderr.contains("`ignore_null_updates`")
            && refused.stderr.contains("--full-reload"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        version(&lake.join("silver")).await,
        before,
        "nothing written"
    );
    let reload = exec(tidemark_at(T0 + 2 * HOUR).args(["run", p, "--full-reload"]));
    assert_eq!(reload.code, 0, "{reload:?}");
    let row = |seq_min: i64| Row {
        id: "k1".into(),
        seq: T0 + seq_min * MIN,
        amount: Some(5),
        note: Some("a".into()),
        deleted: false,
    };
    assert_eq!(read_rows(&lake.join("silver")).await, vec![row(70)]);
    append_batch(&lake.join("bronze"), to_batch(&[rec(130, None, None)])).await;
    let hourly = exec(tidemark_at(T0 + 3 * HOUR).args(["run", p]));
    assert_eq!(hourly.code, 0, "{hourly:?}");
    assert_eq!(read_rows(&lake.join("silver")).await, vec![row(130)]);
}
