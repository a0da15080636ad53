//! The world model: payments created at a constant rate with a diurnal profile, their state
//! versions, and when each version lands (the ingestion lag mixture, re-deliveries).

use super::*;

/// The parameters that fully determine the generated world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct World {
    pub(super) payments: u64,
    pub(super) days: u32,
    pub(super) start_us: i64,
    pub(super) seed: u64,
}

impl World {
    pub(super) fn check(&self) -> Result<(), &'static str> {
        if self.payments == 0 {
            return Err("payments must be at least 1");
        }
        if self.days == 0 {
            return Err("days must be at least 1");
        }
        Ok(())
    }

    pub(super) fn n_customers(&self) -> u64 {
        (self.payments / 8).max(1000)
    }

    /// Number of payments created before day `k`.
    pub(super) fn day_offset(&self, k: u64) -> u64 {
        let n = u128::from(k) * u128::from(self.payments) / u128::from(self.days);
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    pub(super) fn day_count(&self, k: u64) -> u64 {
        self.day_offset(k + 1) - self.day_offset(k)
    }

    pub(super) fn day_start(&self, k: u64) -> i64 {
        self.start_us + k as i64 * DAY
    }

    /// Ingestion day of a row, relative to day 0.
    pub(super) fn ingestion_day(&self, row: &Row) -> i64 {
        (row.ingested - self.start_us).div_euclid(DAY)
    }
}

/// The independent RNG stream of creation day `k`.
pub(super) fn day_rng(seed: u64, k: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(k);
    rng
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Status {
    Created,
    Authorized,
    Captured,
    Refunded,
    Failed,
}

impl Status {
    pub(super) fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Authorized => "authorized",
            Status::Captured => "captured",
            Status::Refunded => "refunded",
            Status::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Op {
    Upsert,
    Delete,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Upsert => "U",
            Op::Delete => "D",
        }
    }
}

/// Final state a payment reaches, in [`OUTCOME_CUM`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Abandoned,
    Failed,
    AuthorizedOnly,
    Captured,
    Refunded,
}

impl Outcome {
    pub(super) fn draw(rng: &mut ChaCha8Rng) -> Self {
        match pick(rng, &OUTCOME_CUM) {
            0 => Outcome::Abandoned,
            1 => Outcome::Failed,
            2 => Outcome::AuthorizedOnly,
            3 => Outcome::Captured,
            _ => Outcome::Refunded,
        }
    }
}

/// The immutable attributes of a payment, repeated on each of its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Payment {
    pub(super) pnum: u64,
    pub(super) customer: u64,
    pub(super) merchant: u64,
    pub(super) amount: i64,
    pub(super) currency: u8,
    pub(super) created: i64,
}

/// One state version of a payment, before delivery.
#[derive(Debug, Clone, Copy)]
pub(super) struct Version {
    pub(super) status: Status,
    pub(super) op: Op,
    pub(super) updated: i64,
}

/// One delivered change record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) payment: Payment,
    pub(super) status: Status,
    pub(super) op: Op,
    pub(super) updated: i64,
    pub(super) ingested: i64,
}

impl Row {
    /// Ingestion order, ties broken like the python (`lexsort` on op, updated, pnum,
    /// ingested) and then by status so the order is total.
    pub(super) fn sort_key(&self) -> (i64, u64, i64, Op, Status) {
        (
            self.ingested,
            self.payment.pnum,
            self.updated,
            self.op,
            self.status,
        )
    }
}

pub(super) fn uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

pub(super) fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    mean * rng.sample::<f64, _>(Exp1)
}

pub(super) fn lognormal(rng: &mut ChaCha8Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * rng.sample::<f64, _>(StandardNormal)).exp()
}

/// Inverse-CDF draw of a categorical index from normalised cumulative weights.
pub(super) fn pick(rng: &mut ChaCha8Rng, cum: &[f64]) -> usize {
    let u = rng.random::<f64>();
    cum.iter()
        .position(|&c| u < c)
        .unwrap_or(cum.len().saturating_sub(1))
}

