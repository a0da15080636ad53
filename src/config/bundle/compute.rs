//! `job_clusters[].new_cluster`: the compute this engine can honour on one machine — worker
//! threads, a memory limit and a spill directory — checked for range and units.

use std::path::PathBuf;

use serde::Serialize;

use super::raw::{RawCompute, Scalar};
use crate::config::size::parse_size;

/// Most worker threads a job cluster may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;
/// Smallest memory limit: DataFusion reserves 10 MB for a sort's merge before it spills, so
/// below this a full reload fails instead of spilling.
pub const MIN_MEMORY_LIMIT: u64 = 16 << 20;
/// Largest memory limit accepted (a typo guard: 1 PiB).
pub const MAX_MEMORY_LIMIT: u64 = 1 << 50;

/// Validated compute of one job cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Compute {
    /// Threads of the runtime its tasks run on, and DataFusion's `target_partitions`.
    pub worker_threads: Option<usize>,
    /// Bytes of DataFusion's memory pool; operators over it spill to `spill_directory`.
    pub memory_limit: Option<u64>,
    /// Where spill files go (created when missing); the OS temp directory when absent.
    pub spill_directory: Option<PathBuf>,
}

/// Turns the raw compute into [`Compute`]. `sub` substitutes variables in a value (errors already
/// reported, returns None); every problem goes to `problem(key, message)`.
pub fn build(
    raw: &RawCompute,
    sub: &mut dyn FnMut(&str, &str) -> Option<String>,
    problem: &mut dyn FnMut(&str, String),
) -> Compute {
    let mut out = Compute::default();
    if let Some(v) = &raw.worker_threads {
        let text = match v {
            Scalar::Str(s) => sub("worker_threads", s),
            other => Some(other.to_string()),
        };
        if let Some(text) = text {
            match text.trim().parse::<i64>() {
                Ok(n) if (1..=MAX_WORKER_THREADS as i64).contains(&n) => {
                    out.worker_threads = Some(n as usize)
                }
                Ok(n) => problem(
                    "worker_threads",
                    format!("`worker_threads: {n}` is out of range; use 1 to {MAX_WORKER_THREADS}"),
                ),
                Err(_) => problem(
                    "worker_threads",
                    format!("`worker_threads: {text}` is not a whole number of threads, e.g. 2"),
                ),
            }
        }
    }
    if let Some(v) = &raw.memory_limit {
        let text = match v {
            Scalar::Str(s) => sub("memory_limit", s),
            other => Some(other.to_string()),
        };
        if let Some(text) = text {
            match memory(&format!("`memory_limit: {}`", text.trim()), &text) {
                Ok(bytes) => out.memory_limit = Some(bytes),
                Err(message) => problem("memory_limit", message),
            }
        }
    }
    if let Some(dir) = &raw.spill_directory {
        if let Some(dir) = sub("spill_directory", dir) {
            let path = PathBuf::from(dir.trim());
            if dir.trim().is_empty() {
                problem(
                    "spill_directory",
                    "`spill_directory` is empty; name a local directory, e.g. /var/tmp/tidemark"
                        .to_string(),
                );
            } else if path.exists() && !path.is_dir() {
                problem(
                    "spill_directory",
                    format!(
                        "`spill_directory: {}` exists and is not a directory",
                        path.display()
                    ),
                );
            } else {
                out.spill_directory = Some(path);
            }
        }
    }
    out
}

/// A memory limit, as a bundle's `memory_limit:` and `--memory-limit` both take it (`shown`:
/// the setting as the message quotes it); one rule for both.
pub fn memory(shown: &str, text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{shown} has no unit; write it like 512MiB or 4GiB"));
    }
    let Some(bytes) = parse_size(t) else {
        return Err(format!(
            "{shown} is not a size; write it like 512MiB or 4GiB (units B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)"
        ));
    };
    if !(MIN_MEMORY_LIMIT..=MAX_MEMORY_LIMIT).contains(&bytes) {
        return Err(format!(
            "{shown} is out of range; use at least {}MiB (at most 1PiB): a sort reserves 10 MB before it can spill",
            MIN_MEMORY_LIMIT >> 20
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_from(yaml: &str) -> (Compute, Vec<String>) {
        let raw: RawCompute = serde_yaml::from_str(yaml).unwrap();
        let mut problems = Vec::new();
        let c = build(
            &raw,
            &mut |_, v| Some(v.replace("${var.dir}", "/tmp/spill")),
            &mut |k, m| problems.push(format!("{k}: {m}")),
        );
        (c, problems)
    }

    #[test]
    fn parses_threads_memory_and_spill() {
        let (c, p) = build_from(
            "{ worker_threads: 2, memory_limit: 512MiB, spill_directory: \"${var.dir}\" }",
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.worker_threads, Some(2));
        assert_eq!(c.memory_limit, Some(512 << 20));
        assert_eq!(c.spill_directory, Some(PathBuf::from("/tmp/spill")));
        let (c, p) = build_from("{ worker_threads: \"4\", memory_limit: 2GB }");
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(
            (c.worker_threads, c.memory_limit),
            (Some(4), Some(2_000_000_000))
        );
    }

    #[test]
    fn refuses_out_of_range_and_bad_units() {
        let (_, p) = build_from("{ worker_threads: 0, memory_limit: 2048 }");
        assert!(
            p[0].contains("`worker_threads: 0` is out of range"),
            "{p:?}"
        );
        assert!(p[1].contains("has no unit"), "{p:?}");
        let (_, p) = build_from("{ worker_threads: lots, memory_limit: 2 gigs }");
        assert!(p[0].contains("not a whole number"), "{p:?}");
        assert!(p[1].contains("not a size"), "{p:?}");
        let (_, p) = build_from("{ memory_limit: 1MiB }");
        assert!(p[0].contains("out of range"), "{p:?}");
    }
}
