// (get_ranges with one range: an array of one Range)
#![allow(clippy::single_range_in_vec_init)]

use std::sync::atomic::AtomicUsize;

use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::ObjectStoreExt;

use super::*;

/// Counts the reads that reach the store, per path.
#[derive(Debug, Default)]
struct Counting {
    inner: InMemory,
    reads: Mutex<HashMap<String, usize>>,
    ranged: AtomicUsize,
}

impl Counting {
    fn reads(&self, p: &str) -> usize {
        *self.reads.lock().unwrap().get(p).unwrap_or(&0)
    }
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting")
    }
}

#[async_trait]
impl ObjectStore for Counting {
    async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(l, o).await
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
        // Yield first, so that reads started together really wait on each other.
        tokio::task::yield_now().await;
        *self.reads.lock().unwrap().entry(l.to_string()).or_default() += 1;
        if o.range.is_some() {
            self.ranged.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        l: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(l)
    }
    fn list(&self, p: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(p)
    }
    async fn list_with_delimiter(&self, p: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(p).await
    }
    async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> Result<()> {
        self.inner.copy_opts(f, t, o).await
    }
}

const COMMIT: &str = "t/_delta_log/00000000000000000007.json";
const CHECKPOINT: &str = "t/_delta_log/00000000000000000005.checkpoint.parquet";
const LAST: &str = "t/_delta_log/_last_checkpoint";
const DATA: &str = "t/part-00000-1.snappy.parquet";

fn body(n: usize) -> Bytes {
    Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

async fn setup() -> (Arc<Counting>, RemoteReads) {
    let counting = Arc::new(Counting::default());
    for (p, n) in [
        (COMMIT, 300),
        (CHECKPOINT, 10_000),
        (LAST, 20),
        (DATA, 5_000),
    ] {
        counting.put(&Path::from(p), body(n).into()).await.unwrap();
    }
    let cache = RemoteReads::new(counting.clone());
    (counting, cache)
}

fn ranged(r: GetRange) -> GetOptions {
    GetOptions {
        range: Some(r),
        ..Default::default()
    }
}

#[test]
fn immutable_log_files_are_told_apart() {
    for p in [
        "_delta_log/00000000000000000000.json",
        "a/b/_delta_log/00000000000000000012.json",
        "t/_delta_log/00000000000000000010.checkpoint.parquet",
        "t/_delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet",
        "t/_delta_log/00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json",
        "t/_delta_log/00000000000000000010.crc",
        "t/_delta_log/00000000000000000004.00000000000000000009.compacted.json",
        "t/_delta_log/_sidecars/016ae953-37a9-438e-8683-9a9a4a79a395.parquet",
    ] {
        assert!(is_immutable_log_file(&Path::from(p)), "{p}");
    }
    for p in [
        "t/_delta_log/_last_checkpoint",
        "t/part-00000-1.snappy.parquet",
        "t/00000000000000000000.json",
        "t/_delta_log/0000000000000000000.json",
        "t/_delta_log/00000000000000000000.json.tmp",
        "t/_delta_log/.00000000000000000000.json.crc",
        "t/_delta_log/_staged_commits/00000000000000000001.x.json",
        "t/_delta_log/00000000000000000001.compacted.json",
        "t/deletion_vector_1.bin",
    ] {
        assert!(!is_immutable_log_file(&Path::from(p)), "{p}");
    }
}

#[tokio::test]
async fn a_commit_is_read_from_the_store_once() {
    let (counting, cache) = setup().await;
    let p = Path::from(COMMIT);
    for _ in 0..3 {
        let got = cache.get(&p).await.unwrap();
        assert_eq!(got.meta.size, 300);
        assert_eq!(got.bytes().await.unwrap(), body(300));
    }
    assert_eq!(cache.head(&p).await.unwrap().size, 300);
    let part = cache.get_range(&p, 10..20).await.unwrap();
    assert_eq!(part, body(300).slice(10..20));
    assert_eq!(counting.reads(COMMIT), 1);
}

#[tokio::test]
async fn a_listed_checkpoint_is_fetched_whole_and_its_ranges_served_from_memory() {
    let (counting, cache) = setup().await;
    let listed: Vec<ObjectMeta> = cache
        .list(Some(&Path::from("t/_delta_log")))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), 3);
    let p = Path::from(CHECKPOINT);
    let all = body(10_000);
    let suffix = cache
        .get_opts(&p, ranged(GetRange::Suffix(8)))
        .await
        .unwrap();
    assert_eq!(suffix.range, 9_992..10_000);
    assert_eq!(suffix.bytes().await.unwrap(), all.slice(9_992..));
    let offset = cache
        .get_opts(&p, ranged(GetRange::Offset(9_000)))
        .await
        .unwrap();
    assert_eq!(offset.bytes().await.unwrap(), all.slice(9_000..));
    // a bounded range past the end is cut at the end, as a store does
    let past = cache.get_range(&p, 9_990..20_000).await.unwrap();
    assert_eq!(past, all.slice(9_990..));
    let ranges = cache
        .get_ranges(&p, &[0..4, 100..200, 5_000..5_001])
        .await
        .unwrap();
    assert_eq!(
        ranges,
        vec![
            all.slice(0..4),
            all.slice(100..200),
            all.slice(5_000..5_001)
        ]
    );
    assert_eq!(counting.reads(CHECKPOINT), 1);
    assert_eq!(
        counting.ranged.load(Ordering::Relaxed),
        0,
        "fetched whole, not by range"
    );
    // a range that starts past the end is an error, as from the store
    assert!(cache.get_range(&p, 20_000..20_010).await.is_err());
}

