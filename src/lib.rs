//! tidemark keeps payments tables in Delta Lake current every hour, and the numbers built on
//! them honest when data arrives late: landing files → bronze (`ingest`, with the arrival
//! clock) → silver (`cdc_merge`; `dimension` beside it) → gold (`aggregate`: days restated,
//! finality, adjustments), with `lateness` measuring how late the data really runs.
//!
//! The house, from the ground up (each room imports only rooms below it):
//! - ground: [`error`] (classes and exit codes), [`clock`], [`phase`], [`host`],
//!   [`failpoint`], [`signal`];
//! - [`config`]: YAML files → validated settings, one file per kind;
//! - [`lake`]: Delta access (logs, statistics, `txn` records, restore, maintenance, sessions);
//! - [`report`]: the run summary's header, and the trait a kind's counters implement;
//! - [`run`]: the toolkit every kind stands on — the attempt harness and the kind contract
//!   ([`run::RunKind`], written once in [`mod@run::attempt`]), the engine session, quarantine,
//!   definitions, errors;
//! - [`keyed`]: the newest-per-key stages `cdc_merge` and `reconcile` share;
//! - the kinds, side by side, none importing another: [`ingest`], [`merge`] (`cdc_merge`),
//!   [`dimension`], [`aggregate`];
//! - [`pipeline`]: the one entry point that picks a kind and replans a lost race;
//! - [`jobs`] (when runs happen), [`reconcile`], [`lateness`], [`generate`];
//! - [`app`] (one function per command), [`cli`], [`logging`]; `main.rs` only parses and maps
//!   errors to exit codes.

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
