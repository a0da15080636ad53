//! `kind: aggregate` at its edges, through the binary: a definition changed under a built gold,
//! backfills with an older logical date, NaN in a summed column, days past 2099, an empty open
//! day that turns final. Each case was once a silent wrong answer.

use crate::aggregate::oracle;
use crate::aggregate::*;
use crate::common::*;

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use chrono::NaiveDate;

/// The run's exit, stdout and stderr (whatever the code).
fn try_run(p: &Path, logical: &str, extra: &[&str]) -> Out {
    exec(
        tidemark_at(at(2024, 4, 10, 12, 0))
            .arg("run")
            .arg(p)
            .args(["--logical-date", logical, "--output", "json"])
            .args(extra),
    )
}

fn edit(p: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(p).expect("read");
    assert!(text.contains(from), "{from} not in {text}");
    std::fs::write(p, text.replace(from, to)).expect("write");
}

/// A setting that gives gold's rows their meaning changed: refused (65) naming the setting and
/// the full reload, gold untouched, nothing booked; the full reload rebuilds every day under the
/// new meaning, and incremental runs go on from there.
#[tokio::test]
async fn a_changed_definition_is_refused_until_a_full_reload() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let pays = six_days();
    write_source(d, &pays).await;
    let p = pipeline(d, "recompute: { lookback: 2d }\nafter_close: adjust\n");
    run(&p, "2024-04-06", &[]);
    let gold_version = version(&d.join("gold")).await;
    let changes = [
        (
            "time_zone: Europe/Amsterdam",
            "time_zone: UTC",
            "event_date.time_zone",
        ),
        (
            "filter: \"status = 'refunded'\"",
            "filter: \"status = 'captured'\"",
            "measures.refunds",
        ),
        (
            "agg: sum, column: amount_cents }",
            "agg: sum, column: amount_cents, filter: \"amount_cents > 150\" }",
            "measures.amount_cents",
        ),
        (
            "group_by: [merchant_id]\n",
            "group_by: [merchant_id]\nwhere: \"amount_cents > 150\"\n",
            "where",
        ),
    ];
    for (from, to, setting) in changes {
        edit(&p, from, to);
        let out = try_run(&p, "2024-04-06", &[]);
        assert_eq!(out.code, 65, "{setting}: {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains(&format!("`{setting}`")) && out.stderr.contains("--full-reload"),
            "{setting}: {}",
            out.stderr
        );
        let dry = try_run(&p, "2024-04-06", &["--dry-run"]);
        assert_eq!(
            dry.code, 65,
            "{setting}: a dry run says so too: {}",
            dry.stderr
        );
        assert_eq!(version(&d.join("gold")).await, gold_version, "{setting}");
        assert!(
            version(&d.join("gold_adjustments")).await.is_none(),
            "{setting}: nothing booked"
        );
        edit(&p, to, from);
    }
    // Under the new time zone, rebuilt whole; then runs go on, booking nothing.
    edit(&p, "time_zone: Europe/Amsterdam", "time_zone: UTC");
    run(&p, "2024-04-06", &["--full-reload"]);
    let again = run(&p, "2024-04-06", &[]);
    assert_eq!(again["num_adjustment_rows"], 0, "{again}");
    assert!(again["target_version"].is_null(), "{again}");
    assert!(version(&d.join("gold_adjustments")).await.is_none());
}

