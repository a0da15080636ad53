//! An object store that stops at storage failpoints (only with the `failpoints` feature).
//!
//! Crashes inside delta-rs cannot be reached by the run's own failpoints: "while data files are
//! written" and "after the data files, before the commit" happen inside a MERGE or WRITE. This
//! wrapper sits under every table tidemark opens and fires `store.put_data` before each data
//! file and `store.put_commit` before each `_delta_log` commit file, and `store.get_data` before
//! each read of a data file. With the `enospc` / `eacces` actions the store fails the way a local
//! disk does: the OS error (`No space left on device`, `Permission denied`) under a generic store
//! error, as `object_store`'s `LocalFileSystem` reports it.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Wraps the real store; see the module docs.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultyStore { inner }
    }

    fn check(location: &Path) -> Result<()> {
        let p = location.as_ref();
        let point = if p.contains("_delta_log/") && p.ends_with(".json") {
            "store.put_commit"
        } else if is_data_file(p) {
            "store.put_data"
        } else {
            return Ok(());
        };
        crate::failpoint::hit(point).map_err(store_error)
    }

    fn check_read(location: &Path) -> Result<()> {
        if !is_data_file(location.as_ref()) {
            return Ok(());
        }
        crate::failpoint::hit("store.get_data").map_err(store_error)
    }
}

fn is_data_file(path: &str) -> bool {
    path.ends_with(".parquet") && !path.contains("_delta_log/")
}

/// The store error an injected fault stands for: the OS error itself for a full disk or a
/// denied permission (what `LocalFileSystem` wraps), the injected error otherwise.
fn store_error(e: crate::failpoint::Injected) -> object_store::Error {
    let source: Box<dyn std::error::Error + Send + Sync> = match e.io_error() {
        Some(io) => Box::new(io),
        None => Box::new(e),
    };
    object_store::Error::Generic {
        store: "FaultyStore",
        source,
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        Self::check(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Self::check(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        Self::check_read(location)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        Self::check_read(location)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// DataFusion reads local data files through the session's `file://` store, not the table's:
/// when failpoints are armed the faulty store replaces it there too, so `store.get_data` also
/// stops scans.
pub fn register_for_scans(env: &datafusion::execution::runtime_env::RuntimeEnv) {
    if let Ok(url) = url::Url::parse("file:///") {
        if let Some(store) = store_for(&url) {
            env.register_object_store(&url, store);
        }
    }
}

/// The store to use under a table at `url`: the faulty wrapper for local tables when
/// failpoints are armed, otherwise none (delta-rs picks its own).
pub fn store_for(url: &url::Url) -> Option<Arc<dyn ObjectStore>> {
    if url.scheme() != "file" || std::env::var(crate::failpoint::ENV).is_err() {
        return None;
    }
    Some(Arc::new(FaultyStore::new(Arc::new(
        object_store::local::LocalFileSystem::new(),
    ))))
}
