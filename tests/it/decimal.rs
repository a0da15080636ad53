//! `decimal(p, s)` end to end through the binary: JSON lines and CSV landing files with amounts
//! like 0.10 and 0.20 (whose f64s do not sum to 0.30) → bronze `Decimal128(12, 2)` → a
//! `cdc_merge` silver → an aggregate's `sum`/`min`/`max` in gold, exact against an i128
//! recompute; a value that does not fit is quarantined with its line; gold's schema stays put
//! when a late correction restates a day and books an adjustment; `reconcile` agrees, and
//! flags a gold amount tampered by one cent.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use common::*;

/// 2024-04-10T12:00:00Z: the runs' clock.
const NOW: i64 = 1_712_750_400_000_000;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// The two ingests (JSON lines and CSV into one bronze), the merge and the aggregate.
fn pipelines(d: &Path) -> [std::path::PathBuf; 6] {
    let schema = "schema:\n  payment_id: string not null\n  merchant_id: string\n  amount: decimal(12, 2)\n  created_at: timestamp\n  updated_at: timestamp not null\n";
    let ingest = |name: &str, glob: &str, format: &str| {
        let p = d.join(format!("{name}.yml"));
        write(&p, &format!(
            "name: {name}\nkind: ingest\nlanding: {{ uri: \"{l}\", glob: \"{glob}\" }}\nformat: {format}\ntarget: {{ uri: \"{b}\" }}\n{schema}quarantine: {{ uri: \"{q}\" }}\n",
            l = d.join("landing").display(),
            b = bronze(d).display(),
            q = d.join("quarantine_landing").display(),
        ));
        p
    };
    let merge = d.join("payments.yml");
    write(&merge, &format!(
        "name: payments\nkind: cdc_merge\nsource: {{ uri: \"{b}\" }}\ntarget: {{ uri: \"{s}\" }}\nkeys: [payment_id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 15m\nquarantine: {{ uri: \"{q}\" }}\nreconcile: {{ day: created_at, group_by: [merchant_id], sum: [amount] }}\n",
        b = bronze(d).display(),
        s = silver(d).display(),
        q = quarantine(d).display(),
    ));
    let aggregate = |name: &str, gold: &str, measures: &str, after_close: &str| {
        let p = d.join(format!("{name}.yml"));
        write(&p, &format!(
            "name: {name}\nkind: aggregate\nsource: {{ uri: \"{s}\" }}\ntarget: {{ uri: \"{g}\" }}\nevent_date: {{ column: created_at, time_zone: UTC }}\ngroup_by: [merchant_id]\nmeasures:\n{measures}recompute: {{ lookback: 2d }}\nafter_close: {after_close}\n",
            s = silver(d).display(),
            g = d.join(gold).display(),
        ));
        p
    };
    let daily = aggregate(
        "daily",
        "gold",
        "  - { name: payments, agg: count }\n  - { name: amount, agg: sum, column: amount }\n",
        "adjust",
    );
    let range = aggregate(
        "range",
        "gold_range",
        "  - { name: smallest, agg: min, column: amount }\n  - { name: largest, agg: max, column: amount }\n",
        "restate",
    );
    let history = d.join("payment_history.yml");
    write(&history, &format!(
        "name: payment_history\nkind: dimension\nsource: {{ uri: \"{b}\" }}\ntarget: {{ uri: \"{h}\" }}\nkeys: [payment_id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\nhistory: scd2\nquarantine: {{ uri: \"{q}\" }}\n",
        b = bronze(d).display(),
        h = d.join("history").display(),
        q = d.join("quarantine_history").display(),
    ));
    [
        ingest("events_json", "*.jsonl", "json"),
        ingest("events_csv", "*.csv", "csv"),
        merge,
        daily,
        range,
        history,
    ]
}

