//! The generator's unit tests: determinism, the world's proportions, windows and metadata.

use std::collections::HashMap;
use std::error::Error;
use std::path::Path;
use std::time::Instant;

use arrow::array::AsArray;
use arrow::compute::cast;
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use datafusion::prelude::SessionContext;
use deltalake::kernel::DataType as DeltaType;

use super::*;

type TestResult = Result<(), Box<dyn Error>>;
/// A bronze row as plain values, in schema order.
type Tuple = (
    String,
    String,
    String,
    i64,
    String,
    String,
    i64,
    i64,
    i64,
    String,
);

const START: &str = "2024-01-01";

fn options(dir: &Path, payments: u64, days: u32, seed: u64) -> GenerateOptions {
    GenerateOptions {
        out: dir.join("bronze").display().to_string(),
        payments,
        days,
        seed,
        start: START.parse().expect("valid test date"),
        mode: GenerateMode::Full,
    }
}

fn world(payments: u64, days: u32, seed: u64) -> World {
    let start: NaiveDate = START.parse().expect("valid test date");
    World {
        payments,
        days,
        start_us: start.and_time(NaiveTime::MIN).and_utc().timestamp_micros(),
        seed,
    }
}

fn tuples(batches: &[RecordBatch]) -> Result<Vec<Tuple>, Box<dyn Error>> {
    let mut out = Vec::new();
    for b in batches {
        let text = |i: usize| cast(b.column(i), &DataType::Utf8);
        let (pay, cus, mch, cur, st, op) =
            (text(0)?, text(1)?, text(2)?, text(4)?, text(5)?, text(9)?);
        let amount = b.column(3).as_primitive::<Int64Type>();
        let ts = |i: usize| b.column(i).as_primitive::<TimestampMicrosecondType>();
        let (created, updated, ingested) = (ts(6), ts(7), ts(8));
        for r in 0..b.num_rows() {
            let s = |a: &ArrayRef| a.as_string::<i32>().value(r).to_string();
            out.push((
                s(&pay),
                s(&cus),
                s(&mch),
                amount.value(r),
                s(&cur),
                s(&st),
                created.value(r),
                updated.value(r),
                ingested.value(r),
                s(&op),
            ));
        }
    }
    Ok(out)
}

fn sorted(mut rows: Vec<Tuple>) -> Vec<Tuple> {
    rows.sort();
    rows
}

async fn read_table(path: &str) -> Result<Vec<Tuple>, Box<dyn Error>> {
    let table = deltalake::open_table(parse_table_uri(path)?).await?;
    let ctx = SessionContext::new();
    ctx.register_table("t", table.table_provider().await?)?;
    let batches = ctx.sql("SELECT * FROM t").await?.collect().await?;
    Ok(sorted(tuples(&batches)?))
}

