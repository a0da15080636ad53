//! The byte ranges of one Parquet file fetched in few requests, all at once, and kept.
//!
//! On an object store a request costs its first-byte latency whatever its size, so reading the
//! column chunks a probe needs row group by row group pays that latency once per row group.
//! [`Fetched::fetch`] merges the wanted ranges into spans (chunks of a row group closer than
//! [`GAP`], neighbouring row groups closer than [`GROUP_GAP`], up to [`SPAN`] bytes), fetches
//! the missing spans concurrently and keeps them: a later read of the same file (the mark step
//! reads whole the row groups the probe read in part) finds its bytes here.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deltalake::logstore::ObjectStoreRef;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;

/// Column chunks of one row group closer than this are fetched in one request.
pub const GAP: u64 = 1024 * 1024;
/// Neighbouring row groups' spans closer than this are fetched in one request…
pub const GROUP_GAP: u64 = 64 * 1024;
/// …while the request stays at most this large.
pub const SPAN: u64 = 8 * 1024 * 1024;
/// Requests in flight for one file.
pub const FETCHES: usize = 16;

/// Spans of one file already fetched.
#[derive(Default)]
pub struct Fetched {
    spans: Mutex<Vec<(Range<u64>, Bytes)>>,
}

/// Merges `groups` (per row group, the byte ranges wanted) into the spans to request.
pub fn spans(groups: &[Vec<Range<u64>>]) -> Vec<Range<u64>> {
    let merge = |mut rs: Vec<Range<u64>>, gap: u64, cap: u64| {
        rs.sort_by_key(|r| r.start);
        let mut out: Vec<Range<u64>> = Vec::with_capacity(rs.len());
        for r in rs {
            match out.last_mut() {
                Some(last)
                    if r.start <= last.end.saturating_add(gap)
                        && r.end.max(last.end) - last.start <= cap =>
                {
                    last.end = last.end.max(r.end)
                }
                _ => out.push(r),
            }
        }
        out
    };
    let per_group: Vec<Range<u64>> = groups
        .iter()
        .flat_map(|g| merge(g.clone(), GAP, u64::MAX))
        .collect();
    merge(per_group, GROUP_GAP, SPAN)
}

/// Bytes `wanted` of a file, from `bytes` (its bytes `span`) when the span holds all of them.
pub fn slice_of(span: &Range<u64>, bytes: &Bytes, wanted: &Range<u64>) -> Option<Bytes> {
    (span.start <= wanted.start && wanted.end <= span.end).then(|| {
        bytes.slice((wanted.start - span.start) as usize..(wanted.end - span.start) as usize)
    })
}

impl Fetched {
    fn find(&self, r: &Range<u64>) -> Option<Bytes> {
        let spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans.iter().find_map(|(s, b)| slice_of(s, b, r))
    }

    /// Fetches the spans of `groups` (see [`spans`]) that are not here yet, concurrently.
    pub async fn fetch(
        &self,
        store: &ObjectStoreRef,
        path: &Path,
        groups: &[Vec<Range<u64>>],
    ) -> object_store::Result<()> {
        let missing: Vec<Range<u64>> = spans(groups)
            .into_iter()
            .filter(|s| self.find(s).is_none())
            .collect();
        let got: Vec<(Range<u64>, Bytes)> = futures::stream::iter(missing)
            .map(|r| async move {
                Ok::<_, object_store::Error>((r.clone(), store.get_range(path, r).await?))
            })
            .buffer_unordered(FETCHES)
            .try_collect()
            .await?;
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans.extend(got);
        Ok(())
    }

    /// A Parquet reader of the file that serves what was fetched from memory (anything else
    /// from the store).
    pub fn reader(
        self: &Arc<Self>,
        store: ObjectStoreRef,
        path: Path,
        meta: Arc<ParquetMetaData>,
    ) -> FetchedReader {
        FetchedReader {
            fetched: self.clone(),
            store,
            path,
            meta,
        }
    }
}

/// See [`Fetched::reader`].
pub struct FetchedReader {
    fetched: Arc<Fetched>,
    store: ObjectStoreRef,
    path: Path,
    meta: Arc<ParquetMetaData>,
}

impl AsyncFileReader for FetchedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            if let Some(b) = self.fetched.find(&range) {
                return Ok(b);
            }
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let meta = self.meta.clone();
        async move { Ok(meta) }.boxed()
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // (one row group's ranges: a Vec of one Range)
mod tests {
    use super::*;

    #[test]
    fn chunks_of_a_row_group_merge_and_row_groups_merge_while_close_and_small() {
        // one row group, three chunks with small gaps: one span
        assert_eq!(spans(&[vec![0..10, 500..600, 20..30]]), vec![0..600]);
        // a gap over GAP inside a row group: two spans
        assert_eq!(
            spans(&[vec![0..10, 10 + GAP + 1..GAP + 20]]),
            vec![0..10, 10 + GAP + 1..GAP + 20]
        );
        // two row groups close together merge; a third far away does not
        let far = 10 * SPAN;
        assert_eq!(
            spans(&[vec![0..100], vec![150..300], vec![far..far + 5]]),
            vec![0..300, far..far + 5]
        );
        // neighbouring row groups stop merging at SPAN
        let g = SPAN / 2 + 1;
        assert_eq!(
            spans(&[vec![0..g], vec![g..2 * g], vec![2 * g..3 * g]]),
            vec![0..g, g..2 * g, 2 * g..3 * g]
        );
        assert!(spans(&[]).is_empty());
    }

    #[tokio::test]
    async fn fetched_spans_serve_later_reads_and_only_missing_spans_are_fetched() {
        let store: ObjectStoreRef = Arc::new(object_store::memory::InMemory::new());
        let path = Path::from("f.parquet");
        let data = Bytes::from((0..4000u32).map(|i| (i % 256) as u8).collect::<Vec<_>>());
        store.put(&path, data.clone().into()).await.unwrap();
        let f = Arc::new(Fetched::default());
        f.fetch(&store, &path, &[vec![100..200, 300..400]])
            .await
            .unwrap();
        assert_eq!(f.find(&(150..350)), Some(data.slice(150..350)));
        assert_eq!(f.find(&(50..150)), None);
        // the same spans again: nothing new is kept
        f.fetch(&store, &path, &[vec![120..180]]).await.unwrap();
        assert_eq!(f.spans.lock().unwrap().len(), 1);
        let mut r = f.reader(store.clone(), path.clone(), Arc::new(dummy_meta()));
        assert_eq!(r.get_bytes(110..120).await.unwrap(), data.slice(110..120));
        // outside what was fetched: read from the store
        assert_eq!(
            r.get_bytes(3000..3010).await.unwrap(),
            data.slice(3000..3010)
        );
    }

    fn dummy_meta() -> ParquetMetaData {
        use parquet::file::metadata::FileMetaData;
        use parquet::schema::types::{SchemaDescriptor, Type};
        let schema = Type::group_type_builder("s").build().unwrap();
        let descr = Arc::new(SchemaDescriptor::new(Arc::new(schema)));
        ParquetMetaData::new(FileMetaData::new(1, 0, None, None, descr, None), vec![])
    }
}
