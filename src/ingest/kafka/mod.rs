//! `kind: ingest` with a `kafka:` source: a topic's records appended to bronze, exactly once.
//!
//! plan → read → validate → commit, like a landing-file ingest:
//!
//! - **plan** reads bronze's log for this pipeline's run number and each partition's next
//!   offset, asks the brokers for the topic's partitions (new ones are picked up) and their
//!   bounds, and chooses where each partition is read from ([`positions`]);
//! - **read** fetches every partition up to the high watermark seen when planning, within the
//!   run's bounds ([`read`]), and parses each value with the JSON or Debezium record code the
//!   landing files use ([`decode`]);
//! - **validate** quarantines the values that do not parse (topic, partition, offset, reason);
//! - **commit** appends the rows and the offsets in **one** Delta commit.
//!
//! # Exactly once
//!
//! The offsets live in bronze's own log, never in a side file or a consumer group: the commit
//! that appends the rows carries one `txn` per partition (app id
//! `tidemark/<pipeline>/kafka/<topic>/<partition>`, version = the partition's next offset)
//! and the run-number `txn` every ingest writes (`tidemark/<pipeline>/ingest`, version N,
//! `lastUpdated` = the run's `_ingested_at`). A Delta commit lands whole or not at all, so:
//!
//! - a crash at any phase before the commit leaves bronze as it was: the next run reads the
//!   same offsets and fetches the same records again (the quarantine keeps a rejected value
//!   once: its rows are deduplicated by content);
//! - a crash after the commit leaves the rows *and* their offsets: the next run starts after
//!   them;
//! - two runs racing both write the run-number `txn` (and the same partitions' `txn`s): Delta's
//!   conflict check refuses the second commit of an app id the winner wrote since the loser's
//!   snapshot, so the loser plans again from the winner's offsets (and commits only what is
//!   still new, or nothing). Two racing first runs both create bronze: the loser's creation
//!   fails and it plans again.
//!
//! A run that read nothing new commits nothing. The first run of a topic commits even without
//! records: it records where `start` put each partition (with `start: latest`, the backlog
//! stays skipped on later runs). `txn` actions must not expire for this to hold, so bronze
//! with `delta.setTransactionRetentionDuration` is refused as for files.

mod broker;
mod commit;
mod decode;
mod error;
mod lanes;
mod positions;
mod read;

pub use error::KafkaError;

use deltalake::kernel::Transaction;
use tracing::info;

use super::{commit as bronze, IngestError, Run};
use crate::config::pipeline::kafka::KafkaSource;
use crate::config::pipeline::SchemaChange;
use crate::ingest::counters::KafkaCounters;
use crate::ingest::schema::Col;
use crate::lake;
use crate::run::{Phase, Point, RunError, Table};
use decode::Decoded;
use positions::{partition_app, Lost, Recorded};
use read::Fetch;

impl Run<'_, '_> {
    /// plan → read → validate → commit, for a Kafka source.
    pub(super) async fn execute_kafka(&mut self, k: &KafkaSource) -> Result<(), RunError> {
        let spec = self.spec;
        let path = self.p.path.display().to_string();
        if self.opts.full_reload {
            return Err(KafkaError::NoFullReload { pipeline: path }.into());
        }
        let target = lake::open_if_exists(&spec.target_uri).await?;
        if let Some(t) = &target {
            bronze::check_retention(t, &spec.target_uri)?;
            bronze::check_foreign(t, &spec.target_uri, &self.p.name, &path).await?;
        }
        self.a.mode_for(target.is_some());
        let rec =
            positions::recorded(target.as_ref(), &spec.target_uri, &self.p.name, &k.topic).await?;
        self.check_clock(&rec);
        let broker = broker::connect(k).await?;
        let (positions, mut lost) = positions::plan(broker.as_ref(), k, &rec, &path).await?;
        self.end_phase(Phase::Plan)?;
        let fetch = read::read(broker.as_ref(), k, &positions, &path).await?;
        lost.extend(fetch.lost.iter().copied());
        self.count(k, positions.len(), &fetch, &lost);
        if fetch.messages.is_empty() && lost.is_empty() && !rec.next.is_empty() {
            info!(topic = k.topic, "no new Kafka records");
            return Ok(());
        }
        let bronze_schema = match &target {
            Some(t) => Some(bronze::table_schema(t, &spec.target_uri)?),
            None => None,
        };
        let (cols, decoded) = self.decode_all(k, bronze_schema.as_deref(), &fetch).await?;
        self.end_phase(Phase::Read)?;
        let rejected = decode::rejects_batch(&k.topic, &fetch.messages, &decoded)
            .map_err(RunError::arrow(Phase::Validate))?;
        self.a
            .quarantine(&spec.quarantine, rejected.into_iter().collect())
            .await?;
        self.end_phase(Phase::Validate)?;
        let written = Written {
            target,
            bronze_schema,
            cols,
            decoded,
            fetch,
            run: rec.run.unwrap_or(0) + 1,
        };
        self.commit_kafka(k, written).await
    }

    /// Warns when the clock is behind this pipeline's latest arrival.
    fn check_clock(&mut self, rec: &Recorded) {
        if let Some(latest) = rec.last_ms.filter(|l| *l > self.now.timestamp_millis()) {
            self.warn(format!(
                "the clock is behind this pipeline's latest arrival ({}): records ingested now are stamped earlier than records ingested before; check the machine's clock (and TIDEMARK_FAKE_NOW)",
                crate::report::rfc3339_ms(latest).unwrap_or_default()
            ));
        }
    }

