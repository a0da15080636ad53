//! A full restatement streams the aggregate into gold's writer instead of collecting it (every
//! day's groups at once would double the run's memory): the stream notes each day's facts for
//! the status table as the batches pass and drops the helper column.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use chrono::NaiveDate;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;

use super::compute::{add_day_facts, without_helper, DayFacts};
use crate::run::once::Once;

/// What passed through the stream.
pub type Seen = Arc<Mutex<BTreeMap<NaiveDate, DayFacts>>>;

/// The grouped stream, observed.
pub struct Observed {
    schema: SchemaRef,
    input: Once<SendableRecordBatchStream>,
    seen: Seen,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("schema", &self.schema)
            .finish()
    }
}

impl Observed {
    /// `input` (the grouped rows, with the helper column) as gold's rows (`schema`).
    pub fn new(schema: SchemaRef, input: SendableRecordBatchStream) -> Self {
        Observed {
            schema,
            input: Once::new(input),
            seen: Arc::default(),
        }
    }

    pub fn seen(&self) -> Seen {
        self.seen.clone()
    }

    pub fn schema_ref(&self) -> SchemaRef {
        self.schema.clone()
    }
}

impl PartitionStream for Observed {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let input = match self.input.take(&schema, "aggregate") {
            Ok(input) => input,
            Err(failed) => return failed,
        };
        let seen = self.seen.clone();
        let stream = input.map(move |batch| {
            let batch = batch?;
            let mut days = seen
                .lock()
                .map_err(|_| DataFusionError::Internal("day facts poisoned".into()))?;
            add_day_facts(&mut days, std::slice::from_ref(&batch))?;
            Ok(without_helper(&batch)?)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}
