//! What a `dimension` counts, and how its counters read in the summary, the facts and the ledger.

use serde::Serialize;

use crate::report::{CounterText, LedgerCounts, RunSummary};

/// What a `dimension` run counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DimensionCounters {
    /// The source version the previous run read (the rows landed since it name the keys).
    pub previous_source_version: Option<u64>,
    /// Business keys whose rows landed since then (all keys on a full reload): rebuilt.
    pub num_keys_read: u64,
    /// Of those, keys whose rows in the table changed.
    pub num_keys_changed: u64,
    /// Versions (SCD2) or rows (SCD1) of the changed keys before and after the run.
    pub num_rows_before: u64,
    pub num_rows_after: u64,
    /// Change records folded into the existing version in place (a change to untracked
    /// columns only, SCD2).
    pub num_updated_in_place: u64,
    /// Rows of the whole table after the run.
    pub num_rows_total: u64,
    /// Inferred members (`infer_from`): placeholders written by this run for keys the facts
    /// name first, placeholders completed by their first record, placeholders still pending,
    /// and of those the ones older than `alert_after`.
    pub num_inferred_new: u64,
    pub num_inferred_completed: u64,
    pub num_inferred_pending: u64,
    pub num_inferred_overdue: u64,
    /// Rows marked deleted in deletion vectors (`target.apply: deletion_vectors`): the rebuilt
    /// keys' rows replaced, none of the other rows of their files written.
    pub num_rows_marked_deleted: u64,
    /// Files whose deletion vector grew.
    pub num_files_marked: u64,
    /// The first changed keys by name, in key order (`reconcile` lists them; not in the
    /// summary or the facts).
    #[serde(skip)]
    pub changed_keys: Vec<String>,
}

impl DimensionCounters {
    /// The keys the run rebuilt, from where they came, and how many changed: `N read` from the
    /// source, `+ M inferred` (placeholders new in this run, named by the facts first), `K
    /// changed` (of those, the keys whose rows differ now).
    fn keys_text(&self) -> String {
        let inferred = match self.num_inferred_new {
            0 => String::new(),
            n => format!(" + {n} inferred"),
        };
        format!(
            "{} read{inferred}, {} changed",
            self.num_keys_read, self.num_keys_changed
        )
    }
}

impl CounterText for DimensionCounters {
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)> {
        let c = self;
        vec![
            (
                "source version",
                s.source_version_text(c.previous_source_version.map(|v| v.to_string())),
            ),
            ("rows read", s.num_source_rows_read.to_string()),
            ("quarantined", s.quarantined_text()),
            ("keys", c.keys_text()),
            (
                "their rows",
                format!("{} before -> {} after", c.num_rows_before, c.num_rows_after),
            ),
            ("updated in place", c.num_updated_in_place.to_string()),
            (
                "inferred members",
                format!(
                    "{} new, {} completed, {} pending ({} past alert_after)",
                    c.num_inferred_new,
                    c.num_inferred_completed,
                    c.num_inferred_pending,
                    c.num_inferred_overdue
                ),
            ),
            ("table rows", c.num_rows_total.to_string()),
            ("files added/removed", s.files_text()),
        ]
    }

    /// The changed keys' rows: those written replace those before.
    fn ledger(&self) -> LedgerCounts {
        LedgerCounts {
            inserted: Some(self.num_rows_after),
            deleted: Some(self.num_rows_before),
            updated: Some(self.num_keys_changed),
            ..LedgerCounts::default()
        }
    }
}
