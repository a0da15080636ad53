//! The per-partition accumulator: everything the profile needs, updated once per row from the
//! two timestamps, merged across partitions at the end.

use super::counts::Counts;

/// Microseconds in a second, minute, hour, day.
pub const SEC: i64 = 1_000_000;
pub const MIN: i64 = 60 * SEC;
pub const HOUR: i64 = 60 * MIN;
pub const DAY: i64 = 24 * HOUR;

/// Lateness keys of the whole table: floored to the millisecond.
pub const TABLE_PRECISION_US: i64 = 1_000;
/// Lateness keys of a `--by` group: floored to the second (a group's exact counts must stay
/// small when there are hundreds of groups).
pub const GROUP_PRECISION_US: i64 = SEC;

/// The thresholds every row is compared with, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub budget: i64,
    pub overlap: Option<i64>,
    /// The settled window `[lo, hi)` of event times, against the (maybe provisional) `now`.
    pub lo: i64,
    pub hi: i64,
    /// When `now` is provisional (the log's statistics truncate timestamps to the millisecond,
    /// so the true maximum arrival is up to 999 µs later), rows whose event time is within this
    /// much of `lo` or `hi` are kept aside and classified once the exact `now` is known.
    pub edge: i64,
}

impl Bounds {
    #[inline(always)]
    fn at_edge(&self, ev: i64) -> bool {
        self.edge > 0
            && ((ev >= self.lo && ev < self.lo.saturating_add(self.edge))
                || (ev >= self.hi && ev < self.hi.saturating_add(self.edge)))
    }
}

/// Sizes of an accumulator's dense ranges.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Lateness key precision, in microseconds.
    pub precision: i64,
    /// Dense keys of the lateness counts (the first 70 minutes at ms precision for the table).
    pub lateness_dense: usize,
    /// Dense keys of the settled rows' lateness in whole seconds (rounded up).
    pub settled_dense: usize,
    pub days_dense: usize,
    pub pending: usize,
}

impl Shape {
    /// The whole table's accumulator: 2^22 ms (16 MiB of counters, touched only where rows
    /// land), 2^17 s (36 h) of settled seconds.
    pub const TABLE: Shape = Shape {
        precision: TABLE_PRECISION_US,
        lateness_dense: 1 << 22,
        settled_dense: 1 << 17,
        days_dense: 1 << 10,
        pending: 1 << 16,
    };
    /// A `--by` group's: small dense ranges (the first hour), the rest as sorted runs.
    pub const GROUP: Shape = Shape {
        precision: GROUP_PRECISION_US,
        lateness_dense: 1 << 12,
        settled_dense: 1 << 12,
        days_dense: 1 << 6,
        pending: 1 << 10,
    };
}

/// What one scan partition (or the merge of all) learned about a set of rows.
#[derive(Debug, Clone)]
pub struct Acc {
    pub precision: i64,
    /// Rows read, nulls included.
    pub rows: u64,
    pub null_event: u64,
    pub null_arrival: u64,
    /// Rows with both timestamps: the profiled rows.
    pub n: u64,
    /// Profiled rows whose arrival is before their event (clock skew).
    pub negative: u64,
    pub beyond_budget: u64,
    pub beyond_overlap: u64,
    pub min_lateness: i64,
    pub max_lateness: i64,
    pub min_event: i64,
    pub max_event: i64,
    /// The latest arrival of any row (also those with a null event time).
    pub max_arrival: Option<i64>,
    /// `floor(lateness / precision)` of every profiled row.
    pub lateness: Counts,
    /// `date(arrival) - date(event)` in UTC calendar days, every profiled row.
    pub days: Counts,
    /// Profiled rows with an event time in the settled window and a lateness >= 0.
    pub settled: u64,
    /// Rows in the settled window arriving before their event: left out of the curve.
    pub settled_negative: u64,
    /// Settled rows the overlap covers (`lateness <= overlap`).
    pub settled_within_overlap: u64,
    /// Calendar days late of the settled rows.
    pub settled_days: Counts,
    /// Lateness of the settled rows in whole seconds, rounded up: `key <= s` exactly when
    /// `lateness <= s` seconds.
    pub settled_secs: Counts,
    /// Rows too close to the settled window's edges to classify before `now` is exact:
    /// `(event, arrival)`.
    pub edge: Vec<(i64, i64)>,
}

