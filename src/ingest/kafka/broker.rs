//! The brokers, behind a small trait ([`Broker`]: partitions, offsets, fetch) so the one case
//! the test broker cannot produce — records deleted before they were read — is tested with a
//! fake ([`Retention`]). The real implementation is rskafka's pure-Rust client; every call is
//! bounded by `kafka.request_timeout` (rskafka itself retries a lost broker forever).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rskafka::client::error::{Error as ClientError, ProtocolError};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::BackoffConfig;
use tracing::debug;

use super::error::KafkaError;
use crate::config::pipeline::kafka::KafkaSource;

/// How long a fetch may wait for records to arrive (ms). A run reads below the high
/// watermarks it planned, so the records are there and Kafka answers at once; the wait only
/// bounds an answer with nothing to give (read again next run). tansu 0.6 waits this long on
/// every fetch, and answers one connection's requests one after another.
const MAX_WAIT_MS: i32 = 10;

/// One record of a partition, as fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, Vec<u8>>,
    pub timestamp: DateTime<Utc>,
}

impl Message {
    /// The bytes it counts against `max_bytes_per_run`.
    pub fn size(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        (self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + headers)
            as u64
    }
}

/// What a fetch gave.
#[derive(Debug)]
pub enum Fetched {
    /// Records from the offset asked (possibly none).
    Records(Vec<Message>),
    /// The offset is outside what the partition holds (deleted by retention meanwhile).
    OutOfRange,
}

/// What tidemark asks of the brokers.
#[async_trait]
pub trait Broker: Send + Sync {
    /// The topic's partitions.
    async fn partitions(&self) -> Result<Vec<i32>, KafkaError>;
    /// The earliest offset a partition holds and its high watermark (the next offset produced).
    async fn bounds(&self, partition: i32) -> Result<(i64, i64), KafkaError>;
    /// The first offset whose record's timestamp is at or after `at` (the high watermark when
    /// none is).
    async fn offset_at(&self, partition: i32, at: DateTime<Utc>) -> Result<i64, KafkaError>;
    /// Records from `offset`, about `max_bytes` of them.
    async fn fetch(
        &self,
        partition: i32,
        offset: i64,
        max_bytes: i32,
    ) -> Result<Fetched, KafkaError>;
}

/// The brokers of `source`, through rskafka.
pub struct Rskafka {
    client: Client,
    topic: String,
    brokers: String,
    timeout: Duration,
    partitions: Mutex<HashMap<i32, Arc<PartitionClient>>>,
}

/// Connects to the brokers of `source` (wrapped in the fake retention under test, see
/// [`Retention`]).
pub async fn connect(source: &KafkaSource) -> Result<Box<dyn Broker>, KafkaError> {
    let brokers = source.brokers.join(",");
    let backoff = BackoffConfig {
        deadline: Some(source.request_timeout),
        ..BackoffConfig::default()
    };
    let build = ClientBuilder::new(source.brokers.clone())
        .client_id("tidemark")
        .backoff_config(backoff)
        .build();
    let client = bounded(&brokers, source.request_timeout, "a connection", build)
        .await?
        .map_err(|e| KafkaError::Unreachable {
            brokers: brokers.clone(),
            reason: e.to_string(),
        })?;
    let real = Rskafka {
        client,
        topic: source.topic.clone(),
        brokers,
        timeout: source.request_timeout,
        partitions: Mutex::new(HashMap::new()),
    };
    Ok(Retention::wrap(Box::new(real)))
}

/// `f`, or [`KafkaError::Timeout`] after `after`.
async fn bounded<T>(
    brokers: &str,
    after: Duration,
    what: &str,
    f: impl std::future::Future<Output = T>,
) -> Result<T, KafkaError> {
    tokio::time::timeout(after, f)
        .await
        .map_err(|_| KafkaError::Timeout {
            brokers: brokers.to_string(),
            what: what.to_string(),
            after: humantime::format_duration(after).to_string(),
        })
}

impl Rskafka {
    async fn partition(&self, partition: i32) -> Result<Arc<PartitionClient>, KafkaError> {
        if let Some(c) = self.cached(partition) {
            return Ok(c);
        }
        let made = bounded(
            &self.brokers,
            self.timeout,
            "a partition's leader lookup",
            self.client
                .partition_client(&self.topic, partition, UnknownTopicHandling::Error),
        )
        .await?
        .map_err(|e| self.failed("leader lookup", partition, e))?;
        let made = Arc::new(made);
        if let Ok(mut m) = self.partitions.lock() {
            m.insert(partition, made.clone());
        }
        Ok(made)
    }

    fn cached(&self, partition: i32) -> Option<Arc<PartitionClient>> {
        self.partitions.lock().ok()?.get(&partition).cloned()
    }

    fn failed(&self, what: &'static str, partition: i32, e: ClientError) -> KafkaError {
        KafkaError::Broker {
            what,
            topic: self.topic.clone(),
            partition,
            reason: e.to_string(),
        }
    }

    async fn offset(&self, partition: i32, at: OffsetAt) -> Result<i64, KafkaError> {
        let c = self.partition(partition).await?;
        bounded(
            &self.brokers,
            self.timeout,
            "an offset lookup",
            c.get_offset(at),
        )
        .await?
        .map_err(|e| self.failed("offset lookup", partition, e))
    }
}

