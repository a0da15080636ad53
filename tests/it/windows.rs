//! `kind: aggregate` with `window:` through the binary: rows per tumbling window (minutes, hours,
//! days) of the local day, across Amsterdam's return from summer time; the same rows delivered in
//! one batch or many, in any order, give the same windows, equal to an oracle that computes each
//! window from the wall clock.

use crate::aggregate::{pay, write_source, Pay};
use crate::common::*;

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMicrosecondType};
use chrono::{DateTime, NaiveDate, Offset, TimeZone, Utc};
use chrono_tz::Europe::Amsterdam;
use proptest::prelude::*;

const MINUTE: i64 = 60_000_000;

fn pipeline(dir: &Path, window: &str) -> std::path::PathBuf {
    pipeline_with(dir, window, "")
}

fn pipeline_with(dir: &Path, window: &str, extra: &str) -> std::path::PathBuf {
    let text = format!(
        "name: windowed\nkind: aggregate\nsource: {{ uri: \"{d}/silver\" }}\ntarget: {{ uri: \"{d}/gold\" }}\nevent_date: {{ column: created_at, time_zone: Europe/Amsterdam }}\nwindow: {window}\ngroup_by: [merchant_id]\nmeasures:\n  - {{ name: payments, agg: count }}\n  - {{ name: amount_cents, agg: sum, column: amount_cents }}\n{extra}",
        d = dir.display()
    );
    let p = dir.join("windowed.yml");
    std::fs::write(&p, text).expect("write");
    p
}

fn run(p: &Path, logical: &str) -> Out {
    let mut c = tidemark_at(NOW);
    c.arg("run").arg(p);
    if !logical.is_empty() {
        c.args(["--logical-date", logical]);
    }
    exec(&mut c)
}

/// The clock of every run: after every event.
const NOW: i64 = 1_730_203_200_000_000; // 2024-10-29T12:00:00Z

/// Gold's windows plus the adjustments booked for them (a window whose rows all went away
/// drops out).
async fn with_adjustments(dir: &Path) -> Windows {
    let mut out = gold(dir).await;
    if !dir.join("gold_adjustments").exists() {
        return out;
    }
    for b in read_all(&dir.join("gold_adjustments")).await {
        let mut booked = Windows::new();
        collect(&b, &mut booked);
        for (k, v) in booked {
            let w = out.entry(k).or_insert((v.0, 0, 0));
            w.1 += v.1;
            w.2 += v.2;
        }
    }
    out.retain(|_, v| v.1 != 0);
    out
}

/// Gold's `is_final` per window.
async fn finality(dir: &Path) -> BTreeMap<(i64, String), bool> {
    let mut out = BTreeMap::new();
    for b in read_all(&dir.join("gold")).await {
        let s = b
            .column_by_name("window_start")
            .expect("start")
            .as_primitive::<TimestampMicrosecondType>()
            .clone();
        let m = arrow::compute::cast(b.column_by_name("merchant_id").expect("m"), &DataType::Utf8)
            .expect("utf8");
        let f = b
            .column_by_name("is_final")
            .expect("final")
            .as_boolean()
            .clone();
        for i in 0..b.num_rows() {
            out.insert(
                (s.value(i), m.as_string::<i32>().value(i).to_string()),
                f.value(i),
            );
        }
    }
    out
}

/// A window of gold: (start, end, merchant) → (event_date, payments, amount).
type Windows = BTreeMap<(i64, i64, String), (NaiveDate, i64, i64)>;

