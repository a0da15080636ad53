//! Issue 32's chain on a real topic: a PostgreSQL connector's Debezium events for `payments`
//! (an initial snapshot, then creates, updates whose unchanged TOASTed `note` is the marker,
//! deletes followed by their tombstones, re-creates, and late changes to closed days; the
//! amount a `decimal(18, 2)` sent precisely — base64, the scale in the schema envelope — or as
//! text) through Kafka → bronze (ingest) → silver (cdc_merge) → gold (aggregate, closed days
//! adjusted), round after round, each stage killed (abort: as `kill -9`) at each of its phases
//! and then rerun. After every round bronze holds each produced record once by (partition,
//! offset), silver equals a plain fold over the produced events, gold plus its adjustments
//! equals that fold's exact daily totals, the day facts (open or final, adjusted) are right,
//! and a rerun of every stage commits nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use chrono::NaiveDate;

use crate::common::debezium::MARKER;
use crate::common::kafka::{self, Kafka};
use crate::common::*;

mod feed;

use feed::*;

/// The rounds after the bootstrap; each kills every stage once.
const ROUNDS: usize = 7;

/// Each stage's kill points on its incremental path, in the order a run passes them.
const INGEST: [&str; 6] = kafka::INCREMENTAL_POINTS;
const MERGE: [&str; 7] = [
    "after_plan",
    "after_read",
    "after_validate",
    "after_dedup",
    "after_compare",
    "before_commit",
    "after_commit",
];
const AGGREGATE: [&str; 6] = [
    "after_plan",
    "after_read",
    "after_compare",
    "committed_adjustments",
    "committed_target",
    "after_write",
];
/// On the bootstrap (whole-source) path: the points before the first commit, then one after.
const INGEST_BOOT: [&str; 5] = [
    "after_plan",
    "after_read",
    "after_validate",
    "before_commit",
    "committed_target",
];
/// (a merge with partial updates sorts every source row on this path: it has no dedup phase)
const MERGE_BOOT: [&str; 4] = ["after_plan", "after_read", "after_validate", "after_write"];
const AGGREGATE_BOOT: [&str; 2] = ["after_plan", "after_write"];

fn col<'a>(b: &'a RecordBatch, name: &str) -> &'a dyn Array {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("column {name}"))
        .as_ref()
}

fn texts(b: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let c = arrow::compute::cast(col(b, name), &DataType::Utf8).expect("cast");
    c.as_string::<i32>()
        .iter()
        .map(|v| v.map(str::to_string))
        .collect()
}

/// A decimal column's unscaled values, checked to be `decimal(precision, 2)`.
fn cents(b: &RecordBatch, name: &str, precision: u8) -> Vec<Option<i128>> {
    let c = col(b, name);
    assert_eq!(c.data_type(), &DataType::Decimal128(precision, 2), "{name}");
    c.as_primitive::<Decimal128Type>().iter().collect()
}

fn dates(b: &RecordBatch, name: &str) -> Vec<NaiveDate> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
    (col(b, name).as_primitive::<Date32Type>().values().iter())
        .map(|d| epoch + chrono::Days::new(*d as u64))
        .collect()
}

fn longs(b: &RecordBatch, name: &str) -> Vec<i64> {
    col(b, name).as_primitive::<Int64Type>().values().to_vec()
}

async fn bronze(lake: &Path) -> Vec<BronzeRow> {
    let mut out = Vec::new();
    for b in read_all(&lake.join("bronze/payments_cdc")).await {
        let parts = col(&b, "_kafka_partition").as_primitive::<Int32Type>();
        let (offs, ids) = (longs(&b, "_kafka_offset"), longs(&b, "payment_id"));
        let (ops, amounts) = (texts(&b, "_op"), cents(&b, "amount", 18));
        for i in 0..b.num_rows() {
            let op = ops[i].clone().expect("op");
            out.push((parts.value(i), offs[i], ids[i], op, amounts[i]));
        }
    }
    out.sort();
    out
}