/// `recompute.touched` and a backfill of an older day that commits: the source's changes for
/// newer open days are left for the next run, which restates them (they were once consumed
/// without being restated, leaving an open day short until it turned final).
#[tokio::test]
async fn a_backfill_with_an_older_logical_date_leaves_newer_changes_for_the_next_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut pays = six_days();
    write_source(d, &pays).await;
    let p = pipeline(d, "recompute: { lookback: 3d, touched: true }\n");
    run(&p, "2024-04-06", &[]);
    let late = vec![
        pay("late3", at(2024, 4, 3, 15, 0), "m1", 7),
        pay("late5", at(2024, 4, 5, 15, 0), "m2", 200),
    ];
    pays.extend(late.clone());
    write_source(d, &late).await;
    let back = run(&p, "2024-04-04", &[]);
    assert!(
        back["target_version"].is_number(),
        "the backfill committed: {back}"
    );
    assert!(
        back["warnings"].to_string().contains("2024-04-05"),
        "says what it left: {back}"
    );
    let next = run(&p, "2024-04-06", &[]);
    assert!(next["num_days_changed"].as_u64() >= Some(1), "{next}");
    assert_eq!(without_final(&gold(d).await), oracle(&pays), "{next}");
    // And once restated, they are consumed: the next run has nothing to do.
    let idle = run(&p, "2024-04-06", &[]);
    assert_eq!(idle["num_days_recomputed"], 0, "{idle}");
}

/// `after_close: adjust`: a day still empty at the previous run whose first row arrives as it
/// turns final gets its one last restatement (gold holds it, labelled final), not an adjustment.
#[tokio::test]
async fn an_empty_open_day_that_turns_final_with_its_first_row_is_restated() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut pays: Vec<Pay> = six_days()
        .into_iter()
        .filter(|p| local_day(p.created) != day("2024-04-05"))
        .collect();
    write_source(d, &pays).await;
    let p = pipeline(d, "recompute: { lookback: 2d }\nafter_close: adjust\n");
    run(&p, "2024-04-06", &[]);
    let first = pay("first5", at(2024, 4, 5, 9, 0), "m1", 500);
    pays.push(first.clone());
    write_source(d, std::slice::from_ref(&first)).await;
    let s = run(&p, "2024-04-08", &[]);
    assert_eq!(s["num_adjustment_rows"], 0, "{s}");
    assert!(version(&d.join("gold_adjustments")).await.is_none(), "{s}");
    let g = gold(d).await;
    let key = (day("2024-04-05"), "m1".to_string());
    assert_eq!(g.get(&key), Some(&(1, 500, 0, true)), "{s}");
    assert_eq!(without_final(&g), oracle(&pays), "{s}");
    let st = status(d).await;
    assert_eq!(st[&day("2024-04-05")].0, "final");
    assert_eq!(st[&day("2024-04-05")].1, 1);
    // And a later row for it, now that it is closed, is an adjustment.
    let late = pay("late5", at(2024, 4, 5, 10, 0), "m1", 5);
    pays.push(late.clone());
    write_source(d, std::slice::from_ref(&late)).await;
    let s = run(&p, "2024-04-08", &[]);
    assert_eq!(s["num_adjustment_rows"], 1, "{s}");
    assert_eq!(with_adjustments(d).await, oracle(&pays), "{s}");
}

/// A source whose summed column is a float, NaN and signed zeros included.
async fn write_float_source(dir: &Path, rows: &[(&str, i64, f64, i64)]) {
    write_float_source_for(dir, "m1", rows).await
}

async fn write_float_source_for(dir: &Path, merchant: &str, rows: &[(&str, i64, f64, i64)]) {
    use arrow::array::{
        BooleanArray, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use std::sync::Arc;
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("payment_id", DataType::Utf8, false),
        Field::new("created_at", ts.clone(), true),
        Field::new("merchant_id", DataType::Utf8, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("_ingested_at", ts, true),
        Field::new("_deleted", DataType::Boolean, false),
    ]));
    let t = |v: Vec<i64>| Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            t(rows.iter().map(|r| r.1).collect()),
            Arc::new(StringArray::from(vec![merchant; rows.len()])),
            Arc::new(Float64Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            t(rows.iter().map(|r| r.3).collect()),
            Arc::new(BooleanArray::from(vec![false; rows.len()])),
        ],
    )
    .expect("batch");
    append_batch(&dir.join("silver"), batch).await;
}

