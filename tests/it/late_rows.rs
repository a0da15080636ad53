//! `late_rows:` of an aggregate through the binary: the source rows that reached a final day
//! or window after gold published it are stored in a side table — new rows, corrected rows'
//! new images, soft deletes — each once, in both `after_close` modes, for days and for windows
//! final by the watermark; rows for open days and windows are not late.

use crate::aggregate::{
    at, oracle, pay, pipeline, replace_source, run, six_days, with_adjustments, write_source, Pay,
};
use crate::common::*;

use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;

/// The late rows table's rows: (payment_id, deleted, its `_event_date`, whether a published
/// `data_as_of` is given).
async fn late(dir: &Path, name: &str) -> BTreeSet<(String, bool, String, bool)> {
    let mut out = BTreeSet::new();
    for b in read_all(&dir.join(name)).await {
        let s = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect(c), &DataType::Utf8).expect("text")
        };
        let (id, day) = (s("payment_id"), s("_event_date"));
        let deleted = b
            .column_by_name("_deleted")
            .expect("deleted")
            .as_boolean()
            .clone();
        let seen = b
            .column_by_name("_published_data_as_of")
            .expect("as of")
            .clone();
        for c in [
            "_run_id",
            "_recorded_at",
            "_row_hash",
            "_ingested_at",
            "amount_cents",
        ] {
            assert!(b.column_by_name(c).is_some(), "no {c}: {:?}", b.schema());
        }
        for i in 0..b.num_rows() {
            out.insert((
                id.as_string::<i32>().value(i).to_string(),
                deleted.value(i),
                day.as_string::<i32>().value(i).to_string(),
                seen.is_valid(i),
            ));
        }
    }
    out
}

/// After the 6th closed days 1 to 4 (lookback 2d... days 5 and 6 open): late rows for the 2nd
/// (a new payment of a new merchant, a delete) and the 3rd (a correction), and a row for the
/// open 5th (not late).
fn late_arrivals(pays: &mut Vec<Pay>) {
    let later = at(2024, 4, 10, 11, 0);
    let mut new_merchant = pay("late2", at(2024, 4, 2, 15, 0), "m3", 55);
    new_merchant.arrived = later;
    let mut deleted = pays[3].clone(); // p21: the 2nd, m2
    deleted.deleted = true;
    deleted.arrived = later;
    let mut corrected = pays[4].clone(); // p30: the 3rd, m1
    corrected.amount = 333;
    corrected.arrived = later;
    let mut open = pay("open5", at(2024, 4, 5, 15, 0), "m1", 7);
    open.arrived = later;
    pays.extend([new_merchant, deleted, corrected, open]);
}

#[tokio::test]
async fn late_rows_of_closed_days_are_stored_once_in_either_mode() {
    for mode in ["adjust", "restate"] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let mut pays = six_days();
        write_source(d, &pays).await;
        let p = pipeline(
            d,
            &format!("recompute: {{ lookback: 2d, touched: true }}\nafter_close: {mode}\nlate_rows: {{}}\n"),
        );
        let first = run(&p, "2024-04-06", &[]);
        assert!(
            first.get("num_late_rows").is_none() || first["num_late_rows"] == 0,
            "{mode}: {first}"
        );
        assert!(
            !d.join("gold_late_rows").exists(),
            "{mode}: nothing late on a bootstrap"
        );
        late_arrivals(&mut pays);
        replace_source(d, &pays).await;
        let v = run(&p, "2024-04-06", &[]);
        assert_eq!(v["num_late_rows"], 3, "{mode}: {v}");
        assert_eq!(v["num_late_rows_new"], 3, "{mode}: {v}");
        let want: BTreeSet<(String, bool, String, bool)> = [
            ("late2", false, "2024-04-02", false),
            ("p21", true, "2024-04-02", true),
            ("p30", false, "2024-04-03", true),
        ]
        .into_iter()
        .map(|(a, b, c, e)| (a.to_string(), b, c.to_string(), e))
        .collect();
        assert_eq!(late(d, "gold_late_rows").await, want, "{mode}");
        // the numbers are right whatever the mode
        assert_eq!(with_adjustments(d).await, oracle(&pays), "{mode}");
        // a rerun stores nothing again
        let again = run(&p, "2024-04-06", &[]);
        assert_eq!(
            again["num_late_rows_new"].as_u64().unwrap_or(0),
            0,
            "{mode}: {again}"
        );
        assert_eq!(late(d, "gold_late_rows").await.len(), 3, "{mode}");
        // a later change to the same closed day re-reads it: what was stored is not stored
        // again (in restate mode the deleted payment's group is gone from gold by now)
        let mut another = pay("late2b", at(2024, 4, 2, 16, 0), "m1", 5);
        another.arrived = at(2024, 4, 10, 11, 30);
        pays.push(another);
        replace_source(d, &pays).await;
        let more = run(&p, "2024-04-06", &[]);
        assert_eq!(more["num_late_rows_new"], 1, "{mode}: {more}");
        assert_eq!(late(d, "gold_late_rows").await.len(), 4, "{mode}");
        // the text summary says it
        let text = exec(
            tidemark_at(at(2024, 4, 10, 12, 0))
                .arg("run")
                .arg(&p)
                .args(["--logical-date", "2024-04-06"]),
        );
        assert_eq!(text.code, 0, "{}", text.stderr);
        if mode == "adjust" {
            assert!(text.stdout.contains("late rows"), "{}", text.stdout);
        }
    }
}

