//! What can stop a Kafka ingest, beyond what every ingest shares.

use crate::error::{Classify, ErrorClass};

/// Why a Kafka ingest stopped. Nothing was committed to bronze when a run returns one.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// No broker of `kafka.brokers` answered.
    #[error("cannot reach the Kafka brokers {brokers}: {reason}. Check `kafka.brokers` and that the brokers run and accept connections from this host, then rerun; nothing was written")]
    Unreachable { brokers: String, reason: String },
    /// A broker request did not finish within `kafka.request_timeout`.
    #[error("the Kafka brokers {brokers} did not answer {what} within {after}: they are overloaded, unreachable, or `kafka.request_timeout` is too short. Rerun; nothing was written")]
    Timeout {
        brokers: String,
        what: String,
        after: String,
    },
    /// The topic is not in the brokers' metadata.
    #[error("the Kafka topic `{topic}` does not exist on {brokers}: create it (tidemark does not create topics) or fix `kafka.topic`; nothing was written")]
    TopicMissing { topic: String, brokers: String },
    /// A broker answered a request with an error.
    #[error("Kafka {what} on topic `{topic}` partition {partition} failed: {reason}. Rerun; nothing was written")]
    Broker {
        what: &'static str,
        topic: String,
        partition: i32,
        reason: String,
    },
    /// Records this pipeline never read were deleted from the topic (retention).
    #[error("records this pipeline never read are gone from Kafka topic `{topic}` partition {partition}: offsets {from} to {to} were deleted (retention, or DeleteRecords) before they were ingested; nothing was written. Recover them from elsewhere if they matter, then set `kafka.on_data_loss: continue` in {pipeline} for one run to go on from offset {earliest} (the loss is then reported as a warning and counted)")]
    DataLoss {
        topic: String,
        partition: i32,
        from: i64,
        to: i64,
        earliest: i64,
        pipeline: String,
    },
    /// Bronze records a position past the end of the partition (the topic was recreated).
    #[error("bronze records Kafka topic `{topic}` partition {partition} as read up to offset {recorded}, but the partition ends at {high}: the topic was deleted and created again (or the brokers are another cluster). Nothing was written. Point the pipeline at a new bronze table (or rebuild it) to read the topic from its start")]
    AheadOfTopic {
        topic: String,
        partition: i32,
        recorded: i64,
        high: i64,
    },
    /// `--full-reload` (and `reconcile`, which is a dry full reload) of a Kafka ingest.
    #[error("{pipeline} reads a Kafka topic: `--full-reload` (and `reconcile`, which compares bronze with a full reload) would need the whole topic again, which the brokers may no longer hold, so it is not supported. To rebuild bronze from the topic, point `target.uri` at a new table and run the pipeline (it starts where `kafka.start` says); nothing was written")]
    NoFullReload { pipeline: String },
    /// A Debezium truncate event.
    #[error("the message at offset {offset} of Kafka topic `{topic}` partition {partition} is a Debezium truncate event (`op: t`): the source table was emptied, which tidemark cannot apply as row changes. Nothing was written and the offsets stay where they were; decide what the truncate means (rebuild bronze and silver from a reload with `--full-reload`, or move the pipeline past it), then rerun")]
    Truncate {
        topic: String,
        partition: i32,
        offset: i64,
    },
}

impl Classify for KafkaError {
    fn class(&self) -> ErrorClass {
        match self {
            KafkaError::Unreachable { .. }
            | KafkaError::Timeout { .. }
            | KafkaError::Broker { .. } => ErrorClass::Retryable,
            KafkaError::TopicMissing { .. } => ErrorClass::Unavailable,
            KafkaError::NoFullReload { .. } => ErrorClass::Usage,
            KafkaError::DataLoss { .. }
            | KafkaError::AheadOfTopic { .. }
            | KafkaError::Truncate { .. } => ErrorClass::BadData,
        }
    }
}

impl From<KafkaError> for crate::run::RunError {
    fn from(e: KafkaError) -> Self {
        crate::run::RunError::kind(e)
    }
}
