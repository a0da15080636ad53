//! `kind: ingest` through the real binary: landing files into bronze exactly once (reruns, kills
//! at every phase, another writer at the same time), a changed file, bad records, limits, schema
//! drift, and a full reload that keeps each file's `_ingested_at`. The fault figures go to
//! `target/reliability/ingest_faults.json`, which the reliability scoreboard merges.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use common::*;

/// One bronze row: (payment id, amount, source file's name, `_ingested_at` µs).
pub(crate) type Row = (String, Option<i64>, String, i64);

pub(crate) fn landing(dir: &Path) -> PathBuf {
    let l = dir.join("landing");
    std::fs::create_dir_all(&l).expect("landing");
    l
}

/// An ingest pipeline over `dir/landing` into `dir/lake/bronze`; `extra` is appended.
pub(crate) fn pipeline(dir: &Path, extra: &str) -> PathBuf {
    let text = format!(
        "name: events\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.jsonl\" }}\nformat: json\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema:\n  id: string not null\n  amount: long\n  updated_at: timestamp\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n{extra}",
        d = dir.display()
    );
    let p = dir.join("ingest.yml");
    std::fs::write(&p, text).expect("pipeline");
    p
}

/// A JSON-lines landing file of `(id, amount)` records.
pub(crate) fn land(dir: &Path, name: &str, records: &[(&str, i64)]) {
    let mut text = String::new();
    for (id, amount) in records {
        text.push_str(&format!(
            "{{\"id\":\"{id}\",\"amount\":{amount},\"updated_at\":\"2025-01-06T10:00:00Z\"}}\n"
        ));
    }
    std::fs::write(landing(dir).join(name), text).expect("land");
}

pub(crate) fn run(dir: &Path, now: i64, args: &[&str]) -> Out {
    exec(
        tidemark_at(now)
            .arg("run")
            .arg(dir.join("ingest.yml"))
            .args(args),
    )
}

pub(crate) fn bronze_rows(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let s = |n: &str| {
            arrow::compute::cast(
                b.column_by_name(n).expect(n),
                &arrow::datatypes::DataType::Utf8,
            )
            .expect("cast")
        };
        let (ids, files) = (s("id"), s("_source_file"));
        let (ids, files) = (ids.as_string::<i32>(), files.as_string::<i32>());
        let amounts = b.column_by_name("amount").expect("amount");
        let amounts = amounts.as_primitive::<Int64Type>();
        let at = b.column_by_name("_ingested_at").expect("_ingested_at");
        let at = at.as_primitive::<TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            let file = files.value(i);
            out.push((
                ids.value(i).to_string(),
                (!amounts.is_null(i)).then(|| amounts.value(i)),
                file.rsplit('/').next().unwrap_or(file).to_string(),
                at.value(i),
            ));
        }
    }
    out.sort();
    out
}

pub(crate) async fn bronze(dir: &Path) -> Vec<Row> {
    let path = dir.join("lake/bronze");
    if version(&path).await.is_none() {
        return Vec::new();
    }
    bronze_rows(&read_all(&path).await)
}

/// What bronze must hold: every record of every landing file, once (ignoring `_ingested_at`).
pub(crate) fn oracle(dir: &Path) -> Vec<(String, Option<i64>, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("landing")).expect("landing") {
        let p = e.expect("entry").path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        for line in std::fs::read_to_string(&p).expect("read").lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            out.push((
                v["id"].as_str().expect("id").to_string(),
                v["amount"].as_i64(),
                name.clone(),
            ));
        }
    }
    out.sort();
    out
}

/// Bronze's records, sorted, without their arrival time: what [`oracle_sorted`] says.
pub(crate) async fn held_sorted(dir: &Path) -> Vec<(String, Option<i64>, String)> {
    let mut held = without_time(&bronze(dir).await);
    held.sort();
    held
}

/// [`oracle`], sorted.
pub(crate) fn oracle_sorted(dir: &Path) -> Vec<(String, Option<i64>, String)> {
    let mut want = oracle(dir);
    want.sort();
    want
}

pub(crate) fn without_time(rows: &[Row]) -> Vec<(String, Option<i64>, String)> {
    let mut v: Vec<_> = rows
        .iter()
        .map(|(a, b, c, _)| (a.clone(), *b, c.clone()))
        .collect();
    v.sort();
    v
}

pub(crate) fn json(out: &Out) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

