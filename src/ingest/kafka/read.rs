//! Fetching each partition from its position up to the high watermark seen when planning,
//! within the run's bounds (`max_records_per_run`, `max_bytes_per_run`): the partitions' answers
//! are applied in turns, one answer each, so a backlog on one does not starve the others, while
//! every partition's fetches run ahead on their own ([`super::lanes`]).

use std::collections::BTreeMap;

use super::broker::{Broker, Fetched, Message};
use super::error::KafkaError;
use super::lanes::{Lanes, AHEAD};
use super::positions::{gap_allowed, Lost, Position};
use crate::config::pipeline::kafka::KafkaSource;

/// Bytes asked per fetch (less with a byte bound, see [`ask`]). Brokers cap it (Kafka:
/// `fetch.max.bytes`, 50 MiB by default; tansu: 5 MiB): a larger answer is fewer round trips,
/// and against tansu fewer listings of the whole partition (each fetch lists it).
const FETCH_BYTES: u64 = 8 << 20;

/// What the read gave.
#[derive(Debug, Default)]
pub struct Fetch {
    /// In fetch order: per partition, by offset.
    pub messages: Vec<Message>,
    /// Each partition's next offset after this run.
    pub next: BTreeMap<i32, i64>,
    pub bytes: u64,
    /// Records below the planned high watermarks left for the next run.
    pub pending: u64,
    /// Gaps met while reading (records deleted after planning), with `on_data_loss: continue`.
    pub lost: Vec<Lost>,
    /// Partitions that returned nothing below their high watermark (read again next run).
    pub stalled: Vec<i32>,
}

/// The run's remaining bounds.
struct Budget {
    records: Option<u64>,
    bytes: Option<u64>,
}

impl Budget {
    fn exhausted(&self) -> bool {
        self.records == Some(0) || self.bytes == Some(0)
    }

    /// Whether `m` fits; the first record of a run always does (a record larger than the byte
    /// bound would otherwise stop the pipeline for good).
    fn take(&mut self, m: &Message, first: bool) -> bool {
        let size = m.size();
        let fits = self.records.is_none_or(|r| r > 0) && self.bytes.is_none_or(|b| b >= size);
        if !(fits || first && self.records.is_none_or(|r| r > 0)) {
            self.bytes = self.bytes.map(|_| 0);
            return false;
        }
        self.records = self.records.map(|r| r - 1);
        self.bytes = self.bytes.map(|b| b.saturating_sub(size));
        true
    }
}

/// Reads every partition from its position, within the bounds of `source`.
pub async fn read(
    broker: &dyn Broker,
    source: &KafkaSource,
    positions: &[Position],
    pipeline_path: &str,
) -> Result<Fetch, KafkaError> {
    let mut out = Fetch {
        next: positions.iter().map(|p| (p.partition, p.from)).collect(),
        ..Fetch::default()
    };
    let mut budget = Budget {
        records: source.max_records_per_run,
        bytes: source.max_bytes_per_run,
    };
    let active: Vec<Position> = positions
        .iter()
        .filter(|p| p.from < p.high)
        .copied()
        .collect();
    let mut lanes = Lanes::start(broker, &active, ask(source, active.len()));
    let mut turn: Vec<usize> = (0..active.len()).collect();
    while !turn.is_empty() && !budget.exhausted() {
        // Each partition's answers in turn, in partition order, so the bounds cut the same
        // records whatever answers first; the fetches themselves run ahead (see `lanes`).
        let mut still = Vec::with_capacity(turn.len());
        for i in turn {
            if budget.exhausted() {
                break;
            }
            let Some(fetched) = lanes.next(i).await? else {
                continue;
            };
            let p = active[i];
            if apply(
                broker,
                source,
                p,
                fetched,
                &mut out,
                &mut budget,
                pipeline_path,
            )
            .await?
            {
                lanes.resume(i, out.next.get(&p.partition).copied().unwrap_or(p.from));
                still.push(i);
            }
        }
        turn = still;
    }
    out.pending = positions
        .iter()
        .map(|p| (p.high - out.next.get(&p.partition).copied().unwrap_or(p.from)).max(0) as u64)
        .sum();
    Ok(out)
}

/// Bytes asked per fetch: [`FETCH_BYTES`], or with a byte bound its share of it (every
/// partition may have [`AHEAD`] answers not yet applied, which the bound then also caps).
fn ask(source: &KafkaSource, partitions: usize) -> i32 {
    let ahead = (partitions.max(1) * AHEAD) as u64;
    let bytes = source
        .max_bytes_per_run
        .map_or(FETCH_BYTES, |b| (b / ahead).clamp(1, FETCH_BYTES));
    i32::try_from(bytes).unwrap_or(i32::MAX)
}

