//! A Debezium feed through the binary, landing files → bronze → silver → gold, with the docs'
//! pipelines: a snapshot whose rows were *read* after changes the stream then delivered
//! (ordering by the source's time would let the stale snapshot win), creates, updates whose
//! unchanged TOASTed note is `__debezium_unavailable_value`, deletes holding only the key,
//! precise (base64) and string decimals, with and without the schema envelope, a re-delivered
//! copy of a file and a truncate event — each table checked against an oracle computed from the
//! events themselves.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::debezium::{
    self, decimal_field, envelope_schema, precise, text_decimal, MARKER,
};
use crate::common::*;
use crate::readme::blocks;

use arrow::array::AsArray;
use arrow::datatypes::DataType;
use serde_json::{json, Value};

/// 2025-01-06T00:00:00Z in milliseconds.
const T0_MS: i64 = T0 / 1_000;
const H_MS: i64 = 3_600_000;

/// One change the "database" made, as the test keeps it for the oracle.
#[derive(Debug, Clone)]
struct Change {
    id: i64,
    op: &'static str,
    /// Source commit (or snapshot read) time, ms.
    ts_ms: i64,
    lsn: u64,
    /// Cents; `None` in a delete's key-only `before`.
    cents: Option<i64>,
    status: Option<&'static str>,
    /// `None`: the marker (unchanged TOASTed value).
    note: Option<String>,
    created_ms: Option<i64>,
}

fn created(id: i64) -> i64 {
    T0_MS + id * 2 * H_MS
}

fn row(c: &Change, envelope: bool) -> Value {
    let amount = c.cents.map(|v| {
        if envelope {
            precise(v.into())
        } else {
            text_decimal(v.into(), 2)
        }
    });
    let mut r = json!({"payment_id": c.id});
    if c.op == "d" {
        return r;
    }
    r["merchant_id"] = json!(format!("m{}", c.id % 3));
    r["amount"] = json!(amount);
    r["status"] = json!(c.status);
    r["note"] = json!(c.note.clone().unwrap_or_else(|| MARKER.to_string()));
    // created_at: MicroTimestamp (µs) with the envelope, RFC 3339 text without
    r["created_at"] = match (c.created_ms, envelope) {
        (Some(ms), true) => json!(ms * 1_000),
        (Some(ms), false) => json!(rfc3339(ms * 1_000)),
        (None, _) => Value::Null,
    };
    r
}

fn schema_envelope() -> Value {
    envelope_schema(json!([
        {"field": "payment_id", "type": "int64"},
        {"field": "merchant_id", "type": "string", "optional": true},
        decimal_field("amount", 12, 2),
        {"field": "status", "type": "string", "optional": true},
        {"field": "note", "type": "string", "optional": true},
        {"field": "created_at", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"}
    ]))
}

fn event(c: &Change, envelope: bool) -> String {
    let schema = envelope.then(schema_envelope);
    debezium::event(c.op, row(c, envelope), c.ts_ms, c.lsn, schema.as_ref())
}

fn land(dir: &Path, name: &str, changes: &[Change], envelope: bool) {
    let landing = dir.join("lake/landing/payments_cdc");
    std::fs::create_dir_all(&landing).expect("landing");
    let body: String = changes.iter().map(|c| event(c, envelope) + "\n").collect();
    std::fs::write(landing.join(name), body).expect("write");
}

fn upsert(
    id: i64,
    op: &'static str,
    ts_ms: i64,
    lsn: u64,
    cents: i64,
    status: &'static str,
    note: Option<&str>,
) -> Change {
    Change {
        id,
        op,
        ts_ms,
        lsn,
        cents: Some(cents),
        status: Some(status),
        note: note.map(str::to_string),
        created_ms: Some(created(id)),
    }
}

fn delete(id: i64, ts_ms: i64, lsn: u64) -> Change {
    Change {
        id,
        op: "d",
        ts_ms,
        lsn,
        cents: None,
        status: None,
        note: None,
        created_ms: None,
    }
}

/// The silver row per key: changes ordered as the docs' merge orders them (a snapshot read
/// before every streamed change, then the log position); the newest wins, a delete leaves a
/// tombstone, and a marker keeps the newest sent note since the last delete.
fn oracle(all: &[Change]) -> BTreeMap<i64, Option<(i64, &'static str, String)>> {
    let mut by_key: BTreeMap<i64, Vec<&Change>> = BTreeMap::new();
    for c in all {
        by_key.entry(c.id).or_default().push(c);
    }
    let mut out = BTreeMap::new();
    for (id, mut cs) in by_key {
        cs.sort_by_key(|c| (if c.op == "r" { 0 } else { c.ts_ms }, c.lsn));
        let newest = cs[cs.len() - 1];
        if newest.op == "d" {
            out.insert(id, None);
            continue;
        }
        let since = cs.iter().rposition(|c| c.op == "d").map_or(0, |i| i + 1);
        let note = cs[since..]
            .iter()
            .rev()
            .find_map(|c| c.note.clone())
            .unwrap_or_else(|| MARKER.to_string());
        out.insert(
            id,
            Some((
                newest.cents.unwrap_or_default(),
                newest.status.unwrap_or_default(),
                note,
            )),
        );
    }
    out
}

/// A docs block holding `needle`, from docs/kinds/ingest.md.
fn docs_block(needle: &str) -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/kinds/ingest.md"))
            .expect("docs");
    blocks(&text)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.contains(needle))
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("no yaml block with {needle}"))
}

