//! `kind: aggregate` with `watermark:` through the binary: finality by the data's own clock —
//! the watermark in the summary and the facts, never moving back; a late row for a final
//! window restated or booked; the options that do not apply refused.

use crate::aggregate::{pay, replace_source, write_source, Pay};
use crate::common::*;

use std::path::Path;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Int64Type, TimestampMicrosecondType};
use chrono::{TimeZone, Utc};

const MINUTE: i64 = 60_000_000;

fn pipeline(dir: &Path, extra: &str) -> std::path::PathBuf {
    let text = format!(
        "name: fives\nkind: aggregate\nsource: {{ uri: \"{d}/silver\" }}\ntarget: {{ uri: \"{d}/gold\" }}\nevent_date: {{ column: created_at, time_zone: Europe/Amsterdam }}\nwindow: 5m\nmeasures:\n  - {{ name: payments, agg: count }}\n  - {{ name: amount_cents, agg: sum, column: amount_cents }}\n{extra}",
        d = dir.display()
    );
    let p = dir.join("fives.yml");
    std::fs::write(&p, text).expect("write");
    p
}

/// The clock of every command.
const NOON: i64 = 1_730_116_800_000_000; // 2024-10-28T12:00:00Z

fn run(p: &Path, args: &[&str]) -> Out {
    exec(
        tidemark_at(NOON)
            .arg("run")
            .arg(p)
            .args(["--output", "json"])
            .args(args),
    )
}

fn json(out: &Out) -> serde_json::Value {
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

/// Gold's windows: start → (payments, is_final).
async fn windows(dir: &Path) -> Vec<(i64, i64, bool)> {
    let mut out = Vec::new();
    for b in read_all(&dir.join("gold")).await {
        let s = b
            .column_by_name("window_start")
            .expect("start")
            .as_primitive::<TimestampMicrosecondType>()
            .clone();
        let n = arrow::compute::cast(b.column_by_name("payments").expect("n"), &DataType::Int64)
            .expect("int");
        let f = b
            .column_by_name("is_final")
            .expect("f")
            .as_boolean()
            .clone();
        for i in 0..b.num_rows() {
            out.push((
                s.value(i),
                n.as_primitive::<Int64Type>().value(i),
                f.value(i),
            ));
        }
    }
    out.sort();
    out
}

/// One payment every 5 minutes from 09:00Z to 09:55Z on 28 October 2024.
fn hour() -> (i64, Vec<Pay>) {
    let nine = Utc
        .with_ymd_and_hms(2024, 10, 28, 9, 0, 0)
        .unwrap()
        .timestamp_micros();
    let pays = (0..12)
        .map(|k| pay(&format!("p{k}"), nine + k * 5 * MINUTE + MINUTE, "m1", 100))
        .collect();
    (nine, pays)
}

#[tokio::test]
async fn windows_close_as_the_watermark_passes_them_and_it_never_moves_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (nine, mut pays) = hour();
    write_source(d, &pays).await;
    let p = pipeline(d, "watermark: { delay: 10m }\n");
    let v = json(&run(&p, &[]));
    // newest event 09:56Z; watermark 09:46Z: the windows ending by then are final
    assert_eq!(v["event_time_seen"], "2024-10-28T09:56:00Z", "{v}");
    assert_eq!(v["watermark"], "2024-10-28T09:46:00Z", "{v}");
    assert_eq!(v["final_before"], "2024-10-28T09:46:00Z", "{v}");
    assert_eq!(v["logical_date"], "2024-10-28", "{v}");
    let w = windows(d).await;
    assert_eq!(w.len(), 12);
    for (s, n, f) in &w {
        assert_eq!(*n, 1);
        assert_eq!(*f, s + 5 * MINUTE <= nine + 46 * MINUTE, "window at {s}");
    }
    // `tidemark status` shows the clock and the windows
    let status = |json: bool| {
        let mut c = tidemark_at(NOON);
        c.arg("status").arg(&p);
        if json {
            c.args(["--output", "json"]);
        }
        exec(&mut c)
    };
    let out = status(false);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for needle in [
        "final by the watermark",
        "watermark 2024-10-28T09:46:00Z (newest event 2024-10-28T09:56:00Z",
        "5m windows (Europe/Amsterdam, newest first)",
        "2024-10-28 10:40 +01:00",
    ] {
        assert!(out.stdout.contains(needle), "{needle}: {}", out.stdout);
    }
    let v: serde_json::Value = serde_json::from_str(status(true).stdout.trim()).expect("json");
    let listed = v["windows"].as_array().expect("windows");
    assert_eq!(listed.len(), 12, "{v}");
    assert_eq!(listed[0]["window_start"], "2024-10-28T09:55:00Z", "{v}");
    assert_eq!(listed[0]["is_final"], false, "{v}");
    assert_eq!(listed[11]["is_final"], true, "{v}");
    assert_eq!(v["watermark"]["watermark"], "2024-10-28T09:46:00Z", "{v}");
    // the newest payment deleted: the watermark stays where it was
    pays.pop();
    replace_source(d, &pays).await;
    let v = json(&run(&p, &[]));
    assert_eq!(v["watermark"], "2024-10-28T09:46:00Z", "{v}");
    // a payment dated tomorrow (a producer's clock ahead) does not move the data's clock
    pays.push(pay("ahead", nine + 24 * 60 * MINUTE, "m1", 1));
    replace_source(d, &pays).await;
    let v = json(&run(&p, &[]));
    assert_eq!(v["event_time_seen"], "2024-10-28T09:56:00Z", "{v}");
    assert!(
        v["warnings"].to_string().contains("after this run's clock"),
        "{v}"
    );
    pays.pop();
    replace_source(d, &pays).await;
    // a late payment for the 09:00 window (final): restated (after_close: restate)
    pays.push(pay("late", nine + 2 * MINUTE, "m1", 5));
    replace_source(d, &pays).await;
    json(&run(&p, &[]));
    let w = windows(d).await;
    assert_eq!(w[0], (nine, 2, true));
    // --logical-date does not apply
    let out = run(&p, &["--logical-date", "2024-10-28"]);
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("watermark"), "{}", out.stderr);
}