/// `after_close: adjust` with a NaN in a summed float column: a closed day already NaN, and one
/// that turns NaN late. Each is booked at most once; reruns book nothing ("fresh − published"
/// was NaN ≠ 0 on every run).
#[tokio::test]
async fn a_nan_in_a_closed_day_is_booked_once_and_never_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let mut rows = Vec::new();
    for dd in 1..=6u32 {
        let t = at(2024, 4, dd, 9, 0);
        rows.push((
            ["a1", "a2", "a3", "a4", "a5", "a6"][dd as usize - 1],
            t,
            f64::from(dd),
            t + 10 * MIN,
        ));
    }
    rows.push((
        "nan1",
        at(2024, 4, 1, 10, 0),
        f64::NAN,
        at(2024, 4, 1, 10, 10),
    ));
    rows.push((
        "negzero",
        at(2024, 4, 3, 10, 0),
        -0.0,
        at(2024, 4, 3, 10, 10),
    ));
    write_float_source(d, &rows).await;
    let text = format!(
        "name: daily\nkind: aggregate\nsource: {{ uri: \"{d}/silver\" }}\ntarget: {{ uri: \"{d}/gold\" }}\nevent_date: {{ column: created_at, time_zone: Europe/Amsterdam }}\ngroup_by: [merchant_id]\nmeasures:\n  - {{ name: payments, agg: count }}\n  - {{ name: amount, agg: sum, column: amount }}\nrecompute: {{ lookback: 2d }}\nafter_close: adjust\n",
        d = d.display()
    );
    let p = d.join("daily.yml");
    std::fs::write(&p, text).expect("write");
    run(&p, "2024-04-06", &[]);
    // Late: a row for the NaN day, a NaN for a finite closed day.
    let late = at(2024, 4, 10, 13, 0);
    write_float_source(
        d,
        &[
            ("late1", at(2024, 4, 1, 15, 0), 5.0, late),
            ("nan2", at(2024, 4, 2, 15, 0), f64::NAN, late),
        ],
    )
    .await;
    let s = run(&p, "2024-04-06", &[]);
    assert_eq!(s["num_days_adjusted"], 2, "{s}");
    for _ in 0..2 {
        let again = run(&p, "2024-04-06", &[]);
        assert_eq!(again["num_adjustment_rows"], 0, "{again}");
        assert!(again["adjustments_version"].is_null(), "{again}");
    }
    // The NaN day 1 changed payments only; day 2's amount turned NaN.
    let booked = || async {
        let adj = read_all(&d.join("gold_adjustments")).await;
        adj.iter().map(|b| b.num_rows()).sum::<usize>()
    };
    assert_eq!(booked().await, 2, "one row per adjusted day");
    // Another group's late row makes the runs compare days 1 and 2 again: their NaN groups
    // book nothing more, the new group once.
    write_float_source_for(
        d,
        "m2",
        &[
            ("other1", at(2024, 4, 1, 16, 0), 1.0, late),
            ("other2", at(2024, 4, 2, 16, 0), -0.0, late),
        ],
    )
    .await;
    let s = run(&p, "2024-04-06", &[]);
    assert_eq!(s["num_adjustment_rows"], 2, "the m2 groups only: {s}");
    let again = run(&p, "2024-04-06", &[]);
    assert_eq!(again["num_adjustment_rows"], 0, "{again}");
    assert_eq!(booked().await, 4);
}

/// Local days after 2099 keep daylight saving: 2100-07-01T22:30Z is 2 July in Amsterdam.
#[tokio::test]
async fn days_after_2099_keep_daylight_saving() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let late_summer = pay("p2100", at(2100, 7, 1, 22, 30), "m1", 100);
    let winter = pay("w2100", at(2100, 12, 1, 23, 30), "m1", 1);
    write_source(d, &[late_summer, winter]).await;
    let p = pipeline(d, "");
    run(&p, "2100-12-05", &[]);
    let days: Vec<_> = gold(d).await.keys().map(|k| k.0).collect();
    assert_eq!(days, vec![day("2100-07-02"), day("2100-12-02")]);
}

