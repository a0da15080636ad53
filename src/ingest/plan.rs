//! Which landing files a run ingests: those the record does not hold (or holds with another
//! fingerprint), oldest first, within `max_files_per_run` and `max_bytes_per_run`.

use std::collections::HashMap;

use super::landing::LandingFile;
use super::Recorded;
use crate::config::pipeline::ingest::{FileChange, Ingest};

/// What the plan chose.
#[derive(Debug, Default)]
pub struct Plan {
    /// The files this run reads, oldest first.
    pub files: Vec<LandingFile>,
    pub listed: u64,
    /// Recorded with the same fingerprint: already ingested.
    pub skipped: u64,
    /// Recorded with another fingerprint: changed since they were ingested.
    pub changed: Vec<LandingFile>,
    /// New files left for a later run by the limits.
    pub pending: u64,
}

/// Chooses the run's files from the listing. A full reload (`whole`) takes every listed file.
pub fn choose(
    listed: Vec<LandingFile>,
    record: &HashMap<String, Recorded>,
    spec: &Ingest,
    whole: bool,
) -> Plan {
    let mut plan = Plan {
        listed: listed.len() as u64,
        ..Plan::default()
    };
    if whole {
        plan.changed = listed
            .iter()
            .filter(|f| {
                record
                    .get(&f.rel)
                    .is_some_and(|r| r.fingerprint != f.fingerprint)
            })
            .cloned()
            .collect();
        plan.files = listed;
        return plan;
    }
    let mut bytes = 0u64;
    let mut full = false;
    for f in listed {
        match record.get(&f.rel) {
            Some(r) if r.fingerprint == f.fingerprint => {
                plan.skipped += 1;
                continue;
            }
            Some(_) => {
                plan.changed.push(f.clone());
                if spec.on_file_change == FileChange::Fail {
                    continue;
                }
            }
            None => {}
        }
        let over_files = spec
            .max_files_per_run
            .is_some_and(|m| plan.files.len() as u64 >= m);
        let over_bytes = spec
            .max_bytes_per_run
            .is_some_and(|m| !plan.files.is_empty() && bytes + f.size > m);
        if full || over_files || over_bytes {
            // Oldest first: once the batch is full, every later file waits for the next run.
            full = true;
            plan.pending += 1;
            continue;
        }
        bytes += f.size;
        plan.files.push(f);
    }
    plan
}
