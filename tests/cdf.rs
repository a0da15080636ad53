//! `target.change_data_feed: true`: the target keeps a Delta change data feed, and an incremental
//! run's feed holds exactly the rows it changed (read back with delta-rs' CDF reader, an
//! implementation independent of tidemark's writes), whether tidemark turned the feed on or
//! another tool set the table property.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::{Array, AsArray, RecordBatch};
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

/// The feed between two versions: (change type, id, val) sorted, and the table's property.
async fn feed(dir: &Path, from: u64, to: u64) -> Vec<(String, String, Option<i64>)> {
    let path = dir.join("lake/silver");
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url).await.expect("open");
    let ctx = SessionContext::new();
    let plan = table
        .scan_cdf()
        .with_starting_version(from)
        .with_ending_version(to)
        .build(&ctx.state(), None)
        .await
        .expect("cdf plan");
    let batches: Vec<RecordBatch> = datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .expect("cdf rows");
    let mut out = Vec::new();
    for b in &batches {
        let s = |n: &str| {
            arrow::compute::cast(
                b.column_by_name(n).expect(n),
                &arrow::datatypes::DataType::Utf8,
            )
            .expect("cast")
        };
        let (kind, id) = (s("_change_type"), s("id"));
        let val = arrow::compute::cast(
            b.column_by_name("val").expect("val"),
            &arrow::datatypes::DataType::Int64,
        )
        .expect("cast");
        let val = val.as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..b.num_rows() {
            out.push((
                kind.as_string::<i32>().value(i).to_string(),
                id.as_string::<i32>().value(i).to_string(),
                (!val.is_null(i)).then(|| val.value(i)),
            ));
        }
    }
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
    // One payment changes, one is new, one is deleted (soft: a tombstone).
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
            ("insert", 1),
            ("update_postimage", 2),
            ("update_preimage", 2)
        ]),
        "{changes:?}"
    );
    assert!(changes.contains(&("update_preimage".into(), "k005".into(), Some(5))));
    assert!(changes.contains(&("update_postimage".into(), "k005".into(), Some(500))));
    assert!(changes.contains(&("insert".into(), "k900".into(), Some(900))));
    assert!(
        changes
            .iter()
            .any(|c| c.0 == "update_postimage" && c.1 == "k007"),
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
        serde_json::json!({"insert": 1, "update_preimage": 2, "update_postimage": 2, "delete": 0}),
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
        text.stdout.contains("updated: id=\"k005\"; id=\"k007\""),
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