/// A run killed right after the late rows' commit (before the adjustments and gold): the rerun
/// books the adjustments and stores no late row twice.
#[tokio::test]
async fn a_run_killed_after_storing_late_rows_converges() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut pays = six_days();
    write_source(d, &pays).await;
    let p = pipeline(
        d,
        &format!(
            "recompute: {{ lookback: 2d }}\nafter_close: adjust\nlate_rows: {{ uri: \"{}/late\" }}\n",
            d.display()
        ),
    );
    run(&p, "2024-04-06", &[]);
    late_arrivals(&mut pays);
    replace_source(d, &pays).await;
    let killed = exec(
        tidemark_at(at(2024, 4, 10, 12, 0))
            .env(
                "TIDEMARK_FAILPOINTS",
                "aggregate.incremental.committed_late_rows=abort",
            )
            .arg("run")
            .arg(&p)
            .args(["--logical-date", "2024-04-06"]),
    );
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    assert_eq!(late(d, "late").await.len(), 3);
    let v = run(&p, "2024-04-06", &[]);
    assert_eq!(v["num_late_rows_new"], 0, "{v}");
    assert_eq!(late(d, "late").await.len(), 3);
    assert_eq!(with_adjustments(d).await, oracle(&pays));
}

#[test]
fn late_rows_is_a_table_of_its_own() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(
        d,
        &format!("late_rows: {{ uri: \"{}/gold\" }}\n", d.display()),
    );
    let out = exec(tidemark_at(at(2024, 4, 10, 12, 0)).arg("run").arg(&p));
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stderr.contains("late_rows.uri"), "{}", out.stderr);
    let p = pipeline(d, "late_rows: { where: x }\n");
    let out = exec(tidemark_at(at(2024, 4, 10, 12, 0)).arg("run").arg(&p));
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stderr.contains("unknown key `where`"), "{}", out.stderr);
}