async fn silver(lake: &Path) -> BTreeMap<i64, Option<Row>> {
    let mut out = BTreeMap::new();
    for b in read_all(&lake.join("silver/payments")).await {
        let (ids, amounts) = (longs(&b, "payment_id"), cents(&b, "amount", 18));
        let (currency, status, note) = (
            texts(&b, "currency"),
            texts(&b, "status"),
            texts(&b, "note"),
        );
        let created = col(&b, "created_at").as_primitive::<TimestampMicrosecondType>();
        let deleted = col(&b, "_deleted").as_boolean();
        for i in 0..b.num_rows() {
            let row = (!deleted.value(i)).then(|| {
                (
                    amounts[i].expect("amount"),
                    currency[i].clone().expect("currency"),
                    status[i].clone().expect("status"),
                    note[i].clone().expect("note"),
                    created.value(i) / 1_000,
                )
            });
            assert!(
                out.insert(ids[i], row).is_none(),
                "payment {} twice",
                ids[i]
            );
        }
    }
    out
}

/// Gold's rows, (day, currency) → (totals, is_final); or the adjustments' rows summed, with
/// `false` for is_final, and (day, reported_in, run_id) of each.
async fn gold_rows(
    path: &Path,
) -> (
    BTreeMap<(NaiveDate, String), (Totals, bool)>,
    Vec<(NaiveDate, NaiveDate, String)>,
) {
    let (mut out, mut booked) = (BTreeMap::new(), Vec::new());
    if version(path).await.is_none() {
        return (out, booked);
    }
    for b in read_all(path).await {
        let (days, currency) = (dates(&b, "event_date"), texts(&b, "currency"));
        let (n, refunds) = (longs(&b, "payments"), longs(&b, "refunds"));
        let amount = cents(&b, "amount", 28);
        let adjustment = b.column_by_name("reported_in").is_some();
        for i in 0..b.num_rows() {
            let key = (days[i], currency[i].clone().expect("currency"));
            let e: &mut (Totals, bool) = out.entry(key).or_default();
            e.0 .0 += n[i];
            e.0 .1 += amount[i].expect("sum");
            e.0 .2 += refunds[i];
            if adjustment {
                let run = texts(&b, "run_id")[i].clone().expect("run");
                booked.push((days[i], dates(&b, "reported_in")[i], run));
            } else {
                e.1 = col(&b, "is_final").as_boolean().value(i);
            }
        }
    }
    (out, booked)
}

/// The status table: day → (is_final, rows, adjusted_after_close).
async fn day_status(path: &Path) -> BTreeMap<NaiveDate, (bool, i64, i64)> {
    let mut out = BTreeMap::new();
    for b in read_all(path).await {
        let (days, rows, adjusted) = (
            dates(&b, "event_date"),
            longs(&b, "rows"),
            longs(&b, "adjusted_after_close"),
        );
        let is_final = col(&b, "is_final").as_boolean();
        for i in 0..b.num_rows() {
            out.insert(days[i], (is_final.value(i), rows[i], adjusted[i]));
        }
    }
    out
}

