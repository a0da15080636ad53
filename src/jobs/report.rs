//! What a job run did, task by task and attempt by attempt: text for people, JSON for machines.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::lease::Holder;
use super::ledger::{TaskStatus, Trigger};
use crate::error::ErrorClass;
use crate::report::RunSummary;

/// How a whole job run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Every task succeeded.
    Succeeded,
    /// Some task did not succeed.
    Failed,
    /// Nothing ran: another run of the job held its lease.
    Skipped,
    /// Stopped from outside (a signal, the scheduler's shutdown) while a task ran.
    Cancelled,
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Skipped => "skipped",
            JobStatus::Cancelled => "cancelled",
        })
    }
}

/// One attempt of one task.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptReport {
    pub attempt: u32,
    pub trigger: Trigger,
    #[serde(serialize_with = "crate::report::ser_time")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::report::ser_time")]
    pub ended_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub status: TaskStatus,
    pub error_class: Option<ErrorClass>,
    pub error: Option<String>,
    /// Spill files written while the attempt ran (its job cluster's memory limit was reached).
    pub spill_files: u64,
    /// The pipeline run's summary, when the attempt succeeded.
    pub summary: Option<RunSummary>,
}

/// One task of a job run.
#[derive(Debug, Clone, Serialize)]
pub struct TaskReport {
    pub task: String,
    pub pipeline: String,
    pub status: TaskStatus,
    /// Why the task has no attempt (upstream failed, job timed out), if it has none.
    pub reason: Option<String>,
    pub attempts: Vec<AttemptReport>,
}

impl TaskReport {
    /// The error class of the task's last attempt, if it failed.
    pub fn error_class(&self) -> Option<ErrorClass> {
        self.attempts.last().and_then(|a| a.error_class)
    }
}

/// One run of a job.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub run_id: String,
    pub job: String,
    pub target: String,
    pub trigger: Trigger,
    #[serde(serialize_with = "crate::report::rfc3339_opt")]
    pub scheduled_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "crate::report::ser_time")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::report::ser_time")]
    pub ended_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub status: JobStatus,
    /// When skipped: the run that held the job's lease.
    pub holder: Option<Holder>,
    pub tasks: Vec<TaskReport>,
    /// Problems that did not stop the job (e.g. a ledger row that could not be written).
    pub warnings: Vec<String>,
    /// Continuous runs: the pipelines whose tables were maintained after the tasks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<super::continuous::Compaction>,
}

impl JobReport {
    /// Every warning of the run: the job's own, then each successful attempt's, named by task.
    pub fn all_warnings(&self) -> Vec<String> {
        let mut all = self.warnings.clone();
        for t in &self.tasks {
            for a in &t.attempts {
                let Some(s) = &a.summary else { continue };
                all.extend(s.warnings.iter().map(|w| format!("task `{}`: {w}", t.task)));
            }
        }
        all
    }

    /// The class that decides the exit code, or None when the job succeeded: a skipped run is
    /// retryable (75); a failed one takes the class of its first failed task (a timeout counts as
    /// retryable).
    pub fn failure_class(&self) -> Option<ErrorClass> {
        match self.status {
            JobStatus::Succeeded => None,
            JobStatus::Skipped => Some(ErrorClass::Retryable),
            JobStatus::Failed | JobStatus::Cancelled => Some(
                self.tasks
                    .iter()
                    .filter(|t| t.status != TaskStatus::Succeeded)
                    .find_map(|t| match t.status {
                        TaskStatus::TimedOut => Some(ErrorClass::Retryable),
                        _ => t.error_class(),
                    })
                    .unwrap_or(ErrorClass::Retryable),
            ),
        }
    }

    /// One line for stderr saying why the job did not succeed.
    pub fn failure_message(&self) -> Option<String> {
        match self.status {
            JobStatus::Succeeded => None,
            JobStatus::Skipped => Some(match &self.holder {
                Some(h) => format!(
                    "job `{}` is already running: {h}. This run was skipped; try again when it has finished (exit code 75 means: safe to retry)",
                    self.job
                ),
                None => format!("job `{}` was skipped", self.job),
            }),
            JobStatus::Failed | JobStatus::Cancelled => {
                let failed: Vec<String> = self
                    .tasks
                    .iter()
                    .filter(|t| t.status != TaskStatus::Succeeded)
                    .map(|t| {
                        let why = t
                            .attempts
                            .last()
                            .and_then(|a| a.error.clone())
                            .or_else(|| t.reason.clone())
                            .unwrap_or_default();
                        format!("task `{}` {}: {why}", t.task, t.status)
                    })
                    .collect();
                Some(format!(
                    "job `{}` {} (run {}): {}. See `tidemark runs --job {}`",
                    self.job,
                    if self.status == JobStatus::Cancelled { "was cancelled" } else { "failed" },
                    self.run_id,
                    failed.join("; "),
                    self.job
                ))
            }
        }
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report for people: the job's outcome, then each task and its attempts, with the
    /// pipeline run summary of each successful attempt.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let when = self
            .scheduled_at
            .map(|t| format!(", fire {}", crate::report::rfc3339(&t)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "job {} on target {} — {} (run {}, {}{when}, {} ms)",
            self.job, self.target, self.status, self.run_id, self.trigger, self.duration_ms
        );
        if let Some(h) = &self.holder {
            let _ = writeln!(out, "  already running: {h}");
        }
        for t in &self.tasks {
            let attempts = t.attempts.len();
            let _ = writeln!(
                out,
                "  task {} ({}): {}{}",
                t.task,
                t.pipeline,
                t.status,
                match (attempts, &t.reason) {
                    (0, Some(r)) => format!(" — {r}"),
                    (0, None) => String::new(),
                    (1, _) => " after 1 attempt".to_string(),
                    (n, _) => format!(" after {n} attempts"),
                }
            );
            for a in &t.attempts {
                let _ = write!(
                    out,
                    "    attempt {} ({}): {} in {} ms",
                    a.attempt, a.trigger, a.status, a.duration_ms
                );
                if a.spill_files > 0 {
                    let _ = write!(out, ", {} spill files", a.spill_files);
                }
                if let Some(e) = &a.error {
                    let class = a.error_class.map(|c| format!(" [{c}]")).unwrap_or_default();
                    let _ = write!(out, "{class}: {e}");
                }
                out.push('\n');
                if let Some(s) = &a.summary {
                    for line in s.to_text().lines() {
                        let _ = writeln!(out, "      {line}");
                    }
                }
            }
        }
        for c in &self.compactions {
            let _ = writeln!(out, "  {}", c.to_text());
        }
        for w in &self.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
        out
    }
}
