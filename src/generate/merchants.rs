//! The merchants' change records: the dimension feed of the generated world.
//!
//! Every merchant the payments name (`mch_000000` …) has a first record, most of them long before
//! the payments start; one in ten is **onboarded during** the payments' range and its record
//! often arrives **days after** its first payments (the dimension infers it first). Merchants
//! move segment now and then (a tracked change; a few of those records arrive days late), some
//! are renamed (untracked), a few are closed (a delete). Deterministic from the seed: the same
//! world gives the same records, and a window of arrival times selects what "landed" then.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Merchants the world has (the payments' merchant ids are below this).
pub const MERCHANTS: u64 = super::N_MERCHANTS as u64;

const SEGMENTS: [&str; 5] = ["micro", "small", "mid", "large", "enterprise"];
const COUNTRIES: [&str; 8] = ["NL", "DE", "FR", "BE", "ES", "IT", "GB", "US"];
const MINUTE: i64 = 60_000_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// One change record of a merchant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerchantRecord {
    pub merchant: u64,
    /// When the change happened (µs) and when its record landed.
    pub updated_at: i64,
    pub ingested_at: i64,
    pub name: String,
    pub segment: &'static str,
    pub country: &'static str,
    pub delete: bool,
}

/// Midnight UTC of `day`, in µs.
pub fn start_of(day: chrono::NaiveDate) -> i64 {
    day.and_time(chrono::NaiveTime::MIN)
        .and_utc()
        .timestamp_micros()
}

/// The records of every merchant for a world starting at `start` with `days` of payments
/// (changes continue 30 days past the range, for the hours a demo adds), in landing order.
pub fn records(seed: u64, start: chrono::NaiveDate, days: u32) -> Vec<MerchantRecord> {
    let start_us = start_of(start);
    let end = start_us + (i64::from(days) + 30) * DAY;
    let mut out = Vec::new();
    for m in 0..MERCHANTS {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d65_7263_6861_6e74);
        rng.set_stream(m);
        let late_onboarding = rng.random::<f64>() < 0.10;
        let first = if late_onboarding {
            start_us + (rng.random::<f64>() * f64::from(days) * DAY as f64) as i64
        } else {
            start_us - 1 - (rng.random::<f64>() * 365.0 * DAY as f64) as i64
        };
        let lag = |rng: &mut ChaCha8Rng, late_share: f64| -> i64 {
            if rng.random::<f64>() < late_share {
                DAY + (rng.random::<f64>() * 3.0 * DAY as f64) as i64
            } else {
                MINUTE + (rng.random::<f64>() * 2.0 * HOUR as f64) as i64
            }
        };
        let mut segment = rng.random_range(0..SEGMENTS.len());
        let country = COUNTRIES[rng.random_range(0..COUNTRIES.len())];
        let name = format!("Merchant {m}");
        let record =
            |at: i64, landed: i64, name: &str, segment: usize, delete: bool| MerchantRecord {
                merchant: m,
                updated_at: at,
                ingested_at: landed,
                name: name.to_string(),
                segment: SEGMENTS[segment],
                country,
                delete,
            };
        let first_lag = lag(&mut rng, if late_onboarding { 0.4 } else { 0.0 });
        out.push(record(first, first + first_lag, &name, segment, false));
        // Changes from 60 days before the payments start (or the first record) to the end.
        let from = first.max(start_us - 60 * DAY);
        let span = (end - from).max(1) as f64;
        let moves = match rng.random::<f64>() {
            x if x < 0.55 => 0,
            x if x < 0.85 => 1,
            x if x < 0.97 => 2,
            _ => 3,
        };
        let mut times: Vec<i64> = (0..moves)
            .map(|_| from + 1 + (rng.random::<f64>() * span) as i64)
            .collect();
        times.sort_unstable();
        let mut current_name = name.clone();
        for at in times {
            segment = if segment + 1 < SEGMENTS.len() && rng.random::<f64>() < 0.7 {
                segment + 1
            } else {
                segment.saturating_sub(1)
            };
            let l = lag(&mut rng, 0.15);
            out.push(record(at, at + l, &current_name, segment, false));
        }
        if rng.random::<f64>() < 0.2 {
            let at = from + 1 + (rng.random::<f64>() * span) as i64;
            current_name = format!("{name} & Co");
            let l = lag(&mut rng, 0.05);
            out.push(record(at, at + l, &current_name, segment, false));
        }
        if rng.random::<f64>() < 0.005 {
            let at = from + 1 + (rng.random::<f64>() * span) as i64;
            let l = lag(&mut rng, 0.0);
            out.push(record(at, at + l, &current_name, segment, true));
        }
    }
    out.sort_by_key(|r| (r.ingested_at, r.merchant, r.updated_at));
    out
}