fn run(dir: &Path, pipeline: &str) -> Out {
    let lake = format!("lake={}", dir.join("lake").display());
    exec(
        tidemark_at(T0 + 48 * HOUR)
            .current_dir(dir)
            .args(["run", pipeline, "--var", &lake]),
    )
}

async fn silver(dir: &Path) -> BTreeMap<i64, Option<(i64, String, String)>> {
    let mut out = BTreeMap::new();
    for b in read_all(&dir.join("lake/silver/payments")).await {
        let id = arrow::compute::cast(
            b.column_by_name("payment_id").expect("id"),
            &DataType::Int64,
        )
        .expect("cast");
        let id = id.as_primitive::<arrow::datatypes::Int64Type>();
        let amount = b
            .column_by_name("amount")
            .expect("amount")
            .as_primitive::<arrow::datatypes::Decimal128Type>()
            .clone();
        let text = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect("col"), &DataType::Utf8)
                .expect("cast")
                .as_string::<i32>()
                .clone()
        };
        let (status, note) = (text("status"), text("note"));
        let deleted = b
            .column_by_name("_deleted")
            .expect("_deleted")
            .as_boolean()
            .clone();
        for i in 0..b.num_rows() {
            let v = (!deleted.value(i)).then(|| {
                (
                    amount.value(i) as i64,
                    status.value(i).to_string(),
                    note.value(i).to_string(),
                )
            });
            out.insert(id.value(i), v);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_feed_reaches_gold_in_order_with_toast_deletes_and_exact_money() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("payments_cdc.yml"), docs_block("format: debezium")).expect("write");
    std::fs::write(d.join("payments.yml"), docs_block("kind: cdc_merge")).expect("write");
    std::fs::write(
        d.join("daily.yml"),
        "name: daily\nkind: aggregate\nsource: { uri: \"${var.lake}/silver/payments\" }\ntarget: { uri: \"${var.lake}/gold/daily\" }\nevent_date: { column: created_at }\nmeasures:\n  - { name: payments, agg: count }\n  - { name: amount, agg: sum, column: amount }\n",
    )
    .expect("write");

    // The snapshot read every row at 10:00 (LSN 1000); the stream then delivers changes committed
    // at 05:00–07:00 after the snapshot's start (LSN 2000+): they are newer than the snapshot.
    let mut all: Vec<Change> = Vec::new();
    let snapshot: Vec<Change> = (1..=16)
        .map(|id| {
            upsert(
                id,
                "r",
                T0_MS + 10 * H_MS,
                1000,
                id * 110 + 10,
                "captured",
                Some(&format!("n{id}")),
            )
        })
        .collect();
    let stream_a: Vec<Change> = (1..=8)
        .map(|id| {
            upsert(
                id,
                "u",
                T0_MS + 5 * H_MS,
                2000 + id as u64,
                id * 110 + 20,
                "refunded",
                None,
            )
        })
        .chain((17..=24).map(|id| {
            upsert(
                id,
                "c",
                T0_MS + 6 * H_MS,
                3000 + id as u64,
                3 * id + 1,
                "captured",
                Some("new"),
            )
        }))
        .collect();
    let stream_b = vec![
        delete(2, T0_MS + 7 * H_MS, 4002),
        delete(17, T0_MS + 7 * H_MS, 4017),
        upsert(
            20,
            "u",
            T0_MS + 7 * H_MS,
            4100,
            99_999_999_999,
            "captured",
            None,
        ),
        // 0.10 + 0.20: exact in decimal, not in a double
        upsert(25, "c", T0_MS + 7 * H_MS, 4101, 10, "captured", Some("a")),
        upsert(26, "c", T0_MS + 7 * H_MS, 4102, 20, "captured", Some("b")),
    ];
    land(d, "stream-b.json", &stream_b, true);
    land(d, "stream-a.json", &stream_a, false);
    land(d, "snapshot.json", &snapshot, true);
    all.extend(snapshot.iter().chain(&stream_a).chain(&stream_b).cloned());

    for p in ["payments_cdc.yml", "payments.yml", "daily.yml"] {
        let out = run(d, p);
        assert_eq!(out.code, 0, "{p}: {out:?}");
    }
    let expected = oracle(&all);
    let got = silver(d).await;
    let want: BTreeMap<i64, Option<(i64, String, String)>> = expected
        .iter()
        .map(|(k, v)| (*k, v.clone().map(|(c, s, n)| (c, s.to_string(), n))))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        got[&3],
        Some((350, "refunded".into(), "n3".into())),
        "the stream's update wins over the later-read snapshot, the TOASTed note is kept"
    );

    // gold: per UTC day of created_at, the live payments and their exact sum
    let mut days: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (id, v) in &want {
        if let Some((cents, _, _)) = v {
            let day = rfc3339(created(*id) * 1_000)[..10].to_string();
            let e = days.entry(day).or_default();
            e.0 += 1;
            e.1 += cents;
        }
    }
    let mut gold: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for b in read_all(&d.join("lake/gold/daily")).await {
        let day = arrow::compute::cast(
            b.column_by_name("event_date").expect("day"),
            &DataType::Utf8,
        )
        .expect("cast");
        let n = arrow::compute::cast(b.column_by_name("payments").expect("n"), &DataType::Int64)
            .expect("cast");
        let sum = b
            .column_by_name("amount")
            .expect("sum")
            .as_primitive::<arrow::datatypes::Decimal128Type>()
            .clone();
        for i in 0..b.num_rows() {
            gold.insert(
                day.as_string::<i32>().value(i).to_string(),
                (
                    n.as_primitive::<arrow::datatypes::Int64Type>().value(i),
                    sum.value(i) as i64,
                ),
            );
        }
    }
    assert_eq!(gold, days);

    // A re-delivered copy of a file is recorded, not appended again: nothing changes downstream.
    std::fs::copy(
        d.join("lake/landing/payments_cdc/stream-a.json"),
        d.join("lake/landing/payments_cdc/stream-a-copy.json"),
    )
    .expect("copy");
    assert_eq!(run(d, "payments_cdc.yml").code, 0);
    let merged = run(d, "payments.yml");
    assert_eq!(merged.code, 0, "{merged:?}");
    assert_eq!(silver(d).await, want);

    // A truncate stops the ingest: exit 65, the file and line named, nothing written.
    let bronze = version(&d.join("lake/bronze/payments_cdc")).await;
    std::fs::write(
        d.join("lake/landing/payments_cdc/truncate.json"),
        format!("{}\n{}\n", event(&upsert(30, "c", T0_MS + 8 * H_MS, 5000, 1, "captured", Some("x")), false),
            json!({"op": "t", "source": {"connector": "postgresql", "ts_ms": T0_MS + 9 * H_MS, "lsn": 5001}})),
    )
    .expect("write");
    let refused = run(d, "payments_cdc.yml");
    assert_eq!(refused.code, 65, "{refused:?}");
    assert!(
        refused.stderr.contains("line 2 of") && refused.stderr.contains("truncate"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        version(&d.join("lake/bronze/payments_cdc")).await,
        bronze,
        "nothing written"
    );

    // A file of rows a sink already unwrapped (no envelope) is named as such, not quarantined.
    std::fs::remove_file(d.join("lake/landing/payments_cdc/truncate.json")).expect("rm");
    std::fs::write(
        d.join("lake/landing/payments_cdc/unwrapped.json"),
        "{\"payment_id\":40,\"amount\":\"1.00\"}\n{\"payment_id\":41,\"amount\":\"2.00\"}\n",
    )
    .expect("write");
    let refused = run(d, "payments_cdc.yml");
    assert_eq!(refused.code, 65, "{refused:?}");
    assert!(
        refused.stderr.contains("ExtractNewRecordState") && refused.stderr.contains("format: json"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        version(&d.join("lake/bronze/payments_cdc")).await,
        bronze,
        "nothing written"
    );
}