    /// The counters and warnings of what was fetched and lost.
    fn count(&mut self, k: &KafkaSource, partitions: usize, fetch: &Fetch, lost: &[Lost]) {
        for gap in lost {
            self.warn(format!(
                "Kafka topic `{}` partition {}: offsets {} to {} were deleted before this pipeline read them ({} record(s) lost; `on_data_loss: continue`)",
                k.topic, gap.partition, gap.from, gap.to, gap.count()
            ));
        }
        if fetch.pending > 0 {
            self.warn(format!(
                "{} Kafka record(s) left for the next run (kafka.max_records_per_run / kafka.max_bytes_per_run)",
                fetch.pending
            ));
        }
        for p in &fetch.stalled {
            self.warn(format!(
                "Kafka topic `{}` partition {p} returned no records below its high watermark; it is read again next run",
                k.topic
            ));
        }
        self.c.num_bytes_read = fetch.bytes;
        self.c.kafka = Some(KafkaCounters {
            topic: k.topic.clone(),
            num_partitions: partitions as u64,
            num_records_read: fetch.messages.len() as u64,
            num_tombstones: 0,
            num_records_pending: fetch.pending,
            num_records_lost: lost.iter().map(Lost::count).sum(),
        });
    }

    /// The columns, and the fetched values parsed into them (again with the new columns, when
    /// values carry fields bronze lacks and `on_schema_change: add_new_columns`).
    async fn decode_all(
        &mut self,
        k: &KafkaSource,
        bronze_schema: Option<&arrow::datatypes::Schema>,
        fetch: &Fetch,
    ) -> Result<(Vec<Col>, Decoded), RunError> {
        let spec = self.spec;
        let mut cols = self.columns(bronze_schema, None).await?;
        let mut d = decode::decode(&fetch.messages, &self.shape(&cols), spec.format)
            .map_err(RunError::arrow(Phase::Read))?;
        if let Some(i) = d.truncate {
            let m = &fetch.messages[i.min(fetch.messages.len().saturating_sub(1))];
            return Err(KafkaError::Truncate {
                topic: k.topic.clone(),
                partition: m.partition,
                offset: m.offset,
            }
            .into());
        }
        if !d.parsed.unknown.is_empty() {
            let names: Vec<String> = d.parsed.unknown.keys().map(|n| format!("`{n}`")).collect();
            if spec.on_schema_change != SchemaChange::AddNewColumns {
                return Err(IngestError::Schema {
                    pipeline: self.p.path.display().to_string(),
                    message: format!(
                        "the values of Kafka topic `{}` carry field(s) bronze does not have: {}; nothing was written. Add them with `on_schema_change: add_new_columns`, keep them as JSON text with `rescue: true` (in `_rescued_data`), or fix the producer",
                        k.topic,
                        names.join(", ")
                    ),
                }
                .into());
            }
            for (name, ty) in std::mem::take(&mut d.parsed.unknown) {
                self.c.columns_added.push(name.clone());
                cols.push(Col {
                    name,
                    ty,
                    required: false,
                });
            }
            d = decode::decode(&fetch.messages, &self.shape(&cols), spec.format)
                .map_err(RunError::arrow(Phase::Read))?;
        }
        self.a.summary.num_source_rows_read = d.parsed.records;
        self.c.num_rescued = d.parsed.rescued;
        if let Some(kc) = self.c.kafka.as_mut() {
            kc.num_tombstones = d.tombstones;
        }
        Ok((cols, d))
    }

    /// Appends the rows with the run's number and every partition's next offset, in one
    /// commit (nothing on a dry run).
    async fn commit_kafka(&mut self, k: &KafkaSource, w: Written) -> Result<(), RunError> {
        let spec = self.spec;
        self.c.num_rows_written = w.decoded.parsed.batch.num_rows() as u64;
        if self.opts.dry_run {
            return Ok(());
        }
        self.a.failpoint(Point::Before(Phase::Commit))?;
        self.c.ingested_at = Some(self.now);
        let schema = bronze::output_schema(
            w.bronze_schema.as_deref(),
            &w.cols,
            spec.rescue,
            &decode::columns(),
        );
        let grows = w
            .bronze_schema
            .as_ref()
            .is_some_and(|b| b.fields().len() != schema.fields().len());
        let fixed = decode::row_columns(
            &w.fetch.messages,
            &w.decoded.row_of,
            self.now.timestamp_micros(),
        );
        let batch = bronze::conform(&schema, &w.decoded.parsed.batch, &fixed)
            .map_err(RunError::arrow(Phase::Commit))?;
        let mut txns = vec![Transaction::new_with_last_update(
            super::record::run_app(&self.p.name),
            w.run,
            Some(self.now.timestamp_millis()),
        )];
        txns.extend(
            w.fetch.next.iter().map(|(p, next)| {
                Transaction::new(partition_app(&self.p.name, &k.topic, *p), *next)
            }),
        );
        let mut extra = serde_json::Map::new();
        let apps: Vec<String> = txns.iter().map(|t| t.app_id.clone()).collect();
        extra.insert(lake::TXN_APPS.into(), apps.into());
        let facts = self.a.facts(&self.c, extra);
        let table = commit::write(commit::Write {
            ctx: &self.a.ctx,
            uri: &spec.target_uri,
            target: w.target,
            pipeline: &self.p.name,
            batch,
            grows,
            txns,
            facts,
        })
        .await?;
        self.a.summary.target_version = table.version();
        self.a.summary.num_files_added = 1;
        self.a.failpoint(Point::Committed(Table::Target))?;
        self.end_phase(Phase::Commit)
    }
}

/// What the commit of a Kafka run takes.
struct Written {
    target: Option<deltalake::DeltaTable>,
    bronze_schema: Option<std::sync::Arc<arrow::datatypes::Schema>>,
    cols: Vec<Col>,
    decoded: Decoded,
    fetch: Fetch,
    run: i64,
}
