//! Rows no day or window can count (seed 003's edge case): a row whose event time is null
//! belongs to no day. Rather than drop it silently, each run stores such rows of the source in
//! the pipeline's quarantine table with the reason (each row once: a rerun adds none), counts
//! them in the summary, and warns; `quarantine.max_rows` / `max_fraction` stop the run before
//! any commit when there are too many.

use datafusion::logical_expr::lit;
use datafusion::prelude::{ident, DataFrame};

use super::{compute, Run};
use crate::run::quarantine::REASON_COLUMN;
use crate::run::{Phase, RunError};

impl Run<'_, '_> {
    /// Quarantines the counted rows of `df` (the source with its lookups) that have no event
    /// time. `count_read`: count the rows the limits compare with first (a full reload has
    /// not read them yet).
    pub(super) async fn quarantine_unplaced(
        &mut self,
        df: &DataFrame,
        count_read: bool,
    ) -> Result<(), RunError> {
        let spec = self.spec;
        let q = |e| RunError::query(Phase::Quarantine)(e);
        let counted = compute::counted(self.p, spec, df.clone())?;
        let reason = format!(
            "`{}` is null: the row has no event time, so no day or window counts it",
            spec.event_date
        );
        let rows = counted
            .clone()
            .filter(ident(&spec.event_date).is_null())
            .and_then(|df| df.with_column(REASON_COLUMN, lit(reason)))
            .map_err(q)?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Quarantine, &spec.source_uri))?;
        let limited = spec.quarantine.max_rows.is_some() || spec.quarantine.max_fraction.is_some();
        if count_read && limited && rows.iter().any(|b| b.num_rows() > 0) {
            let n = counted.count().await.map_err(q)?;
            self.a.summary.num_source_rows_read = n as u64;
        }
        self.a.quarantine(&spec.quarantine, rows).await
    }
}