/// Every row (all versions, all redeliveries) of the payments created on day `k`, unsorted.
pub(super) fn gen_day(world: &World, k: u64) -> Vec<Row> {
    let mut rng = day_rng(world.seed, k);
    let n = world.day_count(k) as usize;
    let day0 = world.day_start(k);
    let mut created: Vec<i64> = (0..n)
        .map(|_| {
            let hour = pick(&mut rng, &HOUR_CUM) as i64;
            day0 + hour * HOUR + (rng.random::<f64>() * HOUR as f64) as i64
        })
        .collect();
    created.sort_unstable();

    let first_pnum = world.day_offset(k);
    let mut rows = Vec::with_capacity(n * 4);
    let mut versions = Vec::with_capacity(5);
    for (i, &t) in created.iter().enumerate() {
        let payment = draw_payment(&mut rng, world, first_pnum + i as u64, t);
        draw_versions(&mut rng, t, &mut versions);
        for v in &versions {
            deliver(&mut rng, payment, v, &mut rows);
        }
    }
    rows
}

pub(super) fn draw_payment(
    rng: &mut ChaCha8Rng,
    world: &World,
    pnum: u64,
    created: i64,
) -> Payment {
    let customer = (world.n_customers() as f64 * rng.random::<f64>().powi(3)) as u64;
    let merchant = (N_MERCHANTS * rng.random::<f64>().powi(4)) as u64;
    let amount = lognormal(rng, 2500.0, 1.1)
        .round()
        .clamp(50.0, 10_000_000.0) as i64;
    let currency = pick(rng, &CURRENCY_CUM) as u8;
    Payment {
        pnum,
        customer,
        merchant,
        amount,
        currency,
        created,
    }
}

/// The state versions of a payment created at `created` (into `out`, which is cleared first):
/// its lifecycle up to the drawn outcome, plus the rare trailing tombstone.
pub(super) fn draw_versions(rng: &mut ChaCha8Rng, created: i64, out: &mut Vec<Version>) {
    let upsert = |status, updated| Version {
        status,
        op: Op::Upsert,
        updated,
    };
    out.clear();
    out.push(upsert(Status::Created, created));
    let outcome = Outcome::draw(rng);
    if outcome == Outcome::Failed {
        let t_fail = created + SEC + exponential(rng, MIN as f64) as i64;
        out.push(upsert(Status::Failed, t_fail));
    }
    if matches!(
        outcome,
        Outcome::AuthorizedOnly | Outcome::Captured | Outcome::Refunded
    ) {
        let t_auth = created + 200_000 + exponential(rng, 3.0 * SEC as f64) as i64;
        out.push(upsert(Status::Authorized, t_auth));
        if outcome != Outcome::AuthorizedOnly {
            let capture_delay = lognormal(rng, 30.0 * MIN as f64, 1.5).min(7.0 * DAY as f64);
            let t_capt = t_auth + capture_delay as i64;
            out.push(upsert(Status::Captured, t_capt));
            if outcome == Outcome::Refunded {
                let t_ref = t_capt + SEC + refund_delay(rng);
                out.push(upsert(Status::Refunded, t_ref));
            }
        }
    }
    if rng.random::<f64>() < 0.001 {
        let last = *out.last().expect("every payment has a created version");
        let delay = SEC + exponential(rng, 2.0 * DAY as f64).min(10.0 * DAY as f64) as i64;
        out.push(Version {
            op: Op::Delete,
            updated: last.updated + delay,
            ..last
        });
    }
}

/// Refund after capture: 30% chargeback-like (14–75 d), otherwise ~exp(3 d) capped at 75 d.
pub(super) fn refund_delay(rng: &mut ChaCha8Rng) -> i64 {
    let delay = if rng.random::<f64>() < 0.3 {
        uniform(rng, 14.0 * DAY as f64, 75.0 * DAY as f64)
    } else {
        exponential(rng, 3.0 * DAY as f64).min(75.0 * DAY as f64)
    };
    delay as i64
}

/// Deliver one version: draw its ingestion lag, and with 0.5% probability a redelivery of the
/// identical row a little later (at-least-once delivery).
pub(super) fn deliver(rng: &mut ChaCha8Rng, payment: Payment, v: &Version, rows: &mut Vec<Row>) {
    let row = Row {
        payment,
        status: v.status,
        op: v.op,
        updated: v.updated,
        ingested: v.updated + ingestion_lag(rng),
    };
    rows.push(row);
    if rng.random::<f64>() < 0.005 {
        let again = SEC + (exponential(rng, 10.0 * MIN as f64) as i64).min(DAY);
        rows.push(Row {
            ingested: row.ingested + again,
            ..row
        });
    }
}

