//! Jobs: *when* pipeline runs happen, never how.
//!
//! - schedules (Quartz cron in a time zone, one DST rule) are parsed in
//!   [`crate::config::schedule`].
//! - [`lease`]: single flight per job across processes, kept in the lake.
//! - [`ledger`]: the run ledger, a Delta table with one row per task attempt.
//! - [`runner`]: one run of a job — tasks in dependency order, retries, timeouts — each task
//!   through [`crate::pipeline::run`], exactly what `tidemark run` calls.
//! - [`scheduler`]: the long-running process that fires jobs on their schedules.
//! - [`continuous`]: jobs and pipelines run back to back on a period, small files kept in step.

pub mod continuous;
mod error;
pub mod lease;
pub mod ledger;
pub mod report;
pub mod runner;
pub mod scheduler;

pub use error::JobsError;
pub use ledger::{Ledger, LedgerRow, TaskStatus, Trigger};
pub use report::{JobReport, JobStatus};
pub use runner::{JobRequest, JobRunner};
pub use scheduler::{BundleExecutor, Executor, Fire, ScheduledJob, Scheduler, SchedulerReport};
