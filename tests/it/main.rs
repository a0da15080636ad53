//! The integration tests, as one test binary: every suite is a module here. One binary links
//! delta-rs and DataFusion once, instead of once per suite (each link is ~0.5 GB on disk and
//! tens of seconds), which keeps a clean CI build's disk and time small.
//!
//! Run one suite with its module path as the filter: `cargo test --test it faults::`.

mod common;

mod aggregate;
mod aggregate_edges;
mod bundle_vars;
mod cdf;
mod cli;
mod commit_facts;
mod continuous;
mod contract;
mod debezium;
mod decimal;
mod deletion_vectors;
mod dimension;
mod docs_walkthrough;
mod expectations;
mod faults;
mod foreign;
mod ingest;
mod ingest_edges;
mod jobs;
mod kafka;
mod kafka_gold;
mod kind_faults;
mod kind_foreign;
mod lake_features;
mod late_rows;
mod lateness;
mod merge_edges;
mod oracle;
mod partial;
mod readme;
mod reliability;
mod s3;
mod schema;
mod signals;
mod spill;
mod tombstones;
mod ux;
mod ux_messages;
mod watermark;
mod windows;