#[tokio::test]
async fn each_file_is_ingested_once_across_reruns_and_new_arrivals() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 100), ("p2", 200)]);
    land(d, "b.jsonl", &[("p3", 300)]);
    let first = run(d, T0, &["--output", "json"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let s = json(&first);
    assert_eq!(s["kind"], "ingest");
    assert_eq!(s["mode"], "bootstrap");
    assert_eq!(s["num_files_ingested"], 2);
    assert_eq!(s["num_rows_written"], 3);
    assert_eq!(s["source_version"], serde_json::Value::Null);
    assert_eq!(s["ingested_at"], "2025-01-06T00:00:00.000000Z");
    // A rerun finds nothing new: no commit, both files counted as already ingested.
    let again = run(d, T0 + HOUR, &["--output", "json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let s = json(&again);
    assert_eq!(s["target_version"], serde_json::Value::Null);
    assert_eq!(s["num_files_skipped"], 2);
    assert!(again.stdout.contains("\"num_files_ingested\":0"));
    // A new file arrives: only it is read, stamped with the new run's time.
    land(d, "c.jsonl", &[("p1", 101)]);
    let third = run(d, T0 + 2 * HOUR, &[]);
    assert_eq!(third.code, 0, "{}", third.stderr);
    assert!(
        third
            .stdout
            .contains("3 listed: 1 ingested, 2 already ingested"),
        "{}",
        third.stdout
    );
    let rows = bronze(d).await;
    assert_eq!(without_time(&rows), oracle(d));
    let at: BTreeMap<String, i64> = rows.iter().map(|r| (r.2.clone(), r.3)).collect();
    assert_eq!(at["a.jsonl"], T0);
    assert_eq!(at["c.jsonl"], T0 + 2 * HOUR);
    // After a checkpoint (and compaction) the record is read from the checkpoint's txn column.
    let m = exec(
        tidemark_at(T0 + 3 * HOUR)
            .arg("maintain")
            .arg(d.join("ingest.yml")),
    );
    assert_eq!(m.code, 0, "{}", m.stderr);
    assert!(std::fs::read_dir(d.join("lake/bronze/_delta_log"))
        .expect("log")
        .any(|e| e
            .expect("e")
            .file_name()
            .to_string_lossy()
            .contains(".checkpoint")));
    land(d, "d.jsonl", &[("p5", 5)]);
    let s = json(&run(d, T0 + 4 * HOUR, &["--output", "json"]));
    assert_eq!(
        (
            s["num_files_skipped"].as_u64(),
            s["num_files_ingested"].as_u64()
        ),
        (Some(3), Some(1))
    );
    assert_eq!(without_time(&bronze(d).await), oracle(d));
}

#[tokio::test]
async fn a_changed_file_is_an_error_naming_it_or_is_reingested_when_asked() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 100)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    land(d, "a.jsonl", &[("p1", 100), ("p1", 150)]);
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("a.jsonl") && out.stderr.contains("on_file_change: reingest"),
        "{}",
        out.stderr
    );
    assert_eq!(
        bronze(d).await.len(),
        1,
        "nothing written by the refused run"
    );
    // A full reload would replace the delivered rows with the new contents: refused likewise.
    let out = run(d, T0 + HOUR, &["--full-reload"]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(out.stderr.contains("a.jsonl"), "{}", out.stderr);
    assert_eq!(
        bronze(d).await.len(),
        1,
        "nothing written by the refused reload"
    );
    pipeline(d, "on_file_change: reingest\n");
    let out = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_files_changed"], 1);
    let rows = bronze(d).await;
    assert_eq!(
        rows.len(),
        3,
        "the earlier rows stay, the new contents are appended: {rows:?}"
    );
    // Re-recorded: the next run skips it.
    let out = run(d, T0 + 3 * HOUR, &["--output", "json"]);
    assert_eq!(json(&out)["num_files_skipped"], 1);
    // Changed again, then a full reload (reingest): the new contents arrive now, not at the
    // time the file's earlier contents did.
    land(d, "a.jsonl", &[("p1", 100), ("p1", 150), ("p1", 175)]);
    let out = run(d, T0 + 4 * HOUR, &["--full-reload"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = bronze(d).await;
    assert_eq!(rows.len(), 3, "the reload rebuilt a.jsonl's rows: {rows:?}");
    assert!(
        rows.iter().all(|r| r.3 == T0 + 4 * HOUR),
        "contents never ingested before arrive now: {rows:?}"
    );
}

#[tokio::test]
async fn bad_records_are_quarantined_once_with_file_line_and_reason() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    let text = "{\"id\":\"p1\",\"amount\":1}\n{\"id\":\"p2\",\"amount\":\"ten\"}\nnot json\n\n{\"amount\":5}\n[1,2]\n";
    std::fs::write(landing(d).join("a.jsonl"), text).expect("land");
    let out = run(d, T0, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(
        s["num_source_rows_read"], 5,
        "the blank line is not a record"
    );
    assert_eq!(s["num_quarantined"], 4);
    assert_eq!(s["num_rows_written"], 1);
    let q = read_all(&d.join("lake/quarantine")).await;
    let mut got = Vec::new();
    for b in &q {
        let line = b
            .column_by_name("_line")
            .expect("_line")
            .as_primitive::<Int64Type>()
            .clone();
        let reason = arrow::compute::cast(
            b.column_by_name("_quarantine_reason").expect("r"),
            &arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        let file = arrow::compute::cast(
            b.column_by_name("_source_file").expect("f"),
            &arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        for i in 0..b.num_rows() {
            assert!(file
                .as_string::<i32>()
                .value(i)
                .ends_with("/landing/a.jsonl"));
            got.push((
                line.value(i),
                reason.as_string::<i32>().value(i).to_string(),
            ));
        }
    }
    got.sort();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], (2, "`amount`: \"ten\" is not a long".to_string()));
    assert!(
        got[1].0 == 3 && got[1].1.starts_with("malformed JSON"),
        "{got:?}"
    );
    assert_eq!(
        got[2],
        (5, "required field `id` is missing or null".to_string())
    );
    assert_eq!(got[3], (6, "not a JSON object (an array)".to_string()));
    // The limits apply to the run's records.
    std::fs::write(
        landing(d).join("b.jsonl"),
        "oops\n{\"id\":\"p9\",\"amount\":9}\n",
    )
    .expect("land");
    let text = std::fs::read_to_string(d.join("ingest.yml")).expect("read");
    std::fs::write(
        d.join("ingest.yml"),
        text.replace(
            "/lake/quarantine\" }",
            "/lake/quarantine\", max_fraction: 0.1 }",
        ),
    )
    .expect("write");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("1 of 2 rows read failed validation"),
        "{}",
        out.stderr
    );
    assert_eq!(
        bronze(d).await.len(),
        1,
        "a run over the limit writes nothing to bronze"
    );
}

#[tokio::test]
async fn a_full_reload_rebuilds_from_the_landing_files_and_keeps_each_ingested_at() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 100)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    land(d, "b.jsonl", &[("p2", 200), ("p3", 300)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
    let before = bronze(d).await;
    land(d, "c.jsonl", &[("p4", 400)]);
    let out = run(d, T0 + 5 * HOUR, &["--full-reload", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["mode"], "full_reload");
    let after = bronze(d).await;
    assert_eq!(without_time(&after), oracle(d));
    for row in &before {
        assert!(
            after.contains(row),
            "{row:?} kept with its _ingested_at: {after:?}"
        );
    }
    let c = after.iter().find(|r| r.2 == "c.jsonl").expect("c");
    assert_eq!(
        c.3,
        T0 + 5 * HOUR,
        "a file never ingested before arrives now"
    );
    // A landing file whose rows bronze holds is gone: the reload would drop them.
    std::fs::remove_file(d.join("landing/a.jsonl")).expect("rm");
    let out = run(d, T0 + 6 * HOUR, &["--full-reload"]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("a.jsonl") && out.stderr.contains("no longer there"),
        "{}",
        out.stderr
    );
    assert_eq!(bronze(d).await, after);
}

#[tokio::test]
async fn limits_take_the_oldest_files_first_and_leave_the_rest_for_later() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "max_files_per_run: 2\n");
    for (i, name) in ["a.jsonl", "b.jsonl", "c.jsonl"].iter().enumerate() {
        land(d, name, &[("p", i as i64)]);
        let f = std::fs::File::options()
            .write(true)
            .open(d.join("landing").join(name))
            .expect("open");
        let t =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + i as u64 * 60);
        f.set_modified(t).expect("mtime");
    }
    let out = run(d, T0, &["--output", "json"]);
    let s = json(&out);
    assert_eq!(
        (
            s["num_files_ingested"].as_u64(),
            s["num_files_pending"].as_u64()
        ),
        (Some(2), Some(1))
    );
    assert!(s["warnings"][0]
        .as_str()
        .unwrap_or("")
        .contains("left for the next run"));
    let files: Vec<String> = bronze(d).await.into_iter().map(|r| r.2).collect();
    assert_eq!(files, vec!["a.jsonl", "b.jsonl"]);
    let s = json(&run(d, T0 + HOUR, &["--output", "json"]));
    assert_eq!(
        (
            s["num_files_ingested"].as_u64(),
            s["num_files_pending"].as_u64()
        ),
        (Some(1), Some(0))
    );
    assert_eq!(without_time(&bronze(d).await), oracle(d));
}

