//! `tidemark lateness` end to end: the binary on real Delta tables in temporary directories,
//! its numbers checked against an independent computation over the rows the test wrote.
//!
//! The oracle is plain Rust over the rows: calendar days late with `div_euclid`, DuckDB's
//! `quantile_cont` over a sorted vector of lateness floored to the millisecond (to the second per
//! `--by` group — the precision the command documents), the settled window `[now-FROM, now-TO)`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Date32Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use common::*;
use serde_json::Value;

const SEC: i64 = 1_000_000;
const DAY: i64 = 24 * HOUR;

/// One bronze row: event time, arrival, source system.
#[derive(Debug, Clone, Copy)]
struct Row {
    ev: Option<i64>,
    ar: Option<i64>,
    src: Option<&'static str>,
}

fn schema() -> Arc<Schema> {
    let ts = |n: &str| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        ts("updated_at"),
        ts("_ingested_at"),
        Field::new("src", DataType::Utf8, true),
    ]))
}

fn to_batch(rows: &[Row]) -> RecordBatch {
    let ts = |v: Vec<Option<i64>>| -> ArrayRef {
        Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"))
    };
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(
                (0..rows.len())
                    .map(|i| Some(format!("p{i}")))
                    .collect::<Vec<_>>(),
            )),
            ts(rows.iter().map(|r| r.ev).collect()),
            ts(rows.iter().map(|r| r.ar).collect()),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.src).collect::<Vec<_>>(),
            )),
        ],
    )
    .expect("batch")
}

/// Appends `batch` to the Delta table at `path` as one commit (creating it).
async fn write(path: &Path, batch: RecordBatch) {
    append_batch(path, batch).await;
}

/// A tiny deterministic generator (no test depends on a crate's random numbers).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }
    fn below(&mut self, n: i64) -> i64 {
        (self.next() % n as u64) as i64
    }
}

/// The latest arrival: `T0 + 12_345 µs`, so the log's millisecond-truncated statistics are
/// 345 µs short of it and the rows at the window's edges must wait for the exact value.
const MAX_ARRIVAL: i64 = T0 + 12_345;

/// 20,000 rows over 200 days of event time with a known lateness mixture per source, a few
/// clock-skewed and null rows, and rows exactly at the default window's edges.
fn rows() -> Vec<Row> {
    let mut g = Lcg(7);
    let mut out = Vec::new();
    for i in 0..20_000 {
        let ev = T0 - 200 * DAY + g.below(199 * DAY);
        let (src, lateness) = match g.below(1000) {
            0..=849 => ("app", g.below(120 * SEC)),
            850..=949 => ("app", HOUR + g.below(29 * HOUR)),
            950..=979 => ("partner", DAY + g.below(3 * DAY)),
            980..=994 => ("mobile", 7 * DAY + g.below(33 * DAY)),
            _ => ("mobile", -(SEC + g.below(10 * MIN))),
        };
        let ar = (ev + lateness).min(MAX_ARRIVAL - 1);
        let row = match i % 997 {
            1 => Row {
                ev: None,
                ar: Some(ar),
                src: Some(src),
            },
            2 => Row {
                ev: Some(ev),
                ar: None,
                src: Some(src),
            },
            3 => Row {
                ev: None,
                ar: None,
                src: None,
            },
            4 => Row {
                ev: Some(ev),
                ar: Some(ar),
                src: None,
            },
            _ => Row {
                ev: Some(ev),
                ar: Some(ar),
                src: Some(src),
            },
        };
        out.push(row);
    }
    let at = |ev: i64, late: i64| Row {
        ev: Some(ev),
        ar: Some(ev + late),
        src: Some("app"),
    };
    out.push(Row {
        ev: Some(T0 - HOUR),
        ar: Some(MAX_ARRIVAL),
        src: Some("app"),
    });
    // The default window [now-120d, now-30d): its first microsecond is in, its last out.
    out.push(at(MAX_ARRIVAL - 120 * DAY, 5 * SEC));
    out.push(at(MAX_ARRIVAL - 120 * DAY - 1, 7 * SEC));
    out.push(at(MAX_ARRIVAL - 30 * DAY, 11 * SEC));
    out.push(at(MAX_ARRIVAL - 30 * DAY - 1, 13 * SEC));
    // Lateness of exactly the budget (not beyond it) and one microsecond more.
    out.push(at(T0 - 90 * DAY, 3 * DAY));
    out.push(at(T0 - 90 * DAY, 3 * DAY + 1));
    out
}

