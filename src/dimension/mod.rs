//! Dimensions: SCD type 2 history from a CDC source.
//!
//! [`history`] is the core every dimension run applies per business key: the fold that defines
//! the table (tracked changes open versions, untracked ones update in place, deletes close).
//! [`fold`] applies it to source rows; this module is the `kind: dimension` pipeline: the keys
//! whose records landed since the previous run are rebuilt from all their records, so a late
//! change lands inside the history where its sequence puts it.
//!
//! plan → read → fold → compare → write (`run.rs`). The plan (`plan.rs`) finds the keys to
//! rebuild: every key of the rows that landed in the source since the version the previous run
//! recorded (read from the log: the files those commits added), or every key (bootstrap,
//! `--full-reload`). The read takes **all** source rows of those keys — a key's history is the
//! fold of everything the source holds for it, so a late or re-delivered record lands where its
//! sequence puts it — rejecting rows without a key or a sequence to the quarantine. The compare
//! checks the fold against the table's rows of those keys; when they differ, the rebuilt keys'
//! rows are replaced in one commit, with the source version recorded in the same commit. A
//! change to the dimension's rules (history, tracked columns) rebuilds every key, with a
//! warning. Sized for dimensions (merchants, customers), not fact tables.

mod compare;
mod counters;
mod error;
pub mod fold;
pub mod history;
mod infer;
mod plan;
mod run;

pub use counters::DimensionCounters;

use chrono::{DateTime, Utc};
use tracing::info;

use crate::config::pipeline::{Dimension, Kind};
use crate::config::Pipeline;
use crate::run::{Attempt, RunError, RunKind, RunOptions, Table};

impl RunKind for Dimension {
    const KIND: Kind = Kind::Dimension;
    type Counters = DimensionCounters;

    fn uris(&self) -> (&str, &str) {
        (&self.source_uri, &self.target_uri)
    }

    fn tables(&self) -> Vec<(Table, &str)> {
        vec![
            (Table::Target, &self.target_uri),
            (Table::Quarantine, &self.quarantine.uri),
        ]
    }

    /// At most one new commit to the table.
    async fn execute(&self, a: &mut Attempt<'_>) -> Result<DimensionCounters, RunError> {
        let (p, opts, now) = (a.p, a.opts, a.now);
        let mut run = Run {
            a,
            p,
            d: self,
            opts,
            now,
            c: DimensionCounters::default(),
            source_table: None,
            relayout: false,
            layout: String::new(),
        };
        run.execute().await?;
        info!(keys_changed = run.c.num_keys_changed, "dimension finished");
        Ok(run.c)
    }
}

/// One attempt of a dimension run: the harness's attempt and what the phases share.
pub(super) struct Run<'r, 'a> {
    pub(super) a: &'r mut Attempt<'a>,
    pub(super) p: &'a Pipeline,
    pub(super) d: &'r Dimension,
    pub(super) opts: &'a RunOptions,
    pub(super) now: DateTime<Utc>,
    pub(super) c: DimensionCounters,
    pub(super) source_table: Option<i64>,
    /// The table's columns or its rules (history, tracked columns) changed since it was
    /// written: every key is rebuilt and the table written again.
    pub(super) relayout: bool,
    /// [`Layout::describe`] of this run, recorded in its commit.
    pub(super) layout: String,
}

pub use error::DimensionError;
