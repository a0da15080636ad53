//! Delta access, knowing no kind and no config: opening tables, reading the log's statistics,
//! commit entries and `txn` records, the metadata tidemark writes into its own commits, restore
//! and maintenance, and the sessions tables are scanned with ([`session`]).
//!
//! Most data is read through DataFusion scans the kinds plan; a few operations read or write
//! data files directly where the log tells exactly which ones: copy-on-write's footers
//! ([`datafile`]), deletion vectors ([`dv`]) and key replacement ([`replace_keys`]).

pub mod change_file;
mod compact;
pub mod datafile;
pub mod dv;
mod error;
pub mod facts;
#[cfg(feature = "failpoints")]
pub(crate) mod faulty;
mod log;
mod maintain;
mod open;
mod ranges;
pub mod record;
pub mod remote;
pub mod replace_keys;
mod restore;
mod restore_feed;
pub mod session;
pub mod stats;
pub mod storage;
pub mod store_fault;
pub mod txns;

pub use compact::{compact_clustered, Compacted, PURGE_DELETED_SHARE};
pub use error::{classify_delta, classify_delta_write, LakeError};
pub use log::{
    cleanup_at_checkpoints, commit_actions, files_added_between, live_files, max_from_stats,
    no_blind_retry, read_commits, read_commits_until, row_count, row_count_from_stats, valid_until,
    AddedFiles, CommitEntry, LiveFiles, Rewrite, StatsMax,
};
pub use maintain::{maintain, MaintainError, MaintainOptions, MaintainReport};
pub use open::{
    builder, check_scheme, create_url, local_path, location_url, open_if_exists, open_required,
    or_new, table_url, NewDirs,
};
pub use record::SourceRecord;
pub use restore::{companion_version, restore, RestoreOutcome, TXN_APPS};
pub use store_fault::{store_fault, StoreFault};

/// Key under which tidemark stores its run facts in the Delta `commitInfo`.
pub const COMMIT_INFO_KEY: &str = "tidemark";
