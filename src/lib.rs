//! tidemark keeps Delta Lake tables of payments current from a stream of change records:
//! an hourly incremental merge that is safe to rerun and never loses a late row, and a
//! full reload for recovery.
//!
//! Data flows one way: [`config`] (YAML → validated types) → [`run`] (plan, read, validate,
//! dedup, compare, commit) over [`lake`] (Delta access) → [`report`] (the run summary).
//! [`jobs`] decides *when* runs happen (bundle jobs, the scheduler, leases, the run ledger) and
//! calls the same [`run::run`] entry point.
//! [`app`] has one function per command; `main.rs` only parses and maps errors to exit codes.

pub mod aggregate;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dimension;
pub mod error;
pub mod failpoint;
pub mod generate;
pub mod host;
pub mod ingest;
pub mod jobs;
pub mod keyed;
pub mod lake;
pub mod lateness;
pub mod logging;
pub mod merge;
pub mod phase;
pub mod pipeline;
pub mod reconcile;
pub mod report;
pub mod run;
pub mod signal;
