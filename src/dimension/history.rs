//! SCD type 2 history of one business key, folded from its change records — and kept exact
//! when changes arrive out of order.
//!
//! **The fold** (the definition the table must equal): the key's changes sorted by their order
//! (sequence, then tie-breakers), a re-delivered change counted once, folded one after the
//! other:
//! - an upsert with no version open opens one, valid from its sequence;
//! - an upsert whose *tracked* columns differ from the open version's closes it at its
//!   sequence and opens a new one there;
//! - an upsert that changes only untracked columns updates the open version in place (AUTO
//!   CDC's `track_history_column_list` semantics: no new version);
//! - a delete closes the open version at its sequence (with nothing open, it closes nothing).
//!
//! **Why each version keeps its changes.** Done in place, an untracked change overwrites the
//! values the version had before it; when a change with a *tracked* difference then arrives
//! late, inside that version, the fold splits the version at the late change and needs what
//! the version held just before it, and where the in-place changes after it start a version of
//! their own — neither survives an overwrite. So a [`Version`] carries the changes folded into
//! it (its opening change, its in-place updates, the delete that closed it), and a key's
//! [`History`] the deletes that closed nothing: a late change is spliced in by folding the
//! history's changes together with the new ones, which equals folding everything the source
//! ever delivered for the key, in whatever order and batches it arrived.

use std::cmp::Ordering;

/// One change record of a business key: its order (sequence and tie-breakers), whether it is a
/// delete, and its row (whatever the caller compares and stores).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<K, R> {
    pub order: K,
    pub delete: bool,
    pub row: R,
}

/// One version of a key: valid from its opening change's order until the next version opens or
/// a delete closes it (`to`, exclusive; `None` while current).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version<K, R> {
    pub from: K,
    pub to: Option<K>,
    /// The newest upsert folded into this version: its values.
    pub row: R,
    /// Every change folded into it, in order: the opening upsert, the in-place updates, and
    /// last the delete that closed it, if one did.
    pub changes: Vec<Change<K, R>>,
}

impl<K: Clone, R> Version<K, R> {
    /// Whether a delete closed this version (the key had no version from `to` on, until a later
    /// upsert opened one).
    pub fn closed_by_delete(&self) -> bool {
        self.changes.last().is_some_and(|c| c.delete)
    }
}

/// A key's history: its versions, oldest first, and the deletes that closed nothing (kept: a
/// late upsert older than such a delete opens a version the delete then closes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History<K, R> {
    pub versions: Vec<Version<K, R>>,
    pub idle_deletes: Vec<Change<K, R>>,
}

impl<K, R> Default for History<K, R> {
    fn default() -> Self {
        History {
            versions: Vec::new(),
            idle_deletes: Vec::new(),
        }
    }
}

impl<K: Ord + Clone, R: Clone> History<K, R> {
    /// The history of a key's changes, in any order, re-deliveries included: sorted by order
    /// (an upsert and a delete of the same order: the delete last), one change per order and
    /// kind kept (the last delivered), folded. `tracked_eq` says whether two rows agree on
    /// the tracked columns.
    pub fn fold(
        mut changes: Vec<Change<K, R>>,
        tracked_eq: impl Fn(&R, &R) -> bool,
    ) -> History<K, R> {
        changes.sort_by(|a, b| a.order.cmp(&b.order).then(a.delete.cmp(&b.delete)));
        // A re-delivered change (same order and kind) counts once: the last delivered wins.
        changes.reverse();
        changes.dedup_by(|later, earlier| {
            later.order == earlier.order && later.delete == earlier.delete
        });
        changes.reverse();
        let mut h = History::default();
        let mut open: Option<Version<K, R>> = None;
        for c in changes {
            if c.delete {
                match open.take() {
                    Some(mut v) => {
                        v.to = Some(c.order.clone());
                        v.changes.push(c);
                        h.versions.push(v);
                    }
                    None => h.idle_deletes.push(c),
                }
                continue;
            }
            match open.as_mut() {
                Some(v) if tracked_eq(&v.row, &c.row) => {
                    v.row = c.row.clone();
                    v.changes.push(c);
                }
                _ => {
                    if let Some(mut v) = open.take() {
                        v.to = Some(c.order.clone());
                        h.versions.push(v);
                    }
                    open = Some(Version {
                        from: c.order.clone(),
                        to: None,
                        row: c.row.clone(),
                        changes: vec![c],
                    });
                }
            }
        }
        h.versions.extend(open);
        h
    }

    /// Every change the history holds (what folding it again needs).
    pub fn changes(&self) -> Vec<Change<K, R>> {
        self.versions
            .iter()
            .flat_map(|v| v.changes.iter().cloned())
            .chain(self.idle_deletes.iter().cloned())
            .collect()
    }

    /// The history with `new` changes spliced in where their order puts them, out of order or
    /// re-delivered: the fold of everything.
    pub fn splice(
        &self,
        new: Vec<Change<K, R>>,
        tracked_eq: impl Fn(&R, &R) -> bool,
    ) -> History<K, R> {
        let mut all = self.changes();
        all.extend(new);
        History::fold(all, tracked_eq)
    }

    /// The version valid at `at`: the one with `from <= at < to`.
    pub fn as_of(&self, at: &K) -> Option<&Version<K, R>> {
        self.versions
            .iter()
            .find(|v| v.from.cmp(at) != Ordering::Greater && v.to.as_ref().is_none_or(|to| at < to))
    }