#[tokio::test]
async fn new_fields_fail_or_become_columns_or_are_rescued() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    std::fs::write(
        landing(d).join("b.jsonl"),
        "{\"id\":\"p2\",\"amount\":2,\"channel\":\"app\"}\n",
    )
    .expect("land");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("`channel`") && out.stderr.contains("add_new_columns"),
        "{}",
        out.stderr
    );
    pipeline(d, "rescue: true\n");
    let out = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_rescued"], 1);
    let batches = read_all(&d.join("lake/bronze")).await;
    let rescued = strings(&batches, "_rescued_data");
    assert_eq!(rescued, vec!["{\"channel\":\"app\"}"]);
    std::fs::write(
        landing(d).join("c.jsonl"),
        "{\"id\":\"p3\",\"amount\":3,\"region\":\"eu\"}\n",
    )
    .expect("land");
    pipeline(d, "on_schema_change: add_new_columns\n");
    let out = run(d, T0 + 3 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["columns_added"], serde_json::json!(["region"]));
    let batches = read_all(&d.join("lake/bronze")).await;
    assert!(batches[0].schema().field_with_name("region").is_ok());
}

#[tokio::test]
async fn csv_and_parquet_landing_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let text = format!(
        "name: partner\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.csv\" }}\nformat: csv\ncsv: {{ delimiter: \";\" }}\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        d = d.display()
    );
    std::fs::write(d.join("ingest.yml"), text).expect("pipeline");
    std::fs::write(
        landing(d).join("a.csv"),
        "id;amount;note\np1;10;\"semi;colon\"\np2;20;\"said \"\"hi\"\"\"\np3;3;a;extra\n",
    )
    .expect("land");
    let out = run(d, T0, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(
        (
            s["num_rows_written"].as_u64(),
            s["num_quarantined"].as_u64()
        ),
        (Some(2), Some(1))
    );
    let batches = read_all(&d.join("lake/bronze")).await;
    let notes = strings(&batches, "note");
    assert_eq!(notes, vec!["semi;colon", "said \"hi\""]);
    assert_eq!(
        batches[0]
            .schema()
            .field_with_name("amount")
            .expect("amount")
            .data_type(),
        &arrow::datatypes::DataType::Int64,
        "inferred from the first file"
    );

    // Parquet: columns cast to the declared types; a value that does not cast rejects its row.
    let p = tempfile::tempdir().expect("tmp");
    let pd = p.path();
    let text = format!(
        "name: pq\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.parquet\" }}\nformat: parquet\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema: {{ id: string not null, amount: long }}\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        d = pd.display()
    );
    std::fs::write(pd.join("ingest.yml"), text).expect("pipeline");
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            std::sync::Arc::new(arrow::array::StringArray::from(vec![
                Some("a"),
                None,
                Some("c"),
            ])) as arrow::array::ArrayRef,
        ),
        (
            "amount",
            std::sync::Arc::new(arrow::array::StringArray::from(vec!["1", "2", "three"]))
                as arrow::array::ArrayRef,
        ),
    ])
    .expect("batch");
    let file = std::fs::File::create(landing(pd).join("a.parquet")).expect("create");
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
    std::fs::write(landing(pd).join("b.parquet"), b"not parquet at all").expect("land");
    let out = run(pd, T0, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(
        (
            s["num_rows_written"].as_u64(),
            s["num_quarantined"].as_u64()
        ),
        (Some(1), Some(3)),
        "{s}"
    );
}

