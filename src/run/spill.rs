//! Each engine's spill files live in a directory of their own under the configured spill
//! directory (`--spill-dir`, `spill_directory`, or the OS temp directory):
//! `tidemark-spill-<host>-<pid>-<nonce>`. It is removed when the run or job run ends — on success,
//! error, cancellation (SIGINT/SIGTERM) and a caught panic — and directories that a killed
//! process left behind (same host, pid gone) are removed when the next engine starts. A running
//! process's directory is never touched.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

const PREFIX: &str = "tidemark-spill-";

/// One engine's spill directory; removed on [`SpillDir::remove`] or when dropped.
#[derive(Debug)]
pub(crate) struct SpillDir {
    path: PathBuf,
}

impl SpillDir {
    /// Creates a fresh directory under `base` (created when missing), after removing the ones
    /// left there by processes of this host that no longer exist.
    pub(crate) fn create(base: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(base)?;
        remove_stale(base);
        let host = crate::host::hostname().replace(['/', '\\'], "_");
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let path = base.join(format!("{PREFIX}{host}-{}-{nonce}", std::process::id()));
        std::fs::create_dir(&path)?;
        Ok(SpillDir { path })
    }

    /// Where the spill files go.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory and whatever spill files are still in it. Open files stay
    /// readable by whoever holds them (Unix), and are gone when closed.
    pub(crate) fn remove(&self) {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %self.path.display(), "cannot remove the spill directory: {e}; remove it by hand")
            }
        }
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The pid in a spill directory's name, when it was made on `host`.
fn owner_pid(name: &str, host: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut parts = rest.rsplitn(3, '-');
    let _nonce = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    (parts.next()? == host).then_some(pid)
}

/// The default place of spill directories when no `--spill-dir` / `spill_directory` is set.
pub fn default_base() -> PathBuf {
    std::env::temp_dir()
}

/// Removes (with `dry_run`: only lists) the spill directories under `base` whose owner process
/// on this host is gone — what `tidemark maintain` sweeps. Directories of running processes and
/// of other hosts are left alone.
pub fn sweep(base: &Path, dry_run: bool) -> Vec<PathBuf> {
    if dry_run {
        return stale(base);
    }
    remove_stale(base)
}

/// Spill directories under `base` made on this host by processes that no longer exist, with
/// their owner's pid.
fn stale_with_pid(base: &Path) -> Vec<(PathBuf, u32)> {
    let host = crate::host::hostname().replace(['/', '\\'], "_");
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = owner_pid(&name, &host)?;
            let gone = pid != std::process::id() && !crate::host::process_alive(pid);
            gone.then(|| (entry.path(), pid))
        })
        .collect()
}

fn stale(base: &Path) -> Vec<PathBuf> {
    stale_with_pid(base)
        .into_iter()
        .map(|(dir, _)| dir)
        .collect()
}

/// Removes spill directories under `base` whose owner process (on this host) is gone; returns
/// those removed.
fn remove_stale(base: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for (dir, pid) in stale_with_pid(base) {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                info!(dir = %dir.display(), pid, "removed the spill directory of a process that no longer exists");
                removed.push(dir);
            }
            Err(e) => {
                warn!(dir = %dir.display(), "cannot remove a stale spill directory: {e}")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_their_owner() {
        assert_eq!(
            owner_pid("tidemark-spill-my-host-4182-0123abcd", "my-host"),
            Some(4182)
        );
        assert_eq!(
            owner_pid("tidemark-spill-other-4182-0123abcd", "my-host"),
            None
        );
        assert_eq!(owner_pid("datafusion-xyz", "my-host"), None);
    }

    #[test]
    fn a_dead_process_s_directory_goes_and_a_live_one_stays() {
        let base = tempfile::tempdir().expect("tempdir");
        let mine = SpillDir::create(base.path()).expect("create");
        let host = crate::host::hostname().replace(['/', '\\'], "_");
        // pid 0x7fff_fff0 does not exist
        let dead = base
            .path()
            .join(format!("{PREFIX}{host}-2147483632-deadbeef"));
        std::fs::create_dir(&dead).expect("mkdir");
        std::fs::write(dead.join("spill.arrow"), b"x").expect("write");
        let again = SpillDir::create(base.path()).expect("create");
        assert!(
            !dead.exists(),
            "a dead process's spill directory is removed"
        );
        assert!(mine.path().exists() && again.path().exists());
        drop(mine);
        drop(again);
        assert_eq!(std::fs::read_dir(base.path()).expect("read").count(), 0);
    }
}
