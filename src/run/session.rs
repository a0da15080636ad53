//! The compute a run gets: DataFusion session settings, a memory pool with spill files, and
//! (for job clusters) a tokio runtime with a bounded number of worker threads.
//!
//! `tidemark run` uses [`Engine::default`]: every core, no memory limit, spills to the OS temp
//! directory. A bundle's `job_clusters` build an [`Engine`] with [`Engine::new`] from its
//! [`Compute`]: `worker_threads` bound the runtime the job's tasks run on and DataFusion's
//! `target_partitions`; `memory_limit` is a [`FairSpillPool`], so sorts and joins over the limit
//! spill to `spill_directory` instead of growing until the process is killed.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::disk_manager::{DiskManager, DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::spill_file::{SpillFile, TempFileFactory};
use datafusion::prelude::SessionContext;
use deltalake::delta_datafusion::DeltaSessionContext;

use crate::config::bundle::Compute;

use super::spill::SpillDir;
pub use super::spill::{default_base as default_spill_base, sweep as sweep_spill_dirs};

/// Why the compute of a job cluster cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The spill directory cannot be created or used.
    #[error("cannot use spill directory {path}: {source}; create it or point `spill_directory` at a writable local directory")]
    SpillDirectory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// DataFusion refused the runtime settings.
    #[error("cannot set up the query runtime: {0}")]
    Runtime(#[source] Box<DataFusionError>),
    /// The worker thread pool could not start.
    #[error("cannot start {threads} worker threads: {source}")]
    Threads {
        threads: usize,
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::Classify for EngineError {
    fn class(&self) -> crate::error::ErrorClass {
        crate::error::ErrorClass::Io
    }
}

/// The memory pool's share each DataFusion partition needs before a run uses more than one
/// (see [`Engine::partitions`]): a pool under twice this runs one partition.
pub const MEMORY_PER_PARTITION: usize = 128 << 20;

/// Compute settings a run honours.
#[derive(Debug, Clone)]
pub struct Engine {
    /// DataFusion partitions (and so the parallelism of scans and sorts).
    pub target_partitions: usize,
    runtime_env: Arc<RuntimeEnv>,
    spill: Arc<SpillCounter>,
    threads: Option<Arc<OwnedRuntime>>,
    /// This engine's own directory under the spill directory (none without spilling set up).
    spill_dir: Option<Arc<SpillDir>>,
}

impl Default for Engine {
    fn default() -> Self {
        let counter = Arc::new(SpillCounter::default());
        let runtime_env = RuntimeEnvBuilder::new()
            .build_arc()
            .unwrap_or_else(|_| Arc::new(RuntimeEnv::default()));
        Engine {
            target_partitions: cores(),
            runtime_env,
            spill: counter,
            threads: None,
            spill_dir: None,
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

impl Engine {
    /// An engine for a job cluster's compute. With `worker_threads` it owns a runtime of that
    /// many threads, on which [`Engine::spawn`] runs the tasks.
    pub fn new(compute: &Compute) -> Result<Self, EngineError> {
        let mut builder = RuntimeEnvBuilder::new();
        if let Some(bytes) = compute.memory_limit {
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            builder = builder.with_memory_pool(Arc::new(FairSpillPool::new(bytes)));
        }
        let base = compute
            .spill_directory
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let spill_dir = SpillDir::create(&base).map_err(|source| EngineError::SpillDirectory {
            path: base.clone(),
            source,
        })?;
        let mode = DiskManagerMode::Directories(vec![spill_dir.path().to_path_buf()]);
        let inner = DiskManagerBuilder::default()
            .with_mode(mode)
            .build()
            .map_err(|e| match e {
                DataFusionError::IoError(source) => EngineError::SpillDirectory {
                    path: base.clone(),
                    source,
                },
                e => EngineError::Runtime(Box::new(e)),
            })?;
        let counter = Arc::new(SpillCounter {
            inner: Some(Arc::new(inner)),
            created: AtomicU64::new(0),
        });
        builder = builder.with_disk_manager_builder(
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Custom(counter.clone())),
        );
        let runtime_env = builder
            .build_arc()
            .map_err(|e| EngineError::Runtime(Box::new(e)))?;
        let threads = match compute.worker_threads {
            Some(n) => Some(Arc::new(OwnedRuntime(Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n)
                    .thread_name("tidemark-worker")
                    .enable_all()
                    .build()
                    .map_err(|source| EngineError::Threads { threads: n, source })?,
            )))),
            None => None,
        };
        Ok(Engine {
            target_partitions: compute.worker_threads.unwrap_or_else(cores),
            runtime_env,
            spill: counter,
            threads,
            spill_dir: Some(Arc::new(spill_dir)),
        })
    }

    /// A fresh session with these settings, on delta-rs' defaults (its query planner is
    /// needed for streamed writes, and identifiers stay case-sensitive).
    pub fn context(&self) -> SessionContext {
        let ctx = DeltaSessionContext::with_runtime_env(self.runtime_env.clone()).into_inner();
        #[cfg(feature = "failpoints")]
        crate::lake::faulty::register_for_scans(ctx.runtime_env().as_ref());
        let state = ctx.state();
        let partitions = self.partitions();
        let mut config = state.config().clone().with_target_partitions(partitions);
        // Each sort reserves this much up front for merging its spilled runs (10 MB by
        // default): under a small pool shared by several partitions that reservation alone
        // would exhaust it, so it is scaled to a quarter of each partition's share.
        if let datafusion::execution::memory_pool::MemoryLimit::Finite(limit) =
            self.runtime_env.memory_pool.memory_limit()
        {
            let share = limit / partitions / 4;
            let reservation = config.options().execution.sort_spill_reservation_bytes;
            config.options_mut().execution.sort_spill_reservation_bytes =
                reservation.min(share.max(1 << 20));
        }
        // Spill files LZ4-compressed: a 10M full reload spills its sorted runs (~4 GB raw);
        // copying them into the page cache cost more than compressing them (measured: 29.2 s ->
        // 26.9 s, 12 -> 3 s of system time, 522 -> 450 MB RSS).
        config.options_mut().execution.spill_compression =
            datafusion::common::config::SpillCompression::Lz4Frame;
        let state = crate::lake::session::guarded(
            SessionStateBuilder::new_from_existing(state).with_config(config),
        )
        .build();
        SessionContext::new_with_state(state)
    }

    /// Spill files created through this engine so far (a job reports the difference per task).
    pub fn spill_files(&self) -> u64 {
        self.spill.created.load(Ordering::Relaxed)
    }

    /// DataFusion's partitions: the engine's threads, but no more than the memory pool gives
    /// `MEMORY_PER_PARTITION` each. Under a small pool, several partitions each sorting (and
    /// spilling) their share, plus the merge of their outputs, ran out of memory where one
    /// partition streams through (measured: 272k–544k generated rows failed with 2 partitions in
    /// 16 and 64 MiB; one partition in 16 MiB, and 2 in 128 MiB, succeeded).
    pub fn partitions(&self) -> usize {
        let threads = self.target_partitions.max(1);
        match self.runtime_env.memory_pool.memory_limit() {
            datafusion::execution::memory_pool::MemoryLimit::Finite(limit) => {
                threads.min((limit / MEMORY_PER_PARTITION).max(1))
            }
            _ => threads,
        }
    }

    /// Removes this engine's spill directory and the spill files still in it. Call it when no
    /// more work will run on the engine (the run or job run ended, however it ended); dropping
    /// the last clone of the engine does the same.
    pub fn remove_spill_dir(&self) {
        if let Some(dir) = &self.spill_dir {
            dir.remove();
        }
    }

    /// Runs `future` on this engine's worker threads (on the caller's runtime when the engine
    /// has none). Aborting the handle cancels the work.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.threads.as_ref().and_then(|t| t.0.as_ref()) {
            Some(rt) => rt.spawn(future),
            None => tokio::spawn(future),
        }
    }
}