/// Five-minute windows final by the watermark (delay 10m), `after_close: adjust`: a row for a
/// final window in the open day is late (stored with its window, booked, the window kept as
/// published); one for an open window is not.
#[tokio::test]
async fn a_row_for_a_window_final_by_the_watermark_is_late_one_for_an_open_window_is_not() {
    use chrono::{TimeZone, Utc};
    const MINUTE: i64 = 60_000_000;
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let nine = Utc
        .with_ymd_and_hms(2024, 10, 28, 9, 0, 0)
        .unwrap()
        .timestamp_micros();
    let mut pays: Vec<Pay> = (0..12)
        .map(|k| pay(&format!("p{k}"), nine + k * 5 * MINUTE + MINUTE, "m1", 100))
        .collect();
    write_source(d, &pays).await;
    let text = format!(
        "name: fives\nkind: aggregate\nsource: {{ uri: \"{d}/silver\" }}\ntarget: {{ uri: \"{d}/gold\" }}\nevent_date: {{ column: created_at, time_zone: Europe/Amsterdam }}\nwindow: 5m\nwatermark: {{ delay: 10m }}\nafter_close: adjust\nlate_rows: {{}}\nmeasures:\n  - {{ name: payments, agg: count }}\n",
        d = d.display()
    );
    let p = d.join("fives.yml");
    std::fs::write(&p, text).expect("write");
    let noon = Utc
        .with_ymd_and_hms(2024, 10, 28, 12, 0, 0)
        .unwrap()
        .timestamp_micros();
    let go = || {
        let out = exec(
            tidemark_at(noon)
                .arg("run")
                .arg(&p)
                .args(["--output", "json"]),
        );
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        serde_json::from_str::<serde_json::Value>(out.stdout.trim()).expect("json")
    };
    go();
    // (the watermark is 09:46Z: the window 09:10-09:15Z is final, 09:50-09:55Z open)
    let mut early = pay("late", nine + 12 * MINUTE, "m1", 1);
    early.arrived = nine + 150 * MINUTE;
    let mut open = pay("open", nine + 52 * MINUTE, "m1", 1);
    open.arrived = nine + 150 * MINUTE;
    pays.extend([early, open]);
    replace_source(d, &pays).await;
    let v = go();
    assert_eq!(v["num_late_rows"], 1, "{v}");
    assert_eq!(v["num_adjustment_rows"], 1, "{v}");
    let rows = read_all(&d.join("gold_late_rows")).await;
    let b = arrow::compute::concat_batches(&rows[0].schema(), &rows).expect("concat");
    assert_eq!(b.num_rows(), 1);
    let id = arrow::compute::cast(b.column_by_name("payment_id").expect("id"), &DataType::Utf8)
        .expect("text");
    assert_eq!(id.as_string::<i32>().value(0), "late");
    let start = arrow::compute::cast(
        b.column_by_name("_window_start").expect("start"),
        &DataType::Int64,
    )
    .expect("int");
    assert_eq!(
        start.as_primitive::<arrow::datatypes::Int64Type>().value(0),
        nine + 10 * MINUTE
    );
    assert!(b.column_by_name("_window_end").is_some());
    assert_eq!(go()["num_late_rows_new"], 0);
}

/// With `after_close: restate`, a late row for a day older than `max_lookback` is not restated
/// (the run warns) but is kept as a late row: never in neither place.
#[tokio::test]
async fn a_late_row_past_max_lookback_is_kept_though_not_restated() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut pays = six_days();
    write_source(d, &pays).await;
    let p = pipeline(
        d,
        "recompute: { lookback: 1d, max_lookback: 3d }\nlate_rows: {}\n",
    );
    run(&p, "2024-04-06", &[]);
    let mut old = pay("old1", at(2024, 4, 1, 15, 0), "m1", 9);
    old.arrived = at(2024, 4, 10, 11, 0);
    pays.push(old);
    replace_source(d, &pays).await;
    let v = run(&p, "2024-04-06", &[]);
    // (the source is rewritten whole: both days before the cap count as changed)
    assert_eq!(v["num_days_beyond_max_lookback"], 2, "{v}");
    assert_eq!(v["num_late_rows_new"], 1, "{v}");
    let stored = late(d, "gold_late_rows").await;
    assert_eq!(stored.len(), 1);
    assert!(
        stored.iter().any(|r| r.0 == "old1" && r.2 == "2024-04-01"),
        "{stored:?}"
    );
}

/// A `late_rows` location holding another table is refused (78, naming the key), and that
/// table is left as it was.
#[tokio::test]
async fn a_late_rows_location_holding_another_table_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut pays = six_days();
    write_source(d, &pays).await;
    let other = d.join("elsewhere");
    write_source(&other, &pays).await;
    let p = pipeline(
        d,
        &format!(
            "recompute: {{ lookback: 2d }}\nafter_close: adjust\nlate_rows: {{ uri: \"{}/silver\" }}\n",
            other.display()
        ),
    );
    run(&p, "2024-04-06", &[]);
    late_arrivals(&mut pays);
    replace_source(d, &pays).await;
    let before = read_all(&other.join("silver")).await;
    let out = exec(
        tidemark_at(at(2024, 4, 10, 12, 0))
            .arg("run")
            .arg(&p)
            .args(["--logical-date", "2024-04-06"]),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("not a late rows table"),
        "{}",
        out.stderr
    );
    let after = read_all(&other.join("silver")).await;
    assert_eq!(
        before.iter().map(|b| b.num_rows()).sum::<usize>(),
        after.iter().map(|b| b.num_rows()).sum::<usize>()
    );
    assert_eq!(before[0].schema(), after[0].schema());
}