/// The window holding `t` in Amsterdam, from the wall clock: a window shorter than a day is the
/// wall-clock time floored to its length, at the instant's own UTC offset (Amsterdam's changes are
/// on the hour, so no such window spans one); a day is local midnight to local midnight.
fn oracle_window(t: i64, minutes: i64) -> (i64, i64) {
    let local = DateTime::<Utc>::from_timestamp_micros(t)
        .expect("t")
        .with_timezone(&Amsterdam);
    if minutes == 1440 {
        let midnight = |d: NaiveDate| {
            Amsterdam
                .from_local_datetime(&d.and_hms_opt(0, 0, 0).expect("00:00"))
                .earliest()
                .expect("midnight")
                .timestamp_micros()
        };
        let d = local.date_naive();
        return (midnight(d), midnight(d.succ_opt().expect("next")));
    }
    let off = i64::from(local.offset().fix().local_minus_utc()) * 1_000_000;
    let size = minutes * MINUTE;
    let wall = t + off;
    let start = wall - wall.rem_euclid(size) - off;
    (start, start + size)
}

fn oracle(pays: &[Pay], minutes: i64) -> Windows {
    let mut out = Windows::new();
    for p in pays.iter().filter(|p| !p.deleted) {
        let (s, e) = oracle_window(p.created, minutes);
        let day = DateTime::<Utc>::from_timestamp_micros(s)
            .expect("s")
            .with_timezone(&Amsterdam)
            .date_naive();
        let w = out
            .entry((s, e, p.merchant.to_string()))
            .or_insert((day, 0, 0));
        w.1 += 1;
        w.2 += p.amount;
    }
    out
}

async fn gold(dir: &Path) -> Windows {
    let mut out = Windows::new();
    for b in read_all(&dir.join("gold")).await {
        collect(&b, &mut out);
    }
    out
}

fn collect(b: &RecordBatch, out: &mut Windows) {
    let ts = |c: &str| {
        let col = b
            .column_by_name(c)
            .unwrap_or_else(|| panic!("gold has no {c}"));
        assert_eq!(
            col.data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "{c}"
        );
        col.as_primitive::<TimestampMicrosecondType>().clone()
    };
    let (s, e) = (ts("window_start"), ts("window_end"));
    let day = arrow::compute::cast(
        b.column_by_name("event_date").expect("day"),
        &DataType::Date32,
    )
    .expect("date");
    let day = day.as_primitive::<arrow::datatypes::Date32Type>();
    let m = arrow::compute::cast(b.column_by_name("merchant_id").expect("m"), &DataType::Utf8)
        .expect("utf8");
    let m = m.as_string::<i32>();
    let int = |c: &str| {
        arrow::compute::cast(b.column_by_name(c).expect(c), &DataType::Int64).expect("int")
    };
    let (n, a) = (int("payments"), int("amount_cents"));
    for i in 0..b.num_rows() {
        let key = (s.value(i), e.value(i), m.value(i).to_string());
        let v = (
            day.value_as_date(i).expect("day"),
            n.as_primitive::<Int64Type>().value(i),
            a.as_primitive::<Int64Type>().value(i),
        );
        assert!(out.insert(key.clone(), v).is_none(), "window {key:?} twice");
    }
}

/// The days of a scenario: Amsterdam's return from summer time (clocks go back at 03:00 on 27
/// October 2024: 02:00 to 03:00 happens twice) or its start (at 02:00 on 31 March 2024 the
/// clocks jump to 03:00: that day has 23 hours).
#[derive(Debug, Clone, Copy)]
struct Season {
    /// The first instant of the scenario's main days (three days and an hour of them).
    start: i64,
    /// A few payments a week before: a closed day by the logical date.
    early: i64,
    /// Two hours around the change (UTC), where most payments fall.
    change: i64,
    /// The logical date of the runs by the logical date.
    logical: &'static str,
}

fn seasons() -> [Season; 2] {
    let at = |y, mo, d, h| {
        Utc.with_ymd_and_hms(y, mo, d, h, 0, 0)
            .unwrap()
            .timestamp_micros()
    };
    [
        Season {
            start: at(2024, 10, 25, 21),
            early: at(2024, 10, 20, 9),
            change: at(2024, 10, 27, 0),
            logical: "2024-10-28",
        },
        Season {
            start: at(2024, 3, 28, 22),
            early: at(2024, 3, 22, 9),
            change: at(2024, 3, 31, 0),
            logical: "2024-04-01",
        },
    ]
}