#[tokio::test]
async fn a_missing_landing_folder_and_a_bad_pipeline_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    let out = run(d, T0, &[]);
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
    let text = std::fs::read_to_string(d.join("ingest.yml")).expect("read");
    std::fs::write(
        d.join("ingest.yml"),
        text.replace("amount: long", "amount: money"),
    )
    .expect("write");
    landing(d);
    let out = run(d, T0, &[]);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("ingest.yml:8:") && out.stderr.contains("not a column type"),
        "{}",
        out.stderr
    );
    std::fs::write(
        d.join("ingest.yml"),
        text.replace("format: json", "format: jsonl"),
    )
    .expect("write");
    let out = run(d, T0, &[]);
    assert_eq!(out.code, 78, "{}", out.stderr);
}

/// Kills (error, panic, abort ≈ kill -9) at every phase of an incremental run and of a full
/// reload; the rerun must leave bronze holding every landing record exactly once.
#[tokio::test]
async fn exactly_once_through_kills_at_every_phase() {
    const INCREMENTAL: &[&str] = &[
        "ingest.incremental.after_plan",
        "ingest.incremental.after_read",
        "ingest.incremental.after_validate",
        "ingest.incremental.before_commit",
        "ingest.incremental.after_commit",
        "ingest.incremental.committed_target",
        "store.put_data",
        "store.put_commit",
    ];
    const RELOAD: &[&str] = &[
        "ingest.full_reload.after_plan",
        "ingest.full_reload.after_read",
        "ingest.full_reload.after_validate",
        "ingest.full_reload.before_write",
        "ingest.full_reload.after_write",
        "ingest.full_reload.committed_target",
    ];
    let (mut injected, mut survived, mut lost, mut duplicated, mut exit70) = (0, 0, 0, 0, 0);
    for (points, reload) in [(INCREMENTAL, false), (RELOAD, true)] {
        for point in points {
            for action in ["error", "panic", "abort"] {
                let dir = tempfile::tempdir().expect("tmp");
                let d = dir.path();
                pipeline(d, "");
                land(d, "a.jsonl", &[("p1", 1), ("p2", 2)]);
                assert_eq!(run(d, T0, &[]).code, 0);
                land(d, "b.jsonl", &[("p3", 3)]);
                land(d, "c.jsonl", &[("p1", 11), ("p4", 4)]);
                let args: &[&str] = if reload { &["--full-reload"] } else { &[] };
                let faulty = exec(
                    tidemark_at(T0 + HOUR)
                        .arg("run")
                        .arg(d.join("ingest.yml"))
                        .args(args)
                        .env("TIDEMARK_FAILPOINTS", format!("{point}={action}")),
                );
                if faulty.code == 0 {
                    continue; // the point is not on this path
                }
                injected += 1;
                // An injected panic stands for a bug: exit 70 with its message (never the
                // runtime's bare 101), as in tests/it/faults.rs; any other 70 is counted.
                if action == "panic" {
                    assert_eq!(faulty.code, 70, "{point}=panic: {}", faulty.stderr);
                } else if faulty.code == 70 {
                    exit70 += 1;
                    eprintln!("{point}={action}: exit 70: {}", faulty.stderr);
                }
                let rerun = run(d, T0 + 2 * HOUR, args);
                if rerun.code != 0 {
                    panic!(
                        "{point}={action}: rerun exited {}: {}",
                        rerun.code, rerun.stderr
                    );
                }
                let (got, want) = (without_time(&bronze(d).await), oracle(d));
                if got == want {
                    survived += 1;
                } else {
                    let missing = want.iter().filter(|r| !got.contains(r)).count();
                    lost += missing as u64;
                    duplicated += got.len().saturating_sub(want.len() - missing) as u64;
                    eprintln!("{point}={action}: bronze {got:?} != oracle {want:?}");
                }
            }
        }
    }
    let figures = serde_json::json!({
        "ingest_faults_injected": injected,
        "ingest_faults_survived": survived,
        "ingest_records_lost": lost,
        "ingest_records_duplicated": duplicated,
        "ingest_exit_70_seen": exit70,
    });
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).expect("report dir");
    std::fs::write(dir.join("ingest_faults.json"), figures.to_string()).expect("write");
    println!("ingest faults: {figures}");
    assert!(injected >= 30, "too few faults fired: {figures}");
    assert_eq!(
        (survived, lost, duplicated, exit70),
        (injected, 0, 0, 0),
        "{figures}"
    );
}