/// The merchants feed's columns (as `tidemark generate` writes bronze: `op` says U or D).
pub fn schema() -> SchemaRef {
    let ts = |n: &str| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("merchant_id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("segment", DataType::Utf8, true),
        Field::new("country", DataType::Utf8, true),
        ts("updated_at"),
        ts("_ingested_at"),
        Field::new("op", DataType::Utf8, false),
    ]))
}

/// `records` as a batch of [`schema`].
pub fn batch(records: &[&MerchantRecord]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let ts = |f: &dyn Fn(&MerchantRecord) -> i64| {
        TimestampMicrosecondArray::from_iter_values(records.iter().map(|r| f(r)))
            .with_timezone("UTC")
    };
    let text = |f: &dyn Fn(&MerchantRecord) -> Option<String>| {
        StringArray::from(records.iter().map(|r| f(r)).collect::<Vec<_>>())
    };
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(text(&|r| Some(format!("mch_{:06}", r.merchant)))),
            Arc::new(text(&|r| (!r.delete).then(|| r.name.clone()))),
            Arc::new(text(&|r| (!r.delete).then(|| r.segment.to_string()))),
            Arc::new(text(&|r| (!r.delete).then(|| r.country.to_string()))),
            Arc::new(ts(&|r| r.updated_at)),
            Arc::new(ts(&|r| r.ingested_at)),
            Arc::new(text(&|r| {
                Some(if r.delete { "D" } else { "U" }.to_string())
            })),
        ],
    )
}

/// Appends to the merchants table at `uri` the records that landed in `(after, until]` (all up
/// to `until` when `after` is `None`), creating the table; returns how many.
pub async fn land(
    uri: &str,
    all: &[MerchantRecord],
    after: Option<i64>,
    until: i64,
) -> Result<u64, super::GenerateError> {
    let picked: Vec<&MerchantRecord> = all
        .iter()
        .filter(|r| r.ingested_at <= until && after.is_none_or(|a| r.ingested_at > a))
        .collect();
    if picked.is_empty() {
        return Ok(0);
    }
    let b = batch(&picked)?;
    let delta = |source: deltalake::DeltaTableError| super::GenerateError::Delta {
        path: uri.to_string(),
        source: Box::new(source),
    };
    let existing = crate::lake::open_if_exists(uri)
        .await
        .map_err(|e| delta(deltalake::DeltaTableError::Generic(e.to_string())))?;
    let table = crate::lake::or_new(existing, uri)
        .map_err(|e| delta(deltalake::DeltaTableError::Generic(e.to_string())))?;
    table
        .write(vec![b])
        .with_save_mode(deltalake::protocol::SaveMode::Append)
        .await
        .map_err(delta)?;
    Ok(picked.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_is_deterministic_and_has_late_onboarding_moves_and_deletes() {
        let day = chrono::NaiveDate::from_ymd_opt(2024, 1, 1).expect("date");
        let start = start_of(day);
        assert_eq!(start, 1_704_067_200_000_000);
        let a = records(42, day, 30);
        assert_eq!(a, records(42, day, 30));
        let firsts: std::collections::BTreeMap<u64, &MerchantRecord> =
            a.iter().rev().map(|r| (r.merchant, r)).collect();
        assert_eq!(
            firsts.len() as u64,
            MERCHANTS,
            "every merchant has a record"
        );
        let onboarded_late = a
            .iter()
            .filter(|r| r.updated_at >= start && r.ingested_at - r.updated_at > DAY)
            .count();
        assert!(onboarded_late > 100, "{onboarded_late}");
        assert!(a.iter().filter(|r| r.delete).count() > 20);
        assert!(a.windows(2).all(|w| w[0].ingested_at <= w[1].ingested_at));
    }
}