impl Acc {
    pub fn new(shape: Shape) -> Self {
        Acc {
            precision: shape.precision,
            rows: 0,
            null_event: 0,
            null_arrival: 0,
            n: 0,
            negative: 0,
            beyond_budget: 0,
            beyond_overlap: 0,
            min_lateness: i64::MAX,
            max_lateness: i64::MIN,
            min_event: i64::MAX,
            max_event: i64::MIN,
            max_arrival: None,
            lateness: Counts::new(shape.lateness_dense, shape.pending),
            days: Counts::new(shape.days_dense, shape.pending),
            settled: 0,
            settled_negative: 0,
            settled_within_overlap: 0,
            settled_days: Counts::new(shape.days_dense, shape.pending),
            settled_secs: Counts::new(shape.settled_dense, shape.pending),
            edge: Vec::new(),
        }
    }

    /// One row with both timestamps (microseconds since the epoch, UTC).
    #[inline(always)]
    pub fn add(&mut self, ev: i64, ar: i64, b: &Bounds) {
        let lateness = ar.saturating_sub(ev);
        let days = ar.div_euclid(DAY) - ev.div_euclid(DAY);
        self.n += 1;
        self.lateness.add(lateness.div_euclid(self.precision));
        self.days.add(days);
        self.min_lateness = self.min_lateness.min(lateness);
        self.max_lateness = self.max_lateness.max(lateness);
        self.min_event = self.min_event.min(ev);
        self.max_event = self.max_event.max(ev);
        self.negative += u64::from(lateness < 0);
        self.beyond_budget += u64::from(lateness > b.budget);
        if let Some(o) = b.overlap {
            self.beyond_overlap += u64::from(lateness > o);
        }
        if b.at_edge(ev) {
            self.edge.push((ev, ar));
        } else if ev >= b.lo && ev < b.hi {
            self.add_settled(lateness, days, b.overlap);
        }
    }

    #[inline(always)]
    fn add_settled(&mut self, lateness: i64, days: i64, overlap: Option<i64>) {
        if lateness < 0 {
            self.settled_negative += 1;
            return;
        }
        self.settled += 1;
        self.settled_days.add(days);
        // Ceiling division (lateness >= 0).
        self.settled_secs.add((lateness + SEC - 1) / SEC);
        if overlap.is_some_and(|o| lateness <= o) {
            self.settled_within_overlap += 1;
        }
    }

    /// Classifies the rows kept at the window's edges against the exact window `[lo, hi)`.
    pub fn resolve_edges(&mut self, lo: i64, hi: i64, overlap: Option<i64>) {
        for (ev, ar) in std::mem::take(&mut self.edge) {
            if ev >= lo && ev < hi {
                let lateness = ar.saturating_sub(ev);
                self.add_settled(lateness, ar.div_euclid(DAY) - ev.div_euclid(DAY), overlap);
            }
        }
    }

    /// Adds another partition's accumulator of the same shape.
    pub fn merge(&mut self, other: Acc) {
        self.rows += other.rows;
        self.null_event += other.null_event;
        self.null_arrival += other.null_arrival;
        self.n += other.n;
        self.negative += other.negative;
        self.beyond_budget += other.beyond_budget;
        self.beyond_overlap += other.beyond_overlap;
        self.min_lateness = self.min_lateness.min(other.min_lateness);
        self.max_lateness = self.max_lateness.max(other.max_lateness);
        self.min_event = self.min_event.min(other.min_event);
        self.max_event = self.max_event.max(other.max_event);
        self.max_arrival = match (self.max_arrival, other.max_arrival) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.lateness.merge(other.lateness);
        self.days.merge(other.days);
        self.settled += other.settled;
        self.settled_negative += other.settled_negative;
        self.settled_within_overlap += other.settled_within_overlap;
        self.settled_days.merge(other.settled_days);
        self.settled_secs.merge(other.settled_secs);
        self.edge.extend(other.edge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            budget: 3 * DAY,
            overlap: Some(15 * MIN),
            lo: 10 * DAY,
            hi: 20 * DAY,
            edge: 0,
        }
    }