/// Every column of every status row as text, by day (the tests' clock is fixed, so two runs
/// that did the same write the same times).
async fn status_rows(dir: &Path) -> BTreeMap<NaiveDate, Vec<String>> {
    let mut out = BTreeMap::new();
    for b in read_all(&dir.join("gold_status")).await {
        let text: Vec<_> = (b.columns().iter())
            .map(|c| arrow::compute::cast(c, &DataType::Utf8).expect("utf8"))
            .collect();
        let days = b
            .column_by_name("event_date")
            .expect("event_date")
            .as_primitive::<arrow::datatypes::Date32Type>();
        for i in 0..b.num_rows() {
            let row = (b.schema().fields().iter().zip(&text))
                .map(|(f, c)| {
                    let c = c.as_string::<i32>();
                    let v = if c.is_null(i) { "null" } else { c.value(i) };
                    format!("{}={v}", f.name())
                })
                .collect();
            out.insert(days.value_as_date(i).expect("day"), row);
        }
    }
    out
}

/// A run killed after booking an adjustment, before the status table's commit (at
/// `committed_adjustments` or `committed_target`, or at both, one rerun after the other): the
/// rerun books nothing again, and the status table ends exactly as after an uninterrupted
/// run — the closed day counted as adjusted once, its rows, groups and late rows current.
#[tokio::test]
async fn a_run_killed_after_booking_leaves_the_status_as_an_uninterrupted_run_would() {
    const AT: &str = "aggregate.incremental.";
    let kills: [&[&str]; 3] = [
        &["committed_adjustments"],
        &["committed_target"],
        &["committed_adjustments", "committed_target"],
    ];
    let mut want = None;
    for points in [&[][..]].into_iter().chain(kills) {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let mut pays = six_days();
        write_source(d, &pays).await;
        let p = pipeline(d, "recompute: { lookback: 2d }\nafter_close: adjust\n");
        run(&p, "2024-04-06", &[]);
        // A late payment for the 2nd (closed), after its close, and one for the 5th (open).
        let mut late = pay("late2", at(2024, 4, 2, 15, 0), "m1", 55);
        late.arrived = at(2024, 4, 10, 13, 0);
        pays.push(late);
        pays.push(pay("late5", at(2024, 4, 5, 15, 0), "m2", 66));
        replace_source(d, &pays).await;
        for point in points {
            let killed = exec(
                tidemark_at(at(2024, 4, 10, 12, 0))
                    .env("TIDEMARK_FAILPOINTS", format!("{AT}{point}=abort"))
                    .arg("run")
                    .arg(&p)
                    .args(["--logical-date", "2024-04-06"]),
            );
            assert_ne!(killed.code, 0, "{points:?}: not killed at {point}");
        }
        let s = run(&p, "2024-04-06", &[]);
        assert_eq!(with_adjustments(d).await, oracle(&pays), "{points:?}: {s}");
        let booked = read_all(&d.join("gold_adjustments")).await;
        let rows: usize = booked.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 1, "{points:?}: booked once");
        let st = status_rows(d).await;
        let adjusted = st[&day("2024-04-02")]
            .iter()
            .any(|c| c == "adjusted_after_close=1");
        assert!(adjusted, "{points:?}: {:?}", st[&day("2024-04-02")]);
        match &want {
            None => want = Some(st),
            Some(want) => assert_eq!(&st, want, "{points:?}: the status after the rerun"),
        }
        let again = run(&p, "2024-04-06", &[]);
        assert!(again["status_version"].is_null(), "{points:?}: {again}");
        assert!(
            again["adjustments_version"].is_null(),
            "{points:?}: {again}"
        );
    }
}
