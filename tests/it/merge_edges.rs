//! `cdc_merge` at its edges, through the binary: float keys (NaN, -0.0), re-delivered copies of
//! whole files. Each case was once a silent wrong answer.

use crate::common::*;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

/// Appends (key, seq, ing, val) rows with a float key to `dir/lake/bronze`.
async fn land_float_keys(dir: &Path, rows: &[(f64, i64, i64, &str)]) {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Float64, true),
        Field::new("updated_at", ts.clone(), true),
        Field::new("_ingested_at", ts, false),
        Field::new("val", DataType::Utf8, true),
    ]));
    let t = |v: Vec<i64>| Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC"));
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Float64Array::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            t(rows.iter().map(|r| r.1).collect()),
            t(rows.iter().map(|r| r.2).collect()),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
        ],
    )
    .expect("batch");
    append_batch(&bronze(dir), b).await;
}

fn float_key_pipeline(dir: &Path) -> std::path::PathBuf {
    let l = dir.join("lake");
    let text = format!(
        "name: fk\nkind: cdc_merge\nsource: {{ uri: \"{l}/bronze\" }}\ntarget: {{ uri: \"{l}/silver\" }}\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 15m\nmax_future_skew: 5m\nquarantine: {{ uri: \"{l}/quarantine\" }}\n",
        l = l.display()
    );
    let p = dir.join("fk.yml");
    std::fs::write(&p, text).expect("write");
    p
}

fn run_json(p: &Path, now: i64, extra: &[&str]) -> serde_json::Value {
    let out = exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"])
            .args(extra),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

/// A column's values as text.
fn texts(b: &RecordBatch, column: &str) -> Vec<String> {
    let c = arrow::compute::cast(b.column_by_name(column).expect(column), &DataType::Utf8)
        .expect("utf8");
    let c = c.as_string::<i32>();
    (0..c.len()).map(|i| c.value(i).to_string()).collect()
}

/// Silver's (id bits, val) rows, sorted.
async fn float_rows(dir: &Path) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for b in read_all(&silver(dir)).await {
        let id = b
            .column_by_name("id")
            .expect("id")
            .as_primitive::<arrow::datatypes::Float64Type>()
            .clone();
        let val = texts(&b, "val");
        out.extend(id.values().iter().map(|k| k.to_bits()).zip(val));
    }
    out.sort();
    out
}

/// A float key: -0.0 and 0.0 are one key (the newer version wins, one row), and a NaN key is
/// quarantined with a reason that names it — never inserted beside itself on each run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_keys_match_themselves_or_are_quarantined() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = float_key_pipeline(d);
    land_float_keys(
        d,
        &[
            (1.5, T0, T0, "a1"),
            (0.0, T0, T0, "zero1"),
            (f64::NAN, T0, T0, "nan1"),
        ],
    )
    .await;
    let now = T0 + HOUR;
    let s = run_json(&p, now, &[]);
    assert_eq!(s["num_quarantined"], 1, "{s}");
    land_float_keys(
        d,
        &[
            (1.5, T0 + MIN, T0 + MIN, "a2"),
            (-0.0, T0 + MIN, T0 + MIN, "zero2"),
            (f64::NAN, T0 + MIN, T0 + MIN, "nan2"),
        ],
    )
    .await;
    let s = run_json(&p, now + MIN, &[]);
    assert_eq!(s["num_quarantined_new"], 1, "{s}");
    assert_eq!(s["num_inserted"], 0, "-0.0 is the key 0.0: {s}");
    let expected = vec![
        (0.0f64.to_bits(), "zero2".to_string()),
        (1.5f64.to_bits(), "a2".to_string()),
    ];
    assert_eq!(float_rows(d).await, expected);
    // A full reload agrees.
    run_json(&p, now + MIN, &["--full-reload"]);
    assert_eq!(float_rows(d).await, expected);
    let reasons: Vec<String> = read_all(&quarantine(d))
        .await
        .iter()
        .flat_map(|b| texts(b, "_quarantine_reason"))
        .collect();
    assert!(
        !reasons.is_empty() && reasons.iter().all(|r| r.contains("NaN in key column `id`")),
        "{reasons:?}"
    );
}

