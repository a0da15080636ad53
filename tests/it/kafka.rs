//! `kind: ingest` from a Kafka topic, through the real binary against a real Kafka-protocol
//! broker (tansu, `common::kafka`): every record exactly once across reruns, new records,
//! bounds, kills at every phase and racing runs; `start: latest`; and the retention gap, which
//! tansu cannot produce (no retention, DeleteRecords panics it), through the fake retention
//! `TIDEMARK_KAFKA_DELETED_BELOW` arms in failpoint builds.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, TimestampMicrosecondType};
use chrono::{TimeZone, Utc};
use common::debezium::{self, MARKER};
use common::kafka::{Kafka, Msg};
use common::*;

const TOPIC: &str = "payments";

/// A bronze row: (partition, offset, id, amount, key, headers, kafka timestamp µs).
type Row = (i32, i64, String, Option<i64>, Option<String>, String, i64);

fn pipeline(dir: &Path, kafka: &Kafka, extra: &str) -> PathBuf {
    let text = format!(
        "name: pay\nkind: ingest\nkafka: {{ brokers: [\"{addr}\"], topic: {TOPIC}, request_timeout: 20s{extra} }}\nformat: json\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema:\n  id: string not null\n  amount: long\n  updated_at: timestamp\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        addr = kafka.addr,
        d = dir.display()
    );
    let p = dir.join("kafka.yml");
    std::fs::write(&p, text).expect("pipeline");
    p
}

fn ts(i: i64) -> chrono::DateTime<Utc> {
    Utc.timestamp_millis_opt(1_736_150_400_000 + i * 1000)
        .single()
        .expect("ts")
}

/// Message `i`: partition i % 3, key `k<i>` (i = 4: bytes that are not UTF-8), a header, and
/// a payment as its value — except i = 5, a tombstone, and i = 7, a value that is not JSON.
fn msg(i: i64) -> Msg {
    let value = match i {
        5 => None,
        7 => Some(b"{not json".to_vec()),
        _ => Some(
            format!("{{\"id\":\"p{i}\",\"amount\":{i},\"updated_at\":\"2025-01-06T10:00:00Z\"}}")
                .into_bytes(),
        ),
    };
    Msg {
        partition: (i % 3) as i32,
        key: Some(if i == 4 {
            vec![0xff, 0x00]
        } else {
            format!("k{i}").into_bytes()
        }),
        value,
        headers: BTreeMap::from([("seq".to_string(), i.to_string().into_bytes())]),
        timestamp: ts(i),
    }
}

/// Produces messages `range`; returns (message number, partition, offset) of each.
async fn produce(kafka: &Kafka, range: std::ops::Range<i64>) -> Vec<(i64, i32, i64)> {
    let msgs: Vec<Msg> = range.clone().map(msg).collect();
    let offs = kafka.produce(TOPIC, &msgs).await;
    range
        .zip(msgs.iter().zip(offs))
        .map(|(i, (m, o))| (i, m.partition, o))
        .collect()
}

/// What bronze must hold for the produced messages: one row per message with a JSON value.
fn oracle(produced: &[(i64, i32, i64)]) -> Vec<Row> {
    let mut out: Vec<Row> = produced
        .iter()
        .filter(|(i, _, _)| ![5, 7].contains(i))
        .map(|(i, p, o)| {
            let key = if *i == 4 {
                "base64:/wA=".to_string()
            } else {
                format!("k{i}")
            };
            (
                *p,
                *o,
                format!("p{i}"),
                Some(*i),
                Some(key),
                format!("{{\"seq\":\"{i}\"}}"),
                ts(*i).timestamp_micros(),
            )
        })
        .collect();
    out.sort();
    out
}

fn rows(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("column {n}"));
        let text = |n: &str| arrow::compute::cast(col(n), &DataType::Utf8).expect("cast");
        let (ids, keys, headers) = (text("id"), text("_kafka_key"), text("_kafka_headers"));
        let (ids, keys, headers) = (
            ids.as_string::<i32>(),
            keys.as_string::<i32>(),
            headers.as_string::<i32>(),
        );
        let parts = col("_kafka_partition").as_primitive::<Int32Type>();
        let offs = col("_kafka_offset").as_primitive::<Int64Type>();
        let amounts = col("amount").as_primitive::<Int64Type>();
        let kts = col("_kafka_timestamp").as_primitive::<TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            out.push((
                parts.value(i),
                offs.value(i),
                ids.value(i).to_string(),
                (!amounts.is_null(i)).then(|| amounts.value(i)),
                (!keys.is_null(i)).then(|| keys.value(i).to_string()),
                headers.value(i).to_string(),
                kts.value(i),
            ));
        }
    }
    out.sort();
    out
}