/// Writes the rows in three commits (several files: several scan partitions).
async fn write_rows(path: &Path, rows: &[Row]) {
    let third = rows.len() / 3;
    for chunk in [&rows[..third], &rows[third..2 * third], &rows[2 * third..]] {
        write(path, to_batch(chunk)).await;
    }
}

/// What the command must print, computed from the rows.
struct Expected {
    rows: u64,
    profiled: u64,
    null_event: u64,
    null_arrival: u64,
    negative: u64,
    days: BTreeMap<i64, u64>,
    hours: BTreeMap<i64, u64>,
    settled: u64,
    settled_negative: u64,
    settled_days: BTreeMap<i64, u64>,
    settled_lateness: Vec<i64>,
    percentiles: [f64; 4],
    max: f64,
    beyond_budget: u64,
    beyond_overlap: u64,
}

/// DuckDB's `quantile_cont`: linear interpolation at `(n - 1) q` of the sorted values.
fn quantile_cont(sorted: &[i64], q: f64) -> f64 {
    let pos = (sorted.len() - 1) as f64 * q;
    let (lo, hi) = (sorted[pos.floor() as usize], sorted[pos.ceil() as usize]);
    let frac = pos - pos.floor();
    if frac == 0.0 {
        lo as f64
    } else {
        lo as f64 + (hi - lo) as f64 * frac
    }
}

#[allow(clippy::too_many_arguments)]
fn expect(
    rows: &[Row],
    now: i64,
    from: i64,
    to: i64,
    budget: i64,
    overlap: i64,
    precision: i64,
) -> Expected {
    let (lo, hi) = (now - from, now - to);
    let mut e = Expected {
        rows: rows.len() as u64,
        profiled: 0,
        null_event: 0,
        null_arrival: 0,
        negative: 0,
        days: BTreeMap::new(),
        hours: BTreeMap::new(),
        settled: 0,
        settled_negative: 0,
        settled_days: BTreeMap::new(),
        settled_lateness: Vec::new(),
        percentiles: [0.0; 4],
        max: 0.0,
        beyond_budget: 0,
        beyond_overlap: 0,
    };
    let mut keys = Vec::new();
    for r in rows {
        e.null_event += u64::from(r.ev.is_none());
        e.null_arrival += u64::from(r.ar.is_none());
        let (Some(ev), Some(ar)) = (r.ev, r.ar) else {
            continue;
        };
        let late = ar - ev;
        e.profiled += 1;
        e.negative += u64::from(late < 0);
        e.beyond_budget += u64::from(late > budget);
        e.beyond_overlap += u64::from(late > overlap);
        let days = ar.div_euclid(DAY) - ev.div_euclid(DAY);
        *e.days.entry(days).or_default() += 1;
        *e.hours.entry(late.div_euclid(HOUR)).or_default() += 1;
        keys.push(late.div_euclid(precision));
        if ev >= lo && ev < hi {
            if late < 0 {
                e.settled_negative += 1;
            } else {
                e.settled += 1;
                *e.settled_days.entry(days).or_default() += 1;
                e.settled_lateness.push(late);
            }
        }
    }
    keys.sort_unstable();
    let per_second = (SEC / precision) as f64;
    for (i, q) in [0.5, 0.9, 0.99, 0.999].into_iter().enumerate() {
        e.percentiles[i] = quantile_cont(&keys, q) / per_second;
    }
    e.max = rows
        .iter()
        .filter_map(|r| Some(r.ar? - r.ev?))
        .max()
        .unwrap_or(0) as f64
        / SEC as f64;
    e
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole as f64
}

/// The smallest whole second covering `pct_num / pct_den` of the settled rows: the
/// `ceil(share * n)`-th smallest lateness, rounded up to the second.
fn needed_seconds(settled: &[i64], pct_num: u64, pct_den: u64) -> u64 {
    let mut sorted = settled.to_vec();
    sorted.sort_unstable();
    let need = (pct_num * sorted.len() as u64).div_ceil(pct_den).max(1);
    let v = sorted[need as usize - 1];
    (v.max(0) as u64).div_ceil(SEC as u64)
}

/// Equal up to float parsing: serde_json may read a printed f64 back one ulp off.
fn close(got: f64, want: f64) -> bool {
    got == want || (got - want).abs() <= 1e-12 * want.abs().max(1.0)
}