/// What one fetch of partition `p` from its next offset gave, taken within the bounds; `true`
/// while it has more to read.
async fn apply(
    broker: &dyn Broker,
    source: &KafkaSource,
    p: Position,
    fetched: Fetched,
    out: &mut Fetch,
    budget: &mut Budget,
    pipeline_path: &str,
) -> Result<bool, KafkaError> {
    let from = out.next.get(&p.partition).copied().unwrap_or(p.from);
    let records = match fetched {
        Fetched::Records(records) => records,
        Fetched::OutOfRange => {
            let (earliest, _) = broker.bounds(p.partition).await?;
            if earliest <= from {
                return Err(KafkaError::Broker {
                    what: "fetch",
                    topic: source.topic.clone(),
                    partition: p.partition,
                    reason: format!("offset {from} is out of range, though the partition holds offsets from {earliest}"),
                });
            }
            let gap = Lost {
                partition: p.partition,
                from,
                to: earliest - 1,
            };
            gap_allowed(source, gap, earliest, pipeline_path)?;
            out.lost.push(gap);
            out.next.insert(p.partition, earliest);
            return Ok(earliest < p.high);
        }
    };
    let mut next = from;
    for m in records {
        if m.offset < next || m.offset >= p.high {
            continue;
        }
        if !budget.take(&m, out.messages.is_empty()) {
            break;
        }
        next = m.offset + 1;
        out.bytes += m.size();
        out.messages.push(m);
    }
    if next == from {
        if !budget.exhausted() {
            out.stalled.push(p.partition);
        }
        return Ok(false);
    }
    out.next.insert(p.partition, next);
    Ok(next < p.high)
}

#[cfg(test)]
mod tests {
    //! The pipelined read against a fake broker whose partitions answer at different speeds.
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::config::pipeline::kafka::{DataLoss, Start, DEFAULT_REQUEST_TIMEOUT};

    /// Partitions holding offsets 0..end, answering `chunk` records per fetch after
    /// `delay_ms[partition]`; counts the records it sent.
    struct Slow {
        end: i64,
        chunk: i64,
        delay_ms: [u64; 3],
        sent: AtomicU64,
    }

    #[async_trait]
    impl Broker for Slow {
        async fn partitions(&self) -> Result<Vec<i32>, KafkaError> {
            Ok(vec![0, 1, 2])
        }
        async fn bounds(&self, _: i32) -> Result<(i64, i64), KafkaError> {
            Ok((0, self.end))
        }
        async fn offset_at(&self, _: i32, _: DateTime<Utc>) -> Result<i64, KafkaError> {
            Ok(0)
        }
        async fn fetch(&self, p: i32, offset: i64, _: i32) -> Result<Fetched, KafkaError> {
            let delay = self.delay_ms.get(p as usize).copied().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let to = (offset + self.chunk).min(self.end);
            self.sent.fetch_add((to - offset) as u64, Ordering::Relaxed);
            Ok(Fetched::Records(
                (offset..to)
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

    fn source(max_records: Option<u64>) -> KafkaSource {
        KafkaSource {
            brokers: vec!["fake:9092".into()],
            topic: "payments".into(),
            start: Start::Earliest,
            max_records_per_run: max_records,
            max_bytes_per_run: None,
            on_data_loss: DataLoss::Fail,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    async fn run(delay_ms: [u64; 3], max_records: Option<u64>) -> (Fetch, u64) {
        let broker = Slow {
            end: 20,
            chunk: 4,
            delay_ms,
            sent: AtomicU64::new(0),
        };
        let planned: Vec<Position> = (0..3)
            .map(|partition| Position {
                partition,
                from: 0,
                high: 20,
            })
            .collect();
        let got = read(&broker, &source(max_records), &planned, "p.yml")
            .await
            .unwrap();
        (got, broker.sent.load(Ordering::Relaxed))
    }

    fn taken(f: &Fetch) -> Vec<(i32, i64)> {
        f.messages.iter().map(|m| (m.partition, m.offset)).collect()
    }

    #[tokio::test]
    async fn the_bounds_cut_the_same_prefixes_whichever_partition_answers_first() {
        let (slow_first, sent) = run([30, 0, 0], Some(25)).await;
        let (slow_last, _) = run([0, 0, 30], Some(25)).await;
        assert_eq!(taken(&slow_first), taken(&slow_last));
        assert_eq!(slow_first.next, slow_last.next);
        assert_eq!(slow_first.messages.len(), 25);
        for (p, next) in &slow_first.next {
            let offsets: Vec<i64> = slow_first
                .messages
                .iter()
                .filter(|m| m.partition == *p)
                .map(|m| m.offset)
                .collect();
            assert_eq!(offsets, (0..*next).collect::<Vec<_>>(), "partition {p}");
        }
        assert_eq!(slow_first.pending, 60 - 25);
        // fetched ahead: at most AHEAD answers of 4 records per partition beyond what was taken
        assert!(sent <= 25 + 3 * AHEAD as u64 * 4, "{sent}");
    }

    #[tokio::test]
    async fn an_unbounded_read_takes_every_partition_to_its_high_watermark() {
        let (got, sent) = run([5, 0, 1], None).await;
        assert_eq!(got.messages.len(), 60);
        assert_eq!(sent, 60);
        assert!(got.next.values().all(|n| *n == 20));
        assert!(got.stalled.is_empty() && got.pending == 0);
    }
}