#[tokio::test]
async fn with_adjust_a_late_row_for_a_final_window_is_booked_not_rewritten() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (nine, mut pays) = hour();
    write_source(d, &pays).await;
    let p = pipeline(
        d,
        "watermark: { delay: 10m, allowed_lateness: 5m }\nafter_close: adjust\n",
    );
    json(&run(&p, &[]));
    let before = windows(d).await;
    assert!(before[0].2, "the 09:00 window is final: {before:?}");
    // late rows: one for the final 09:00 window, one for the open 09:55 one
    pays.push(pay("late", nine + 2 * MINUTE, "m1", 5));
    pays.push(pay("open", nine + 57 * MINUTE, "m1", 7));
    replace_source(d, &pays).await;
    let v = json(&run(&p, &[]));
    assert_eq!(v["num_adjustment_rows"], 1, "{v}");
    let after = windows(d).await;
    assert_eq!(after[0], before[0], "a final window is never rewritten");
    assert_eq!(after[11].1, 2, "the open window takes its row: {after:?}");
    let booked = read_all(&d.join("gold_adjustments")).await;
    let rows: usize = booked.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1);
    let b = &booked[0];
    let start = b
        .column_by_name("window_start")
        .expect("start")
        .as_primitive::<TimestampMicrosecondType>()
        .value(0);
    assert_eq!(start, nine);
    let arrived = |b: &arrow::array::RecordBatch, i: usize| {
        b.column_by_name("arrived_at")
            .expect("arrived_at")
            .as_primitive::<TimestampMicrosecondType>()
            .value(i)
    };
    // (it arrived 10 minutes after it was made: the latest arrival the window had not seen)
    assert_eq!(arrived(b, 0), nine + 12 * MINUTE);
    // the rerun books nothing again, and reconcile finds gold + adjustments right while the
    // day is still open
    let v = json(&run(&p, &[]));
    assert_eq!(v["num_adjustment_rows"], 0, "{v}");
    let out = exec(tidemark_at(NOON).arg("reconcile").arg(&p));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    // a payment of a final window removed: booked as a negative, arrived_at the run's time
    pays.retain(|p| p.id != "p1");
    replace_source(d, &pays).await;
    let v = json(&run(&p, &[]));
    assert_eq!(v["num_adjustment_rows"], 1, "{v}");
    let booked = read_all(&d.join("gold_adjustments")).await;
    let removal = booked
        .iter()
        .flat_map(|b| (0..b.num_rows()).map(move |i| (b, i)))
        .find(|(b, i)| {
            let n =
                arrow::compute::cast(b.column_by_name("payments").expect("n"), &DataType::Int64)
                    .expect("int");
            n.as_primitive::<Int64Type>().value(*i) == -1
        })
        .expect("the removal's booking");
    assert_eq!(arrived(removal.0, removal.1), NOON);
}

#[test]
fn watermark_settings_that_cannot_hold_are_refused_at_their_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    for (extra, needle, line) in [
        (
            "watermark: { delay: 10m }\nrecompute: { lookback: 3d }\n",
            "keep one",
            "fives.yml:11",
        ),
        (
            "watermark: { delay: soon }\n",
            "not a length of time",
            "fives.yml:10",
        ),
        (
            "watermark: { delay: 1m, allowed: 2m }\n",
            "allowed",
            "fives.yml:10",
        ),
    ] {
        let p = pipeline(d, extra);
        let out = run(&p, &[]);
        assert_eq!(out.code, 78, "{extra}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{extra}: {}", out.stderr);
        assert!(out.stderr.contains(line), "{extra}: {}", out.stderr);
    }
}