/// Payments over the season's days, most of them around its clock change, a few on a closed day.
fn payments(season: Season) -> impl Strategy<Value = Vec<Pay>> {
    let one = (
        prop::bool::weighted(0.1),
        0..(73 * 3600i64),
        0..3usize,
        -500..5000i64,
    )
        .prop_map(move |(old, secs, m, amount)| {
            let base = if old { season.early } else { season.start };
            (base + secs * 1_000_000, ["m1", "m2", "m3"][m], amount)
        });
    let dst = (0..(2 * 3600i64), 0..3usize, 1..100i64).prop_map(move |(secs, m, amount)| {
        (
            season.change + secs * 1_000_000,
            ["m1", "m2", "m3"][m],
            amount,
        )
    });
    (
        prop::collection::vec(one, 1..40),
        prop::collection::vec(dst, 0..20),
    )
        .prop_map(|(a, b)| {
            a.into_iter()
                .chain(b)
                .enumerate()
                .map(|(i, (t, m, amount))| pay(&format!("p{i}"), t, m, amount))
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        max_shrink_iters: 32,
        .. ProptestConfig::default()
    })]

    /// Delivered in one batch or in several, shuffled, the windows are the oracle's: the same
    /// rows give the same windows whatever the order and pace of their arrival.
    #[test]
    fn windows_equal_the_oracle_whatever_the_order_and_batches(
        (season, pays) in prop::sample::select(seasons().to_vec())
            .prop_flat_map(|s| (Just(s), payments(s))),
        minutes in prop::sample::select(vec![1i64, 5, 15, 60, 1440]),
        order in any::<u64>(),
        batches in 1..7usize,
        by_watermark in prop::bool::ANY,
        adjust in prop::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tmp");
            let d = dir.path();
            // (by the watermark: no logical date; the clock is the data's)
            let (p, logical) = match by_watermark {
                true => (pipeline_with(d, &format!("{minutes}m"), &format!("watermark: {{ delay: 10m, allowed_lateness: 5m }}\nafter_close: {}\n", if adjust { "adjust" } else { "restate" })), ""),
                false => (pipeline(d, &format!("{minutes}m")), season.logical),
            };
            let mut shuffled = pays.clone();
            let mut rng = order;
            for i in (1..shuffled.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let size = shuffled.len().div_ceil(batches);
            // (with `adjust`, a window gold labelled final is never rewritten afterwards)
            let mut published_final = Windows::new();
            for chunk in shuffled.chunks(size) {
                write_source(d, chunk).await;
                let out = run(&p, logical);
                prop_assert_eq!(out.code, 0, "{}", out.stderr);
                if by_watermark && adjust {
                    let now = gold(d).await;
                    for (k, v) in &published_final {
                        prop_assert_eq!(now.get(k), Some(v), "final window {:?} rewritten", k);
                    }
                    let labels = finality(d).await;
                    published_final = now
                        .into_iter()
                        .filter(|((s, _, m), _)| labels.get(&(*s, m.clone())) == Some(&true))
                        .collect();
                }
            }
            let want = oracle(&pays, minutes);
            // (final windows are never rewritten with `adjust`: gold plus the adjustments)
            prop_assert_eq!(with_adjustments(d).await, want.clone());
            // ... and reconcile agrees, open days included
            let r = exec(tidemark_at(NOW).arg("reconcile").arg(&p));
            prop_assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
            if by_watermark {
                // final: the window ends at or before the newest event − delay − lateness
                let newest = pays.iter().map(|p| p.created).max().expect("a payment");
                let final_before = newest - 15 * MINUTE;
                let labels: BTreeMap<(i64, String), bool> = gold(d)
                    .await
                    .keys()
                    .map(|(s, e, m)| ((*s, m.clone()), *e <= final_before))
                    .collect();
                prop_assert_eq!(finality(d).await, labels);
            }
            Ok(())
        })?;
    }
}

