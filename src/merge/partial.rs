//! Partial updates in the hourly merge ([`crate::keyed::partial`] has the definition).
//!
//! The dedup fills each winner from the older rows of its key the run read. The run reads
//! every source row with a sequence after `lo` (the overlap slice), so for a key whose rows all
//! lie there, what the slice does not carry was carried — if at all — before `lo`, and the
//! target's row holds it: the fold of everything older. Two cases break that, and are handled
//! here:
//! - a row landed late, behind `lo`: the target's values may come from rows older *or newer*
//!   than it, which the row alone cannot tell, so the run reads the key's whole history from
//!   the source ([`Run::read_histories`]) — late rows are rare, and only their keys are read;
//! - the winner is a delete, or a delete passed: nothing before it counts (the dedup stops).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use datafusion::common::JoinType;
use datafusion::logical_expr::{lit, Expr};
use datafusion::prelude::{ident, DataFrame};
use deltalake::DeltaTable;

use super::*;
use crate::keyed::dedup::RowEncoders;
use crate::keyed::partial;
use crate::lake::storage::cast_to;

/// Which keys' whole history the run read (the target fills none of their columns).
#[derive(Debug, Default)]
pub(super) enum Complete {
    /// Only the slice and the late rows: the target fills every open column.
    #[default]
    None,
    /// These keys (encoded): their late rows brought their history.
    Keys(HashSet<Box<[u8]>>),
    /// The run read the whole source.
    All,
}

impl Run<'_, '_> {
    /// With partial updates, every row behind `lo` of the keys that had a late row (the source
    /// rows behind it, in files other than those landed since the previous run, which the
    /// landed read already holds), flagged not late.
    pub(super) async fn read_histories(
        &mut self,
        input: DataFrame,
        source: &DeltaTable,
        landed: &[deltalake::kernel::Add],
        behind: Expr,
        roles: &ColumnRoles,
    ) -> Result<(DataFrame, Complete), RunError> {
        let q = RunError::query;
        let keys: Vec<Expr> = roles.keys.iter().map(ident).collect();
        let late_keys = input
            .clone()
            .filter(ident(LATE_COLUMN))
            .and_then(|df| df.select(keys))
            .and_then(|df| df.distinct())
            .map_err(q(Phase::Read))?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Read, &self.m.source_uri))?;
        if late_keys.iter().all(|b| b.num_rows() == 0) {
            return Ok((input, Complete::Keys(HashSet::new())));
        }
        let complete = encoded_keys(roles, &late_keys)?;
        let landed: HashSet<&str> = landed.iter().map(|a| a.path.as_str()).collect();
        #[allow(deprecated)] // the log's own `add`, to select the file
        let older: Vec<deltalake::kernel::Add> = source
            .snapshot()
            .map_err(RunError::delta(Phase::Read, &self.m.source_uri))?
            .log_data()
            .iter()
            .filter(|f| !landed.contains(f.path().as_ref()))
            .map(|f| f.add_action())
            .collect();
        let provider = source
            .table_provider()
            .with_file_selection(deltalake::delta_datafusion::FileSelection::from_adds(older))
            .await
            .map_err(q(Phase::Read))?;
        let cols: Vec<&str> = roles.keys.iter().map(String::as_str).collect();
        let wanted = self.a.ctx.read_batches(late_keys).map_err(q(Phase::Read))?;
        let history = self
            .a
            .ctx
            .read_table(provider)
            .and_then(|df| df.filter(behind))
            .and_then(|df| df.join(wanted, JoinType::LeftSemi, &cols, &cols, None))
            .and_then(|df| df.with_column(LATE_COLUMN, lit(false)))
            .map_err(q(Phase::Read))?;
        let input = input.union(history).map_err(q(Phase::Read))?;
        Ok((input, Complete::Keys(complete)))
    }

    /// The winners whose partial columns no row read carried, filled from the target's row
    /// (unless their history was read whole, or the target's row is a tombstone).
    pub(super) async fn fill_from_target(
        &mut self,
        target: &DeltaTable,
        roles: &ColumnRoles,
        winners: RecordBatch,
        open: &HashMap<Box<[u8]>, Vec<usize>>,
        complete: &Complete,
    ) -> Result<RecordBatch, RunError> {
        let a = RunError::arrow;
        let Some(carrier) = &roles.partial else {
            return Ok(winners);
        };
        let skip = |k: &[u8]| match complete {
            Complete::All => true,
            Complete::Keys(keys) => keys.contains(k),
            Complete::None => false,
        };
        let enc = RowEncoders::new(roles).map_err(a(Phase::Compare))?;
        let e = enc.encode_order(&winners).map_err(a(Phase::Compare))?;
        let mut needy: HashMap<Box<[u8]>, usize> = HashMap::new();
        for i in 0..winners.num_rows() {
            let k = e.keys.row(i);
            if open.contains_key(k.as_ref()) && !skip(k.as_ref()) {
                needy.insert(k.as_ref().into(), i);
            }
        }
        if needy.is_empty() {
            return Ok(winners);
        }
        let idx = arrow::array::UInt32Array::from_iter_values(needy.values().map(|&i| i as u32));
        let rows = arrow::compute::take_record_batch(&winners, &idx).map_err(a(Phase::Compare))?;
        let held = changes::matching_rows(&self.a.ctx, target, roles, &rows).await?;
        let mut pieces = vec![winners.clone()];
        let mut picks: Vec<(usize, usize)> = (0..winners.num_rows()).map(|i| (0, i)).collect();
        for batch in held {
            let batch = cast_to(&batch, &roles.canonical).map_err(a(Phase::Compare))?;
            let t = enc.encode_order(&batch).map_err(a(Phase::Compare))?;
            for j in 0..batch.num_rows() {
                let key = t.keys.row(j);
                let (Some(&i), Some(cols)) = (needy.get(key.as_ref()), open.get(key.as_ref()))
                else {
                    continue;
                };
                if t.is_deleted(j) {
                    continue;
                }
                let row = partial::own_row(&winners, i);
                let filled = partial::fill_from(carrier, &row, cols, &batch, j)
                    .map_err(a(Phase::Compare))?;
                pieces.push(filled);
                picks[i] = (pieces.len() - 1, 0);
            }
        }
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        arrow::compute::interleave_record_batch(&refs, &picks).map_err(a(Phase::Compare))
    }
}

/// Key rows (the key columns only, in key order) encoded as the dedup encodes them.
fn encoded_keys(
    roles: &ColumnRoles,
    batches: &[RecordBatch],
) -> Result<HashSet<Box<[u8]>>, RunError> {
    let a = RunError::arrow;
    let enc = RowEncoders::new(roles).map_err(a(Phase::Read))?;
    let mut out = HashSet::new();
    for b in batches {
        let cols: Vec<Arc<dyn Array>> = roles
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let ty = roles.canonical.field_with_name(k)?.data_type().clone();
                arrow::compute::cast(b.column(i), &ty)
            })
            .collect::<Result<_, _>>()
            .map_err(a(Phase::Read))?;
        let rows = enc.encode_keys(&cols).map_err(a(Phase::Read))?;
        out.extend(rows.iter().map(|r| Box::<[u8]>::from(r.as_ref())));
    }
    Ok(out)
}