async fn bronze_rows(dir: &Path) -> Vec<Row> {
    let path = dir.join("lake/bronze");
    if version(&path).await.is_none() {
        return Vec::new();
    }
    rows(&read_all(&path).await)
}

fn run(p: &Path, env: &[(&str, &str)]) -> Out {
    let mut c = tidemark_at(T0);
    c.arg("run").arg(p);
    for (k, v) in env {
        c.env(k, v);
    }
    exec(&mut c)
}

fn ok(out: &Out) {
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
}

async fn setup(extra: &str) -> (tempfile::TempDir, Kafka, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = common::kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let p = pipeline(dir.path(), &kafka, extra);
    (dir, kafka, p)
}

#[tokio::test(flavor = "multi_thread")]
async fn records_land_once_with_their_kafka_columns_and_reruns_add_only_new_ones() {
    let (dir, kafka, p) = setup("").await;
    let mut produced = produce(&kafka, 0..12).await;
    let out = run(&p, &[]);
    ok(&out);
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
    assert!(out.stdout.contains("1 tombstone"), "{}", out.stdout);
    // the value that is not JSON is quarantined with its partition and offset
    let q = read_all(&dir.path().join("lake/quarantine")).await;
    let offsets: Vec<String> = strings(&q, "_kafka_offset");
    let at = produced.iter().find(|(i, _, _)| *i == 7).expect("7");
    assert_eq!(offsets, vec![at.2.to_string()]);
    assert_eq!(strings(&q, "_kafka_partition"), vec![at.1.to_string()]);
    let v1 = version(&dir.path().join("lake/bronze")).await;
    // a rerun reads nothing new and commits nothing
    let out = run(&p, &[]);
    ok(&out);
    assert!(
        out.stdout.contains("no new Kafka records"),
        "{}",
        out.stdout
    );
    assert_eq!(version(&dir.path().join("lake/bronze")).await, v1);
    // new records: only they are appended
    produced.extend(produce(&kafka, 12..20).await);
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
    // a dry run commits nothing
    produced.extend(produce(&kafka, 20..23).await);
    let v2 = version(&dir.path().join("lake/bronze")).await;
    let mut c = tidemark_at(T0);
    ok(&exec(c.arg("run").arg(&p).arg("--dry-run")));
    assert_eq!(version(&dir.path().join("lake/bronze")).await, v2);
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
    // a full reload (and so `reconcile`) is refused: the topic may no longer hold everything
    let mut c = tidemark_at(T0);
    let out = exec(c.arg("run").arg(&p).arg("--full-reload"));
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("reads a Kafka topic"), "{}", out.stderr);
    // `lateness` reads this bronze as it reads a file ingest's: `_ingested_at` and an event time
    for event in ["updated_at", "_kafka_timestamp"] {
        let mut c = tidemark_at(T0);
        let out = exec(c.arg("lateness").arg(dir.path().join("lake/bronze")).args([
            "--event-time",
            event,
            "--output",
            "json",
        ]));
        ok(&out);
        let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
        assert!(report.is_object(), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn max_records_per_run_splits_a_backlog_across_runs() {
    let (dir, kafka, p) = setup(", max_records_per_run: 4").await;
    let produced = produce(&kafka, 10..20).await;
    let bronze = dir.path().join("lake/bronze");
    let mut runs = 0;
    loop {
        let before = version(&bronze).await;
        let out = run(&p, &[]);
        ok(&out);
        runs += 1;
        if version(&bronze).await == before {
            break;
        }
        assert!(runs < 10, "never caught up");
    }
    assert_eq!(runs, 4, "3 runs of at most 4 records, then nothing new");
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
}

#[tokio::test(flavor = "multi_thread")]
async fn start_latest_skips_the_backlog() {
    let (dir, kafka, p) = setup(", start: latest").await;
    produce(&kafka, 10..16).await;
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, vec![]);
    let later = produce(&kafka, 16..19).await;
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, oracle(&later));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_at_any_phase_then_a_rerun_ingests_each_record_once() {
    let (dir, kafka, p) = setup("").await;
    let mut produced = produce(&kafka, 10..13).await;
    // the first run (bootstrap) killed before its commit, and just after it
    for point in ["full_reload.before_commit", "full_reload.committed_target"] {
        let out = run(
            &p,
            &[("TIDEMARK_FAILPOINTS", &format!("ingest.{point}=abort"))],
        );
        assert_ne!(out.code, 0, "{point}");
    }
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
    let mut n = 13;
    for point in common::kafka::INCREMENTAL_POINTS {
        produced.extend(produce(&kafka, n..n + 3).await);
        n += 3;
        let fp = format!("ingest.incremental.{point}=abort");
        let out = run(&p, &[("TIDEMARK_FAILPOINTS", &fp)]);
        assert_ne!(out.code, 0, "{point}: the kill did not happen");
        ok(&run(&p, &[]));
        assert_eq!(bronze_rows(dir.path()).await, oracle(&produced), "{point}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_racing_runs_ingest_each_record_once() {
    let (dir, kafka, p) = setup("").await;
    let mut produced = produce(&kafka, 10..16).await;
    for round in 0..2 {
        if round == 1 {
            produced.extend(produce(&kafka, 16..22).await);
        }
        // both read the same records, then wait before committing: one wins, the other plans
        // again from the winner's offsets
        let path = if round == 0 {
            "full_reload"
        } else {
            "incremental"
        };
        let fp = format!("ingest.{path}.before_commit=sleep(800)");
        let spawn = || {
            tidemark_process(T0)
                .arg("run")
                .arg(&p)
                .args(["--output", "json"])
                .env("TIDEMARK_FAILPOINTS", &fp)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let (a, b) = (spawn(), spawn());
        let mut replans = 0;
        for child in [a, b] {
            let out = child.wait_with_output().expect("wait");
            assert!(
                out.status.code() == Some(0) || out.status.code() == Some(75),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let summary: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_default();
            replans += summary["num_replans"].as_u64().unwrap_or(0);
            replans += u64::from(out.status.code() == Some(75));
        }
        assert!(replans >= 1, "round {round}: the two runs did not race");
        assert_eq!(
            bronze_rows(dir.path()).await,
            oracle(&produced),
            "round {round}"
        );
    }
    ok(&run(&p, &[]));
    assert_eq!(bronze_rows(dir.path()).await, oracle(&produced));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retention_gap_stops_the_run_or_is_skipped_and_counted() {
    let (dir, kafka, p) = setup("").await;
    let first = produce(&kafka, 10..13).await;
    ok(&run(&p, &[]));
    let more = produce(&kafka, 13..22).await;
    // partition 1 holds offsets 0..4 now; the fake retention deletes those below 3, and this
    // pipeline has read 0 of partition 1 only
    let gone = [("TIDEMARK_KAFKA_DELETED_BELOW", "1=3")];
    let out = run(&p, &gone);
    assert_eq!(out.code, 65, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("topic `payments` partition 1: offsets 1 to 2"),
        "{}",
        out.stderr
    );
    let p = pipeline(dir.path(), &kafka, ", on_data_loss: continue");
    let out = run(&p, &gone);
    ok(&out);
    assert!(out.stdout.contains("records lost"), "{}", out.stdout);
    let kept: Vec<(i64, i32, i64)> = first
        .into_iter()
        .chain(
            more.into_iter()
                .filter(|(_, part, off)| *part != 1 || *off >= 3),
        )
        .collect();
    assert_eq!(bronze_rows(dir.path()).await, oracle(&kept));
}

#[test]
fn config_mistakes_are_exit_78_and_an_unreachable_broker_75() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |kafka: &str| {
        let text = format!(
            "name: pay\nkind: ingest\nkafka: {{ {kafka} }}\nformat: json\ntarget: {{ uri: \"{d}/b\" }}\nschema:\n  id: string\nquarantine: {{ uri: \"{d}/q\" }}\n",
            d = dir.path().display()
        );
        let p = dir.path().join("k.yml");
        std::fs::write(&p, text).expect("write");
        p
    };
    for (kafka, says) in [
        ("brokers: [\"127.0.0.1:1\"], topc: t", "topc"),
        ("brokers: [\"nohost\"], topic: t", "host:port"),
        (
            "brokers: [\"127.0.0.1:1\"], topic: t, start: yesterday",
            "RFC 3339",
        ),
    ] {
        let mut c = tidemark_at(T0);
        let out = exec(c.arg("run").arg(write(kafka)));
        assert_eq!(out.code, 78, "{kafka}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{kafka}: {}", out.stderr);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let p = write(&format!(
        "brokers: [\"127.0.0.1:{port}\"], topic: t, request_timeout: 2s"
    ));
    let mut c = tidemark_at(T0);
    let out = exec(c.arg("run").arg(p));
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert!(out.stderr.contains("Kafka brokers"), "{}", out.stderr);
}

/// A Debezium event of a PostgreSQL row `(id, amount, note)`: `op` r, c, u or d, at log
/// position `lsn` (its commit time follows it).
fn dbz(op: &str, id: i64, amount: i64, note: &str, lsn: u64) -> String {
    let row = serde_json::json!({"id": id, "amount": amount, "note": note});
    debezium::event(op, row, 1_700_000_000_000 + lsn as i64 * 1000, lsn, None)
}

/// A change feed: a snapshot of keys 0–3, then creates, updates (some with the note
/// unavailable) and deletes; each event keyed by its row, so a key stays on one partition.
fn feed(from: i64, to: i64, live: &mut BTreeMap<i64, (i64, String)>) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for step in from..to {
        let id = (step * 7) % 6;
        let lsn = 1000 + step as u64;
        let event = if step < 4 {
            live.insert(step, (step, "s".into()));
            dbz("r", step, step, "s", 0)
        } else {
            match (live.get(&id).cloned(), step % 4) {
                (None, _) => {
                    live.insert(id, (step, format!("c{step}")));
                    dbz("c", id, step, &format!("c{step}"), lsn)
                }
                (Some((_, note)), 0) => {
                    live.remove(&id);
                    dbz("d", id, 0, &note, lsn)
                }
                (Some((_, note)), 1) => {
                    live.insert(id, (step, note));
                    dbz("u", id, step, MARKER, lsn)
                }
                (Some(_), _) => {
                    live.insert(id, (step, format!("u{step}")));
                    dbz("u", id, step, &format!("u{step}"), lsn)
                }
            }
        };
        out.push((id, event));
    }
    out
}

async fn produce_feed(kafka: &Kafka, topic: &str, events: &[(i64, String)]) {
    let msgs: Vec<Msg> = events
        .iter()
        .enumerate()
        .map(|(i, (id, v))| Msg {
            partition: (*id % 2) as i32,
            key: Some(format!("{{\"id\":{id}}}").into_bytes()),
            value: Some(v.clone().into_bytes()),
            headers: BTreeMap::new(),
            timestamp: ts(i as i64),
        })
        .collect();
    kafka.produce(topic, &msgs).await;
}

/// Silver's live rows: (id, amount, note).
async fn silver_rows(path: &Path) -> BTreeMap<i64, (i64, String)> {
    let mut out = BTreeMap::new();
    for b in read_all(path).await {
        let ids = b
            .column_by_name("id")
            .expect("id")
            .as_primitive::<Int64Type>();
        let amounts = b.column_by_name("amount").expect("amount");
        let amounts = amounts.as_primitive::<Int64Type>();
        let notes = b.column_by_name("note").expect("note");
        let notes = arrow::compute::cast(notes, &DataType::Utf8).expect("cast");
        let notes = notes.as_string::<i32>();
        for i in 0..b.num_rows() {
            out.insert(ids.value(i), (amounts.value(i), notes.value(i).to_string()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_debezium_topic_merged_into_silver_equals_the_source_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display();
    let kafka = common::kafka::start();
    kafka.create_topic("cdc", 2).await;
    let ingest = dir.path().join("ingest.yml");
    std::fs::write(
        &ingest,
        format!(
            "name: cdc_raw\nkind: ingest\nkafka: {{ brokers: [\"{}\"], topic: cdc }}\nformat: debezium\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nschema:\n  id: long not null\n  amount: long\n  note: string\nquarantine: {{ uri: \"{d}/lake/q_raw\" }}\n",
            kafka.addr
        ),
    )
    .expect("ingest pipeline");
    let merge = dir.path().join("merge.yml");
    std::fs::write(
        &merge,
        format!(
            "name: cdc\nkind: cdc_merge\nsource: {{ uri: \"{d}/lake/bronze\" }}\ntarget: {{ uri: \"{d}/lake/silver\" }}\nkeys: [id]\nsequence_by: _sequence\ntie_breakers: [_source_position, _source_ts]\noverlap: 10m\ndeletes: {{ column: _op, values: [d], mode: hard }}\nunavailable_marker: {MARKER}\nquarantine: {{ uri: \"{d}/lake/q_silver\" }}\n"
        ),
    )
    .expect("merge pipeline");
    let mut live = BTreeMap::new();
    for (from, to) in [(0, 24), (24, 40)] {
        let events = feed(from, to, &mut live);
        produce_feed(&kafka, "cdc", &events).await;
        ok(&run(&ingest, &[]));
        ok(&run(&merge, &[]));
        assert_eq!(
            silver_rows(&dir.path().join("lake/silver")).await,
            live,
            "after events {from}..{to}"
        );
    }
}