/// 25 one-hour windows on the day the clocks go back, 02:00 twice (as two windows an hour apart);
/// reconcile agrees; changing the window asks for a full reload, after which 2-hour windows end
/// the 25-hour day with a 3-hour one; and a length that does not divide a day is refused at its
/// line.
#[tokio::test]
async fn an_hour_window_day_has_25_hours_when_the_clocks_go_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let first = Utc
        .with_ymd_and_hms(2024, 10, 26, 22, 0, 0)
        .unwrap()
        .timestamp_micros();
    let pays: Vec<Pay> = (0..25)
        .map(|h| {
            pay(
                &format!("h{h}"),
                first + h * 60 * MINUTE + 30 * MINUTE,
                "m1",
                h,
            )
        })
        .collect();
    write_source(d, &pays).await;
    let p = pipeline(d, "1h");
    let out = run(&p, "2024-10-28");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let g = gold(d).await;
    let day = NaiveDate::from_ymd_opt(2024, 10, 27).expect("day");
    assert_eq!(g.len(), 25);
    assert!(g.values().all(|v| v.0 == day && v.1 == 1), "{g:?}");
    let starts: Vec<i64> = g.keys().map(|k| k.0).collect();
    assert_eq!(
        starts,
        (0..25).map(|h| first + h * 60 * MINUTE).collect::<Vec<_>>()
    );
    // the rerun commits nothing
    let out = run(&p, "2024-10-28");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("no commit"), "{}", out.stdout);

    // reconcile recomputes the windows and finds them equal
    let out = exec(
        tidemark_at(
            Utc.with_ymd_and_hms(2024, 10, 29, 12, 0, 0)
                .unwrap()
                .timestamp_micros(),
        )
        .arg("reconcile")
        .arg(&p),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    // a changed window is a changed definition
    let p = pipeline(d, "2h");
    let out = run(&p, "2024-10-28");
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(out.stderr.contains("window"), "{}", out.stderr);
    assert!(out.stderr.contains("--full-reload"), "{}", out.stderr);
    let out = exec(
        tidemark_at(
            Utc.with_ymd_and_hms(2024, 10, 29, 12, 0, 0)
                .unwrap()
                .timestamp_micros(),
        )
        .arg("run")
        .arg(&p)
        .args(["--logical-date", "2024-10-28", "--full-reload"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    // 25 hours in 2-hour windows: twelve, the last of them 3 hours long
    let g = gold(d).await;
    assert_eq!(g.len(), 12, "{g:?}");
    let last = g.keys().last().expect("a window");
    assert_eq!(last.1 - last.0, 3 * 60 * MINUTE);
    assert_eq!(g.values().map(|v| v.1).sum::<i64>(), 25);

    // --windows on an aggregate without `window:` is refused, not ignored
    let daily = d.join("daily.yml");
    std::fs::write(
        &daily,
        format!(
            "name: daily\nkind: aggregate\nsource: {{ uri: \"{d}/silver\" }}\ntarget: {{ uri: \"{d}/gold_daily\" }}\nevent_date: {{ column: created_at }}\nquarantine: {{ max_rows: 5 }}\nmeasures:\n  - {{ name: payments, agg: count }}\n",
            d = d.display()
        ),
    )
    .expect("daily");
    assert_eq!(run(&daily, "2024-10-28").code, 0);
    let out = exec(
        tidemark_at(NOW)
            .arg("status")
            .arg(&daily)
            .args(["--windows", "3"]),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("has rows per day"), "{}", out.stderr);
    for (w, needle) in [
        ("7m", "does not divide a day"),
        ("90s", "whole number of minutes"),
        ("soon", "not a length of time"),
        ("5M", "longer than a day (`M` is months"),
    ] {
        let p = pipeline(d, w);
        let out = run(&p, "2024-10-28");
        assert_eq!(out.code, 78, "{w}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{w}: {}", out.stderr);
        assert!(out.stderr.contains("windowed.yml:6"), "{w}: {}", out.stderr);
    }
}