/// Two ingests of the same landing files at the same time: each file's rows land once (the
/// loser of the commit race plans again and finds the files recorded).
#[tokio::test]
async fn two_ingests_at_once_write_each_file_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p0", 0)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    for i in 1..6 {
        land(d, &format!("f{i}.jsonl"), &[("p", i)]);
    }
    let spawn = || {
        process()
            .arg("run")
            .arg(d.join("ingest.yml"))
            .env("RUST_LOG", "warn")
            .env(
                "TIDEMARK_FAILPOINTS",
                "ingest.incremental.before_commit=sleep(300)",
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (
        a.wait_with_output().expect("a"),
        b.wait_with_output().expect("b"),
    );
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(without_time(&bronze(d).await), oracle(d));
}

/// Two pipelines over one landing folder (different globs, formats) into one bronze: a full
/// reload of one replaces only its own files' rows.
#[tokio::test]
async fn a_full_reload_leaves_another_pipelines_rows_alone() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    let csv = format!(
        "name: partner\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.csv\" }}\nformat: csv\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema: {{ id: string not null, amount: long, updated_at: timestamp }}\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        d = d.display()
    );
    std::fs::write(d.join("partner.yml"), csv).expect("pipeline");
    land(d, "a.jsonl", &[("p1", 1)]);
    std::fs::write(
        landing(d).join("b.csv"),
        "id,amount,updated_at\np2,2,2025-01-06T09:00:00Z\n",
    )
    .expect("land");
    assert_eq!(run(d, T0, &[]).code, 0);
    let partner = exec(tidemark_at(T0).arg("run").arg(d.join("partner.yml")));
    assert_eq!(partner.code, 0, "{}", partner.stderr);
    let before = bronze(d).await;
    assert_eq!(before.len(), 2);
    let out = run(d, T0 + HOUR, &["--full-reload"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        bronze(d).await,
        before,
        "the partner's row stays; the event's is rewritten as it was"
    );
}

#[tokio::test]
async fn a_wrong_delimiter_and_a_clock_behind_are_said_out_loud() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let text = format!(
        "name: partner\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.csv\" }}\nformat: csv\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema: {{ id: string not null }}\non_schema_change: add_new_columns\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        d = d.display()
    );
    std::fs::write(d.join("ingest.yml"), text).expect("pipeline");
    std::fs::write(landing(d).join("a.csv"), "id;amount\np1;1\n").expect("land");
    let out = run(d, T0, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("`id;amount`") && out.stderr.contains("delimiter"),
        "{}",
        out.stderr
    );
    assert!(
        version(&d.join("lake/bronze")).await.is_none(),
        "nothing written, no column added"
    );

    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
    land(d, "b.jsonl", &[("p2", 2)]);
    let out = run(d, T0, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let w = json(&out)["warnings"].to_string();
    assert!(w.contains("the clock is behind"), "{w}");
    let out = run(d, T0 + 2 * HOUR, &["--full-reload", "--output", "json"]);
    let w = json(&out)["warnings"].to_string();
    assert!(
        w.contains("bronze was rewritten") && w.contains("--full-reload"),
        "{w}"
    );
}

/// The `txn` app ids of every commit in a table's log.
fn log_txns(table: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(table.join("_delta_log")).expect("log") {
        let p = e.expect("entry").path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        for line in std::fs::read_to_string(&p).expect("read").lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("action");
            if let Some(app) = v["txn"]["appId"].as_str() {
                out.push(app.to_string());
            }
        }
    }
    out.sort();
    out
}