/// Every check of a round whose logical date is `logical`.
async fn check(lake: &Path, events: &[Event], produced: &[Produced], logical: NaiveDate) {
    assert_eq!(
        bronze(lake).await,
        bronze_oracle(events, produced),
        "bronze: each record once"
    );
    let want = silver_oracle(events);
    assert_eq!(silver(lake).await, want, "silver");
    let want = gold_oracle(&want);
    let closed_before = logical - chrono::Days::new(LOOKBACK as u64);
    let (gold, _) = gold_rows(&lake.join("gold/daily_payments")).await;
    let (adjusted, booked) = gold_rows(&lake.join("gold/daily_payments_adjustments")).await;
    for ((day, currency), (_, is_final)) in &gold {
        assert_eq!(
            *is_final,
            *day < closed_before,
            "is_final of {day} {currency}"
        );
    }
    // published + adjustments == the oracle, exactly; an open day is gold's alone
    let mut combined: BTreeMap<(NaiveDate, String), Totals> = BTreeMap::new();
    for (k, (t, _)) in gold.iter().chain(&adjusted) {
        let c = combined.entry(k.clone()).or_default();
        (c.0, c.1, c.2) = (c.0 + t.0, c.1 + t.1, c.2 + t.2);
    }
    combined.retain(|_, t| *t != (0, 0, 0));
    assert_eq!(combined, want, "gold + adjustments");
    for (day, reported, _) in &booked {
        assert!(
            *day < *reported - chrono::Days::new(LOOKBACK as u64) && *reported <= logical,
            "an adjustment for {day}, open when booked in {reported}"
        );
    }
    // the day status: every day with payments, open or final, its rows, its adjusting runs
    let status = day_status(&lake.join("gold/daily_payments_status")).await;
    let mut rows: BTreeMap<NaiveDate, i64> = BTreeMap::new();
    for ((day, _), t) in &want {
        *rows.entry(*day).or_default() += t.0;
    }
    // (a run killed after its adjustments' commit, before the status table's, at
    // `committed_adjustments` or `committed_target`, is counted by its rerun: every run that
    // booked for a day is)
    let mut runs: BTreeMap<NaiveDate, BTreeSet<&str>> = BTreeMap::new();
    for (day, _, run) in &booked {
        runs.entry(*day).or_default().insert(run);
    }
    for day in rows.keys() {
        assert!(status.contains_key(day), "no status for {day}: {status:?}");
    }
    for (day, (is_final, n, adjusting)) in &status {
        assert_eq!(
            *is_final,
            *day < closed_before,
            "status of {day}, as of {logical}"
        );
        let want = rows.get(day).copied().unwrap_or(0);
        assert_eq!(*n, want, "rows of {day}, as of {logical}");
        let by = runs.get(day).map_or(0, |r| r.len() as i64);
        assert_eq!(
            *adjusting, by,
            "runs that adjusted {day}, as of {logical}: {booked:?}"
        );
    }
}

struct Chain {
    dir: tempfile::TempDir,
    ingest: PathBuf,
    merge: PathBuf,
    gold: PathBuf,
}

impl Chain {
    fn new(kafka: &Kafka) -> Chain {
        let dir = tempfile::tempdir().expect("tempdir");
        let lake = dir.path().join("lake");
        let l = lake.display();
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("pipeline");
            p
        };
        let ingest = write(
            "payments_cdc.yml",
            format!(
                "name: payments_cdc\nkind: ingest\nkafka: {{ brokers: [\"{}\"], topic: \"{TOPIC}\", request_timeout: 20s }}\nformat: debezium\ntarget: {{ uri: \"{l}/bronze/payments_cdc\" }}\nschema:\n  payment_id: long not null\n  amount: decimal(18, 2)\n  currency: string\n  status: string\n  note: string\n  created_at: timestamp\nquarantine: {{ uri: \"{l}/quarantine/payments_cdc\" }}\n",
                kafka.addr
            ),
        );
        let merge = write(
            "payments.yml",
            format!("name: payments\nkind: cdc_merge\nsource: {{ uri: \"{l}/bronze/payments_cdc\" }}\ntarget: {{ uri: \"{l}/silver/payments\" }}\nkeys: [payment_id]\nsequence_by: _sequence\ntie_breakers: [_source_position, _source_ts, _ingested_at]\noverlap: 15m\ndeletes: {{ column: _op, values: [d], mode: soft }}\nunavailable_marker: {MARKER}\nquarantine: {{ uri: \"{l}/quarantine/payments\" }}\n"),
        );
        let gold = write(
            "daily_payments.yml",
            format!("name: daily_payments\nkind: aggregate\nsource: {{ uri: \"{l}/silver/payments\" }}\ntarget: {{ uri: \"{l}/gold/daily_payments\" }}\nevent_date: {{ column: created_at, time_zone: Europe/Amsterdam }}\ngroup_by: [currency]\nmeasures:\n  - {{ name: payments, agg: count }}\n  - {{ name: amount, agg: sum, column: amount }}\n  - {{ name: refunds, agg: count, filter: \"status = 'refunded'\" }}\nrecompute: {{ lookback: {LOOKBACK}d }}\nafter_close: adjust\n"),
        );
        Chain {
            dir,
            ingest,
            merge,
            gold,
        }
    }

    fn lake(&self) -> PathBuf {
        self.dir.path().join("lake")
    }

    /// Runs each stage at round `r`'s time: first killed at each of `kills` (stage by
    /// stage), then to completion.
    fn run(&self, r: usize, kills: [&[&str]; 3]) {
        let logical = local_day(logical_ms(r)).to_string();
        let path = if r == 0 { "full_reload" } else { "incremental" };
        let stages = [
            ("ingest", &self.ingest),
            ("cdc_merge", &self.merge),
            ("aggregate", &self.gold),
        ];
        for ((kind, pipeline), points) in stages.into_iter().zip(kills) {
            let go = |failpoint: Option<String>| {
                let mut c = tidemark_at((logical_ms(r) + 20 * H_MS) * 1_000);
                c.arg("run").arg(pipeline);
                if kind == "aggregate" {
                    c.args(["--logical-date", &logical]);
                }
                if let Some(f) = failpoint {
                    c.env("TIDEMARK_FAILPOINTS", f);
                }
                exec(&mut c)
            };
            for point in points {
                let out = go(Some(format!("{kind}.{path}.{point}=abort")));
                assert_eq!(
                    out.code, -1,
                    "round {r}: {kind} not killed at {point}: {out:?}"
                );
            }
            let out = go(None);
            assert_eq!(out.code, 0, "round {r}: {kind}: {out:?}");
        }
    }

    async fn versions(&self) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for t in [
            "bronze/payments_cdc",
            "silver/payments",
            "gold/daily_payments",
            "gold/daily_payments_status",
            "gold/daily_payments_adjustments",
        ] {
            out.push(version(&self.lake().join(t)).await);
        }
        out
    }
}

