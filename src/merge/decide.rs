//! The merge's rule for one key, in one place: the copy-on-write rewrite (`cow/`) and the
//! MERGE path for schema evolution (`changes.rs`) both ask it, so they cannot disagree.

use std::cmp::Ordering;

/// What a key's winner does to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// A new key: written.
    Insert,
    /// A delete of a live key (or, with soft deletes, of a key the target never had: its
    /// tombstone is written so an older version landing later cannot bring it back).
    Delete,
    /// A newer version of a key the target holds (a live row or a tombstone).
    Update,
    /// Nothing to write: the target already holds this version or a newer one, or a hard delete
    /// of a key the target does not have.
    Unchanged,
}

impl Verdict {
    /// Whether the target changes.
    pub(super) fn changes(self) -> bool {
        self != Verdict::Unchanged
    }
}

/// The verdict for a winner whose key the target does not hold.
pub(super) fn absent(deleted: bool, hard: bool) -> Verdict {
    match (deleted, hard) {
        (true, true) => Verdict::Unchanged,
        (true, false) => Verdict::Delete,
        (false, _) => Verdict::Insert,
    }
}

/// The verdict for a winner whose key the target holds, from the comparison of their
/// `(sequence, tie-breakers)` tuples and then their contents (the dedup's order, so an
/// incremental run picks what a full reload picks), and whether this is a conflict to count:
/// equal tuples with different contents, not already counted by the dedup.
///
/// With partial updates (`partial`) a winner with the target's tuple is the same record filled
/// again, from everything read since: it replaces the target's row when it differs, and is no
/// conflict.
pub(super) fn matched(
    tuple: Ordering,
    content: Ordering,
    deleted: bool,
    target_deleted: bool,
    counted_by_dedup: bool,
    partial: bool,
) -> (Verdict, bool) {
    let refilled = partial && tuple == Ordering::Equal;
    let conflict =
        tuple == Ordering::Equal && content != Ordering::Equal && !counted_by_dedup && !refilled;
    let wins = match refilled {
        true => content != Ordering::Equal,
        false => tuple.then(content) == Ordering::Greater,
    };
    let verdict = if !wins {
        Verdict::Unchanged
    } else if deleted && !target_deleted {
        Verdict::Delete
    } else {
        Verdict::Update
    };
    (verdict, conflict)
}

/// Whether a changed row stays in the target: every row but a hard delete. Only those move the
/// watermark.
pub(super) fn stays(deleted: bool, hard: bool) -> bool {
    !(deleted && hard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Ordering::{Equal, Greater, Less};

    #[test]
    fn a_new_key_is_inserted_and_a_hard_delete_of_it_is_nothing() {
        assert_eq!(absent(false, false), Verdict::Insert);
        assert_eq!(absent(false, true), Verdict::Insert);
        assert_eq!(
            absent(true, false),
            Verdict::Delete,
            "a soft delete writes its tombstone"
        );
        assert_eq!(absent(true, true), Verdict::Unchanged);
    }

    #[test]
    fn only_a_greater_tuple_or_equal_tuple_and_greater_content_wins() {
        assert_eq!(
            matched(Greater, Less, false, false, false, false),
            (Verdict::Update, false)
        );
        assert_eq!(
            matched(Less, Greater, false, false, false, false),
            (Verdict::Unchanged, false)
        );
        assert_eq!(
            matched(Equal, Equal, false, false, false, false),
            (Verdict::Unchanged, false),
            "a rerun"
        );
        assert_eq!(
            matched(Equal, Greater, false, false, false, false),
            (Verdict::Update, true)
        );
        assert_eq!(
            matched(Equal, Less, false, false, false, false),
            (Verdict::Unchanged, true)
        );
        assert_eq!(
            matched(Equal, Less, false, false, true, false),
            (Verdict::Unchanged, false),
            "the dedup counted it"
        );
    }

    #[test]
    fn a_delete_of_a_live_row_deletes_and_of_a_tombstone_updates_it() {
        assert_eq!(
            matched(Greater, Equal, true, false, false, false).0,
            Verdict::Delete
        );
        assert_eq!(
            matched(Greater, Equal, true, true, false, false).0,
            Verdict::Update
        );
        assert_eq!(
            matched(Greater, Equal, false, true, false, false).0,
            Verdict::Update,
            "a key comes back"
        );
        assert!(stays(true, false) && stays(false, true) && !stays(true, true));
    }

    #[test]
    fn with_partial_updates_the_same_tuple_filled_again_replaces_the_row() {
        assert_eq!(
            matched(Equal, Less, false, false, false, true),
            (Verdict::Update, false)
        );
        assert_eq!(
            matched(Equal, Greater, true, false, false, true),
            (Verdict::Delete, false)
        );
        assert_eq!(
            matched(Equal, Equal, false, false, false, true),
            (Verdict::Unchanged, false),
            "a rerun"
        );
        assert_eq!(
            matched(Less, Greater, false, false, false, true).0,
            Verdict::Unchanged
        );
    }
}
