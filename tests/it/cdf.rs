//! `target.change_data_feed: true`: the target keeps a Delta change data feed, and an incremental
//! run's feed holds exactly the rows it changed (read back with delta-rs' CDF reader, an
//! implementation independent of tidemark's writes), whether tidemark turned the feed on or
//! another tool set the table property.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use datafusion::prelude::SessionContext;

fn with_feed(dir: &Path) -> std::path::PathBuf {
    let p = write_pipeline(dir, "15m", "soft", "");
    let text = std::fs::read_to_string(&p).expect("read");
    let text = text.replacen("/silver\" }", "/silver\", change_data_feed: true }", 1);
    assert!(text.contains("change_data_feed: true"), "{text}");
    std::fs::write(&p, text).expect("write");
    p
}

fn run(p: &Path, now: i64) -> Out {
    exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"]),
    )
}

/// The feed between two versions: (change type, id, val), sorted.
async fn feed(dir: &Path, from: u64, to: u64) -> Vec<(String, String, Option<i64>)> {
    let mut out: Vec<(String, String, Option<i64>)> = feed_rows(&dir.join("lake/silver"), from, to)
        .await
        .into_iter()
        .map(|(_, kind, row)| (kind, row.id, row.val))
        .collect();
    out.sort();
    out
}

fn version_of(summary: &serde_json::Value) -> u64 {
    summary["target_version"].as_u64().expect("committed")
}

#[tokio::test]
async fn the_feed_holds_exactly_the_rows_a_run_changed() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = with_feed(d);
    let rows: Vec<Change> = (0..100)
        .map(|i| Change::upsert(&format!("k{i:03}"), T0 + i * MIN, T0 + i * MIN, i))
        .collect();
    append(&bronze(d), &rows).await;
    let first = run(&p, T0 + 3 * HOUR);
    assert_eq!(first.code, 0, "{}", first.stderr);
    // One payment changes, one is new, one is deleted (soft: a tombstone, a `delete` in the feed).
    append(
        &bronze(d),
        &[
            Change::upsert("k005", T0 + 3 * HOUR, T0 + 3 * HOUR, 500),
            Change::upsert("k900", T0 + 3 * HOUR, T0 + 3 * HOUR, 900),
            Change::delete("k007", T0 + 3 * HOUR, T0 + 3 * HOUR),
        ],
    )
    .await;
    let out = run(&p, T0 + 4 * HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    let v = version_of(&s);
    let changes = feed(d, v, v).await;
    let kinds: BTreeMap<&str, usize> = changes.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.0.as_str()).or_default() += 1;
        m
    });
    // 100 rows in the table, 3 changed: the feed names those 3 and nothing else (a copy-on-write
    // rewrite without `_change_data` files would show the whole rewritten file deleted and added).
    assert_eq!(
        kinds,
        BTreeMap::from([
            ("delete", 1),
            ("insert", 1),
            ("update_postimage", 1),
            ("update_preimage", 1)
        ]),
        "{changes:?}"
    );
    assert!(changes.contains(&("update_preimage".into(), "k005".into(), Some(5))));
    assert!(changes.contains(&("update_postimage".into(), "k005".into(), Some(500))));
    assert!(changes.contains(&("insert".into(), "k900".into(), Some(900))));
    // The delete carries the row as it was before (the feed describes the live table).
    assert!(
        changes.contains(&("delete".into(), "k007".into(), Some(7))),
        "{changes:?}"
    );
    // `tidemark changes` says the same, with the keys.
    let out = exec(tidemark_at(T0 + 4 * HOUR).arg("changes").arg(&p).args([
        "--from-version",
        &v.to_string(),
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let c: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(
        c["totals"],
        serde_json::json!({"insert": 1, "update_preimage": 1, "update_postimage": 1, "delete": 1}),
        "{c}"
    );
    assert_eq!(
        c["keys"]["insert"],
        serde_json::json!(["id=\"k900\""]),
        "{c}"
    );
    assert_eq!(c["versions"][0]["version"], v);
    let text = exec(
        tidemark_at(T0 + 4 * HOUR)
            .arg("changes")
            .arg(&p)
            .args(["--from-version", &v.to_string()]),
    );
    assert!(
        text.stdout.contains("updated: id=\"k005\"")
            && text.stdout.contains("deleted: id=\"k007\""),
        "{}",
        text.stdout
    );
    let bad = exec(
        tidemark_at(T0 + 4 * HOUR)
            .arg("changes")
            .arg(&p)
            .args(["--from-version", "99"]),
    );
    assert_eq!(bad.code, 64, "{}", bad.stderr);
    // A rerun with nothing new writes nothing.
    let again = run(&p, T0 + 5 * HOUR);
    let s: serde_json::Value = serde_json::from_str(again.stdout.trim()).expect("json");
    assert!(s["target_version"].is_null(), "{s}");
}

#[tokio::test]
async fn the_feed_is_turned_on_for_an_existing_target_and_honoured_when_set_elsewhere() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let plain = write_pipeline(d, "15m", "soft", "");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0, T0, 1),
            Change::upsert("b", T0, T0, 2),
        ],
    )
    .await;
    assert_eq!(run(&plain, T0 + HOUR).code, 0);
    let none = exec(
        tidemark_at(T0 + HOUR)
            .arg("changes")
            .arg(&plain)
            .args(["--from-version", "0"]),
    );
    assert_eq!(none.code, 64, "{}", none.stderr);
    assert!(
        none.stderr.contains("change_data_feed: true"),
        "{}",
        none.stderr
    );
    // The pipeline asks for the feed: the next run turns it on (its own commit) and writes it.
    let p = with_feed(d);
    append(&bronze(d), &[Change::upsert("a", T0 + HOUR, T0 + HOUR, 10)]).await;
    let out = run(&p, T0 + 2 * HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Versions from before the feed was on have no change files: asking for them is refused.
    let early = exec(
        tidemark_at(T0 + 2 * HOUR)
            .arg("changes")
            .arg(&p)
            .args(["--from-version", "0"]),
    );
    assert_eq!(early.code, 64, "{}", early.stderr);
    assert!(
        early.stderr.contains("starts at version 1"),
        "{}",
        early.stderr
    );
    let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert!(
        s["warnings"]
            .to_string()
            .contains("turned on the change data feed"),
        "{s}"
    );
    let v = version_of(&s);
    let changes = feed(d, v, v).await;
    assert_eq!(changes.len(), 2, "{changes:?}");

    // A table whose property another tool set: the plain pipeline honours it too.
    let other = tempfile::tempdir().expect("tmp");
    let o = other.path();
    let plain = write_pipeline(o, "15m", "soft", "");
    append(
        &bronze(o),
        &[
            Change::upsert("a", T0, T0, 1),
            Change::upsert("b", T0, T0, 2),
        ],
    )
    .await;
    assert_eq!(run(&plain, T0 + HOUR).code, 0);
    let url =
        deltalake::table::builder::parse_table_uri(o.join("lake/silver").to_str().expect("utf8"))
            .expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            "delta.enableChangeDataFeed".to_string(),
            "true".to_string(),
        )]))
        .await
        .expect("set property");
    append(&bronze(o), &[Change::upsert("b", T0 + HOUR, T0 + HOUR, 20)]).await;
    let out = run(&plain, T0 + 2 * HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    let v = version_of(&s);
    let changes = feed(o, v, v).await;
    assert_eq!(
        changes,
        vec![
            ("update_postimage".to_string(), "b".to_string(), Some(20)),
            ("update_preimage".to_string(), "b".to_string(), Some(2)),
        ]
    );
}

