//! The `kafka:` block of an `ingest` pipeline: a Kafka topic instead of a landing location.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::common::Ctx;
use super::ingest::{all_files, Format, RawIngest, RawLanding};
use crate::config::size::parse_size;
use crate::config::ConfigError;

/// The prefix of the columns a Kafka ingest adds to every row (`_kafka_partition`, …).
pub const COLUMN_PREFIX: &str = "_kafka_";
/// Column: the record's partition (int).
pub const PARTITION: &str = "_kafka_partition";
/// Column: the record's offset in its partition (long).
pub const OFFSET: &str = "_kafka_offset";
/// Column: the record's timestamp as the broker keeps it (create or log-append time).
pub const TIMESTAMP: &str = "_kafka_timestamp";
/// Column: the record's key as text (`base64:` and the bytes in base64 when it is not UTF-8,
/// or when its text starts with `base64:`).
pub const KEY: &str = "_kafka_key";
/// Column: the record's headers as a JSON object of text values (encoded as keys are).
pub const HEADERS: &str = "_kafka_headers";

/// Default bound of one broker request (rskafka itself retries a lost broker forever).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a partition this pipeline never read starts, on its first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest record the broker still holds.
    Earliest,
    /// The partition's end: only records produced after the first run.
    Latest,
    /// The first record with a timestamp at or after this instant.
    At(DateTime<Utc>),
}

/// What a run does when records it never read were deleted from the topic (retention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataLoss {
    /// Stop (exit 65) naming the topic, partition and missing offsets.
    #[default]
    Fail,
    /// Warn, count the missing records, and go on from the earliest offset the broker holds.
    Continue,
}

/// A validated `kafka:` block.
#[derive(Debug, Clone)]
pub struct KafkaSource {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    pub topic: String,
    pub start: Start,
    pub max_records_per_run: Option<u64>,
    pub max_bytes_per_run: Option<u64>,
    pub on_data_loss: DataLoss,
    /// Bound of each broker request.
    pub request_timeout: Duration,
}