    /// The current version (none after a delete).
    pub fn current(&self) -> Option<&Version<K, R>> {
        self.versions.last().filter(|v| v.to.is_none())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A row: (tracked value, untracked value).
    type Row = (u8, u8);

    fn tracked(a: &Row, b: &Row) -> bool {
        a.0 == b.0
    }

    fn up(order: i64, t: u8, u: u8) -> Change<i64, Row> {
        Change {
            order,
            delete: false,
            row: (t, u),
        }
    }

    fn del(order: i64) -> Change<i64, Row> {
        Change {
            order,
            delete: true,
            row: (0, 0),
        }
    }

    fn spans(h: &History<i64, Row>) -> Vec<(i64, Option<i64>, Row)> {
        h.versions.iter().map(|v| (v.from, v.to, v.row)).collect()
    }

    #[test]
    fn tracked_changes_open_versions_untracked_ones_update_in_place() {
        let h = History::fold(
            vec![up(1, 1, 0), up(2, 1, 5), up(3, 2, 5), del(4), up(6, 3, 0)],
            tracked,
        );
        assert_eq!(
            spans(&h),
            vec![
                (1, Some(3), (1, 5)),
                (3, Some(4), (2, 5)),
                (6, None, (3, 0))
            ]
        );
        assert!(h.versions[1].closed_by_delete());
        assert_eq!(h.current().map(|v| v.row), Some((3, 0)));
        assert_eq!(h.as_of(&2).map(|v| v.row), Some((1, 5)));
        assert_eq!(h.as_of(&5), None, "deleted between 4 and 6");
    }

    #[test]
    fn a_late_tracked_change_splits_a_version_that_was_updated_in_place() {
        // Version (1, ..) opened at 1 and updated in place at 5; a tracked change at 3 arrives
        // late: [1,3) keeps the values it had before 3, [3,5) is the late change, and the
        // in-place update at 5 (tracked 1 again) opens its own version.
        let h = History::fold(vec![up(1, 1, 0), up(5, 1, 9)], tracked);
        assert_eq!(spans(&h), vec![(1, None, (1, 9))]);
        let h = h.splice(vec![up(3, 2, 0)], tracked);
        assert_eq!(
            spans(&h),
            vec![
                (1, Some(3), (1, 0)),
                (3, Some(5), (2, 0)),
                (5, None, (1, 9))
            ]
        );
    }

    #[test]
    fn a_late_change_older_than_a_delete_does_not_reopen_the_key() {
        let h = History::fold(vec![del(5)], tracked);
        assert!(h.versions.is_empty());
        let h = h.splice(vec![up(3, 1, 0)], tracked);
        assert_eq!(spans(&h), vec![(3, Some(5), (1, 0))]);
        assert_eq!(h.current(), None);
        // Re-delivered: nothing changes.
        assert_eq!(h.splice(vec![up(3, 1, 0), del(5)], tracked), h);
    }

    /// Changes of one key: orders drawn from a small range (collisions: re-deliveries), a few
    /// deletes, rows from a few values.
    fn changes() -> impl Strategy<Value = Vec<Change<i64, Row>>> {
        proptest::collection::vec((0i64..40, prop::bool::weighted(0.2), 0u8..3, 0u8..3), 0..24)
            .prop_map(|v| {
                v.into_iter()
                    .map(|(order, delete, t, u)| Change {
                        order,
                        delete,
                        row: if delete { (0, 0) } else { (t, u) },
                    })
                    .collect()
            })
    }

    proptest! {
        /// Whatever the batches the changes arrive in and their order, splicing run after run
        /// equals folding them all at once; and at every instant the version valid then has the
        /// tracked value of the newest change at or before it — none when that change is a
        /// delete or there is none (an oracle that knows nothing of versions).
        #[test]
        fn splicing_in_any_order_equals_the_fold_of_everything(
            all in changes(),
            cuts in proptest::collection::vec(0usize..24, 0..5),
            seed in any::<u64>(),
        ) {
            // Same order, same kind: the same change (a re-delivery carries the same row).
            let mut all = all;
            for i in 0..all.len() {
                for j in 0..i {
                    if all[j].order == all[i].order && all[j].delete == all[i].delete {
                        all[i].row = all[j].row;
                    }
                }
            }
            let whole = History::fold(all.clone(), tracked);
            // Deliver in a shuffled order, in batches.
            let mut shuffled = all.clone();
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(shuffled.len())).collect();
            cuts.sort();
            let mut h = History::default();
            let mut from = 0;
            for c in cuts.into_iter().chain([shuffled.len()]) {
                h = h.splice(shuffled[from..c.max(from)].to_vec(), tracked);
                from = c.max(from);
            }
            prop_assert_eq!(&h, &whole);
            // Intervals: at each instant, the tracked value of the newest change at or before it.
            for t in -1i64..42 {
                let newest = all
                    .iter()
                    .filter(|c| c.order <= t)
                    .max_by(|a, b| a.order.cmp(&b.order).then(a.delete.cmp(&b.delete)));
                let want = newest.filter(|c| !c.delete).map(|c| c.row.0);
                prop_assert_eq!(h.as_of(&t).map(|v| v.row.0), want, "at {}", t);
            }
            // Versions tile time: each starts where it opened, ends where the next opens or a
            // delete closed it; only the last may be open.
            for w in h.versions.windows(2) {
                let to = w[0].to.expect("only the last version is open");
                prop_assert!(to <= w[1].from);
                prop_assert!(to == w[1].from || w[0].closed_by_delete());
            }
        }
    }
}
