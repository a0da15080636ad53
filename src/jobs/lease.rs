//! Single flight across processes: one lease per job, kept in the lake.
//!
//! A job's lease is a sequence of generation files, `<lake>/_tidemark/leases/<job>/<gen>.json`
//! (zero-padded, so they sort like numbers — the Delta log's trick). The newest generation is the
//! lease. It is taken by *creating* the next generation with an atomic create-if-absent
//! (`PutMode::Create`, through the object store delta-rs builds for the lake, so it works on local
//! disks and object stores alike): of two contenders for the same generation exactly one
//! succeeds, so two runs never both hold the lease.
//!
//! The newest generation is free when it is released, expired (its holder stopped renewing it:
//! the heartbeat extends `expires_at`), or held by a process of this host that no longer exists
//! (pid gone, or reused by another process). A stale lease is therefore never stuck for longer
//! than one expiry. A holder that finds a newer generation than its own has lost the lease (it
//! was stopped past its expiry and taken over) and must stop; the Delta commit conflict check
//! remains the fence for that window.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::JobsError;

/// How long a lease stays valid without a heartbeat.
pub const LEASE_TTL: Duration = Duration::from_secs(90);
/// How often the holder renews its lease.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Who holds (or held) a lease: enough to find the process and judge whether it is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub job: String,
    pub run_id: String,
    pub host: String,
    pub pid: u32,
    /// Start time of the process in clock ticks since boot (Linux), to detect a reused pid.
    #[serde(default)]
    pub pid_started: Option<u64>,
    pub started_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(default)]
    pub released: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "run {} on host {} (pid {}) holds it since {}",
            self.run_id,
            self.host,
            self.pid,
            self.started_at.to_rfc3339_opts(SecondsFormat::Secs, true)
        )
    }
}

/// The identity of this process, written into the leases it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    pub pid_started: Option<u64>,
}

impl Owner {
    /// This process.
    pub fn current() -> Self {
        let pid = std::process::id();
        Owner {
            host: hostname(),
            pid,
            pid_started: process_start(pid),
        }
    }
}

/// Why the newest lease generation may be taken over.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Held,
    Free(&'static str),
}

fn judge(holder: &Holder, now: DateTime<Utc>, me: &Owner) -> Verdict {
    if holder.released {
        return Verdict::Free("released");
    }
    if holder.expires_at <= now {
        return Verdict::Free("expired: its holder stopped renewing it");
    }
    if holder.host == me.host {
        if !process_alive(holder.pid) {
            return Verdict::Free("its process no longer exists");
        }
        if let (Some(recorded), Some(actual)) = (holder.pid_started, process_start(holder.pid)) {
            if recorded != actual {
                return Verdict::Free("its pid now belongs to another process");
            }
        }
    }
    Verdict::Held
}

/// The leases of every job of one lake.
#[derive(Debug, Clone)]
pub struct LeaseStore {
    store: Arc<dyn ObjectStore>,
    root: String,
    owner: Owner,
    ttl: Duration,
}

/// A lease this process holds. Renew it with [`Lease::heartbeat`]; give it back with
/// [`Lease::release`]. Dropping it without releasing leaves it to expire (or to the liveness
/// check, on this host).
#[derive(Debug)]
pub struct Lease {
    store: LeaseStore,
    generation: u64,
    holder: Holder,
}

/// The heartbeat found a newer generation: another run took the lease over.
#[derive(Debug, Clone)]
pub struct LeaseLost {
    pub by: Option<Holder>,
}

impl LeaseStore {
    /// The lease store under `<lake>/_tidemark/leases`.
    pub fn for_lake(lake: &str) -> Result<Self, JobsError> {
        let root = format!("{}/_tidemark/leases", lake.trim_end_matches('/'));
        let url = crate::lake::location_url(&root)?;
        let table = deltalake::DeltaTableBuilder::from_url(url)
            .and_then(|b| b.build())
            .map_err(|e| crate::lake::LakeError::delta("cannot open the lease store", &root, e))?;
        Ok(LeaseStore {
            store: table.log_store().object_store(None),
            root,
            owner: Owner::current(),
            ttl: LEASE_TTL,
        })
    }