/// One payment version: (id, merchant, amount as written, created day of April, updated hour).
type Version = (&'static str, &'static str, &'static str, u32, u32);

fn ts(day: u32, hour: u32) -> String {
    format!("2024-04-{day:02}T{hour:02}:00:00Z")
}

fn jsonl(rows: &[Version]) -> String {
    rows.iter()
        .map(|(id, m, amount, day, hour)| {
            format!(
                "{{\"payment_id\": \"{id}\", \"merchant_id\": \"{m}\", \"amount\": {amount}, \"created_at\": \"{}\", \"updated_at\": \"{}\"}}\n",
                ts(*day, 9),
                ts(*day, *hour)
            )
        })
        .collect()
}

fn csv(rows: &[Version]) -> String {
    let mut out = "payment_id,merchant_id,amount,created_at,updated_at\n".to_string();
    for (id, m, amount, day, hour) in rows {
        out.push_str(&format!(
            "{id},{m},{amount},{},{}\n",
            ts(*day, 9),
            ts(*day, *hour)
        ));
    }
    out
}

/// Cents of an amount as written (`0.1`, `12.30`, `1.5e2` is not used here): the recompute's
/// exact arithmetic, in i128.
fn cents(amount: &str) -> i128 {
    let (int, frac) = amount.trim().split_once('.').unwrap_or((amount.trim(), ""));
    let negative = int.starts_with('-');
    let whole: i128 = int.trim_start_matches('-').parse().expect("whole");
    let frac = format!("{frac:0<2}");
    let c = whole * 100 + frac.parse::<i128>().expect("cents");
    if negative {
        -c
    } else {
        c
    }
}

fn render(c: i128) -> String {
    let sign = if c < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", c.abs() / 100, c.abs() % 100)
}

/// (day, merchant) -> (count, sum, min, max) from each payment's latest version (amounts as
/// text with two places).
fn oracle(all: &[Version]) -> BTreeMap<(String, String), (i64, String, String, String)> {
    let mut latest: BTreeMap<&str, &Version> = BTreeMap::new();
    for v in all {
        if latest.get(v.0).is_none_or(|have| have.4 <= v.4) {
            latest.insert(v.0, v);
        }
    }
    let mut acc: BTreeMap<(String, String), (i64, i128, i128, i128)> = BTreeMap::new();
    for (_, m, amount, day, _) in latest.values() {
        let c = cents(amount);
        let e = acc
            .entry((format!("2024-04-{day:02}"), m.to_string()))
            .or_insert((0, 0, i128::MAX, i128::MIN));
        *e = (e.0 + 1, e.1 + c, e.2.min(c), e.3.max(c));
    }
    acc.into_iter()
        .map(|(k, (n, s, lo, hi))| (k, (n, render(s), render(lo), render(hi))))
        .collect()
}

/// Gold's count and sum plus its adjustments, per (day, merchant): what a reader of the books
/// sees.
async fn books(d: &Path) -> BTreeMap<(String, String), (i64, String)> {
    let gold = read_all(&d.join("gold")).await;
    let mut out = BTreeMap::new();
    let (days, merchants) = (strings(&gold, "event_date"), strings(&gold, "merchant_id"));
    let (n, sum) = (strings(&gold, "payments"), strings(&gold, "amount"));
    for i in 0..days.len() {
        out.insert(
            (days[i].clone(), merchants[i].clone()),
            (n[i].parse().expect("count"), sum[i].clone()),
        );
    }
    if version(&d.join("gold_adjustments")).await.is_some() {
        let adj = read_all(&d.join("gold_adjustments")).await;
        let (days, merchants) = (strings(&adj, "event_date"), strings(&adj, "merchant_id"));
        let (n, sum) = (strings(&adj, "payments"), strings(&adj, "amount"));
        for i in 0..days.len() {
            let e = out
                .get_mut(&(days[i].clone(), merchants[i].clone()))
                .expect("an adjustment of a published day");
            e.0 += n[i].parse::<i64>().expect("count");
            e.1 = render(cents(&e.1) + cents(&sum[i]));
        }
    }
    out
}

fn counts_and_sums(all: &[Version]) -> BTreeMap<(String, String), (i64, String)> {
    oracle(all)
        .into_iter()
        .map(|(k, (n, sum, _, _))| (k, (n, sum)))
        .collect()
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

fn run(p: &Path) -> serde_json::Value {
    let mut c = tidemark_at(NOW);
    c.arg("run").arg(p).args(["--output", "json"]);
    if p.ends_with("daily.yml") {
        c.args(["--logical-date", "2024-04-10"]);
    }
    let out = exec(&mut c);
    assert_eq!(
        out.code,
        0,
        "{}: {}\n{}",
        p.display(),
        out.stdout,
        out.stderr
    );
    serde_json::from_str(out.stdout.trim()).expect("json")
}

fn column_type(batches: &[RecordBatch], name: &str) -> DataType {
    batches[0]
        .schema()
        .field_with_name(name)
        .expect(name)
        .data_type()
        .clone()
}

#[tokio::test]
async fn decimal_amounts_are_exact_from_landing_to_gold_and_reconcile() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let [json_p, csv_p, merge_p, daily_p, range_p, history_p] = pipelines(d);
    let json_rows: Vec<Version> = vec![
        ("p1", "m1", "0.10", 1, 10),
        ("p2", "m1", "0.20", 1, 10),
        ("p11", "m1", "0.50", 1, 10),
        ("p3", "m2", "12345678.91", 1, 10),
        ("p4", "m2", "-0.00", 2, 10),
        ("p5", "m1", "0.1", 2, 10),
    ];
    let mut jsonl_text = jsonl(&json_rows);
    // line 7: one cent and a half does not fit decimal(12, 2): quarantined, not rounded
    jsonl_text.push_str(&jsonl(&[("p6", "m1", "0.015", 2, 10)]));
    write(&d.join("landing/a.jsonl"), &jsonl_text);
    let csv_rows: Vec<Version> = vec![("p7", "m1", "0.30", 2, 11), ("p8", "m2", " 7 ", 2, 11)];
    let mut csv_text = csv(&csv_rows);
    // line 4: eleven digits before the point do not fit decimal(12, 2)
    csv_text.push_str("p9,m2,12345678901.00,2024-04-02T09:00:00Z,2024-04-02T11:00:00Z\n");
    write(&d.join("landing/b.csv"), &csv_text);
    assert_ne!(0.1f64 + 0.2f64, 0.3f64, "what exact decimals are for");

    run(&json_p);
    run(&csv_p);
    let held = read_all(&bronze(d)).await;
    assert_eq!(column_type(&held, "amount"), DataType::Decimal128(12, 2));
    let mut amounts = strings(&held, "amount");
    amounts.sort();
    assert_eq!(
        amounts,
        [
            "0.00",
            "0.10",
            "0.10",
            "0.20",
            "0.30",
            "0.50",
            "12345678.91",
            "7.00"
        ]
    );
    let q = read_all(&d.join("quarantine_landing")).await;
    let mut rejected: Vec<(String, String)> = strings(&q, "_line")
        .into_iter()
        .zip(strings(&q, "_quarantine_reason"))
        .collect();
    rejected.sort();
    assert_eq!(
        rejected,
        [
            (
                "4".to_string(),
                "`amount` = 12345678901.00 does not fit decimal(12, 2): 11 digits before the point, at most 10".to_string()
            ),
            (
                "7".to_string(),
                "`amount` = 0.015 does not fit decimal(12, 2): 3 decimal places, at most 2".to_string()
            ),
        ]
    );

    run(&merge_p);
    let silver_rows = read_all(&silver(d)).await;
    assert_eq!(
        column_type(&silver_rows, "amount"),
        DataType::Decimal128(12, 2)
    );
    run(&daily_p);
    let gold = read_all(&d.join("gold")).await;
    let sum_type = column_type(&gold, "amount");
    assert_eq!(
        sum_type,
        DataType::Decimal128(22, 2),
        "an exact sum, 10 digits wider"
    );
    let mut all: Vec<Version> = json_rows.clone();
    all.extend(csv_rows.iter().cloned());
    assert_eq!(books(d).await, counts_and_sums(&all));
    run(&range_p);
    let ranges = read_all(&d.join("gold_range")).await;
    assert_eq!(
        column_type(&ranges, "smallest"),
        DataType::Decimal128(12, 2)
    );
    let expected: Vec<(String, String)> = oracle(&all)
        .into_values()
        .map(|(_, _, lo, hi)| (lo, hi))
        .collect();
    let got: Vec<(String, String)> = strings(&ranges, "smallest")
        .into_iter()
        .zip(strings(&ranges, "largest"))
        .collect();
    assert_eq!(sorted(got), sorted(expected));
    // m1 on the 2nd: 0.1 + 0.30 = 0.40 exactly
    assert_eq!(
        books(d).await[&("2024-04-02".to_string(), "m1".to_string())].1,
        "0.40"
    );

    // A late correction of the 1st (a final day by now; its min and max stay): booked as an
    // exact adjustment, and gold's columns keep their types.
    let late: Vec<Version> = vec![("p2", "m1", "0.21", 1, 20), ("p10", "m2", "0.07", 9, 10)];
    write(&d.join("landing/c.jsonl"), &jsonl(&late));
    for p in [&json_p, &merge_p, &history_p] {
        run(p);
    }
    let s = run(&daily_p);
    assert_eq!(s["num_adjustment_rows"], 1, "{s}");
    // the dimension keeps both versions of p2, as decimals
    let versions = read_all(&d.join("history")).await;
    assert_eq!(
        column_type(&versions, "amount"),
        DataType::Decimal128(12, 2)
    );
    let p2: Vec<String> = strings(&versions, "payment_id")
        .into_iter()
        .zip(strings(&versions, "amount"))
        .filter(|(id, _)| id == "p2")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(sorted(p2), ["0.20", "0.21"]);
    let gold = read_all(&d.join("gold")).await;
    assert_eq!(
        column_type(&gold, "amount"),
        sum_type,
        "gold's schema is stable"
    );
    let adj = read_all(&d.join("gold_adjustments")).await;
    assert_eq!(strings(&adj, "amount"), ["0.01"], "0.21 - 0.20, exactly");
    all.extend(late.iter().cloned());
    // a second adjustment, with one booked already: the same column type, exact again
    let adjusted_type = column_type(&adj, "amount");
    let later: Vec<Version> = vec![("p7", "m1", "0.35", 2, 21)];
    write(&d.join("landing/d.csv"), &csv(&later));
    for p in [&csv_p, &merge_p, &history_p] {
        run(p);
    }
    let s = run(&daily_p);
    assert_eq!(s["num_adjustment_rows"], 1, "{s}");
    let adj = read_all(&d.join("gold_adjustments")).await;
    assert_eq!(column_type(&adj, "amount"), adjusted_type, "{adj:?}");
    assert_eq!(sorted(strings(&adj, "amount")), ["0.01", "0.05"]);
    all.extend(later.iter().cloned());
    assert_eq!(
        books(d).await,
        counts_and_sums(&all),
        "published + adjustments == the recompute's counts and sums"
    );

    // reconcile agrees with every table, then flags one cent changed in gold
    for p in [&json_p, &csv_p, &merge_p, &daily_p, &range_p, &history_p] {
        let out = exec(tidemark_at(NOW).arg("reconcile").arg(p));
        assert_eq!(
            out.code,
            0,
            "{}: {}\n{}",
            p.display(),
            out.stdout,
            out.stderr
        );
    }
    // bronze's column is decimal(12, 2): declaring another precision is refused, naming both
    let text = std::fs::read_to_string(&json_p).expect("read");
    std::fs::write(&json_p, text.replace("decimal(12, 2)", "decimal(14, 2)")).expect("write");
    write(
        &d.join("landing/e.jsonl"),
        &jsonl(&[("p12", "m1", "1.00", 9, 11)]),
    );
    let out = exec(tidemark_at(NOW).arg("run").arg(&json_p));
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("declares `amount` as decimal(14, 2), but bronze has it as decimal(12, 2)"),
        "{}",
        out.stderr
    );
    tamper_one_cent(&d.join("gold")).await;
    let out = exec(
        tidemark_at(NOW)
            .arg("reconcile")
            .arg(&daily_p)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 65, "{}\n{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(v["groups_differing"], 1, "{v}");
    let diff = &v["differences"][0];
    assert_eq!(diff["measure"], "amount", "{v}");
    let (published, recompute) = (
        diff["published"].as_str().unwrap_or_default(),
        diff["recompute"].as_str().unwrap_or_default(),
    );
    assert_eq!(
        cents(published) - cents(recompute),
        1,
        "one cent, told exactly: {v}"
    );
}

/// Adds 0.01 to gold's `amount` of the row for m2 on 2024-04-01, 12345678.91: a difference
/// under 1e-9 of it, which a float comparison would call rounding (a tamper no run would do).
async fn tamper_one_cent(path: &Path) {
    use arrow::array::{Array, AsArray, Decimal128Array};
    let rows = read_all(path).await;
    let tampered: Vec<RecordBatch> = rows
        .iter()
        .map(|b| {
            let i = b.schema().index_of("amount").expect("amount");
            let (p, s) = match b.column(i).data_type() {
                DataType::Decimal128(p, s) => (*p, *s),
                t => panic!("amount is {t}"),
            };
            let days = strings(std::slice::from_ref(b), "event_date");
            let merchants = strings(std::slice::from_ref(b), "merchant_id");
            let amounts = b
                .column(i)
                .as_primitive::<arrow::datatypes::Decimal128Type>();
            let plus: Decimal128Array = (0..b.num_rows())
                .map(|r| {
                    let hit = days[r] == "2024-04-01" && merchants[r] == "m2";
                    (!amounts.is_null(r)).then(|| amounts.value(r) + i128::from(hit))
                })
                .collect();
            let mut cols = b.columns().to_vec();
            cols[i] = std::sync::Arc::new(plus.with_precision_and_scale(p, s).expect("p, s"));
            RecordBatch::try_new(b.schema(), cols).expect("batch")
        })
        .collect();
    let url = deltalake::ensure_table_uri(path.to_str().expect("utf8")).expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .write(tampered)
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .expect("overwrite");
}

/// A sum past 38 digits (a `decimal(38, 2)` column, Spark's habit) is an error naming the
/// overflow — exit 65, gold not written — never a total wrapped into a wrong number; `reconcile`
/// says the same.
#[test]
fn a_sum_past_38_digits_stops_the_run_instead_of_wrapping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let big = "999999999999999999999999999999999999.99";
    write(
        &d.join("landing/a.jsonl"),
        &format!(
            "{{\"payment_id\":\"a\",\"amount\":\"{big}\",\"created_at\":\"2024-04-09T10:00:00Z\",\"updated_at\":\"2024-04-09T10:00:00Z\"}}\n{{\"payment_id\":\"b\",\"amount\":\"{big}\",\"created_at\":\"2024-04-09T11:00:00Z\",\"updated_at\":\"2024-04-09T11:00:00Z\"}}\n"
        ),
    );
    let ingest = d.join("ingest.yml");
    write(&ingest, &format!(
        "name: raw\nkind: ingest\nlanding: {{ uri: \"{l}\" }}\nformat: json\ntarget: {{ uri: \"{b}\" }}\nschema:\n  payment_id: string not null\n  amount: decimal(38, 2)\n  created_at: timestamp\n  updated_at: timestamp not null\nquarantine: {{ uri: \"{q}\" }}\n",
        l = d.join("landing").display(), b = bronze(d).display(), q = d.join("ql").display()));
    let merge = d.join("payments.yml");
    write(&merge, &format!(
        "name: payments\nkind: cdc_merge\nsource: {{ uri: \"{b}\" }}\ntarget: {{ uri: \"{s}\" }}\nkeys: [payment_id]\nsequence_by: updated_at\noverlap: 15m\nquarantine: {{ uri: \"{q}\" }}\nreconcile: {{ day: created_at, sum: [amount] }}\n",
        b = bronze(d).display(), s = silver(d).display(), q = quarantine(d).display()));
    let gold = d.join("gold.yml");
    write(&gold, &format!(
        "name: gold\nkind: aggregate\nsource: {{ uri: \"{s}\" }}\ntarget: {{ uri: \"{g}\" }}\nevent_date: {{ column: created_at }}\nmeasures:\n  - {{ name: amount, agg: sum, column: amount }}\n  - {{ name: biggest, agg: max, column: amount }}\n",
        s = silver(d).display(), g = d.join("gold").display()));
    for p in [&ingest, &merge] {
        let out = exec(tidemark_at(NOW).arg("run").arg(p));
        assert_eq!(out.code, 0, "{out:?}");
    }
    let out = exec(tidemark_at(NOW).arg("run").arg(&gold));
    assert_eq!(out.code, 65, "{out:?}");
    assert!(
        out.stderr.contains("does not fit 38 decimal digits")
            && out.stderr.contains("declare the column"),
        "{}",
        out.stderr
    );
    assert!(!d.join("gold/_delta_log").exists(), "gold not written");
    let reconciled = exec(tidemark_at(NOW).arg("reconcile").arg(&merge));
    assert_eq!(reconciled.code, 65, "{reconciled:?}");
    assert!(
        reconciled.stderr.contains("does not fit 38 decimal digits"),
        "{}",
        reconciled.stderr
    );
}