macro_rules! assert_close {
    ($got:expr, $want:expr, $($what:tt)+) => {{
        let (got, want): (f64, f64) = ($got, $want);
        assert!(close(got, want), "{} != {}: {}", got, want, format!($($what)+));
    }};
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn int(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Checks one profile object against the oracle.
fn check(p: &Value, e: &Expected, overlap: i64, what: &str) {
    assert_eq!(int(&p["rows"]), e.rows, "{what}: rows");
    assert_eq!(int(&p["profiled_rows"]), e.profiled, "{what}: profiled");
    assert_eq!(int(&p["null_event_time"]), e.null_event, "{what}");
    assert_eq!(int(&p["null_arrival"]), e.null_arrival, "{what}");
    assert_eq!(int(&p["negative_rows"]), e.negative, "{what}: negative");
    assert_eq!(int(&p["beyond_budget"]["rows"]), e.beyond_budget, "{what}");
    assert_eq!(
        int(&p["beyond_overlap"]["rows"]),
        e.beyond_overlap,
        "{what}"
    );
    let ps = &p["percentiles_s"];
    for (name, want) in ["p50", "p90", "p99", "p999"].iter().zip(e.percentiles) {
        assert_close!(num(&ps[name]), want, "{what}: {name} {ps}");
    }
    assert_close!(num(&ps["max"]), e.max, "{what}: max");
    let hist: BTreeMap<i64, u64> = p["histogram"]
        .as_array()
        .expect("histogram")
        .iter()
        .map(|b| (b["late"].as_i64().expect("late"), int(&b["rows"])))
        .collect();
    assert_eq!(hist, e.days, "{what}: days histogram");
    assert_eq!(int(&p["settled_rows"]), e.settled, "{what}: settled");
    assert_eq!(
        int(&p["settled_negative_rows"]),
        e.settled_negative,
        "{what}"
    );
    let mut cum = 0;
    let curve = p["completeness_days"].as_array().expect("curve");
    assert_eq!(curve.len(), e.settled_days.len(), "{what}");
    for (point, (days, rows)) in curve.iter().zip(&e.settled_days) {
        cum += rows;
        assert_eq!(point["days_late"].as_i64(), Some(*days), "{what}");
        assert_eq!(int(&point["rows"]), *rows, "{what}");
        assert_close!(num(&point["pct_complete"]), pct(cum, e.settled), "{what}");
    }
    for point in p["completeness_hours"].as_array().expect("hours") {
        let h = point["within"].as_i64().expect("hours");
        let within = e
            .settled_lateness
            .iter()
            .filter(|&&l| l <= h * HOUR)
            .count() as u64;
        assert_close!(
            num(&point["pct_complete"]),
            pct(within, e.settled),
            "{what}: {h}h"
        );
    }
    let rec = &p["recommendation"];
    let needed = needed_seconds(&e.settled_lateness, 999, 1000);
    assert_eq!(int(&rec["needed_s"]), needed, "{what}: {rec}");
    let lookback = int(&rec["lookback_s"]);
    assert!(lookback >= needed, "{rec}");
    let covered = |s: i64| e.settled_lateness.iter().filter(|&&l| l <= s).count() as u64;
    assert_close!(
        num(&rec["lookback_covers_pct"]),
        pct(covered(lookback as i64 * SEC), e.settled),
        "{what}"
    );
    assert_close!(
        num(&rec["overlap_covers_pct"]),
        pct(covered(overlap), e.settled),
        "{what}"
    );
}

fn json(out: &Out) -> Value {
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}\n{}", out.stdout, out.stderr))
}

/// A pipeline over `dir/lake/bronze` with a 15-minute overlap.
fn pipeline(dir: &Path) -> PathBuf {
    write_pipeline(dir, "15m", "soft", "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curve_percentiles_and_counts_equal_an_independent_computation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = rows();
    write_rows(&bronze(dir.path()), &rows).await;
    let p = pipeline(dir.path());
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--by", "src", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = json(&out);
    // `now` is the latest arrival, exact to the microsecond (the log says 345 µs less).
    assert_eq!(v["now"], rfc3339_us(MAX_ARRIVAL), "{}", v["now"]);
    assert_eq!(v["now_from"], "max_arrival");
    assert_eq!(v["event_time"], "updated_at");
    assert_eq!(v["arrival"], "_ingested_at");
    assert_eq!(v["pipeline"], "test");
    assert_eq!(v["overlap_s"], 900.0);
    assert_eq!(v["settled"]["from"], "120d");
    assert_eq!(v["settled"]["to"], "30d");
    let (budget, overlap) = (3 * DAY, 15 * MIN);
    let e = expect(
        &rows,
        MAX_ARRIVAL,
        120 * DAY,
        30 * DAY,
        budget,
        overlap,
        1_000,
    );
    assert!(e.settled > 5_000 && e.negative > 0 && e.beyond_budget > 0);
    check(&v["overall"], &e, overlap, "table");
    assert_eq!(v["overall"]["percentile_precision_s"], 0.001);

    // Per source system, at the second, the tail's owner first.
    let groups = v["groups"].as_array().expect("groups");
    let names: Vec<Value> = groups.iter().map(|g| g["group"].clone()).collect();
    assert_eq!(names[0], "mobile", "{names:?}");
    assert_eq!(names.len(), 4, "app, partner, mobile and null: {names:?}");
    assert!(names.contains(&Value::Null), "{names:?}");
    for g in groups {
        let name = g["group"].as_str();
        let mine: Vec<Row> = rows.iter().copied().filter(|r| r.src == name).collect();
        let e = expect(
            &mine,
            MAX_ARRIVAL,
            120 * DAY,
            30 * DAY,
            budget,
            overlap,
            SEC,
        );
        if e.settled == 0 {
            assert!(g["recommendation"].is_null(), "{g}");
            continue;
        }
        check(g, &e, overlap, &format!("group {name:?}"));
    }
    let beyond: Vec<u64> = groups
        .iter()
        .map(|g| int(&g["beyond_budget"]["rows"]))
        .collect();
    assert!(beyond.windows(2).all(|w| w[0] >= w[1]), "{beyond:?}");

    // The text says the same, out loud.
    let text = exec(tidemark_in(dir.path(), T0 + DAY).arg("lateness").arg(&p));
    assert_eq!(text.code, 0, "{}", text.stderr);
    let rec = &v["overall"]["recommendation"];
    let sentence = format!(
        "lookback {} keeps 99.9% of rows inside open days",
        rec["lookback"].as_str().expect("lookback")
    );
    let overlap = format!(
        "overlap 15m spans {:.1}% of them, a cost setting: later rows are still merged",
        num(&rec["overlap_covers_pct"])
    );
    // (the text wraps at 100 columns: compared with its lines joined)
    let joined = text.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(joined.contains(&overlap), "{overlap}\n{}", text.stdout);
    assert!(joined.contains(&sentence), "{sentence}\n{}", text.stdout);
    assert!(text.stdout.contains("clock skew"), "{}", text.stdout);
    assert!(text.stdout.contains("D+0 (same day)"), "{}", text.stdout);

    // The engine settings a run takes: the same answer in one partition under a memory limit,
    // its spill directory gone afterwards; a bad value is a usage error naming the flag.
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).expect("spill dir");
    let limited = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--by", "src", "--output", "json", "--threads", "1"])
            .args(["--memory-limit", "64MiB", "--spill-dir"])
            .arg(&spill),
    );
    assert_eq!(limited.code, 0, "{}", limited.stderr);
    assert_eq!(json(&limited), v);
    let left: Vec<_> = std::fs::read_dir(&spill).expect("spill").collect();
    assert!(left.is_empty(), "spill directories left behind: {left:?}");
    for (flag, value) in [
        ("--memory-limit", "1kb"),
        ("--threads", "0"),
        ("--spill-dir", "/dev/null/x"),
    ] {
        let out = exec(
            tidemark_in(dir.path(), T0 + DAY)
                .arg("lateness")
                .arg(&p)
                .args([flag, value]),
        );
        assert_eq!(out.code, 64, "{flag} {value}: {}", out.stderr);
    }
}

