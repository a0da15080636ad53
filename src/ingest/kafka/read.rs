//! Fetching each partition from its position up to the high watermark seen when planning,
//! within the run's bounds (`max_records_per_run`, `max_bytes_per_run`): the partitions take
//! turns, one fetch each, so a backlog on one does not starve the others.

use std::collections::BTreeMap;

use super::broker::{Broker, Fetched, Message};
use super::error::KafkaError;
use super::positions::{gap_allowed, Lost, Position};
use crate::config::pipeline::kafka::KafkaSource;

/// Bytes asked per fetch (at most; less when the run's byte bound is closer).
const FETCH_BYTES: u64 = 1 << 20;

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
    let mut active: Vec<Position> = positions
        .iter()
        .filter(|p| p.from < p.high)
        .copied()
        .collect();
    while !active.is_empty() && !budget.exhausted() {
        // One fetch per partition, all at once (a round trip each, not one after another);
        // applied in partition order, so the bounds cut the same records whatever answers first.
        let ask = budget
            .bytes
            .map_or(FETCH_BYTES, |b| b.clamp(1, FETCH_BYTES));
        let fetched = futures::future::try_join_all(active.iter().map(|p| {
            let from = out.next.get(&p.partition).copied().unwrap_or(p.from);
            broker.fetch(p.partition, from, ask as i32)
        }))
        .await?;
        let mut still = Vec::with_capacity(active.len());
        for (p, records) in active.into_iter().zip(fetched) {
            if budget.exhausted() {
                still.push(p);
                continue;
            }
            if apply(
                broker,
                source,
                p,
                records,
                &mut out,
                &mut budget,
                pipeline_path,
            )
            .await?
            {
                still.push(p);
            }
        }
        active = still;
    }
    out.pending = positions
        .iter()
        .map(|p| (p.high - out.next.get(&p.partition).copied().unwrap_or(p.from)).max(0) as u64)
        .sum();
    Ok(out)
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
