//! How tidemark reads from an object store: each immutable Delta log file once, whole, and a
//! Parquet data file's footer in one request (`footers.rs`).
//!
//! Opening a table makes the kernel read its log twice (protocol and metadata first, then the
//! file actions), each commit file and each checkpoint again, and a checkpoint's Parquet one
//! range at a time (footer, then column chunk after column chunk). On local disk that costs
//! nothing; on an object store every read is a request with its own first-byte latency (tens of
//! milliseconds), one after another. This wrapper sits under every table tidemark opens on an
//! object store (see `lake::open::builder`): the first read of an immutable log file — a commit (`<version>.json`), a
//! checkpoint or its parts and sidecars, a `.crc`, a compacted log file — fetches the whole
//! object in one request, and every later read of it (whole, ranged or `head`) is served from
//! memory. Reads that wait for the same file share its one request.
//!
//! Only files that the Delta protocol never rewrites are kept: `_last_checkpoint` and data files
//! always go to the store. A file is fetched whole when it is a whole-object read, or when a
//! listing told its size and it is at most [`MAX_OBJECT`]; anything larger, or past the
//! store's [`BUDGET`], is read from the store as asked. Conditional or versioned reads go to
//! the store. A failed read is not kept, so the next one asks again. One `RemoteReads` lives as
//! long as the table handle it was opened for (a run), so a table deleted and created again
//! at the same place is never answered from an earlier run's reads.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, RenameOptions, Result,
};
use tokio::sync::OnceCell;

mod footers;
use footers::Footers;

/// The largest log file fetched whole on a ranged read (a checkpoint of ~100k files).
pub const MAX_OBJECT: u64 = 64 * 1024 * 1024;
/// How many bytes of log files one store keeps, at most.
pub const BUDGET: u64 = 256 * 1024 * 1024;

#[derive(Clone)]
struct Cached {
    meta: ObjectMeta,
    bytes: Bytes,
    attributes: Attributes,
}

/// Wraps an object store; see the module docs.
pub struct RemoteReads {
    inner: Arc<dyn ObjectStore>,
    /// Sizes of log files seen in listings (the kernel lists the log before it reads it).
    listed: Arc<Mutex<HashMap<Path, u64>>>,
    files: Mutex<HashMap<Path, Arc<OnceCell<Cached>>>>,
    left: AtomicU64,
    footers: Footers,
}

impl RemoteReads {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        RemoteReads {
            inner,
            footers: Footers::default(),
            listed: Arc::default(),
            files: Mutex::default(),
            left: AtomicU64::new(BUDGET),
        }
    }

    fn cell(&self, location: &Path) -> Arc<OnceCell<Cached>> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.entry(location.clone()).or_default().clone()
    }

    fn listed_size(&self, location: &Path) -> Option<u64> {
        let listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed.get(location).copied()
    }

    /// The whole file, from memory or fetched once; `None` when it is not to be fetched whole
    /// (larger than [`MAX_OBJECT`] or the budget left, or of unknown size on a ranged read).
    async fn whole(&self, location: &Path, whole_read: bool) -> Result<Option<Cached>> {
        let cell = self.cell(location);
        if let Some(c) = cell.get() {
            return Ok(Some(c.clone()));
        }
        match self.listed_size(location) {
            Some(n) if n > MAX_OBJECT || n > self.left.load(Ordering::Relaxed) => return Ok(None),
            None if !whole_read => return Ok(None),
            _ => {}
        }
        let cached = cell
            .get_or_try_init(|| async {
                let got = self.inner.get_opts(location, GetOptions::default()).await?;
                let (meta, attributes) = (got.meta.clone(), got.attributes.clone());
                let bytes = got.bytes().await?;
                let n = bytes.len() as u64;
                let kept = n <= MAX_OBJECT
                    && self
                        .left
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(n))
                        .is_ok();
                if !kept {
                    // Read whole because the caller asked for all of it, but not kept: the
                    // next read asks the store again.
                    let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
                    files.remove(location);
                }
                Ok::<_, object_store::Error>(Cached {
                    meta,
                    bytes,
                    attributes,
                })
            })
            .await?;
        Ok(Some(cached.clone()))
    }

    fn remember_listed(
        &self,
        stream: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let listed = self.listed.clone();
        stream
            .inspect(move |m| {
                if let Ok(m) = m {
                    if is_immutable_log_file(&m.location) {
                        let mut l = listed.lock().unwrap_or_else(|e| e.into_inner());
                        l.insert(m.location.clone(), m.size);
                    }
                }
            })
            .boxed()
    }
}