impl KafkaSource {
    /// The source as the run summary names it: `kafka://<first broker>/<topic>`.
    pub fn uri(&self) -> String {
        format!(
            "kafka://{}/{}",
            self.brokers.first().map(String::as_str).unwrap_or(""),
            self.topic
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKafka {
    brokers: Vec<String>,
    topic: String,
    start: Option<String>,
    max_records_per_run: Option<u64>,
    max_bytes_per_run: Option<String>,
    #[serde(default)]
    on_data_loss: DataLoss,
    request_timeout: Option<String>,
}

impl Ctx<'_> {
    /// Checks a `kafka:` block (of an ingest reading `format`).
    pub(super) fn kafka(&self, raw: RawKafka, format: Format) -> Result<KafkaSource, ConfigError> {
        if !matches!(format, Format::Json | Format::Debezium) {
            return Err(self.invalid(
                "format",
                "a `kafka:` source reads each message value as one JSON document: use `format: json` or `format: debezium`",
            ));
        }
        if raw.brokers.is_empty() {
            return Err(self.invalid(
                "brokers",
                "`kafka.brokers` lists no broker; give at least one `host:port`",
            ));
        }
        if let Some(b) = raw.brokers.iter().find(|b| !is_host_port(b)) {
            return Err(self.invalid(
                "brokers",
                format!("`kafka.brokers: {b}` is not `host:port` (like `kafka-1:9092`)"),
            ));
        }
        if raw.topic.trim().is_empty() {
            return Err(self.invalid("topic", "`kafka.topic` is empty; name the topic"));
        }
        if raw.max_records_per_run == Some(0) {
            return Err(self.invalid(
                "max_records_per_run",
                "`max_records_per_run: 0` would ingest nothing; give 1 or more, or leave it out",
            ));
        }
        let max_bytes_per_run = match &raw.max_bytes_per_run {
            None => None,
            Some(v) => match parse_size(v) {
                Some(n) if n > 0 => Some(n),
                _ => {
                    return Err(self.invalid(
                        "max_bytes_per_run",
                        format!("`max_bytes_per_run: {v}` is not a size; write it like 64MiB"),
                    ))
                }
            },
        };
        let request_timeout = match &raw.request_timeout {
            None => DEFAULT_REQUEST_TIMEOUT,
            Some(t) => match humantime::parse_duration(t) {
                Ok(d) if !d.is_zero() => d,
                _ => {
                    return Err(self.invalid(
                        "request_timeout",
                        format!(
                            "`request_timeout: {t}` is not a duration; write it like 30s or 2m"
                        ),
                    ))
                }
            },
        };
        Ok(KafkaSource {
            brokers: raw.brokers,
            topic: raw.topic,
            start: self.kafka_start(raw.start.as_deref())?,
            max_records_per_run: raw.max_records_per_run,
            max_bytes_per_run,
            on_data_loss: raw.on_data_loss,
            request_timeout,
        })
    }

    fn kafka_start(&self, start: Option<&str>) -> Result<Start, ConfigError> {
        Ok(match start {
            None | Some("earliest") => Start::Earliest,
            Some("latest") => Start::Latest,
            Some(t) => match DateTime::parse_from_rfc3339(t) {
                Ok(at) => Start::At(at.with_timezone(&Utc)),
                Err(_) => {
                    return Err(self.invalid(
                        "start",
                        format!("`start: {t}` is not `earliest`, `latest` or an RFC 3339 timestamp (like 2025-01-06T00:00:00Z)"),
                    ))
                }
            },
        })
    }
}

impl Ctx<'_> {
    /// The source: exactly one of `landing:` and `kafka:` (a landing's glob checked, a Kafka
    /// block validated, and the file-only limits refused for Kafka).
    pub(super) fn source(
        &self,
        landing: Option<RawLanding>,
        kafka: Option<RawKafka>,
        raw: &RawIngest,
    ) -> Result<(RawLanding, Option<KafkaSource>), ConfigError> {
        match (landing, kafka) {
            (Some(_), Some(_)) => Err(self.invalid(
                "kafka",
                "an ingest reads either landing files (`landing:`) or a Kafka topic (`kafka:`), not both: remove one",
            )),
            (None, None) => Err(self.invalid(
                "kind",
                "an ingest needs its source: `landing: { uri: …, glob: … }` (files) or `kafka: { brokers: […], topic: … }`",
            )),
            (Some(l), None) => {
                if glob::Pattern::new(&l.glob).is_err() {
                    return Err(self.invalid(
                        "glob",
                        format!(
                            "`landing.glob: {}` is not a glob pattern; write it like `*.jsonl` or `events/**/*.json`",
                            l.glob
                        ),
                    ));
                }
                Ok((l, None))
            }
            (None, Some(k)) => {
                for (key, given) in [
                    ("max_files_per_run", raw.max_files_per_run.is_some()),
                    ("max_bytes_per_run", raw.max_bytes_per_run.is_some()),
                ] {
                    if given {
                        return Err(self.invalid(
                            key,
                            format!("`{key}` bounds landing files; a Kafka ingest's bounds are `kafka.max_records_per_run` and `kafka.max_bytes_per_run`"),
                        ));
                    }
                }
                if raw.schema.is_none() {
                    return Err(self.invalid(
                        "kafka",
                        "a Kafka ingest needs a declared `schema:` (the columns of each message value)",
                    ));
                }
                let k = self.kafka(k, raw.format)?;
                let landing = RawLanding {
                    uri: k.uri(),
                    glob: all_files(),
                };
                Ok((landing, Some(k)))
            }
        }
    }
}

fn is_host_port(b: &str) -> bool {
    b.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::pipeline::ingest::Ingest;
    use crate::config::pipeline::{Pipeline, Spec};
    use crate::config::Vars;

    const GOOD: &str = r#"
name: events
kind: ingest
landing: { uri: "${var.lake}/landing", glob: "events/*.jsonl" }
format: json
target: { uri: "${var.lake}/bronze" }
schema:
  id: string not null
quarantine: { uri: "${var.lake}/quarantine" }
"#;

    fn parse(text: &str) -> Result<Pipeline, ConfigError> {
        let vars = Vars::from_args(&["lake=/tmp/lake"]).expect("vars");
        Pipeline::parse(Path::new("p.yml"), text, &vars)
    }

    fn ingest(p: &Pipeline) -> &Ingest {
        match &p.spec {
            Spec::Ingest(i) => i,
            _ => panic!("not an ingest"),
        }
    }

    #[test]
    fn a_kafka_source_replaces_the_landing_and_its_mistakes_are_explained() {
        let kafka = GOOD.replace(
            "landing: { uri: \"${var.lake}/landing\", glob: \"events/*.jsonl\" }",
            "kafka: { brokers: [\"k1:9092\", \"k2:9092\"], topic: payments, start: \"2025-01-06T00:00:00Z\", max_records_per_run: 1000, max_bytes_per_run: 64MiB, on_data_loss: continue, request_timeout: 10s }",
        );
        let p = parse(&kafka).expect("parses");
        let k = ingest(&p).kafka.clone().expect("kafka");
        assert_eq!(p.source_uri(), "kafka://k1:9092/payments");
        assert_eq!(k.max_bytes_per_run, Some(64 << 20));
        assert_eq!(k.on_data_loss, DataLoss::Continue);
        assert_eq!(k.request_timeout, std::time::Duration::from_secs(10));
        let err = |text: String| parse(&text).unwrap_err().to_string();
        let both = GOOD.replace(
            "format: json",
            "kafka: { brokers: [\"k:1\"], topic: t }\nformat: json",
        );
        assert!(err(both).contains("not both"));
        let e = err(format!("{kafka}max_files_per_run: 3\n"));
        assert!(e.contains("kafka.max_records_per_run"), "{e}");
        let e = err(kafka.replace("format: json", "format: csv"));
        assert!(e.contains("one JSON document"), "{e}");
        let e = err(kafka.replace("request_timeout: 10s", "request_timeout: soon"));
        assert!(e.contains("not a duration"), "{e}");
        let e = err(kafka.replace("  id: string not null", "  _kafka_offset: long"));
        assert!(e.contains("tidemark adds"), "{e}");
    }
}