/// Lag mixture: 92% lognormal median 20 s (cap 50 min), 7% log-uniform 1 h..24 h,
/// 0.9% uniform 1..5 d, 0.1% uniform 7..42 d.
pub(super) fn ingestion_lag(rng: &mut ChaCha8Rng) -> i64 {
    let u = rng.random::<f64>();
    let lag = if u < 0.92 {
        lognormal(rng, 20.0 * SEC as f64, 1.0).min(50.0 * MIN as f64)
    } else if u < 0.99 {
        uniform(rng, (HOUR as f64).ln(), (DAY as f64).ln()).exp()
    } else if u < 0.999 {
        uniform(rng, DAY as f64, 5.0 * DAY as f64)
    } else {
        uniform(rng, 7.0 * DAY as f64, 42.0 * DAY as f64)
    };
    lag as i64
}

/// The rows ingested before `hi`, one ingestion day at a time, in ingestion order: the same
/// rows as `gen_window(world, None, hi)` cut at day boundaries, without holding the whole
/// history. A creation day's rows are ingested on that day or later, so once creation day `k`
/// is generated every ingestion day before `k` is complete; only the rows of later ingestion
/// days (late deliveries, refunds, chargebacks) wait in memory.
pub(super) struct IngestionDays<'a> {
    world: &'a World,
    hi: i64,
    next_k: i64,
    last_k: i64,
    pending: std::collections::BTreeMap<i64, Vec<Row>>,
    /// Payments with at least one row so far (a payment's rows all come from its creation day).
    pub(super) payments: u64,
}

pub(super) fn ingestion_days(world: &World, hi: i64) -> IngestionDays<'_> {
    IngestionDays {
        world,
        hi,
        next_k: 0,
        last_k: (hi - 1 - world.start_us).div_euclid(DAY),
        pending: Default::default(),
        payments: 0,
    }
}

impl Iterator for IngestionDays<'_> {
    type Item = Vec<Row>;

    fn next(&mut self) -> Option<Vec<Row>> {
        loop {
            let done = self.next_k > self.last_k;
            if let Some(entry) = self.pending.first_entry() {
                if done || *entry.key() < self.next_k {
                    let mut rows = entry.remove();
                    rows.sort_unstable_by_key(Row::sort_key);
                    return Some(rows);
                }
            }
            if done {
                return None;
            }
            let k = self.next_k;
            let mut last_pnum = None;
            for row in gen_day(self.world, k as u64) {
                if row.ingested >= self.hi {
                    continue;
                }
                let day = self.world.ingestion_day(&row);
                debug_assert!(day >= k, "a row ingested before its creation day");
                if last_pnum != Some(row.payment.pnum) {
                    // (gen_day emits a payment's rows together)
                    last_pnum = Some(row.payment.pnum);
                    self.payments += 1;
                }
                self.pending.entry(day).or_default().push(row);
            }
            self.next_k += 1;
        }
    }
}

/// Rows with `lo <= _ingested_at < hi` (`lo = None`: from the beginning), in ingestion order.
/// Only the creation days that can reach the window are generated.
pub(super) fn gen_window(world: &World, lo: Option<i64>, hi: i64) -> Vec<Row> {
    let last_day = (hi - 1 - world.start_us).div_euclid(DAY);
    let first_day = lo.map_or(0, |lo| {
        ((lo - world.start_us).div_euclid(DAY) - LOOKBACK_DAYS).max(0)
    });
    let in_window = |r: &Row| r.ingested < hi && lo.is_none_or(|lo| r.ingested >= lo);
    let mut rows = Vec::new();
    for k in first_day..=last_day {
        let day = gen_day(world, k as u64);
        rows.extend(day.into_iter().filter(in_window));
    }
    rows.sort_unstable_by_key(Row::sort_key);
    rows
}

// ---------------------------------------------------------------------------------------------
// Arrow
// ---------------------------------------------------------------------------------------------