fn expected(world: &World, lo: Option<i64>, hi: i64) -> Result<Vec<Tuple>, Box<dyn Error>> {
    Ok(sorted(tuples(&[to_batch(&gen_window(world, lo, hi))?])?))
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

#[tokio::test]
async fn same_options_give_identical_tables() -> TestResult {
    let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let ra = generate(&options(a.path(), 2_000, 5, 7)).await?;
    let rb = generate(&options(b.path(), 2_000, 5, 7)).await?;
    let (ta, tb) = (read_table(&ra.table).await?, read_table(&rb.table).await?);
    assert!(!ta.is_empty());
    assert_eq!(ta, tb);
    assert_eq!(ra.rows, ta.len() as u64);
    let other_seed = gen_window(&world(2_000, 5, 8), None, us(ra.frontier));
    assert_ne!(
        gen_window(&world(2_000, 5, 7), None, us(ra.frontier)),
        other_seed
    );
    Ok(())
}

#[tokio::test]
async fn full_writes_one_commit_per_ingestion_day_with_metadata_last() -> TestResult {
    let dir = tempfile::tempdir()?;
    let opts = options(dir.path(), 2_000, 5, 1);
    let report = generate(&opts).await?;
    let w = world(2_000, 5, 1);
    assert_eq!(report.mode, "full");
    assert_eq!(report.window_start, None);
    assert_eq!(report.late_rows_behind_15m, 0);
    assert_eq!(us(report.frontier), w.start_us + 5 * DAY);
    assert_eq!(
        read_table(&opts.out).await?,
        expected(&w, None, w.start_us + 5 * DAY)?
    );

    let table = open_existing(&opts.out).await?;
    let history: Vec<_> = table.history(None).collect().await;
    assert_eq!(history.len(), 5, "one commit per ingestion day");
    assert_eq!(report.version, 4);
    let with_meta: Vec<bool> = history
        .into_iter()
        .map(|c| c.map(|c| c.info.contains_key(META_KEY)))
        .collect::<Result<_, _>>()?;
    assert_eq!(
        with_meta,
        [true, false, false, false, false],
        "newest first"
    );
    let meta = find_meta(&table, &opts.out).await?;
    assert_eq!((meta.world, meta.frontier_us), (w, w.start_us + 5 * DAY));

    let fields: Vec<(String, DeltaType)> = table
        .snapshot()?
        .schema()
        .fields()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let (s, l, t) = (DeltaType::STRING, DeltaType::LONG, DeltaType::TIMESTAMP);
    let want = [
        ("payment_id", &s),
        ("customer_id", &s),
        ("merchant_id", &s),
        ("amount_cents", &l),
        ("currency", &s),
        ("status", &s),
        ("created_at", &t),
        ("updated_at", &t),
        ("_ingested_at", &t),
        ("op", &s),
    ]
    .map(|(n, d)| (n.to_string(), d.clone()));
    assert_eq!(fields, want);
    Ok(())
}

#[tokio::test]
async fn next_hours_appends_contiguous_disjoint_windows() -> TestResult {
    let dir = tempfile::tempdir()?;
    let opts = options(dir.path(), 2_000, 5, 3);
    let w = world(2_000, 5, 3);
    let full = generate(&opts).await?;
    let first = next_hours(&opts.out, 1).await?;
    let second = generate(&GenerateOptions {
        mode: GenerateMode::NextHours(1),
        ..opts.clone()
    })
    .await?;

    assert_eq!(first.window_start, Some(full.frontier));
    assert_eq!(second.window_start, Some(first.frontier));
    assert_eq!(us(first.frontier) - us(full.frontier), HOUR);
    assert_eq!(us(second.frontier) - us(first.frontier), HOUR);
    assert_eq!(
        (first.version, second.version),
        (full.version + 1, full.version + 2)
    );
    assert_eq!((first.mode, second.mode), ("increment", "increment"));

    // Everything written equals one generation up to the last frontier: nothing is
    // missing and nothing is written twice.
    let all = read_table(&opts.out).await?;
    assert_eq!(all, expected(&w, None, us(second.frontier))?);
    for r in [&first, &second] {
        let lo = us(r.window_start.expect("increment has a window"));
        let hi = us(r.frontier);
        let window: Vec<&Tuple> = all.iter().filter(|t| (lo..hi).contains(&t.8)).collect();
        assert_eq!(window.len() as u64, r.rows);
        let late = window.iter().filter(|t| t.7 <= lo - 15 * MIN).count() as u64;
        assert_eq!(late, r.late_rows_behind_15m);
    }
    Ok(())
}

#[test]
fn windows_far_from_day_zero_only_need_the_lookback_days() {
    let w = world(3_000, 10, 11);
    let lo = w.start_us + 150 * DAY + 13 * HOUR;
    let hi = lo + 6 * HOUR;
    let everything = gen_window(&w, None, hi);
    let from_lo: Vec<Row> = everything
        .into_iter()
        .filter(|r| r.ingested >= lo)
        .collect();
    assert!(!from_lo.is_empty());
    assert_eq!(gen_window(&w, Some(lo), hi), from_lo);
}

#[test]
fn the_world_has_the_expected_shape() {
    let w = world(50_000, 30, 5);
    let rows: Vec<Row> = (0..30).flat_map(|k| gen_day(&w, k)).collect();
    let mut by_payment: HashMap<u64, Vec<Row>> = HashMap::new();
    for r in &rows {
        by_payment.entry(r.payment.pnum).or_default().push(*r);
    }
    assert_eq!(by_payment.len(), 50_000);
    assert_eq!(by_payment.keys().max(), Some(&49_999));

    use Status::*;
    let lifecycles: [&[Status]; 5] = [
        &[Created],
        &[Created, Failed],
        &[Created, Authorized],
        &[Created, Authorized, Captured],
        &[Created, Authorized, Captured, Refunded],
    ];
    let (mut captured, mut deletes, mut redeliveries) = (0, 0, 0);
    for versions in by_payment.values_mut() {
        versions.sort_by_key(|r| (r.updated, r.op, r.ingested));
        let before = versions.len();
        versions.dedup_by_key(|r| (r.updated, r.op, r.status));
        redeliveries += before - versions.len();
        let (upserts, tombstones): (Vec<Row>, Vec<Row>) =
            versions.iter().partition(|r| r.op == Op::Upsert);
        let statuses: Vec<Status> = upserts.iter().map(|r| r.status).collect();
        assert!(lifecycles.contains(&statuses.as_slice()), "{statuses:?}");
        assert_eq!(upserts[0].updated, upserts[0].payment.created);
        captured += usize::from(statuses.contains(&Captured));
        assert!(tombstones.len() <= 1);
        if let (Some(d), Some(last)) = (tombstones.first(), upserts.last()) {
            assert_eq!(d.status, last.status);
            assert!(d.updated > last.updated);
            deletes += 1;
        }
    }
    let share = captured as f64 / 50_000.0;
    assert!((0.72..0.78).contains(&share), "captured share {share}");
    assert!((10..120).contains(&deletes), "{deletes} deletes");
    assert!(
        redeliveries as f64 > 0.003 * rows.len() as f64,
        "{redeliveries} redeliveries"
    );

    let lags: Vec<i64> = rows.iter().map(|r| r.ingested - r.updated).collect();
    let share_le = |t: i64| lags.iter().filter(|&&l| l <= t).count() as f64 / lags.len() as f64;
    assert!(
        (0.88..0.94).contains(&share_le(15 * MIN)),
        "{}",
        share_le(15 * MIN)
    );
    assert!(lags.iter().any(|&l| l > DAY));
    assert!(lags.iter().any(|&l| l > 7 * DAY));
    assert!(lags.iter().all(|l| (0..=42 * DAY + DAY + SEC).contains(l)));
    let spread = rows.iter().map(|r| r.ingested - r.payment.created).max();
    assert!(spread < Some(LOOKBACK_DAYS * DAY));
}

#[test]
fn ids_are_prefixed_and_zero_padded() -> TestResult {
    let rows = gen_window(
        &world(20_000, 1, 2),
        None,
        world(20_000, 1, 2).start_us + DAY,
    );
    let t = tuples(&[to_batch(&rows[..10])?])?;
    for (pay, cus, mch, ..) in &t {
        assert!(pay.starts_with("pay_") && pay.len() == 16, "{pay}");
        assert!(cus.starts_with("cus_") && cus.len() == 13, "{cus}");
        assert!(mch.starts_with("mch_") && mch.len() == 10, "{mch}");
        assert!(pay[4..].chars().all(|c| c.is_ascii_digit()));
    }
    assert!(rows.windows(2).all(|p| p[0].sort_key() <= p[1].sort_key()));
    Ok(())
}

#[tokio::test]
async fn an_empty_first_window_still_creates_a_generator_table() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("empty").display().to_string();
    let w = world(10, 1, 0);
    let table = new_table(&out).await?;
    let meta = GenMeta::new(w, w.start_us, None);
    write_by_ingestion_day(table.0, std::iter::empty(), &meta, &out, false).await?;
    assert!(read_table(&out).await?.is_empty());
    let report = next_hours(&out, 24).await?;
    assert_eq!(report.window_start.map(us), Some(w.start_us));
    assert!(report.rows > 0);
    Ok(())
}