/// A tokio runtime that may be dropped from async code (it shuts down in the background).
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Counts spill files while delegating to DataFusion's directory-based disk manager.
#[derive(Debug, Default)]
struct SpillCounter {
    inner: Option<Arc<DiskManager>>,
    created: AtomicU64,
}

impl TempFileFactory for SpillCounter {
    fn create_temp_file(&self, description: &str) -> datafusion::error::Result<Arc<dyn SpillFile>> {
        let inner = self.inner.as_ref().ok_or_else(|| {
            DataFusionError::ResourcesExhausted(format!(
                "memory exhausted while {description} and spilling is not set up"
            ))
        })?;
        self.created.fetch_add(1, Ordering::Relaxed);
        let file = inner.create_tmp_file(description)?;
        #[cfg(feature = "failpoints")]
        if std::env::var(crate::failpoint::ENV).is_ok() {
            return Ok(Arc::new(faulty_spill::FaultySpillFile(file)));
        }
        Ok(file)
    }
}

/// Spill files whose writes stop at the `spill.write` failpoint (failpoints builds only): with
/// `enospc` a write fails as on a full disk, the way DataFusion's own spill writer would.
#[cfg(feature = "failpoints")]
mod faulty_spill {
    use std::sync::Arc;

    use datafusion::execution::spill_file::{SpillFile, SpillWriter};