#[tokio::test]
async fn an_unlisted_file_read_by_range_goes_to_the_store() {
    let (counting, cache) = setup().await;
    let p = Path::from(CHECKPOINT);
    for _ in 0..2 {
        let r = cache.get_range(&p, 0..4).await.unwrap();
        assert_eq!(r, body(10_000).slice(0..4));
    }
    assert_eq!(counting.reads(CHECKPOINT), 2);
    assert_eq!(counting.ranged.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn mutable_and_data_files_always_go_to_the_store() {
    let (counting, cache) = setup().await;
    for _ in 0..2 {
        cache.get(&Path::from(LAST)).await.unwrap();
        cache.get(&Path::from(DATA)).await.unwrap();
    }
    assert_eq!(counting.reads(LAST), 2);
    assert_eq!(counting.reads(DATA), 2);
    // `_last_checkpoint` rewritten: the new content is read
    counting
        .put(&Path::from(LAST), body(30).into())
        .await
        .unwrap();
    assert_eq!(cache.get(&Path::from(LAST)).await.unwrap().meta.size, 30);
}

#[tokio::test]
async fn conditional_reads_go_to_the_store() {
    let (counting, cache) = setup().await;
    let p = Path::from(COMMIT);
    cache.get(&p).await.unwrap();
    let o = GetOptions {
        if_none_match: Some("*".to_string()),
        ..Default::default()
    };
    let _ = cache.get_opts(&p, o).await;
    assert_eq!(counting.reads(COMMIT), 2);
}

#[tokio::test]
async fn reads_started_together_share_one_request() {
    let (counting, cache) = setup().await;
    let cache = Arc::new(cache);
    let p = Path::from(COMMIT);
    let reads = (0..8).map(|_| {
        let (cache, p) = (cache.clone(), p.clone());
        tokio::spawn(async move { cache.get(&p).await.unwrap().bytes().await.unwrap() })
    });
    for r in futures::future::join_all(reads).await {
        assert_eq!(r.unwrap(), body(300));
    }
    assert_eq!(counting.reads(COMMIT), 1);
}

#[tokio::test]
async fn a_missing_file_is_not_remembered() {
    let (counting, cache) = setup().await;
    let p = Path::from("t/_delta_log/00000000000000000008.json");
    let missing = cache.get(&p).await;
    assert!(matches!(missing, Err(object_store::Error::NotFound { .. })));
    counting.put(&p, body(40).into()).await.unwrap();
    assert_eq!(
        cache.get(&p).await.unwrap().bytes().await.unwrap(),
        body(40)
    );
    assert_eq!(counting.reads(p.as_ref()), 2);
}

#[tokio::test]
async fn files_past_the_budget_are_read_from_the_store() {
    let (counting, cache) = setup().await;
    cache.left.store(500, Ordering::Relaxed);
    let commit = Path::from(COMMIT);
    cache.get(&commit).await.unwrap(); // 300 bytes: kept, 200 left
    let listed: Vec<ObjectMeta> = cache
        .list(Some(&Path::from("t/_delta_log")))
        .try_collect()
        .await
        .unwrap();
    assert!(!listed.is_empty());
    let cp = Path::from(CHECKPOINT); // 10,000 bytes: over what is left
    for _ in 0..2 {
        assert_eq!(
            cache.get_range(&cp, 0..4).await.unwrap(),
            body(10_000).slice(0..4)
        );
        assert_eq!(cache.get(&cp).await.unwrap().meta.size, 10_000);
    }
    cache.get(&commit).await.unwrap();
    assert_eq!(counting.reads(COMMIT), 1);
    assert_eq!(counting.reads(CHECKPOINT), 4);
}

#[tokio::test]
async fn a_data_files_footer_length_read_fetches_its_tail_and_the_footer_reads_after_it_are_served()
{
    let (counting, cache) = setup().await;
    let big = "t/part-00001-2.snappy.parquet";
    let n = 200_000u64;
    counting
        .put(&Path::from(big), body(n as usize).into())
        .await
        .unwrap();
    let p = Path::from(big);
    let all = body(n as usize);
    // the footer's length and magic: the last 8 bytes
    let tail = cache.get_range(&p, n - 8..n).await.unwrap();
    assert_eq!(tail, all.slice((n - 8) as usize..));
    // then the footer and the page index before it, inside the last WINDOW bytes
    let footer = cache.get_range(&p, n - 12_000..n - 8).await.unwrap();
    assert_eq!(footer, all.slice((n - 12_000) as usize..(n - 8) as usize));
    let both = cache
        .get_ranges(&p, &[n - 20_000..n - 19_000, n - 100..n - 50])
        .await
        .unwrap();
    assert_eq!(
        both,
        vec![
            all.slice((n - 20_000) as usize..(n - 19_000) as usize),
            all.slice((n - 100) as usize..(n - 50) as usize)
        ]
    );
    assert_eq!(counting.reads(big), 1, "one request for the tail");
    // data outside the tail goes to the store
    assert_eq!(cache.get_range(&p, 0..10).await.unwrap(), all.slice(0..10));
    assert_eq!(counting.reads(big), 2);
    // a suffix read of 8 bytes, and a file smaller than the window
    let small = Path::from(DATA);
    let got = cache
        .get_opts(&small, ranged(GetRange::Suffix(8)))
        .await
        .unwrap();
    assert_eq!(got.range, 4_992..5_000);
    assert_eq!(got.meta.size, 5_000);
    assert_eq!(got.bytes().await.unwrap(), body(5_000).slice(4_992..));
    assert_eq!(
        cache.get_range(&small, 0..4).await.unwrap(),
        body(5_000).slice(0..4)
    );
    assert_eq!(counting.reads(DATA), 1);
}

#[tokio::test]
async fn only_the_last_tails_are_kept() {
    let (counting, cache) = setup().await;
    let paths: Vec<String> = (0..footers::KEPT + 1)
        .map(|i| format!("t/part-{i:05}-x.snappy.parquet"))
        .collect();
    for p in &paths {
        counting
            .put(&Path::from(p.as_str()), body(100).into())
            .await
            .unwrap();
        cache
            .get_range(&Path::from(p.as_str()), 92..100)
            .await
            .unwrap();
    }
    // the first tail was dropped: its footer read goes to the store again
    cache
        .get_range(&Path::from(paths[0].as_str()), 0..50)
        .await
        .unwrap();
    cache
        .get_range(&Path::from(paths[1].as_str()), 0..50)
        .await
        .unwrap();
    assert_eq!(counting.reads(&paths[0]), 2);
    assert_eq!(counting.reads(&paths[1]), 1);
}

#[tokio::test]
async fn a_footer_read_through_get_ranges_fetches_the_tail_too() {
    let (counting, cache) = setup().await;
    let p = Path::from(DATA);
    let all = body(5_000);
    let tail = cache.get_ranges(&p, &[4_992..5_000]).await.unwrap();
    assert_eq!(tail, vec![all.slice(4_992..)]);
    let footer = cache.get_ranges(&p, &[4_000..4_992]).await.unwrap();
    assert_eq!(footer, vec![all.slice(4_000..4_992)]);
    assert_eq!(counting.reads(DATA), 1);
}