mod float_key_oracle {
    use super::*;
    use proptest::prelude::*;

    /// The keys real feeds carry in a float column: NaN, both zeros, an integer past 2^53, ...
    fn key() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(0.0),
            Just(-0.0),
            Just(1.5),
            Just(-1.5),
            Just(9_007_199_254_740_993.0),
            Just(f64::INFINITY),
        ]
    }

    /// The oracle: per key (-0.0 is 0.0; NaN keys are quarantined), the greatest (seq, ing,
    /// val) among the rows landed so far.
    fn oracle(rows: &[(f64, i64, i64, String)]) -> Vec<(u64, String)> {
        let mut best: std::collections::BTreeMap<u64, (i64, i64, String)> = Default::default();
        for (k, seq, ing, val) in rows.iter().filter(|r| !r.0.is_nan()) {
            let k = (k + 0.0).to_bits();
            let v = (*seq, *ing, val.clone());
            if best.get(&k).is_none_or(|b| *b < v) {
                best.insert(k, v);
            }
        }
        best.into_iter().map(|(k, (_, _, v))| (k, v)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

        /// Batches of float-keyed changes, each merged incrementally or by a full reload: after
        /// every run silver equals the oracle — one row per key, NaN never inserted.
        #[test]
        fn float_keyed_silver_equals_the_oracle_after_every_run(
            batches in prop::collection::vec(
                (prop::collection::vec((key(), 0i64..30, 0u8..3), 1..6), prop::bool::weighted(0.25)),
                2..5,
            )
        ) {
            let rt = tokio::runtime::Runtime::new().expect("rt");
            rt.block_on(async {
                let dir = tempfile::tempdir().expect("tmp");
                let d = dir.path();
                let p = float_key_pipeline(d);
                let mut landed: Vec<(f64, i64, i64, String)> = Vec::new();
                for (b, (rows, full)) in batches.iter().enumerate() {
                    let now = T0 + (b as i64 + 1) * HOUR;
                    let rows: Vec<(f64, i64, i64, String)> = rows
                        .iter()
                        .map(|(k, m, v)| (*k, T0 + m * MIN, now - MIN, format!("b{b}v{v}")))
                        .collect();
                    let as_refs: Vec<(f64, i64, i64, &str)> =
                        rows.iter().map(|r| (r.0, r.1, r.2, r.3.as_str())).collect();
                    land_float_keys(d, &as_refs).await;
                    landed.extend(rows);
                    let extra: &[&str] = if *full { &["--full-reload"] } else { &[] };
                    run_json(&p, now, extra);
                    prop_assert_eq!(float_rows(d).await, oracle(&landed), "after batch {}", b);
                }
                Ok(())
            })?;
        }
    }
}

/// A file whose float key holds NaN beside one other value has statistics min = max = that
/// value (Parquet leaves NaN out): the NaN row must still be read as NaN — quarantined — and
/// never as the other key (DataFusion 55 takes such a column's value from the statistics).
#[tokio::test]
async fn a_nan_key_beside_one_other_key_in_a_file_is_not_read_as_that_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = float_key_pipeline(d);
    let now = T0 + HOUR;
    land_float_keys(
        d,
        &[
            (f64::NAN, T0 + 19 * MIN, now - MIN, "nan"),
            (1.5, T0, now - MIN, "a"),
        ],
    )
    .await;
    let s = run_json(&p, now, &[]);
    assert_eq!(s["num_quarantined"], 1, "{s}");
    assert_eq!(
        float_rows(d).await,
        vec![(1.5f64.to_bits(), "a".to_string())]
    );
    // An incremental run over a second such file, and a full reload, agree.
    land_float_keys(
        d,
        &[
            (1.5, T0 + 30 * MIN, now, "b"),
            (f64::NAN, T0 + 40 * MIN, now, "nan2"),
        ],
    )
    .await;
    run_json(&p, now + HOUR, &[]);
    assert_eq!(
        float_rows(d).await,
        vec![(1.5f64.to_bits(), "b".to_string())]
    );
    run_json(&p, now + HOUR + MIN, &["--full-reload"]);
    assert_eq!(
        float_rows(d).await,
        vec![(1.5f64.to_bits(), "b".to_string())]
    );
}