    pub struct FaultySpillFile(pub Arc<dyn SpillFile>);

    impl SpillFile for FaultySpillFile {
        fn path(&self) -> Option<&std::path::Path> {
            self.0.path()
        }

        fn size(&self) -> Option<u64> {
            self.0.size()
        }

        fn read_stream(
            &self,
        ) -> datafusion::error::Result<
            std::pin::Pin<
                Box<dyn futures::Stream<Item = datafusion::error::Result<bytes::Bytes>> + Send>,
            >,
        > {
            self.0.read_stream()
        }

        fn open_writer(&self) -> datafusion::error::Result<Box<dyn SpillWriter>> {
            Ok(Box::new(FaultyWriter(self.0.open_writer()?)))
        }
    }

    struct FaultyWriter(Box<dyn SpillWriter>);

    impl std::io::Write for FaultyWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Err(e) = crate::failpoint::hit("spill.write") {
                return Err(e
                    .io_error()
                    .unwrap_or_else(|| std::io::Error::other(e.to_string())));
            }
            self.0.write(buf)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }

    impl SpillWriter for FaultyWriter {
        fn finish(&mut self) -> datafusion::error::Result<()> {
            self.0.finish()
        }
    }
}

/// A Delta table as a DataFrame of `ctx`, its store registered there first (so scans of its
/// files resolve, on S3 too). Errors name `uri` and `phase`.
pub(crate) async fn frame(
    ctx: &datafusion::prelude::SessionContext,
    table: &deltalake::DeltaTable,
    uri: &str,
    phase: super::Phase,
) -> Result<datafusion::prelude::DataFrame, super::RunError> {
    use super::RunError;
    table
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(phase, uri))?;
    let provider = table
        .table_provider()
        .await
        .map_err(RunError::scan(phase, uri))?;
    ctx.read_table(provider).map_err(RunError::query(phase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn compute_sets_partitions_pool_and_spill_directory() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("spill");
        let engine = Engine::new(&Compute {
            worker_threads: Some(2),
            memory_limit: Some(64 << 20),
            spill_directory: Some(spill.clone()),
        })
        .unwrap();
        assert!(spill.is_dir(), "the spill directory is created");
        let ctx = engine.context();
        // 64 MiB is less than two partitions' share: one partition streams through it
        assert_eq!(ctx.state().config().target_partitions(), 1);
        let roomy = Engine::new(&Compute {
            worker_threads: Some(2),
            memory_limit: Some(256 << 20),
            spill_directory: Some(spill.clone()),
        })
        .unwrap();
        assert_eq!(roomy.context().state().config().target_partitions(), 2);
        assert!(matches!(
            ctx.runtime_env().memory_pool.memory_limit(),
            datafusion::execution::memory_pool::MemoryLimit::Finite(n) if n == 64 << 20
        ));
        // delta-rs' settings are kept
        assert!(
            !ctx.state()
                .config()
                .options()
                .sql_parser
                .enable_ident_normalization
        );
        // the engine's own threads run spawned work, and can be dropped inside async code
        let name = engine
            .spawn(async { std::thread::current().name().map(str::to_string) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("tidemark-worker"));
        drop(engine);
    }

    #[test]
    fn default_engine_uses_every_core() {
        assert_eq!(
            Engine::default()
                .context()
                .state()
                .config()
                .target_partitions(),
            cores()
        );
    }
}