/// A file the Delta protocol writes once and never changes: commits, checkpoints (classic,
/// multi-part, V2 and their sidecars), checksums and compacted log files. `_last_checkpoint`
/// is rewritten and is not one of them.
pub fn is_immutable_log_file(location: &Path) -> bool {
    let p = location.as_ref();
    let Some((dir, name)) = p.rsplit_once('/') else {
        return false;
    };
    if dir.ends_with("_delta_log/_sidecars") {
        return name.ends_with(".parquet");
    }
    if !(dir == "_delta_log" || dir.ends_with("/_delta_log")) {
        return false;
    }
    let digits = name.bytes().take_while(u8::is_ascii_digit).count();
    if digits != 20 {
        return false;
    }
    let rest = &name[digits..];
    rest == ".json"
        || rest == ".crc"
        || (rest.starts_with(".checkpoint.")
            && (rest.ends_with(".parquet") || rest.ends_with(".json")))
        || (rest.ends_with(".compacted.json") && rest.len() > ".compacted.json".len())
}

fn has_conditions(o: &GetOptions) -> bool {
    o.if_match.is_some()
        || o.if_none_match.is_some()
        || o.if_modified_since.is_some()
        || o.if_unmodified_since.is_some()
        || o.version.is_some()
}

fn range_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> object_store::Error {
    object_store::Error::Generic {
        store: "RemoteReads",
        source: Box::new(e),
    }
}

fn serve(c: Cached, options: &GetOptions) -> Result<GetResult> {
    let len = c.bytes.len() as u64;
    if options.head {
        return Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::empty().boxed()),
            meta: c.meta,
            range: 0..0,
            attributes: c.attributes,
        });
    }
    let range = match &options.range {
        Some(r) => r.as_range(len).map_err(range_error)?,
        None => 0..len,
    };
    let body = c.bytes.slice(range.start as usize..range.end as usize);
    Ok(result(c.meta, c.attributes, range, body))
}

/// A read answered from memory: `body` is the object's bytes `range`.
fn result(meta: ObjectMeta, attributes: Attributes, range: Range<u64>, body: Bytes) -> GetResult {
    GetResult {
        payload: GetResultPayload::Stream(futures::stream::once(async move { Ok(body) }).boxed()),
        meta,
        range,
        attributes,
    }
}

impl fmt::Debug for RemoteReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteReads({:?})", self.inner)
    }
}

impl fmt::Display for RemoteReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteReads({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for RemoteReads {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if has_conditions(&options) {
            return self.inner.get_opts(location, options).await;
        }
        if footers::is_data_file(location) {
            if let Some(got) = self.footers.serve(location, &options) {
                return Ok(got);
            }
            let Some(wide) = footers::widened(&options) else {
                return self.inner.get_opts(location, options).await;
            };
            let asked = options.range.clone().unwrap_or(wide.clone());
            let got = self
                .inner
                .get_opts(
                    location,
                    GetOptions {
                        range: Some(wide),
                        ..options
                    },
                )
                .await?;
            return self.footers.keep(location, &asked, got).await;
        }
        if !is_immutable_log_file(location) {
            return self.inner.get_opts(location, options).await;
        }
        let whole_read = options.range.is_none() && !options.head;
        match self.whole(location, whole_read).await? {
            Some(c) => serve(c, &options),
            None => self.inner.get_opts(location, options).await,
        }
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if footers::is_data_file(location) {
            let kept: Option<Vec<Bytes>> = ranges
                .iter()
                .map(|r| self.footers.find(location, r).map(|(b, _, _)| b))
                .collect();
            if let Some(kept) = kept {
                return Ok(kept);
            }
            // (DataFusion reads a footer through `get_ranges`, one range at a time)
            if let [r] = ranges {
                let options = GetOptions {
                    range: Some(GetRange::Bounded(r.clone())),
                    ..Default::default()
                };
                return Ok(vec![self.get_opts(location, options).await?.bytes().await?]);
            }
        }
        if !is_immutable_log_file(location) {
            return self.inner.get_ranges(location, ranges).await;
        }
        let Some(c) = self.whole(location, false).await? else {
            return self.inner.get_ranges(location, ranges).await;
        };
        let len = c.bytes.len() as u64;
        ranges
            .iter()
            .map(|r| {
                let r = GetRange::Bounded(r.clone())
                    .as_range(len)
                    .map_err(range_error)?;
                Ok(c.bytes.slice(r.start as usize..r.end as usize))
            })
            .collect()
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.remember_listed(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.remember_listed(self.inner.list_with_offset(prefix, offset))
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

#[cfg(test)]
mod tests;
