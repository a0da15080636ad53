//! The newest-per-key stages that `cdc_merge` runs and `tidemark reconcile` recomputes: which
//! column plays which part ([`roles`]), validation of change records ([`validate`]) with the
//! pipeline's expectations ([`expect`]), conditions counted inside a stream ([`tally`]), and the
//! newest version per key ([`dedup`]).
//!
//! It stands over the run toolkit (`crate::run`) and under the kinds and commands that use it;
//! it knows no kind.

pub mod dedup;
pub mod encode;
pub mod expect;
pub mod partial;
pub mod roles;
pub mod tally;
pub mod validate;

pub use dedup::{winners as dedup_winners, DedupCounts, Deduper};
pub use roles::ColumnRoles;