/// Round `r`'s day at midnight UTC, ms: 2025-01-06 + r days (its local day is the logical date).
fn logical_ms(r: usize) -> i64 {
    T0 / 1_000 + r as i64 * DAY_MS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_topic_reaches_gold_exactly_once_through_kills_at_every_phase() {
    let kafka = kafka::start();
    kafka.create_topic(TOPIC, PARTITIONS).await;
    let chain = Chain::new(&kafka);
    let mut source = Source::new(0x9e37_79b9_7f4a_7c15);
    let (mut events, mut produced) = (Vec::new(), Vec::new());
    for r in 0..=ROUNDS {
        let logical = local_day(logical_ms(r));
        let round = if r == 0 {
            source.snapshot_and_stream(logical_ms(r))
        } else {
            source.stream(logical_ms(r), logical)
        };
        produced.extend(produce(&kafka, &round, events.len()).await);
        events.extend(round);
        if r == 0 {
            let totals = gold_oracle(&silver_oracle(&events));
            assert!(
                totals.values().any(|t| t.1 > i64::MAX as i128),
                "a day's sum past an i64: {totals:?}"
            );
        }
        if r == 0 {
            chain.run(r, [&INGEST_BOOT, &MERGE_BOOT, &AGGREGATE_BOOT]);
        } else {
            let at = r - 1;
            chain.run(
                r,
                [
                    &INGEST[at % INGEST.len()..][..1],
                    &MERGE[at % MERGE.len()..][..1],
                    &AGGREGATE[at % AGGREGATE.len()..][..1],
                ],
            );
        }
        check(&chain.lake(), &events, &produced, logical).await;
        // a rerun of the chain with nothing new commits nothing anywhere
        let before = chain.versions().await;
        chain.run(r, [&[], &[], &[]]);
        assert_eq!(
            chain.versions().await,
            before,
            "round {r}: an idle rerun committed"
        );
        check(&chain.lake(), &events, &produced, logical).await;
    }
    // the feed did what it is for: late changes were booked as adjustments, deleted keys
    // created again, TOAST placeholders sent
    let (_, booked) = gold_rows(&chain.lake().join("gold/daily_payments_adjustments")).await;
    assert!(booked.len() >= 3, "{booked:?}");
    let toasted = (events.iter())
        .filter(|e| e.row.as_ref().is_some_and(|s| s.note.is_none()))
        .count();
    let recreated = (events.iter().enumerate())
        .filter(|(i, e)| e.op == "c" && events[..*i].iter().any(|d| d.op == "d" && d.id == e.id))
        .count();
    assert!(
        toasted >= 5 && recreated >= 1,
        "toasted {toasted}, re-created {recreated}"
    );
}
