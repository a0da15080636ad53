//! Helpers for jobs that hold a lease and write the run ledger: the ledger's rows as
//! `tidemark runs` prints them, the newest lease of a job, and a bounded wait.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::exec;

/// `tidemark runs --limit 100 --output json ARGS...` (e.g. `--bundle DIR`, `--var lake=DIR`)
/// run by `cmd`: the ledger's rows, newest first.
pub fn ledger<I, S>(mut cmd: assert_cmd::Command, args: I) -> Vec<Value>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = exec(
        cmd.args(["runs", "--limit", "100", "--output", "json"])
            .args(args),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    match serde_json::from_str(out.stdout.trim()) {
        Ok(Value::Array(rows)) => rows,
        other => panic!(
            "runs --output json is not an array: {other:?}\n{}",
            out.stdout
        ),
    }
}

/// [`ledger`] of the lake a bundle names: `tidemark runs ... --bundle BUNDLE`.
pub fn bundle_ledger(cmd: assert_cmd::Command, bundle: &Path) -> Vec<Value> {
    ledger(cmd, [OsStr::new("--bundle"), bundle.as_os_str()])
}

/// The holder record of the newest lease generation of `job` in `dir/lake`, if any.
pub fn newest_lease(dir: &Path, job: &str) -> Option<Value> {
    let leases = dir.join("lake/_tidemark/leases").join(job);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&leases)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    serde_json::from_str(&std::fs::read_to_string(files.last()?).ok()?).ok()
}

/// Waits (bounded, not a timing assertion) until `cond` holds.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
