//! Where each partition is read from: the next offsets bronze's log records, the brokers'
//! bounds, `kafka.start` for a topic never read, and the retention gap when records this
//! pipeline never saw are gone.

use std::collections::BTreeMap;

use deltalake::DeltaTable;

use super::broker::Broker;
use super::error::KafkaError;
use crate::config::pipeline::kafka::{DataLoss, KafkaSource, Start};
use crate::lake;
use crate::run::{Phase, RunError};

/// The `txn` app id of a partition's next offset in bronze.
pub fn partition_app(pipeline: &str, topic: &str, partition: i32) -> String {
    format!("tidemark/{pipeline}/kafka/{topic}/{partition}")
}

/// What bronze's log says of this pipeline and topic.
#[derive(Debug, Default)]
pub struct Recorded {
    /// The newest run number (`tidemark/<pipeline>/ingest`) and its `_ingested_at` (ms).
    pub run: Option<i64>,
    pub last_ms: Option<i64>,
    /// Each partition's next offset.
    pub next: BTreeMap<i32, i64>,
}

/// Reads the run number and the partitions' next offsets from bronze's log.
pub async fn recorded(
    bronze: Option<&DeltaTable>,
    uri: &str,
    pipeline: &str,
    topic: &str,
) -> Result<Recorded, RunError> {
    let Some(bronze) = bronze else {
        return Ok(Recorded::default());
    };
    let txns = lake::txns::with_prefix(bronze, &format!("tidemark/{pipeline}/"))
        .await
        .map_err(RunError::delta(Phase::Plan, uri))?;
    let prefix = format!("kafka/{topic}/");
    let next = txns
        .iter()
        .filter_map(|(k, t)| Some((k.strip_prefix(&prefix)?.parse().ok()?, t.version)))
        .collect();
    let run = txns.get("ingest");
    Ok(Recorded {
        run: run.map(|t| t.version),
        last_ms: run.and_then(|t| t.last_updated),
        next,
    })
}

/// Where a partition is read from this run, and up to where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    pub from: i64,
    /// The high watermark when planned: the run reads below it.
    pub high: i64,
}

/// Offsets of a partition that were deleted before this pipeline read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
}

impl Lost {
    pub fn count(&self) -> u64 {
        (self.to - self.from + 1).max(0) as u64
    }
}

/// Each partition's position: the recorded next offset; for a partition not recorded, the
/// earliest offset when this topic was read before (a partition added since), else `start`.
/// A recorded offset below the earliest the broker holds is a gap: an error unless
/// `on_data_loss: continue` (then it is returned, and reading starts at the earliest).
pub async fn plan(
    broker: &dyn Broker,
    source: &KafkaSource,
    rec: &Recorded,
    pipeline_path: &str,
) -> Result<(Vec<Position>, Vec<Lost>), KafkaError> {
    let mut positions = Vec::new();
    let mut lost = Vec::new();
    let mut partitions = broker.partitions().await?;
    partitions.sort_unstable();
    for partition in partitions {
        let (earliest, high) = broker.bounds(partition).await?;
        let from = match rec.next.get(&partition) {
            Some(&next) if next > high => {
                return Err(KafkaError::AheadOfTopic {
                    topic: source.topic.clone(),
                    partition,
                    recorded: next,
                    high,
                })
            }
            Some(&next) if next < earliest => {
                let gap = Lost {
                    partition,
                    from: next,
                    to: earliest - 1,
                };
                gap_allowed(source, gap, earliest, pipeline_path)?;
                lost.push(gap);
                earliest
            }
            Some(&next) => next,
            None if !rec.next.is_empty() => earliest,
            None => match source.start {
                Start::Earliest => earliest,
                Start::Latest => high,
                Start::At(at) => broker.offset_at(partition, at).await?.clamp(earliest, high),
            },
        };
        positions.push(Position {
            partition,
            from,
            high,
        });
    }
    Ok((positions, lost))
}