#[async_trait]
impl Broker for Rskafka {
    async fn partitions(&self) -> Result<Vec<i32>, KafkaError> {
        let topics = bounded(
            &self.brokers,
            self.timeout,
            "a metadata request",
            self.client.list_topics(),
        )
        .await?
        .map_err(|e| KafkaError::Unreachable {
            brokers: self.brokers.clone(),
            reason: e.to_string(),
        })?;
        let topic = topics.into_iter().find(|t| t.name == self.topic);
        match topic {
            Some(t) => Ok(t.partitions.into_iter().collect()),
            None => Err(KafkaError::TopicMissing {
                topic: self.topic.clone(),
                brokers: self.brokers.clone(),
            }),
        }
    }

    async fn bounds(&self, partition: i32) -> Result<(i64, i64), KafkaError> {
        let earliest = self.offset(partition, OffsetAt::Earliest).await?;
        let latest = self.offset(partition, OffsetAt::Latest).await?;
        Ok((earliest, latest))
    }

    async fn offset_at(&self, partition: i32, at: DateTime<Utc>) -> Result<i64, KafkaError> {
        match self.offset(partition, OffsetAt::Timestamp(at)).await? {
            o if o >= 0 => Ok(o),
            // (no record at or after `at`: the partition's end)
            _ => self.offset(partition, OffsetAt::Latest).await,
        }
    }

    async fn fetch(
        &self,
        partition: i32,
        offset: i64,
        max_bytes: i32,
    ) -> Result<Fetched, KafkaError> {
        let c = self.partition(partition).await?;
        let started = std::time::Instant::now();
        let got = bounded(
            &self.brokers,
            self.timeout,
            "a fetch",
            c.fetch_records(offset, 1..max_bytes.max(2), MAX_WAIT_MS),
        )
        .await?;
        match got {
            Ok((records, high)) => {
                let got: Vec<Message> = records
                    .into_iter()
                    .map(|r| Message {
                        partition,
                        offset: r.offset,
                        key: r.record.key,
                        value: r.record.value,
                        headers: r.record.headers,
                        timestamp: r.record.timestamp,
                    })
                    .collect();
                debug!(
                    partition,
                    offset,
                    asked = max_bytes,
                    records = got.len(),
                    bytes = got.iter().map(Message::size).sum::<u64>(),
                    high,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "Kafka fetch"
                );
                Ok(Fetched::Records(got))
            }
            Err(ClientError::ServerError {
                protocol_error: ProtocolError::OffsetOutOfRange,
                ..
            }) => Ok(Fetched::OutOfRange),
            Err(e) => Err(self.failed("fetch", partition, e)),
        }
    }
}

/// A fake retention over a real broker: partitions whose records below an offset are treated
/// as deleted (their earliest offset is moved up; fetching below it is out of range).
///
/// The test broker (tansu 0.6, in-memory engine) has no retention and panics on DeleteRecords
/// (see the spike report in the Kafka section of docs/kinds/ingest.md), so the retention-gap
/// path is tested through this fake, armed only in builds with the `failpoints` feature by
/// `TIDEMARK_KAFKA_DELETED_BELOW="<partition>=<offset>[,…]"`.
pub struct Retention {
    inner: Box<dyn Broker>,
    deleted_below: HashMap<i32, i64>,
}

impl Retention {
    /// `inner`, wrapped when the fake is armed.
    pub fn wrap(inner: Box<dyn Broker>) -> Box<dyn Broker> {
        match armed() {
            Some(deleted_below) if !deleted_below.is_empty() => Box::new(Retention {
                inner,
                deleted_below,
            }),
            _ => inner,
        }
    }

    /// `inner` with the records below `deleted_below[partition]` gone.
    #[cfg(test)]
    pub fn new(inner: Box<dyn Broker>, deleted_below: HashMap<i32, i64>) -> Self {
        Retention {
            inner,
            deleted_below,
        }
    }

    fn start(&self, partition: i32) -> i64 {
        self.deleted_below.get(&partition).copied().unwrap_or(0)
    }
}

#[cfg(feature = "failpoints")]
fn armed() -> Option<HashMap<i32, i64>> {
    let spec = std::env::var("TIDEMARK_KAFKA_DELETED_BELOW").ok()?;
    Some(
        spec.split(',')
            .filter_map(|p| {
                let (part, off) = p.split_once('=')?;
                Some((part.trim().parse().ok()?, off.trim().parse().ok()?))
            })
            .collect(),
    )
}

#[cfg(not(feature = "failpoints"))]
fn armed() -> Option<HashMap<i32, i64>> {
    None
}

#[async_trait]
impl Broker for Retention {
    async fn partitions(&self) -> Result<Vec<i32>, KafkaError> {
        self.inner.partitions().await
    }

    async fn bounds(&self, partition: i32) -> Result<(i64, i64), KafkaError> {
        let (earliest, high) = self.inner.bounds(partition).await?;
        Ok((earliest.max(self.start(partition)).min(high), high))
    }

    async fn offset_at(&self, partition: i32, at: DateTime<Utc>) -> Result<i64, KafkaError> {
        let o = self.inner.offset_at(partition, at).await?;
        Ok(o.max(self.start(partition)))
    }

    async fn fetch(
        &self,
        partition: i32,
        offset: i64,
        max_bytes: i32,
    ) -> Result<Fetched, KafkaError> {
        if offset < self.start(partition) {
            return Ok(Fetched::OutOfRange);
        }
        self.inner.fetch(partition, offset, max_bytes).await
    }
}