/// Every row of the target at `version` (time travel).
async fn rows_at(dir: &Path, version: u64) -> Vec<TargetRow> {
    let path = dir.join("lake/silver");
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    let mut table = deltalake::DeltaTableBuilder::from_url(url)
        .expect("builder")
        .build()
        .expect("table");
    table.load_version(version).await.expect("load version");
    let ctx = SessionContext::new();
    table
        .update_datafusion_session(&ctx.state())
        .expect("register store");
    let provider = table.table_provider().await.expect("provider");
    rows_of(
        &ctx.read_table(provider)
            .expect("read")
            .collect()
            .await
            .expect("collect"),
    )
}

/// A week of changes landing hourly, merged every 8 hours (late rows, re-deliveries, soft and hard deletes): the feed replayed
/// onto the first version reproduces every later version.
#[tokio::test]
async fn the_feed_replayed_reproduces_every_version() {
    for mode in ["soft", "hard"] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let p = write_pipeline(d, "15m", mode, "");
        let text = std::fs::read_to_string(&p).expect("read");
        std::fs::write(
            &p,
            text.replacen("/silver\" }", "/silver\", change_data_feed: true }", 1),
        )
        .expect("write");
        let mut versions = Vec::new();
        let mut batch = Vec::new();
        for hour in 0..24 * 7i64 {
            let now = T0 + hour * HOUR;
            for j in 0..3i64 {
                let id = format!("k{:02}", (hour * 7 + j * 13) % 40);
                // Most changes are fresh; every fifth is an hour late; every 17th is a delete.
                let seq = if (hour + j) % 5 == 0 {
                    now - HOUR
                } else {
                    now - 5 * MIN
                };
                if (hour * 3 + j) % 17 == 0 {
                    batch.push(Change::delete(&id, seq, now));
                } else {
                    batch.push(Change::upsert(&id, seq, now, hour * 10 + j));
                }
            }
            if hour % 8 != 7 {
                continue; // a run every 8 hours: 21 runs over the week
            }
            // The 8 hours' records land in one source commit (each with its own arrival time).
            append(&bronze(d), &std::mem::take(&mut batch)).await;
            let out = exec(
                tidemark_at(now)
                    .arg("run")
                    .arg(&p)
                    .args(["--output", "json"]),
            );
            assert_eq!(out.code, 0, "{}", out.stderr);
            let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
            if let Some(v) = s["target_version"].as_u64() {
                versions.push(v);
            }
        }
        assert!(versions.len() > 15, "{mode}: {versions:?}");
        let (first, last) = (versions[0], versions[versions.len() - 1]);
        let mut state = live_rows(rows_at(d, first).await);
        let changes = feed_rows(&silver(d), first + 1, last).await;
        for &v in &versions[1..] {
            let rows: Vec<(&str, &TargetRow)> = changes
                .iter()
                .filter(|c| c.0 == v as i64)
                .map(|(_, k, r)| (k.as_str(), r))
                .collect();
            apply_feed_version(&mut state, &rows).unwrap_or_else(|e| panic!("{mode} v{v}: {e}"));
            let replayed: Vec<TargetRow> = state.values().cloned().collect();
            assert_eq!(
                replayed,
                live_rows(rows_at(d, v).await)
                    .into_values()
                    .collect::<Vec<_>>(),
                "{mode}: version {v} from the feed"
            );
        }
    }
}