fn rfc3339_us(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .expect("time")
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_settled_budget_and_unit_flags_move_the_numbers_as_the_oracle_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = rows();
    let table = dir.path().join("t");
    write_rows(&table, &rows).await;
    let now = T0 - 50 * DAY;
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&table)
            .args([
                "--event-time",
                "updated_at",
                "--now",
                &rfc3339_us(now),
                "--settled",
                "60d..10d",
                "--budget",
                "36h",
                "--unit",
                "hours",
                "--target-completeness",
                "99.9",
                "--output",
                "json",
            ]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["now_from"], "flag");
    assert!(v["pipeline"].is_null() && v["overlap"].is_null());
    let e = expect(&rows, now, 60 * DAY, 10 * DAY, 36 * HOUR, 0, 1_000);
    let p = &v["overall"];
    assert_eq!(int(&p["settled_rows"]), e.settled);
    assert_eq!(int(&p["beyond_budget"]["rows"]), e.beyond_budget);
    assert!(p["beyond_overlap"].is_null());
    let hist: BTreeMap<i64, u64> = p["histogram"]
        .as_array()
        .expect("histogram")
        .iter()
        .map(|b| (b["late"].as_i64().expect("late"), int(&b["rows"])))
        .collect();
    assert_eq!(hist, e.hours, "elapsed hours late");
    let needed = needed_seconds(&e.settled_lateness, 999, 1000);
    assert_eq!(int(&p["recommendation"]["needed_s"]), needed);
    // Event times after `now` exist, but only the window counts; everything else sees all rows.
    assert_eq!(int(&p["profiled_rows"]), e.profiled);

    // A bare table needs its event-time column named.
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&table),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--event-time"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_table_is_a_profile_of_no_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&bronze(dir.path()), to_batch(&[])).await;
    let p = pipeline(dir.path());
    let out = exec(tidemark_in(dir.path(), T0 + DAY).arg("lateness").arg(&p));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("no rows"), "{}", out.stdout);
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--output", "json", "--by", "src"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["overall"]["rows"], 0);
    assert!(v["now"].is_null());
    assert!(v["overall"]["percentiles_s"]["p50"].is_null());
    assert!(v["overall"]["recommendation"].is_null());
    assert_eq!(v["groups"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_an_arrival_column_or_with_odd_columns_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The test pipeline's usual bronze (id, updated_at, _ingested_at, val, op) ...
    append(&bronze(dir.path()), &[Change::upsert("a", T0, T0 + MIN, 1)]).await;
    let p = pipeline(dir.path());
    // ... with a typo in --arrival: named, with the columns and a suggestion.
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--arrival", "_ingest_at"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--arrival"), "{}", out.stderr);
    assert!(
        out.stderr.contains("did you mean `_ingested_at`"),
        "{}",
        out.stderr
    );
    // A table without any arrival column: the default `_ingested_at` is missing.
    let plain = dir.path().join("plain");
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
            Field::new(
                "updated_at",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(Date32Array::from(vec![Some(20_000)])),
            Arc::new(TimestampMicrosecondArray::from(vec![Some(
                20_000 * DAY + 5 * HOUR,
            )])),
        ],
    )
    .expect("batch");
    write(&plain, batch).await;
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&plain)
            .args(["--event-time", "updated_at", "--output", "json"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--arrival"), "{}", out.stderr);
    assert_eq!(json(&out)["error"]["class"], "usage");
    assert_eq!(json(&out)["error"]["exit_code"], 64);
    // A date and a timestamp without time zone are both clocks: 5 hours, same day.
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&plain)
            .args([
                "--event-time",
                "day",
                "--arrival",
                "updated_at",
                "--output",
                "json",
            ]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["overall"]["percentiles_s"]["max"], 18_000.0);
    assert_eq!(v["overall"]["histogram"][0]["late"], 0);
    // Text is not a clock.
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&plain)
            .args(["--event-time", "id", "--arrival", "updated_at"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--event-time"), "{}", out.stderr);
    assert!(out.stderr.contains("timestamp"), "{}", out.stderr);
    // An unknown --by column lists the columns.
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--by", "vall"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--by"), "{}", out.stderr);
    assert!(out.stderr.contains("did you mean `val`"), "{}", out.stderr);
    assert!(
        out.stderr.contains("id, updated_at, _ingested_at, val, op"),
        "{}",
        out.stderr
    );
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--by", "updated_at"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(
        out.stderr.contains("one of the two clocks"),
        "{}",
        out.stderr
    );
    // A missing table is "unavailable".
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(dir.path().join("nowhere"))
            .args(["--event-time", "x"]),
    );
    assert_eq!(out.code, 66, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plot_writes_an_svg_with_every_group_and_refuses_a_bad_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = rows();
    write_rows(&bronze(dir.path()), &rows).await;
    let p = pipeline(dir.path());
    let svg = dir.path().join("curve.svg");
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .args(["--by", "src", "--plot"])
            .arg(&svg),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = std::fs::read_to_string(&svg).expect("the plot");
    assert!(text.trim_start().starts_with("<svg"), "{}", &text[..80]);
    assert!(text.trim_end().ends_with("</svg>"));
    for name in [
        "app",
        "partner",
        "mobile",
        "all rows",
        "budget 3d",
        "overlap 15m",
    ] {
        assert!(text.contains(name), "the plot names {name}");
    }
    assert!(
        text.contains("target: 99.9% arrived (0.1% missing)"),
        "{text}"
    );
    assert!(text.contains("lookback "), "{text}");
    assert!(text.contains("cost setting"), "{text}");
    // the y axis is the share not arrived yet, on a log scale down to `none`
    assert!(text.contains("not arrived yet (log scale)"), "{text}");
    for tick in ["100%", "10%", "1%", "0.1%", "none"] {
        assert!(text.lines().any(|l| l.trim() == tick), "no y tick {tick}");
    }
    // the groups in Okabe–Ito colours, never the pale yellow
    assert!(text.to_ascii_uppercase().contains("#E69F00"), "{text}");
    assert!(!text.to_ascii_uppercase().contains("#F0E442"), "{text}");
    // the legend draws the dotted overlap as dots (short segments), not a solid swatch
    let attr = |element: &str, name: &str| -> Option<i64> {
        let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
        element[start..].split('"').next()?.parse().ok()
    };
    let dots = text
        .split("<line ")
        .skip(1)
        .filter(
            |l| match (attr(l, "x1"), attr(l, "x2"), attr(l, "y1"), attr(l, "y2")) {
                (Some(a), Some(b), Some(y1), Some(y2)) => b - a == 2 && y1 == y2,
                _ => false,
            },
        )
        .count();
    assert!(dots >= 4, "no dotted legend swatch");
    // Elements open and close in balance (a cheap well-formedness check).
    let opened = text.matches("<text").count();
    assert_eq!(opened, text.matches("</text>").count());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file is left behind");

    let bad = dir.path().join("no/such/dir/curve.svg");
    let out = exec(
        tidemark_in(dir.path(), T0 + DAY)
            .arg("lateness")
            .arg(&p)
            .arg("--plot")
            .arg(&bad)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--plot"), "{}", out.stderr);
    assert_eq!(json(&out)["error"]["class"], "usage");
    assert!(!bad.exists());
}

#[test]
fn runs_shows_the_ledger_trend_after_job_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("time")
        .timestamp_micros();
    let lateness = |extra: &[&str]| {
        exec(
            tidemark_at(now)
                .current_dir(dir.path())
                .arg("lateness")
                .arg("payments")
                .arg("--pipelines-dir")
                .arg(repo.join("pipelines"))
                .arg("--var")
                .arg(format!("lake={}", lake.display()))
                .args(extra),
        )
    };
    // Before any job run there is no ledger: said, with how to get one (exit 0).
    let out = lateness(&["--runs"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("no run ledger"), "{}", out.stdout);
    assert!(out.stdout.contains("tidemark job run"), "{}", out.stdout);
    for _ in 0..2 {
        let demo = exec(
            tidemark_at(now)
                .current_dir(dir.path())
                .arg("demo")
                .arg("--lake")
                .arg(&lake)
                .arg("--bundle")
                .arg(repo.join("bundle")),
        );
        assert_eq!(demo.code, 0, "{}\n{}", demo.stdout, demo.stderr);
    }
    let out = lateness(&["--runs", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["pipeline"], "payments");
    assert_eq!(v["ledger_exists"], true);
    let days = v["days"].as_array().expect("days");
    assert_eq!(days.len(), 1, "{v}");
    // The demo runs each hour on that hour's clock (the generated world's 2024-01-31).
    assert_eq!(days[0]["day"], "2024-01-31");
    assert_eq!(days[0]["runs"], 2, "{v}");
    assert!(int(&days[0]["rows_read"]) > 0, "{v}");
    let text = lateness(&["--runs"]);
    assert!(text.stdout.contains("2024-01-31"), "{}", text.stdout);
    assert!(text.stdout.contains("late rows"), "{}", text.stdout);

    // The demo's bronze has `_ingested_at`: the pipeline's profile works with its defaults; it
    // is younger than the default window, which is narrowed out loud.
    let out = lateness(&[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("recommendation: lookback ")
            && out.stdout.contains("overlap 15m spans"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("note: the default settled window"),
        "{}",
        out.stdout
    );
    // --runs on a bare table is refused: the ledger records pipelines.
    let out = exec(
        tidemark_at(now)
            .current_dir(dir.path())
            .arg("lateness")
            .arg(lake.join("bronze/payments_raw"))
            .args(["--event-time", "updated_at", "--runs"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
}