/// `Ok` when `on_data_loss: continue`; the error naming the gap otherwise.
pub fn gap_allowed(
    source: &KafkaSource,
    gap: Lost,
    earliest: i64,
    pipeline_path: &str,
) -> Result<(), KafkaError> {
    match source.on_data_loss {
        DataLoss::Continue => Ok(()),
        DataLoss::Fail => Err(KafkaError::DataLoss {
            topic: source.topic.clone(),
            partition: gap.partition,
            from: gap.from,
            to: gap.to,
            earliest,
            pipeline: pipeline_path.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    //! The retention gap, against a fake broker: the test broker (tansu) cannot delete records.
    use std::collections::HashMap;

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};

    use super::super::broker::{Fetched, Message, Retention};
    use super::*;
    use crate::config::pipeline::kafka::DEFAULT_REQUEST_TIMEOUT;

    /// Partitions holding offsets 0..end each.
    struct Fake(BTreeMap<i32, i64>);

    #[async_trait]
    impl Broker for Fake {
        async fn partitions(&self) -> Result<Vec<i32>, KafkaError> {
            Ok(self.0.keys().copied().collect())
        }
        async fn bounds(&self, p: i32) -> Result<(i64, i64), KafkaError> {
            Ok((0, self.0.get(&p).copied().unwrap_or(0)))
        }
        async fn offset_at(&self, _: i32, _: DateTime<Utc>) -> Result<i64, KafkaError> {
            Ok(0)
        }
        async fn fetch(&self, p: i32, offset: i64, _: i32) -> Result<Fetched, KafkaError> {
            let end = self.0.get(&p).copied().unwrap_or(0);
            Ok(Fetched::Records(
                (offset..end)
                    .map(|o| Message {
                        partition: p,
                        offset: o,
                        key: None,
                        value: Some(b"{}".to_vec()),
                        headers: Default::default(),
                        timestamp: Utc::now(),
                    })
                    .collect(),
            ))
        }
    }

    fn source(on_data_loss: DataLoss) -> KafkaSource {
        KafkaSource {
            brokers: vec!["fake:9092".into()],
            topic: "payments".into(),
            start: Start::Earliest,
            max_records_per_run: None,
            max_bytes_per_run: None,
            on_data_loss,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    #[tokio::test]
    async fn a_retention_gap_fails_or_is_skipped_and_counted() {
        let broker = Retention::new(
            Box::new(Fake(BTreeMap::from([(0, 10), (1, 10)]))),
            HashMap::from([(1, 7)]),
        );
        let rec = Recorded {
            run: Some(1),
            last_ms: None,
            next: BTreeMap::from([(0, 4), (1, 3)]),
        };
        let e = plan(&broker, &source(DataLoss::Fail), &rec, "p.yml")
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                KafkaError::DataLoss {
                    partition: 1,
                    from: 3,
                    to: 6,
                    earliest: 7,
                    ..
                }
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("`payments` partition 1: offsets 3 to 6"),
            "{text}"
        );
        let (pos, lost) = plan(&broker, &source(DataLoss::Continue), &rec, "p.yml")
            .await
            .unwrap();
        assert_eq!(
            lost,
            vec![Lost {
                partition: 1,
                from: 3,
                to: 6
            }]
        );
        assert_eq!(lost[0].count(), 4);
        assert_eq!(
            pos.iter()
                .map(|p| (p.partition, p.from, p.high))
                .collect::<Vec<_>>(),
            vec![(0, 4, 10), (1, 7, 10)]
        );
    }

    /// rskafka has no CreatePartitions request, so a partition added between runs is tested
    /// here: it starts at its earliest offset, whatever `start` says (that is for a topic's
    /// first run).
    #[tokio::test]
    async fn a_partition_added_since_the_last_run_starts_at_its_earliest() {
        let broker = Fake(BTreeMap::from([(0, 5), (1, 5), (2, 3)]));
        let mut src = source(DataLoss::Fail);
        src.start = Start::Latest;
        let rec = Recorded {
            run: Some(2),
            last_ms: None,
            next: BTreeMap::from([(0, 5), (1, 4)]),
        };
        let (pos, lost) = plan(&broker, &src, &rec, "p.yml").await.unwrap();
        assert!(lost.is_empty());
        let from: Vec<(i32, i64)> = pos.iter().map(|p| (p.partition, p.from)).collect();
        assert_eq!(from, vec![(0, 5), (1, 4), (2, 0)]);
        let first = plan(&broker, &src, &Recorded::default(), "p.yml")
            .await
            .unwrap();
        let from: Vec<i64> = first.0.iter().map(|p| p.from).collect();
        assert_eq!(from, vec![5, 5, 3], "start: latest on the first run");
    }

    #[tokio::test]
    async fn records_deleted_while_reading_are_a_gap_too() {
        let src = source(DataLoss::Continue);
        let inner = Retention::new(Box::new(Fake(BTreeMap::from([(0, 10)]))), HashMap::new());
        let planned = [Position {
            partition: 0,
            from: 2,
            high: 10,
        }];
        // deleted after planning: the fetch at 2 is out of range, the earliest is now 5
        let broker = Retention::new(Box::new(inner), HashMap::from([(0, 5)]));
        let got = super::super::read::read(&broker, &src, &planned, "p.yml")
            .await
            .unwrap();
        assert_eq!(
            got.lost,
            vec![Lost {
                partition: 0,
                from: 2,
                to: 4
            }]
        );
        assert_eq!(got.messages.first().map(|m| m.offset), Some(5));
        assert_eq!(got.next.get(&0), Some(&10));
        let e = super::super::read::read(&broker, &source(DataLoss::Fail), &planned, "p.yml")
            .await
            .unwrap_err();
        assert!(
            matches!(e, KafkaError::DataLoss { from: 2, to: 4, .. }),
            "{e}"
        );
    }
}
