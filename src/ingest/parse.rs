//! Parsing a landing file's bytes (or a chunk of them) in the pipeline's format, off the async
//! threads.

use super::rows::Parsed;
use super::schema::Col;
use super::{csv, debezium, json, parquet, Shape};
use crate::config::pipeline::ingest::{CsvOptions, Format};
use crate::run::{Phase, RunError};

/// The pipeline's parsing settings.
#[derive(Clone, Copy)]
pub(super) struct Parser {
    pub(super) format: Format,
    pub(super) rescue: bool,
    pub(super) max_record_bytes: u64,
    pub(super) csv: CsvOptions,
}

impl Parser {
    /// Parses a body in the pipeline's format, off the async threads.
    pub(super) async fn parse(
        self,
        body: bytes::Bytes,
        cols: std::sync::Arc<Vec<Col>>,
    ) -> Result<Parsed, RunError> {
        tokio::task::spawn_blocking(move || {
            let shape = Shape {
                cols: &cols,
                rescue: self.rescue,
                max_record_bytes: self.max_record_bytes,
                csv: self.csv,
            };
            match self.format {
                Format::Json => json::parse(&body, &shape),
                Format::Csv => csv::parse(&body, &shape),
                Format::Parquet => parquet::parse(body, &shape),
                Format::Debezium => debezium::parse(&body, &shape),
            }
        })
        .await
        .map_err(|e| RunError::Internal {
            phase: Phase::Read,
            message: format!("parsing a landing file stopped: {e}"),
        })?
        .map_err(RunError::arrow(Phase::Read))
    }
}