/// A full reload of a target with the feed writes the difference: the rows that a foreign edit
/// changed come back as updates, a foreign insert is deleted, everything else stays out of the
/// feed; the table ends up what a reload writes.
#[tokio::test]
async fn a_full_reload_feeds_only_the_difference() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = with_feed(d);
    let rows: Vec<Change> = (0..50)
        .map(|i| Change::upsert(&format!("k{i:03}"), T0 + i * MIN, T0 + i * MIN, i))
        .collect();
    append(&bronze(d), &rows).await;
    assert_eq!(run(&p, T0 + 2 * HOUR).code, 0);
    let expected = read_target(&silver(d)).await;
    // Damage the target behind tidemark's back: one row edited, one row added.
    let url =
        deltalake::table::builder::parse_table_uri(silver(d).to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url.clone()).await.expect("open");
    let (table, _) = table
        .update()
        .with_predicate(datafusion::prelude::col("id").eq(datafusion::prelude::lit("k010")))
        .with_update("val", datafusion::prelude::lit(999i64))
        .await
        .expect("foreign update");
    let batch = {
        let b = read_all(&silver(d)).await;
        let one = b
            .iter()
            .find(|b| b.num_rows() > 0)
            .expect("rows")
            .slice(0, 1);
        let one = tidemark::lake::storage::storage_batch(&one).expect("storage types");
        let ids = arrow::array::StringArray::from(vec!["zzz"]);
        let idx = one.schema().index_of("id").expect("id");
        let mut cols = one.columns().to_vec();
        cols[idx] = std::sync::Arc::new(ids);
        arrow::array::RecordBatch::try_new(one.schema(), cols).expect("batch")
    };
    table
        .write(vec![batch])
        .with_save_mode(deltalake::protocol::SaveMode::Append)
        .await
        .expect("foreign insert");
    let out = exec(tidemark_at(T0 + 3 * HOUR).arg("run").arg(&p).args([
        "--full-reload",
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(
        (
            s["num_updated"].as_u64(),
            s["num_deleted"].as_u64(),
            s["num_inserted"].as_u64()
        ),
        (Some(1), Some(1), Some(0)),
        "{s}"
    );
    let v = version_of(&s);
    let changes = feed(d, v, v).await;
    let names: Vec<(&str, &str)> = changes
        .iter()
        .map(|c| (c.0.as_str(), c.1.as_str()))
        .collect();
    assert_eq!(names[0], ("delete", "zzz"), "{changes:?}");
    assert_eq!(
        changes[1..].to_vec(),
        vec![
            ("update_postimage".to_string(), "k010".to_string(), Some(10)),
            ("update_preimage".to_string(), "k010".to_string(), Some(999)),
        ],
        "50 rows, 2 differences: the feed names those, not 100 changes"
    );
    assert_eq!(read_target(&silver(d)).await, expected);
}

/// The runs that go through delta-rs' MERGE — one that adds a column, and full reloads — feed
/// the live table like the copy-on-write path: a tombstone is a `delete` of the live row, a
/// live version over a tombstone an `insert`, a tombstone over a tombstone (or for a key never
/// seen) nothing, and a full reload that changes no row feeds no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_paths_feed_the_live_table() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = with_feed(d);
    let mut text = std::fs::read_to_string(&p).expect("read");
    text.push_str("on_schema_change: add_new_columns\n");
    std::fs::write(&p, text).expect("write");
    let mut rows: Vec<Change> = (0..10)
        .map(|i| Change::upsert(&format!("k{i:03}"), T0 + i * MIN, T0 + i * MIN, i))
        .collect();
    rows.push(Change::delete("k007", T0 + 20 * MIN, T0 + 20 * MIN));
    rows.push(Change::delete("k008", T0 + 20 * MIN, T0 + 20 * MIN));
    append(&bronze(d), &rows).await;
    assert_eq!(run(&p, T0 + 2 * HOUR).code, 0);
    let before = live_rows(read_target(&silver(d)).await);

    // A producer adds `fee`: the run adds the column, through delta-rs' MERGE.
    let t = T0 + 2 * HOUR;
    crate::schema::append_with_fee(
        &bronze(d),
        &[
            Change::upsert("k001", t, t, 100), // live -> live: an update
            Change::delete("k002", t, t),      // live -> tombstone: a delete
            Change::upsert("k008", t, t, 800), // tombstone -> live: an insert
            Change::delete("k007", t, t),      // tombstone -> newer tombstone: nothing
            Change::delete("k010", t, t),      // a tombstone for a key never seen: nothing
            Change::upsert("k011", t, t, 11),  // a new key: an insert
        ],
        &[Some(1), None, Some(8), None, None, Some(11)],
    )
    .await;
    let out = run(&p, T0 + 3 * HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    let v = version_of(&s);
    let changes = feed(d, v, v).await;
    assert_eq!(
        changes,
        vec![
            ("delete".into(), "k002".into(), Some(2)),
            ("insert".into(), "k008".into(), Some(800)),
            ("insert".into(), "k011".into(), Some(11)),
            ("update_postimage".into(), "k001".into(), Some(100)),
            ("update_preimage".into(), "k001".into(), Some(1)),
        ],
        "the feed of the run that added `fee`"
    );
    let mut state = before;
    let all = feed_rows(&silver(d), v, v).await;
    let rows: Vec<(&str, &TargetRow)> = all.iter().map(|(_, k, r)| (k.as_str(), r)).collect();
    apply_feed_version(&mut state, &rows).expect("replays");
    assert_eq!(state, live_rows(read_target(&silver(d)).await));

    // A full reload that changes nothing feeds nothing (not every row deleted and inserted).
    let out = run_full(&p, T0 + 4 * HOUR);
    assert!(
        out["target_version"].is_null(),
        "a no-change reload commits nothing: {out}"
    );
    assert_eq!(version(&silver(d)).await, Some(v));

    // A full reload that picks up a tombstone and a revival feeds exactly those.
    let t = T0 + 4 * HOUR;
    crate::schema::append_with_fee(
        &bronze(d),
        &[
            Change::delete("k003", t, t),
            Change::upsert("k002", t, t, 22),
        ],
        &[None, Some(2)],
    )
    .await;
    let before = live_rows(read_target(&silver(d)).await);
    let out = run_full(&p, T0 + 5 * HOUR);
    let v = out["target_version"].as_u64().expect("committed");
    assert_eq!(
        feed(d, v, v).await,
        vec![
            ("delete".into(), "k003".into(), Some(3)),
            ("insert".into(), "k002".into(), Some(22)),
        ],
        "{out}"
    );
    let mut state = before;
    let all = feed_rows(&silver(d), v, v).await;
    let rows: Vec<(&str, &TargetRow)> = all.iter().map(|(_, k, r)| (k.as_str(), r)).collect();
    apply_feed_version(&mut state, &rows).expect("replays");
    assert_eq!(state, live_rows(read_target(&silver(d)).await));
}

fn run_full(p: &Path, now: i64) -> serde_json::Value {
    let out = exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--full-reload", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

/// `maintain` removing expired tombstones changes no live row: its commit's feed is empty.
#[tokio::test]
async fn removing_expired_tombstones_feeds_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = with_feed(d);
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace("mode: soft }", "mode: soft, retain: 1d }");
    assert!(text.contains("retain: 1d"), "{text}");
    std::fs::write(&p, text).expect("write");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0, T0, 1),
            Change::upsert("b", T0, T0, 2),
            Change::delete("a", T0 + HOUR, T0 + HOUR),
        ],
    )
    .await;
    assert_eq!(run(&p, T0 + 2 * HOUR).code, 0);
    let before = version(&silver(d)).await.expect("table");
    let out = exec(
        tidemark_at(T0 + 48 * HOUR)
            .arg("maintain")
            .arg(&p)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let after = version(&silver(d)).await.expect("table");
    assert!(
        after > before,
        "maintain removed the tombstone: {}",
        out.stdout
    );
    assert_eq!(feed(d, before + 1, after).await, vec![], "{}", out.stdout);
    assert_eq!(
        live_rows(read_target(&silver(d)).await)
            .into_keys()
            .collect::<Vec<_>>(),
        vec!["b".to_string()]
    );
}
