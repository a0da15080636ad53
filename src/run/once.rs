//! What a one-shot DataFusion partition holds until it is executed: the input stream (and
//! whatever goes with it), taken by the first `execute`; a second one gets a stream holding one
//! error instead of a panic.

use std::sync::Mutex;

use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

/// A value a partition stream hands out once.
#[derive(Debug)]
pub struct Once<T>(Mutex<Option<T>>);

impl<T> Once<T> {
    pub fn new(value: T) -> Self {
        Once(Mutex::new(Some(value)))
    }

    /// The value, the first time; then a stream (in `schema`) whose one item is an error
    /// naming `what`.
    pub fn take(&self, schema: &SchemaRef, what: &str) -> Result<T, SendableRecordBatchStream> {
        match self.0.lock().ok().and_then(|mut g| g.take()) {
            Some(v) => Ok(v),
            None => {
                let err =
                    DataFusionError::Internal(format!("the {what} stream can only be read once"));
                Err(Box::pin(RecordBatchStreamAdapter::new(
                    schema.clone(),
                    futures::stream::once(async move { Err(err) }),
                )))
            }
        }
    }
}