/// The index's rows: (file, run), sorted.
async fn index_rows(dir: &Path) -> Vec<(String, i64)> {
    let path = dir.join("lake/bronze_ingest_record");
    if version(&path).await.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for b in read_all(&path).await {
        let file = arrow::compute::cast(
            b.column_by_name("file").expect("file"),
            &arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        let file = file.as_string::<i32>();
        let run = b.column_by_name("run").expect("run");
        let run = run.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((file.value(i).to_string(), run.value(i)));
        }
    }
    out.sort();
    out
}

/// The record of ingested files is an index beside bronze, not one `txn` per file in bronze's
/// log (which every reader of bronze would replay): bronze's commits carry one `txn` per run.
/// A crash between the bronze commit and the index append leaves the index behind; the next
/// run completes it from bronze's commit and ingests nothing twice.
#[tokio::test]
async fn the_record_index_is_completed_after_a_crash_between_the_two_commits() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    land(d, "b.jsonl", &[("p2", 2)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    assert_eq!(
        index_rows(d).await,
        vec![("a.jsonl".to_string(), 1), ("b.jsonl".to_string(), 1)]
    );
    land(d, "c.jsonl", &[("p3", 3)]);
    let crashed = exec(
        tidemark_at(T0 + HOUR)
            .arg("run")
            .arg(d.join("ingest.yml"))
            .env(
                "TIDEMARK_FAILPOINTS",
                "ingest.incremental.committed_target=abort",
            ),
    );
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let bronze_version = version(&d.join("lake/bronze")).await;
    assert_eq!(index_rows(d).await.len(), 2, "the index missed run 2");
    assert_eq!(without_time(&bronze(d).await), oracle(d), "bronze has c");
    // Nothing new: no bronze commit, the index completed from bronze's commit of run 2.
    let out = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_files_skipped"], 3, "{}", out.stdout);
    assert_eq!(version(&d.join("lake/bronze")).await, bronze_version);
    assert_eq!(
        index_rows(d).await,
        vec![
            ("a.jsonl".to_string(), 1),
            ("b.jsonl".to_string(), 1),
            ("c.jsonl".to_string(), 2)
        ]
    );
    assert_eq!(without_time(&bronze(d).await), oracle(d));
    // One `txn` per run in bronze's log, none per file.
    assert_eq!(
        log_txns(&d.join("lake/bronze")),
        vec!["tidemark/events/ingest".to_string(); 2]
    );
    // Bronze deleted to start over, the index left behind: its rows belong to the old table
    // (another table id), so every file lands in the new bronze.
    std::fs::remove_dir_all(d.join("lake/bronze")).expect("rm bronze");
    let out = run(d, T0 + 3 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_files_ingested"], 3, "{}", out.stdout);
    assert_eq!(without_time(&bronze(d).await), oracle(d));
    let out = run(d, T0 + 4 * HOUR, &["--output", "json"]);
    assert_eq!(json(&out)["num_files_skipped"], 3, "{}", out.stdout);
}

/// When the index misses runs whose commits bronze's log no longer holds (the index deleted,
/// the log cleaned up), which files those runs took is unknown: the run refuses (65) and says
/// what repairs it; a full reload rebuilds bronze and the record, each file keeping the
/// `_ingested_at` its rows hold.
#[tokio::test]
async fn an_index_behind_a_cleaned_log_is_refused_and_a_full_reload_rebuilds_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    land(d, "b.jsonl", &[("p2", 2)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
    let before = bronze(d).await;
    let bronze_path = d.join("lake/bronze");
    let url = deltalake::table::builder::parse_table_uri(bronze_path.to_str().expect("utf8"))
        .expect("url");
    let table = deltalake::open_table(url).await.expect("open");
    deltalake::checkpoints::create_checkpoint(&table, None)
        .await
        .expect("checkpoint");
    std::fs::remove_file(bronze_path.join("_delta_log/00000000000000000000.json")).expect("rm");
    std::fs::remove_dir_all(d.join("lake/bronze_ingest_record")).expect("rm index");
    land(d, "c.jsonl", &[("p3", 3)]);
    let out = run(d, T0 + 2 * HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("no longer holds the commit of run 1 ")
            && out.stderr.contains("--full-reload"),
        "{}",
        out.stderr
    );
    assert_eq!(bronze(d).await, before, "nothing written");
    let out = run(d, T0 + 3 * HOUR, &["--full-reload"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let after = bronze(d).await;
    assert_eq!(without_time(&after), oracle(d));
    for row in &before {
        assert!(
            after.contains(row),
            "{row:?} keeps its _ingested_at: {after:?}"
        );
    }
    let out = run(d, T0 + 4 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_files_skipped"], 3, "{}", out.stdout);
}

/// `target.record` naming another kind of Delta table is a clear error (78), not a bug, and
/// `maintain` leaves that table alone.
#[tokio::test]
async fn a_record_location_holding_another_table_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    append(&d.join("other"), &[Change::upsert("x", T0, T0, 1)]).await;
    pipeline(d, "");
    let text = std::fs::read_to_string(d.join("ingest.yml")).expect("read");
    let text = text.replace(
        "lake/bronze\" }",
        &format!("lake/bronze\", record: \"{}/other\" }}", d.display()),
    );
    std::fs::write(d.join("ingest.yml"), text).expect("write");
    land(d, "a.jsonl", &[("p1", 1)]);
    let out = run(d, T0, &[]);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("not an ingest record") && out.stderr.contains("target.record"),
        "{}",
        out.stderr
    );
    let before = version(&d.join("other")).await;
    let out = exec(tidemark_at(T0).arg("maintain").arg(d.join("ingest.yml")));
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert_ne!(out.code, 70, "{}", out.stderr);
    assert_eq!(version(&d.join("other")).await, before);
}

/// Bronze written before the index (one `txn` per file, `tidemark/<pipeline>/file:<path>`) is
/// migrated on its first run, a quiet one included: those files are the record (here with a
/// fingerprint the file no longer has, so it counts as changed), and the index holds them from
/// then on.
#[tokio::test]
async fn per_file_txns_of_an_older_bronze_are_migrated_into_the_index() {
    use deltalake::kernel::transaction::CommitProperties;
    use deltalake::kernel::Transaction;
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    // Bronze as an older tidemark left it: a's rows and a's `txn` (with a fingerprint the file
    // does not have), no run number, no index.
    assert_eq!(run(d, T0, &[]).code, 0);
    let bronze_path = d.join("lake/bronze");
    let rows = read_all(&bronze_path).await;
    std::fs::remove_dir_all(&bronze_path).expect("rm bronze");
    std::fs::remove_dir_all(d.join("lake/bronze_ingest_record")).expect("rm index");
    let url = deltalake::ensure_table_uri(bronze_path.to_str().expect("utf8")).expect("url");
    let legacy =
        Transaction::new_with_last_update("tidemark/events/file:a.jsonl", 12345, Some(T0 / 1000));
    deltalake::DeltaTableBuilder::from_url(url)
        .expect("builder")
        .build()
        .expect("table")
        .write(rows)
        .with_commit_properties(
            CommitProperties::default().with_application_transactions(vec![legacy]),
        )
        .await
        .expect("legacy bronze");
    // A quiet first hour (the file archived meanwhile): the migration is all the run writes, and
    // bronze still has no run number — the migrated files stay recorded all the same.
    let archived = d.join("a.jsonl.archived");
    std::fs::rename(d.join("landing/a.jsonl"), &archived).expect("archive");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        index_rows(d).await,
        vec![("a.jsonl".to_string(), 0)],
        "migrated by the quiet run"
    );
    std::fs::rename(&archived, d.join("landing/a.jsonl")).expect("restore");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("a.jsonl") && out.stderr.contains("changed after"),
        "{}",
        out.stderr
    );
    pipeline(d, "on_file_change: reingest\n");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = index_rows(d).await;
    assert!(
        rows.contains(&("a.jsonl".to_string(), 0)),
        "migrated: {rows:?}"
    );
    assert!(
        rows.contains(&("a.jsonl".to_string(), 1)),
        "re-ingested: {rows:?}"
    );
}

/// A glob edited wrong lists nothing, which looks like a quiet hour: when the landing folder
/// holds files the glob no longer matches and the pipeline ingested before, the run says so.
/// An empty folder (files archived after ingestion) is a quiet hour, without a warning.
#[tokio::test]
async fn a_glob_that_no_longer_matches_is_said_out_loud() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    let text = std::fs::read_to_string(d.join("ingest.yml")).expect("read");
    std::fs::write(d.join("ingest.yml"), text.replace("*.jsonl", "*.json")).expect("write");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("matches `landing.glob: *.json`") && out.stdout.contains("a.jsonl"),
        "{}",
        out.stdout
    );
    std::fs::remove_file(d.join("landing/a.jsonl")).expect("archive");
    let out = run(d, T0 + 2 * HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains("landing.glob"), "{}", out.stdout);
}

