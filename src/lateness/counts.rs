//! Exact counts of integer keys (lateness in milliseconds or seconds, days late), with memory
//! bounded by the number of distinct keys, not the number of rows.
//!
//! The common range (`0..dense_len`) is a dense array of `u32` counters: one increment per row,
//! no hashing, no sorting. Keys outside it (negative lateness, the long tail) are buffered and,
//! when the buffer fills, sorted and folded into run-length `(key, count)` runs. Reading the
//! counts back walks the three sources in key order, so quantiles and cumulative shares are
//! exact for the key's precision, and nothing ever sorts all the rows.

use std::collections::BTreeMap;

/// Counts of `i64` keys.
#[derive(Debug, Clone)]
pub struct Counts {
    /// `dense[k]` counts key `k` for `0 <= k < dense.len()` (zeroed memory the OS maps lazily:
    /// untouched pages cost nothing).
    dense: Vec<u32>,
    /// Counts a dense slot could not hold (a slot that wrapped past `u32::MAX`): `2^32` each time.
    overflow: BTreeMap<i64, u64>,
    /// Keys outside the dense range, not yet folded into `runs`.
    pending: Vec<i64>,
    /// The smallest size `pending` is folded at (it grows with `runs`, so folding stays
    /// amortised O(n log n) over the tail's rows).
    pending_cap: usize,
    /// Keys outside the dense range with their counts, sorted by key, each key once.
    runs: Vec<(i64, u64)>,
    total: u64,
}

impl Counts {
    /// Counts with a dense range of `dense_len` keys from 0, folding the tail every
    /// `pending_cap` keys (at least).
    pub fn new(dense_len: usize, pending_cap: usize) -> Self {
        Counts {
            dense: vec![0; dense_len],
            overflow: BTreeMap::new(),
            pending: Vec::new(),
            pending_cap: pending_cap.max(16),
            runs: Vec::new(),
            total: 0,
        }
    }

    /// Counts one key.
    #[inline]
    pub fn add(&mut self, key: i64) {
        self.total += 1;
        if let Some(slot) = usize::try_from(key)
            .ok()
            .and_then(|k| self.dense.get_mut(k))
        {
            let (next, wrapped) = slot.overflowing_add(1);
            *slot = next;
            if wrapped {
                *self.overflow.entry(key).or_default() += 1u64 << 32;
            }
            return;
        }
        self.pending.push(key);
        if self.pending.len() >= self.pending_cap {
            self.fold();
        }
    }

    /// How many keys were counted.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Sorts the buffered tail keys into `runs`.
    fn fold(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.pending.sort_unstable();
        let mut fresh: Vec<(i64, u64)> = Vec::new();
        for &k in &self.pending {
            match fresh.last_mut() {
                Some((last, n)) if *last == k => *n += 1,
                _ => fresh.push((k, 1)),
            }
        }
        self.pending.clear();
        self.runs = merge_runs(std::mem::take(&mut self.runs), fresh);
        self.pending_cap = self.pending_cap.max(self.runs.len());
    }

    /// Adds `other`'s counts to these (another partition's, or a resolved edge row's).
    pub fn merge(&mut self, mut other: Counts) {
        other.fold();
        self.fold();
        if self.dense.len() < other.dense.len() {
            std::mem::swap(&mut self.dense, &mut other.dense);
            std::mem::swap(&mut self.overflow, &mut other.overflow);
            // The dense range changed: keys of the old tail inside it move to the dense part.
            let runs = std::mem::take(&mut self.runs);
            self.runs = self.place(runs);
        }
        for (k, n) in other.overflow {
            *self.overflow.entry(k).or_default() += n;
        }
        for (k, (mine, theirs)) in self.dense.iter_mut().zip(&other.dense).enumerate() {
            if *theirs == 0 {
                continue;
            }
            let (sum, wrapped) = mine.overflowing_add(*theirs);
            *mine = sum;
            if wrapped {
                *self.overflow.entry(k as i64).or_default() += 1u64 << 32;
            }
        }
        // Keys of other's dense range beyond ours (only when theirs was longer: swapped above).
        let runs = self.place(other.runs);
        self.runs = merge_runs(std::mem::take(&mut self.runs), runs);
        self.total += other.total;
        self.pending_cap = self.pending_cap.max(self.runs.len());
    }

    /// Moves the runs whose keys fall in the dense range into it; returns the others.
    fn place(&mut self, runs: Vec<(i64, u64)>) -> Vec<(i64, u64)> {
        let mut rest = Vec::with_capacity(runs.len());
        for (k, n) in runs {
            match usize::try_from(k).ok().filter(|&i| i < self.dense.len()) {
                Some(_) => *self.overflow.entry(k).or_default() += n,
                None => rest.push((k, n)),
            }
        }
        rest
    }

