//! The change data feed of a copy-on-write run (Delta protocol, "Change Data Files"): the rows
//! that changed, each with its `_change_type`, written to one file under `_change_data/` and
//! committed as a `cdc` action beside the run's removes and adds.
//!
//! The feed describes the *live* table: a key's tombstone (soft delete) is a `delete` of its
//! last live row, a live version arriving for a tombstoned key is an `insert`, and a tombstone
//! replaced by a newer tombstone is no change at all. A commit that has `cdc` actions is read
//! from them alone, so a run whose rewrite changes no live row still writes one (empty) file:
//! without it a reader would take every row of the rewritten files as deleted and inserted.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::kernel::AddCDCFile;

use crate::lake::datafile::FastPath;
use crate::lake::storage::cast_to;
pub(super) use crate::merge::feed::Change;
use crate::run::{Phase, RunError};

/// Where the rows of a feed batch come from: a target row or a winner, and their change.
#[derive(Default)]
pub(super) struct FeedRows {
    picks: Vec<(usize, usize)>,
    types: Vec<&'static str>,
}

impl FeedRows {
    pub(super) fn target(&mut self, row: usize, change: Change) {
        self.picks.push((0, row));
        self.types.push(change.name());
    }

    pub(super) fn winner(&mut self, i: usize, change: Change) {
        self.picks.push((1, i));
        self.types.push(change.name());
    }

    pub(super) fn push(&mut self, change: Change, from_winner: bool, row: usize, i: usize) {
        if from_winner {
            self.winner(i, change)
        } else {
            self.target(row, change)
        }
    }

    /// The rows, in the table's `schema` plus `_change_type`; `target` and `winners` in the
    /// canonical row.
    pub(super) fn batch(
        &self,
        target: &RecordBatch,
        winners: &RecordBatch,
        schema: &SchemaRef,
    ) -> Result<Option<RecordBatch>, RunError> {
        if self.picks.is_empty() {
            return Ok(None);
        }
        let a = |e| RunError::arrow(Phase::Compare)(e);
        let target = cast_to(target, schema).map_err(a)?;
        let winners = cast_to(winners, schema).map_err(a)?;
        let mut columns = (0..schema.fields().len())
            .map(|c| {
                let sources: [&dyn Array; 2] =
                    [target.column(c).as_ref(), winners.column(c).as_ref()];
                arrow::compute::interleave(&sources, &self.picks)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(a)?;
        columns.push(Arc::new(StringArray::from(self.types.clone())) as ArrayRef);
        RecordBatch::try_new(feed_schema(schema), columns)
            .map(Some)
            .map_err(a)
    }
}

/// The table's columns and `_change_type`.
pub(super) fn feed_schema(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        crate::merge::feed::CHANGE_TYPE,
        DataType::Utf8,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// Writes `batches` (possibly none: an empty file) as one change data file and returns its
/// `cdc` action.
pub(super) async fn put(
    fast: &FastPath,
    uri: &str,
    batches: &[RecordBatch],
) -> Result<AddCDCFile, RunError> {
    use crate::merge::feed::{write_change_file, ChangeFileError};
    let (path, size) = write_change_file(
        &fast.store,
        "_change_data",
        feed_schema(&fast.schema),
        batches,
    )
    .await
    .map_err(|e| match e {
        ChangeFileError::Parquet(e) => RunError::delta(Phase::Compare, uri)(e.into()),
        ChangeFileError::Store(e) => RunError::write(Phase::Compare, uri)(e.into()),
    })?;
    Ok(AddCDCFile {
        path,
        size: size as i64,
        partition_values: Default::default(),
        data_change: false,
        tags: None,
    })
}
