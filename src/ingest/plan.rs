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

#[cfg(test)]
mod tests {
    use super::super::landing::listed_for_test as file;
    use super::*;
    use crate::config::pipeline::{Pipeline, Spec};
    use crate::config::Vars;

    fn spec(extra: &str) -> Ingest {
        let text = format!(
            "name: events\nkind: ingest\nlanding: {{ uri: /l, glob: \"*.jsonl\" }}\nformat: json\ntarget: {{ uri: /b }}\nquarantine: {{ uri: /q }}\n{extra}"
        );
        let p = Pipeline::parse(std::path::Path::new("p.yml"), &text, &Vars::new()).unwrap();
        match p.spec {
            Spec::Ingest(i) => i,
            _ => unreachable!("an ingest pipeline"),
        }
    }

    fn recorded(fingerprint: i64) -> Recorded {
        Recorded {
            fingerprint,
            content: None,
            ingested_ms: 0,
        }
    }

    fn rels(files: &[LandingFile]) -> Vec<&str> {
        files.iter().map(|f| f.rel.as_str()).collect()
    }

    #[test]
    fn new_files_are_taken_recorded_ones_skipped_and_changed_ones_named() {
        let listed = vec![file("a", 10, 1), file("b", 10, 2), file("c", 10, 3)];
        let record = HashMap::from([("a".to_string(), recorded(1)), ("b".into(), recorded(9))]);
        let plan = choose(listed.clone(), &record, &spec(""), false);
        assert_eq!((plan.listed, plan.skipped, plan.pending), (3, 1, 0));
        assert_eq!(
            rels(&plan.files),
            vec!["c"],
            "a changed file is not read by default"
        );
        assert_eq!(rels(&plan.changed), vec!["b"]);
        let plan = choose(listed, &record, &spec("on_file_change: reingest\n"), false);
        assert_eq!(rels(&plan.files), vec!["b", "c"]);
        assert_eq!(rels(&plan.changed), vec!["b"]);
    }

    #[test]
    fn the_limits_keep_the_oldest_files_and_leave_the_rest_pending() {
        let listed: Vec<_> = (0..5).map(|i| file(&format!("f{i}"), 100, i)).collect();
        let plan = choose(
            listed.clone(),
            &HashMap::new(),
            &spec("max_files_per_run: 2\n"),
            false,
        );
        assert_eq!(rels(&plan.files), vec!["f0", "f1"]);
        assert_eq!(plan.pending, 3);
        let plan = choose(
            listed.clone(),
            &HashMap::new(),
            &spec("max_bytes_per_run: 250B\n"),
            false,
        );
        assert_eq!(rels(&plan.files), vec!["f0", "f1"]);
        assert_eq!(plan.pending, 3);
        // One file bigger than the byte limit is still taken alone: a run always progresses.
        let plan = choose(
            listed,
            &HashMap::new(),
            &spec("max_bytes_per_run: 50B\n"),
            false,
        );
        assert_eq!((rels(&plan.files), plan.pending), (vec!["f0"], 4));
    }

    #[test]
    fn a_full_reload_takes_every_file_whatever_the_record_and_limits_say() {
        let listed = vec![file("a", 10, 1), file("b", 10, 2)];
        let record = HashMap::from([("a".to_string(), recorded(1)), ("b".into(), recorded(7))]);
        let plan = choose(listed, &record, &spec("max_files_per_run: 1\n"), true);
        assert_eq!(rels(&plan.files), vec!["a", "b"]);
        assert_eq!(rels(&plan.changed), vec!["b"]);
        assert_eq!((plan.skipped, plan.pending), (0, 0));
    }
}