    #[test]
    fn a_row_lands_in_every_count_it_belongs_to() {
        let mut a = Acc::new(Shape::TABLE);
        let b = bounds();
        // Event at day 12 23:59:59.5, arrival 4 days and 1 s later: day 17, 5 calendar days.
        let ev = 12 * DAY + DAY - SEC / 2;
        a.add(ev, ev + 4 * DAY + SEC, &b);
        // Outside the window, one second early (clock skew), the day before.
        a.add(25 * DAY, 25 * DAY - SEC, &b);
        // In the window, 10 minutes late.
        a.add(15 * DAY, 15 * DAY + 10 * MIN, &b);
        assert_eq!(
            (a.n, a.negative, a.beyond_budget, a.beyond_overlap),
            (3, 1, 1, 1)
        );
        assert_eq!(a.days.sorted(), vec![(-1, 1), (0, 1), (5, 1)]);
        assert_eq!(a.settled, 2);
        assert_eq!(a.settled_within_overlap, 1);
        assert_eq!(a.settled_days.sorted(), vec![(0, 1), (5, 1)]);
        assert_eq!(a.settled_secs.sorted(), vec![(600, 1), (4 * 86_400 + 1, 1)]);
        assert_eq!(
            a.lateness.sorted(),
            vec![(-1000, 1), (600_000, 1), (345_601_000, 1)]
        );
        assert_eq!((a.min_lateness, a.max_lateness), (-SEC, 4 * DAY + SEC));
    }

    #[test]
    fn edge_rows_wait_for_the_exact_window() {
        let mut b = bounds();
        b.edge = 1_000;
        let mut a = Acc::new(Shape::GROUP);
        a.add(b.lo + 999, b.lo + 999 + SEC, &b); // edge of lo
        a.add(b.hi + 10, b.hi + 10 + SEC, &b); // edge of hi
        a.add(b.lo + 1_000, b.lo + 2_000, &b); // past the edge: settled now
        assert_eq!(a.settled, 1);
        assert_eq!(a.edge.len(), 2);
        // The exact now was 500 µs later than the provisional one.
        a.resolve_edges(b.lo + 500, b.hi + 500, b.overlap);
        assert_eq!(a.settled, 3);
        assert!(a.edge.is_empty());
        let mut c = Acc::new(Shape::GROUP);
        c.add(b.hi + 10, b.hi + 10 + SEC, &b);
        c.resolve_edges(b.lo, b.hi, b.overlap);
        assert_eq!(c.settled, 0);
    }

    #[test]
    fn merged_partitions_equal_one_pass() {
        let b = bounds();
        let rows: Vec<(i64, i64)> = (0..200)
            .map(|i| {
                (
                    i * DAY / 7,
                    i * DAY / 7 + (i * i * 7_919 % (5 * DAY)) - HOUR,
                )
            })
            .collect();
        let mut one = Acc::new(Shape::TABLE);
        let (mut left, mut right) = (Acc::new(Shape::TABLE), Acc::new(Shape::TABLE));
        for (i, &(ev, ar)) in rows.iter().enumerate() {
            one.add(ev, ar, &b);
            if i % 3 == 0 { &mut left } else { &mut right }.add(ev, ar, &b);
        }
        left.merge(right);
        assert_eq!(left.n, one.n);
        assert_eq!(left.negative, one.negative);
        assert_eq!(left.settled, one.settled);
        assert_eq!(left.lateness.sorted(), one.lateness.sorted());
        assert_eq!(left.settled_secs.sorted(), one.settled_secs.sorted());
        assert_eq!(left.days.sorted(), one.days.sorted());
        assert_eq!(left.max_lateness, one.max_lateness);
    }
}