/// `reconcile` on an ingest parses every landing file again and compares bronze's rows of each
/// file with them: identical after runs; a row changed behind the pipeline's back is exit 65
/// naming its file (and only it); a full reload puts it right.
#[tokio::test]
async fn reconcile_finds_a_bronze_row_its_file_does_not_say() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1), ("p2", 2)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    land(d, "b.jsonl", &[("p3", 3)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
    let reconcile = || {
        exec(
            tidemark_at(T0 + 2 * HOUR)
                .arg("reconcile")
                .arg(d.join("ingest.yml")),
        )
    };
    let ok = reconcile();
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("identical"), "{}", ok.stdout);
    assert!(ok.stdout.contains("2 landing file(s)"), "{}", ok.stdout);
    // p2's amount is changed in bronze by hand
    let bronze = d.join("lake/bronze");
    let tampered: Vec<RecordBatch> = read_all(&bronze)
        .await
        .iter()
        .map(|b| {
            let i = b.schema().index_of("amount").expect("amount");
            let ids = arrow::compute::cast(
                b.column_by_name("id").expect("id"),
                &arrow::datatypes::DataType::Utf8,
            )
            .expect("ids");
            let ids = ids.as_string::<i32>();
            let amounts = b.column(i).as_primitive::<arrow::datatypes::Int64Type>();
            let new: arrow::array::Int64Array = (0..b.num_rows())
                .map(|r| match ids.value(r) {
                    "p2" => Some(20),
                    _ => amounts.is_valid(r).then(|| amounts.value(r)),
                })
                .collect();
            let mut cols = b.columns().to_vec();
            cols[i] = std::sync::Arc::new(new);
            RecordBatch::try_new(b.schema(), cols).expect("batch")
        })
        .collect();
    let url = deltalake::ensure_table_uri(bronze.to_str().expect("utf8")).expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .write(tampered)
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .expect("overwrite");
    let bad = reconcile();
    assert_eq!(bad.code, 65, "{}\n{}", bad.stdout, bad.stderr);
    assert!(bad.stdout.contains("2 row(s) differ"), "{}", bad.stdout);
    assert!(
        bad.stdout.contains("a.jsonl") && !bad.stdout.contains("b.jsonl"),
        "{}",
        bad.stdout
    );
    assert!(bad.stderr.contains("--full-reload"), "{}", bad.stderr);
    assert_eq!(run(d, T0 + 2 * HOUR, &["--full-reload"]).code, 0);
    assert_eq!(reconcile().code, 0);
}
