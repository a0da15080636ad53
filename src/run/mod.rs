//! The run toolkit every kind stands on, knowing no kind: the attempt harness and the kind
//! contract ([`mod@attempt`]), the engine session and its spill folder, phases and their timer,
//! quarantine, the definition record, and the errors a run stops with.
//!
//! The dispatcher above the kinds (`crate::pipeline`) chooses the kind; each kind's folder
//! implements [`RunKind`]; the newest-per-key stages merge and reconcile share are in
//! `crate::keyed`.

pub mod attempt;
pub mod definition;
mod error;
pub(crate) mod once;
pub mod phase;
pub(crate) mod quarantine;
pub(crate) mod render;
mod session;
mod spill;
pub mod sql;

pub use attempt::{attempt, Attempt, Point, RunKind, Table};
pub use error::{KindError, KindFailure, RunError};
pub use phase::Phase;
pub(crate) use session::frame;
pub use session::{default_spill_base, sweep_spill_dirs, Engine, EngineError};

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rebuild the target from the whole source in one overwrite commit.
    pub full_reload: bool,
    /// Plan and count everything, write nothing.
    pub dry_run: bool,
    /// `aggregate`: the run's logical date (default: today in the pipeline's time zone).
    pub logical_date: Option<chrono::NaiveDate>,
    /// `aggregate`: restate exactly these event days (inclusive), on purpose.
    pub restate_from: Option<chrono::NaiveDate>,
    pub restate_to: Option<chrono::NaiveDate>,
    /// The run's `--var` arguments as a shell would take them back (` --var k=v`), for the
    /// commands a message suggests.
    pub var_args: String,
}