    /// Every key with its count, in ascending key order (keys with a zero count left out).
    pub fn iter(&mut self) -> impl Iterator<Item = (i64, u64)> + '_ {
        self.fold();
        let dense_len = self.dense.len() as i64;
        let below = self.runs.iter().copied().take_while(|&(k, _)| k < 0);
        let above = self
            .runs
            .iter()
            .copied()
            .skip_while(move |&(k, _)| k < dense_len);
        let overflow = &self.overflow;
        let dense = self.dense.iter().enumerate().filter_map(move |(k, &n)| {
            let extra = if overflow.is_empty() {
                0
            } else {
                overflow.get(&(k as i64)).copied().unwrap_or(0)
            };
            let n = u64::from(n) + extra;
            (n > 0).then_some((k as i64, n))
        });
        below.chain(dense).chain(above)
    }

    /// The counts as a sorted `(key, count)` list.
    pub fn sorted(&mut self) -> Vec<(i64, u64)> {
        self.iter().collect()
    }

    /// Quantiles by linear interpolation between the two nearest ranks — DuckDB's
    /// `quantile_cont`: position `(n - 1) * q` in the sorted keys, `lo + (hi - lo) * frac`.
    /// `qs` in `[0, 1]`, any order; `None` for each when nothing was counted.
    pub fn quantiles(&mut self, qs: &[f64]) -> Vec<Option<f64>> {
        let n = self.total;
        if n == 0 {
            return vec![None; qs.len()];
        }
        // The ranks needed, sorted, so one walk in key order finds them all.
        let positions: Vec<(f64, u64, u64)> = qs
            .iter()
            .map(|&q| {
                let pos = (n - 1) as f64 * q.clamp(0.0, 1.0);
                let lo = (pos.floor() as u64).min(n - 1);
                let hi = (pos.ceil() as u64).min(n - 1);
                (pos, lo, hi)
            })
            .collect();
        let mut ranks: Vec<u64> = positions.iter().flat_map(|p| [p.1, p.2]).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let mut value_at: BTreeMap<u64, i64> = BTreeMap::new();
        let mut seen = 0u64;
        let mut next = 0usize;
        for (k, c) in self.iter() {
            seen += c;
            while next < ranks.len() && ranks[next] < seen {
                value_at.insert(ranks[next], k);
                next += 1;
            }
            if next == ranks.len() {
                break;
            }
        }
        positions
            .iter()
            .map(|&(pos, lo, hi)| {
                let a = *value_at.get(&lo)? as f64;
                let b = *value_at.get(&hi)? as f64;
                Some(interpolate(a, b, pos - pos.floor()))
            })
            .collect()
    }
}

/// `lo + (hi - lo) * frac`, as DuckDB's `quantile_cont` interpolates.
pub fn interpolate(lo: f64, hi: f64, frac: f64) -> f64 {
    if frac == 0.0 {
        lo
    } else {
        lo + (hi - lo) * frac
    }
}

/// How many of `total` rows `pct` percent of them is, rounded up, at least 1 (with a hair of
/// relative tolerance, so 99.9% of 1000 is 999 whatever the float rounding).
pub fn needed(pct: f64, total: u64) -> u64 {
    let exact = pct.clamp(0.0, 100.0) * total as f64 / 100.0;
    ((exact - 1e-9 * exact.max(1.0)).ceil() as u64).clamp(1, total.max(1))
}