    /// The same store acting as another process (tests use it to plant foreign leases).
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = owner;
        self
    }

    fn path(&self, job: &str, generation: u64) -> Path {
        Path::from(format!("{job}/{generation:020}.json"))
    }

    fn display(&self, path: &Path) -> String {
        format!("{}/{path}", self.root)
    }

    fn err(&self, path: &Path) -> impl FnOnce(object_store::Error) -> JobsError + '_ {
        let p = self.display(path);
        move |source| JobsError::Lease {
            path: p,
            source: Box::new(source),
        }
    }

    /// Generations of `job`'s lease, ascending.
    async fn generations(&self, job: &str) -> Result<Vec<u64>, JobsError> {
        let prefix = Path::from(job);
        let metas: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(self.err(&prefix))?;
        let mut gens: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        gens.sort_unstable();
        Ok(gens)
    }

    async fn read(&self, job: &str, generation: u64) -> Result<Option<Holder>, JobsError> {
        let path = self.path(job, generation);
        let bytes = match self.store.get(&path).await {
            Ok(r) => r.bytes().await.map_err(self.err(&path))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(&path)(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| JobsError::LeaseCorrupt {
                path: self.display(&path),
                reason: e.to_string(),
            })
    }

    async fn write(
        &self,
        job: &str,
        generation: u64,
        holder: &Holder,
        mode: PutMode,
    ) -> Result<(), object_store::Error> {
        let body = serde_json::to_vec_pretty(holder).unwrap_or_default();
        self.store
            .put_opts(
                &self.path(job, generation),
                PutPayload::from(body),
                PutOptions::from(mode),
            )
            .await
            .map(|_| ())
    }

    /// The current holder of `job`'s lease, if it is held.
    pub async fn holder(&self, job: &str, now: DateTime<Utc>) -> Result<Option<Holder>, JobsError> {
        let Some(&latest) = self.generations(job).await?.last() else {
            return Ok(None);
        };
        Ok(self
            .read(job, latest)
            .await?
            .filter(|h| judge(h, now, &self.owner) == Verdict::Held))
    }

    /// Takes `job`'s lease for `run_id`, or reports who holds it.
    pub async fn acquire(
        &self,
        job: &str,
        run_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Lease, JobsError> {
        // A lost race means another contender created the generation we wanted; one more look
        // then finds it holding the lease. Three rounds cover a holder that releases meanwhile.
        for _ in 0..3 {
            let gens = self.generations(job).await?;
            let next = match gens.last() {
                None => 1,
                Some(&latest) => match self.read(job, latest).await? {
                    // removed by a concurrent cleanup: look again
                    None => continue,
                    Some(h) => match judge(&h, now, &self.owner) {
                        Verdict::Held => {
                            return Err(JobsError::AlreadyRunning {
                                job: job.to_string(),
                                holder: Box::new(h),
                            })
                        }
                        Verdict::Free(why) => {
                            if !h.released {
                                tracing::warn!(job, stale_run = %h.run_id, host = %h.host, pid = h.pid, "taking over a stale lease ({why})");
                            }
                            latest + 1
                        }
                    },
                },
            };
            let holder = Holder {
                job: job.to_string(),
                run_id: run_id.to_string(),
                host: self.owner.host.clone(),
                pid: self.owner.pid,
                pid_started: self.owner.pid_started,
                started_at: now,
                expires_at: now + self.ttl,
                released: false,
            };
            match self.write(job, next, &holder, PutMode::Create).await {
                Ok(()) => {
                    self.clean_up(job, next).await;
                    return Ok(Lease {
                        store: self.clone(),
                        generation: next,
                        holder,
                    });
                }
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(self.err(&self.path(job, next))(e)),
            }
        }
        match self.holder(job, now).await? {
            Some(h) => Err(JobsError::AlreadyRunning {
                job: job.to_string(),
                holder: Box::new(h),
            }),
            None => Err(JobsError::LeaseCorrupt {
                path: self.display(&Path::from(job)),
                reason: "the lease changed hands three times while this run tried to take it"
                    .to_string(),
            }),
        }
    }

    /// Deletes generations older than the previous one: the newest two are kept, so a holder
    /// that was taken over can still see that it was.
    async fn clean_up(&self, job: &str, current: u64) {
        let Ok(gens) = self.generations(job).await else {
            return;
        };
        for g in gens.into_iter().filter(|g| *g + 1 < current) {
            let _ = self.store.delete(&self.path(job, g)).await;
        }
    }
}

impl Lease {
    /// The holder record written for this run.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Extends the lease, unless another run took it over meanwhile.
    pub async fn heartbeat(
        &mut self,
        now: DateTime<Utc>,
    ) -> Result<Result<(), LeaseLost>, JobsError> {
        if let Some(lost) = self.superseded().await? {
            return Ok(Err(lost));
        }
        self.holder.expires_at = now + self.store.ttl;
        let job = self.holder.job.clone();
        self.store
            .write(&job, self.generation, &self.holder, PutMode::Overwrite)
            .await
            .map_err(self.store.err(&self.store.path(&job, self.generation)))?;
        Ok(Ok(()))
    }

    async fn superseded(&self) -> Result<Option<LeaseLost>, JobsError> {
        let gens = self.store.generations(&self.holder.job).await?;
        match gens.last() {
            Some(&latest) if latest > self.generation => Ok(Some(LeaseLost {
                by: self.store.read(&self.holder.job, latest).await?,
            })),
            _ => Ok(None),
        }
    }

    /// Gives the lease back (marks this generation released), unless it was taken over.
    pub async fn release(mut self) -> Result<(), JobsError> {
        if self.superseded().await?.is_some() {
            return Ok(());
        }
        self.holder.released = true;
        let job = self.holder.job.clone();
        self.store
            .write(&job, self.generation, &self.holder, PutMode::Overwrite)
            .await
            .map_err(self.store.err(&self.store.path(&job, self.generation)))
    }
}

pub use crate::host::{hostname, process_alive};

/// Start time of a process (clock ticks since boot, field 22 of /proc/<pid>/stat); None where
/// /proc is not available.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: skip past it.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn store(dir: &std::path::Path) -> LeaseStore {
        LeaseStore::for_lake(&dir.to_string_lossy()).unwrap()
    }

    fn foreign() -> Owner {
        Owner {
            host: "elsewhere".to_string(),
            pid: 4242,
            pid_started: None,
        }
    }

    #[tokio::test]
    async fn one_holder_at_a_time_then_release() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let now = t("2027-01-01T00:00:00Z");
        let lease = s.acquire("j", "run-1", now).await.unwrap();
        let err = s.acquire("j", "run-2", now).await.unwrap_err();
        match err {
            JobsError::AlreadyRunning { holder, .. } => {
                assert_eq!(holder.run_id, "run-1");
                assert_eq!(holder.pid, std::process::id());
            }
            other => panic!("{other}"),
        }
        // another job is independent
        s.acquire("other", "run-3", now).await.unwrap();
        lease.release().await.unwrap();
        assert!(s.holder("j", now).await.unwrap().is_none());
        let again = s.acquire("j", "run-4", now).await.unwrap();
        assert!(dir
            .path()
            .join("_tidemark/leases/j/00000000000000000002.json")
            .is_file());
        assert_eq!(again.generation, 2);
    }

    #[tokio::test]
    async fn expired_foreign_lease_is_taken_over_and_the_loser_notices() {
        let dir = tempfile::tempdir().unwrap();
        let now = t("2027-01-01T00:00:00Z");
        let theirs = store(dir.path()).with_owner(foreign());
        let mut zombie = theirs.acquire("j", "old", now).await.unwrap();
        let mine = store(dir.path());
        // not expired: held, whatever the host
        assert!(matches!(
            mine.acquire("j", "new", now + chrono::TimeDelta::seconds(10))
                .await,
            Err(JobsError::AlreadyRunning { .. })
        ));
        let later = now + chrono::TimeDelta::seconds(LEASE_TTL.as_secs() as i64 + 1);
        let taken = mine.acquire("j", "new", later).await.unwrap();
        assert_eq!(taken.generation, 2);
        let lost = zombie.heartbeat(later).await.unwrap().unwrap_err();
        assert_eq!(lost.by.map(|h| h.run_id), Some("new".to_string()));
    }

    #[tokio::test]
    async fn a_dead_local_pid_frees_the_lease_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let now = t("2027-01-01T00:00:00Z");
        let mut me = Owner::current();
        me.pid = u32::MAX - 7; // no such process
        me.pid_started = None;
        store(dir.path())
            .with_owner(me)
            .acquire("j", "dead", now)
            .await
            .unwrap();
        let lease = store(dir.path()).acquire("j", "alive", now).await.unwrap();
        assert_eq!(lease.holder().run_id, "alive");
    }

    #[tokio::test]
    async fn concurrent_contenders_get_exactly_one_lease() {
        let dir = tempfile::tempdir().unwrap();
        let now = t("2027-01-01T00:00:00Z");
        let s = store(dir.path());
        let results = futures::future::join_all((0..8).map(|i| {
            let s = s.clone();
            async move { s.acquire("j", &format!("run-{i}"), now).await }
        }))
        .await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, JobsError::AlreadyRunning { .. })));
    }

    #[tokio::test]
    async fn old_generations_are_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let now = t("2027-01-01T00:00:00Z");
        let s = store(dir.path());
        for i in 0..5 {
            s.acquire("j", &format!("r{i}"), now)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        assert_eq!(s.generations("j").await.unwrap(), vec![4, 5]);
    }

    #[test]
    fn this_process_is_alive_and_has_a_start_time() {
        assert!(process_alive(std::process::id()));
        assert!(!hostname().is_empty());
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(process_start(std::process::id()).is_some());
        }
    }
}
