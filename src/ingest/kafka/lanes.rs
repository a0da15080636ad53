//! Each partition's fetches, pipelined: a partition's next fetch is sent as soon as its
//! previous answer is in (its offset follows from that answer), not when every partition's
//! answer is. The answers are handed out in the order they are asked for ([`Lanes::next`]), so
//! the caller applies them in a fixed order whatever answers first; a partition holds at most
//! [`AHEAD`] answers not yet handed out (counting the one in flight), which bounds the memory
//! the fetches ahead take.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use futures::stream::{FuturesUnordered, StreamExt};

use super::broker::{Broker, Fetched};
use super::error::KafkaError;
use super::positions::Position;

/// Answers a partition may hold not yet handed out, counting the fetch in flight.
pub const AHEAD: usize = 2;

type Answer = (usize, Result<Fetched, KafkaError>);
type InFlight<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

/// One partition's fetches.
struct Lane {
    partition: i32,
    high: i64,
    /// The offset the next fetch asks from (past the answers already in).
    ahead: i64,
    answers: VecDeque<Fetched>,
    fetching: bool,
    /// No more fetches: an answer reached the high watermark, came back empty or out of range.
    ended: bool,
}

/// Every partition's fetches, in flight at once.
pub struct Lanes<'a> {
    broker: &'a dyn Broker,
    ask: i32,
    lanes: Vec<Lane>,
    in_flight: FuturesUnordered<InFlight<'a>>,
}

impl<'a> Lanes<'a> {
    /// Starts a fetch of `ask` bytes on each of `positions`, from its `from`.
    pub fn start(broker: &'a dyn Broker, positions: &[Position], ask: i32) -> Self {
        let lanes = positions
            .iter()
            .map(|p| Lane {
                partition: p.partition,
                high: p.high,
                ahead: p.from,
                answers: VecDeque::new(),
                fetching: false,
                ended: p.from >= p.high,
            })
            .collect();
        let mut me = Lanes {
            broker,
            ask,
            lanes,
            in_flight: FuturesUnordered::new(),
        };
        for i in 0..me.lanes.len() {
            me.send(i);
        }
        me
    }

    /// Lane `i`'s next answer, waiting for it (and taking in the others' meanwhile); `None`
    /// when the lane has nothing more.
    pub async fn next(&mut self, i: usize) -> Result<Option<Fetched>, KafkaError> {
        loop {
            let Some(lane) = self.lanes.get_mut(i) else {
                return Ok(None);
            };
            if let Some(answer) = lane.answers.pop_front() {
                self.send(i);
                return Ok(Some(answer));
            }
            if !lane.fetching {
                return Ok(None);
            }
            let Some((j, got)) = self.in_flight.next().await else {
                return Ok(None);
            };
            self.arrived(j, got?);
        }
    }

    /// Sends lane `i` again from `from` when it stopped with nothing pending (after an
    /// out-of-range answer, reading goes on from the earliest offset the partition holds).
    pub fn resume(&mut self, i: usize, from: i64) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        if lane.ended && !lane.fetching && lane.answers.is_empty() && from < lane.high {
            lane.ahead = from;
            lane.ended = false;
            self.send(i);
        }
    }

    /// Fetches lane `i`'s next answer, unless it ended, has one in flight or holds enough.
    fn send(&mut self, i: usize) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        if lane.ended || lane.fetching || lane.answers.len() >= AHEAD {
            return;
        }
        lane.fetching = true;
        let (broker, partition, from, ask) = (self.broker, lane.partition, lane.ahead, self.ask);
        self.in_flight.push(Box::pin(async move {
            (i, broker.fetch(partition, from, ask).await)
        }));
    }

    /// Keeps lane `i`'s answer and sends its next fetch from past it.
    fn arrived(&mut self, i: usize, answer: Fetched) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        lane.fetching = false;
        match &answer {
            Fetched::Records(records) => {
                let last = records
                    .iter()
                    .map(|m| m.offset)
                    .filter(|o| *o >= lane.ahead);
                match last.max() {
                    Some(o) => lane.ahead = o + 1,
                    None => lane.ended = true,
                }
                lane.ended |= lane.ahead >= lane.high;
            }
            Fetched::OutOfRange => lane.ended = true,
        }
        lane.answers.push_back(answer);
        self.send(i);
    }
}