/// The union of two sorted, key-unique run lists.
fn merge_runs(a: Vec<(i64, u64)>, b: Vec<(i64, u64)>) -> Vec<(i64, u64)> {
    if a.is_empty() {
        return b;
    }
    if b.is_empty() {
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push((a[i].0, a[i].1 + b[j].1));
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// A sorted `(key, count)` list with running totals: how many keys are at most `k`.
#[derive(Debug, Clone, Default)]
pub struct Cumulative {
    keys: Vec<i64>,
    /// `upto[i]`: the count of keys `<= keys[i]`.
    upto: Vec<u64>,
}

impl Cumulative {
    pub fn new(sorted: &[(i64, u64)]) -> Self {
        let mut sum = 0;
        let mut keys = Vec::with_capacity(sorted.len());
        let mut upto = Vec::with_capacity(sorted.len());
        for &(k, n) in sorted {
            sum += n;
            keys.push(k);
            upto.push(sum);
        }
        Cumulative { keys, upto }
    }

    /// All keys counted.
    pub fn total(&self) -> u64 {
        self.upto.last().copied().unwrap_or(0)
    }

    /// How many keys are `<= k`.
    pub fn at_most(&self, k: i64) -> u64 {
        match self.keys.partition_point(|&x| x <= k) {
            0 => 0,
            i => self.upto[i - 1],
        }
    }

    /// The smallest key `k` with `at_most(k) >= pct% of total` (`None` when empty).
    pub fn smallest_covering(&self, pct: f64) -> Option<i64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let need = needed(pct, total);
        let i = self.upto.partition_point(|&u| u < need);
        self.keys.get(i.min(self.keys.len() - 1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// DuckDB's `quantile_cont` over a plain sorted vector: the oracle.
    fn naive_quantile(values: &[i64], q: f64) -> Option<f64> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let pos = (v.len() - 1) as f64 * q;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        Some(interpolate(v[lo] as f64, v[hi] as f64, pos - pos.floor()))
    }

    fn counted(values: &[i64], dense: usize, cap: usize) -> Counts {
        let mut c = Counts::new(dense, cap);
        for &v in values {
            c.add(v);
        }
        c
    }

    #[test]
    fn dense_tail_and_negative_keys_come_back_in_order() {
        let mut c = counted(&[5, -3, 1000, 5, 2, -3, 70, 1000, 1000], 64, 2);
        assert_eq!(
            c.sorted(),
            vec![(-3, 2), (2, 1), (5, 2), (70, 1), (1000, 3)]
        );
        assert_eq!(c.total(), 9);
    }

    #[test]
    fn merging_partitions_equals_counting_everything_once() {
        let a = [1, 2, 3, 500, -1, 7, 7];
        let b = [7, 8, 900, 500, -1, -9];
        let mut left = counted(&a, 16, 2);
        left.merge(counted(&b, 16, 3));
        let all: Vec<i64> = a.iter().chain(&b).copied().collect();
        assert_eq!(left.sorted(), counted(&all, 16, 1000).sorted());
        // Different dense ranges merge too (the longer one wins; the tail moves into it).
        let mut short = counted(&a, 4, 2);
        short.merge(counted(&b, 1024, 2));
        assert_eq!(short.sorted(), counted(&all, 16, 1000).sorted());
        assert_eq!(short.total(), all.len() as u64);
    }

    #[test]
    fn a_wrapped_dense_slot_keeps_its_count() {
        let mut c = Counts::new(4, 16);
        c.dense[2] = u32::MAX;
        c.add(2);
        c.add(2);
        assert_eq!(c.sorted(), vec![(2, (1u64 << 32) + 1)]);
    }

    #[test]
    fn quantiles_interpolate_like_quantile_cont() {
        // 1..=10: position (n-1)q = 4.5 for the median → 5.5.
        let mut c = counted(&(1..=10).collect::<Vec<_>>(), 8, 4);
        let q = c.quantiles(&[0.5, 0.9, 0.0, 1.0]);
        assert_eq!(q, vec![Some(5.5), Some(9.1), Some(1.0), Some(10.0)]);
        assert_eq!(Counts::new(8, 4).quantiles(&[0.5]), vec![None]);
        let mut one = counted(&[-42], 8, 4);
        assert_eq!(one.quantiles(&[0.5, 0.999]), vec![Some(-42.0), Some(-42.0)]);
    }

    #[test]
    fn cumulative_shares_and_the_smallest_covering_key() {
        let c = Cumulative::new(&[(0, 90), (1, 9), (5, 1)]);
        assert_eq!(c.total(), 100);
        assert_eq!(c.at_most(-1), 0);
        assert_eq!(c.at_most(0), 90);
        assert_eq!(c.at_most(4), 99);
        assert_eq!(c.at_most(99), 100);
        assert_eq!(c.smallest_covering(90.0), Some(0));
        assert_eq!(c.smallest_covering(91.0), Some(1));
        assert_eq!(c.smallest_covering(99.0), Some(1));
        assert_eq!(c.smallest_covering(99.9), Some(5));
        assert_eq!(c.smallest_covering(100.0), Some(5));
        assert_eq!(Cumulative::new(&[]).smallest_covering(50.0), None);
        assert_eq!(needed(99.9, 1000), 999);
        assert_eq!(needed(99.9, 1001), 1000);
        assert_eq!(needed(0.0, 10), 1);
    }

    proptest! {
        #[test]
        fn quantiles_and_counts_match_a_naive_oracle(
            values in proptest::collection::vec(-5_000i64..200_000, 0..400),
            split in 0usize..400,
            dense in 1usize..3_000,
            cap in 1usize..64,
            q in 0.0f64..=1.0,
        ) {
            let split = split.min(values.len());
            let mut c = counted(&values[..split], dense, cap);
            c.merge(counted(&values[split..], dense / 2 + 1, cap + 3));
            let qs = [q, 0.5, 0.9, 0.99, 0.999, 1.0];
            let got = c.quantiles(&qs);
            for (q, g) in qs.iter().zip(got) {
                prop_assert_eq!(g, naive_quantile(&values, *q));
            }
            let mut expect: BTreeMap<i64, u64> = BTreeMap::new();
            for &v in &values {
                *expect.entry(v).or_default() += 1;
            }
            let list = c.sorted();
            prop_assert_eq!(&list, &expect.into_iter().collect::<Vec<_>>());
            let cum = Cumulative::new(&list);
            let k = 1_000i64;
            prop_assert_eq!(cum.at_most(k), values.iter().filter(|&&v| v <= k).count() as u64);
            if let Some(s) = cum.smallest_covering(q * 100.0) {
                let need = needed(q * 100.0, values.len() as u64) as usize;
                let covered = |x: i64| values.iter().filter(|&&v| v <= x).count();
                prop_assert!(covered(s) >= need);
                prop_assert!(covered(s - 1) < need);
            }
        }
    }
}