#[tokio::test]
async fn full_mode_refuses_an_existing_table() -> TestResult {
    let dir = tempfile::tempdir()?;
    let opts = options(dir.path(), 100, 1, 0);
    generate(&opts).await?;
    let err = generate(&opts).await.expect_err("second full generation");
    assert!(matches!(err, GenerateError::TableExists { .. }), "{err}");
    assert!(err.to_string().contains("--next-hour"));
    Ok(())
}

#[tokio::test]
async fn next_hours_needs_a_generator_table() -> TestResult {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("missing").display().to_string();
    let err = next_hours(&missing, 1).await.expect_err("no table");
    assert!(matches!(err, GenerateError::NotATable { .. }), "{err}");
    assert!(!Path::new(&missing).exists(), "must not create directories");

    let plain = dir.path().join("plain").display().to_string();
    let rows = gen_window(&world(100, 1, 0), None, world(100, 1, 0).start_us + DAY);
    commit_rows(
        new_table(&plain).await?.0,
        &rows,
        SaveMode::ErrorIfExists,
        None,
        &plain,
    )
    .await?;
    let err = next_hours(&plain, 1).await.expect_err("no metadata");
    assert!(
        matches!(err, GenerateError::NoGeneratorMetadata { .. }),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn zero_sizes_are_rejected() -> TestResult {
    let dir = tempfile::tempdir()?;
    for opts in [
        options(dir.path(), 0, 5, 0),
        options(dir.path(), 10, 0, 0),
        GenerateOptions {
            mode: GenerateMode::NextHours(0),
            ..options(dir.path(), 10, 5, 0)
        },
    ] {
        let err = generate(&opts).await.expect_err("invalid options");
        assert!(matches!(err, GenerateError::InvalidOptions(_)), "{err}");
    }
    assert!(!dir.path().join("bronze").exists());
    Ok(())
}

/// Timing of debug-build generation; run with `--ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn timing() -> TestResult {
    for (payments, days) in [(20_000, 30), (200_000, 90)] {
        let dir = tempfile::tempdir()?;
        let opts = options(dir.path(), payments, days, 42);
        let t0 = Instant::now();
        let full = generate(&opts).await?;
        let t1 = Instant::now();
        let inc = next_hours(&opts.out, 1).await?;
        println!(
            "{payments} payments / {days} days: full {} rows in {:.2?}; next hour {} rows in {:.2?}",
            full.rows,
            t1 - t0,
            inc.rows,
            t1.elapsed()
        );
    }
    Ok(())
}

/// The full generation streams ingestion days: the same rows, in the same order, cut at the
/// same day boundaries as sorting the whole window, and the same payment count.
#[test]
fn ingestion_days_are_the_whole_window_cut_by_day() {
    for (n, days, seed) in [(3_000, 120, 7), (500, 3, 1), (200, 200, 42)] {
        let w = world(n, days, seed);
        let hi = w.start_us + i64::from(days) * DAY;
        let all = gen_window(&w, None, hi);
        let expected: Vec<Vec<Row>> = all
            .chunk_by(|a, b| w.ingestion_day(a) == w.ingestion_day(b))
            .map(<[Row]>::to_vec)
            .collect();
        let mut streamed = ingestion_days(&w, hi);
        let got: Vec<Vec<Row>> = streamed.by_ref().collect();
        assert_eq!(got.len(), expected.len(), "days ({n}, {days}, {seed})");
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g.len(), e.len());
            assert!(g.iter().zip(e).all(|(a, b)| a.sort_key() == b.sort_key()
                && a.payment.amount == b.payment.amount
                && a.payment.customer == b.payment.customer));
        }
        let mut pnums: Vec<u64> = all.iter().map(|r| r.payment.pnum).collect();
        pnums.sort_unstable();
        pnums.dedup();
        assert_eq!(streamed.payments, pnums.len() as u64);
    }
}

/// A full generation stopped between its commits (SIGINT, a crash) left a table with no
/// generator metadata: the same command run again replaces it, and a table of anything else
/// is still refused.
#[tokio::test]
async fn an_interrupted_generation_is_replaced_by_the_rerun() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("bronze").display().to_string();
    let w = world(100, 1, 0);
    let rows = gen_window(&w, None, w.start_us + DAY);
    commit_rows(
        new_table(&out).await?.0,
        &rows,
        SaveMode::ErrorIfExists,
        None,
        &out,
    )
    .await?;
    let (_, restart) = new_table(&out).await?;
    assert!(restart, "an interrupted generation is replaced");
    let report = generate(&options(dir.path(), 100, 1, 7)).await?;
    assert!(report.rows > 0);
    assert!(matches!(
        new_table(&out).await.expect_err("finished now"),
        GenerateError::TableExists { .. }
    ));
    Ok(())
}
