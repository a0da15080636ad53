//! The landing location: a local folder or an object-store prefix, listed with a glob.
//!
//! Files and folders whose name starts with `.` or `_` are skipped (temporary files a producer
//! is still writing, markers like `_SUCCESS`, a generator's state), as Auto Loader does.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::IngestError;

/// One landing file as listed.
#[derive(Debug, Clone)]
pub struct LandingFile {
    /// Path relative to the landing root (`events/2024-01-05T10.jsonl`): the file's identity in
    /// the ingest record.
    pub rel: String,
    /// Full URI, as stored in `_source_file`.
    pub uri: String,
    pub size: u64,
    pub modified: DateTime<Utc>,
    /// What the ingest record keeps to tell a changed file: a hash of the size and the
    /// modification time (local) or the ETag (object stores).
    pub fingerprint: i64,
    /// A hash of its contents (as read: decompressed), once a run read it.
    pub content: Option<i64>,
    location: Location,
}

/// Where a landing file is read from.
#[derive(Debug, Clone)]
enum Location {
    Local(std::path::PathBuf),
    Store(Arc<dyn ObjectStore>, StorePath),
}

/// Where the landing files are listed from.
enum Source {
    /// A local folder: listed and read with the file system directly.
    Local(std::path::PathBuf),
    /// An object-store prefix.
    Store {
        store: Arc<dyn ObjectStore>,
        prefix: Option<StorePath>,
    },
}

/// A landing location, ready to list and read.
pub struct Landing {
    source: Source,
    /// The root as written in `_source_file` values, without a trailing `/`.
    pub root_uri: String,
}

impl Landing {
    /// The landing location at `uri` (a local path, `file://`, or `s3://bucket/prefix`).
    pub fn open(uri: &str, pipeline: &str) -> Result<Landing, IngestError> {
        let bad = |reason: String| IngestError::LandingUri {
            uri: uri.to_string(),
            reason,
        };
        match uri.split_once("://") {
            None | Some(("file", _)) => {
                let path = uri.strip_prefix("file://").unwrap_or(uri);
                let abs = std::path::absolute(path).map_err(|e| bad(e.to_string()))?;
                if !abs.is_dir() {
                    return Err(IngestError::LandingMissing {
                        uri: abs.display().to_string(),
                        pipeline: pipeline.to_string(),
                    });
                }
                let root = format!("file://{}", abs.display());
                Ok(Landing {
                    source: Source::Local(abs),
                    root_uri: root.trim_end_matches('/').to_string(),
                })
            }
            Some(("s3" | "s3a", _)) => {
                let url = url::Url::parse(uri).map_err(|e| bad(e.to_string()))?;
                let store = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(uri)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let prefix = url.path().trim_matches('/').to_string();
                Ok(Landing {
                    source: Source::Store {
                        store: Arc::new(store),
                        prefix: (!prefix.is_empty()).then(|| StorePath::from(prefix)),
                    },
                    root_uri: uri.trim_end_matches('/').to_string(),
                })
            }
            Some((scheme, _)) => Err(bad(format!("the scheme `{scheme}` is not supported"))),
        }
    }

    /// Every file under the root matching `glob`, oldest first (modification time, then path).
    pub async fn list(&self, glob: &glob::Pattern) -> Result<Vec<LandingFile>, IngestError> {
        let mut out = match &self.source {
            Source::Local(root) => {
                let (root, glob, uri) = (root.clone(), glob.clone(), self.root_uri.clone());
                tokio::task::spawn_blocking(move || list_local(&root, &glob, &uri))
                    .await
                    .map_err(|e| IngestError::Landing {
                        action: "list",
                        uri: self.root_uri.clone(),
                        source: Box::new(object_store::Error::Generic {
                            store: "local",
                            source: Box::new(e),
                        }),
                    })??
            }
            Source::Store { store, prefix } => {
                self.list_store(store, prefix.as_ref(), glob).await?
            }
        };
        out.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.rel.cmp(&b.rel)));
        Ok(out)
    }

    async fn list_store(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: Option<&StorePath>,
        glob: &glob::Pattern,
    ) -> Result<Vec<LandingFile>, IngestError> {
        let metas: Vec<ObjectMeta> =
            store
                .list(prefix)
                .try_collect()
                .await
                .map_err(|e| IngestError::Landing {
                    action: "list",
                    uri: self.root_uri.clone(),
                    source: Box::new(e),
                })?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let rel = relative(prefix, &m.location)?;
                let hidden = rel.split('/').any(is_hidden);
                (!hidden && glob.matches_with(&rel, GLOB)).then(|| self.file(store, m, rel))
            })
            .collect())
    }

    fn file(&self, store: &Arc<dyn ObjectStore>, m: ObjectMeta, rel: String) -> LandingFile {
        let identity = m
            .e_tag
            .clone()
            .unwrap_or_else(|| m.last_modified.timestamp_millis().to_string());
        LandingFile {
            uri: format!("{}/{}", self.root_uri, rel),
            fingerprint: fingerprint(m.size, &identity),
            content: None,
            size: m.size,
            modified: m.last_modified,
            location: Location::Store(store.clone(), m.location),
            rel,
        }
    }

    /// The whole file; an error when it is no longer the size it was listed at.
    pub async fn read(&self, f: &LandingFile) -> Result<Bytes, IngestError> {
        let err = |e| IngestError::Landing {
            action: "read",
            uri: f.uri.clone(),
            source: Box::new(e),
        };
        let bytes = match &f.location {
            Location::Local(path) => tokio::fs::read(path).await.map(Bytes::from).map_err(|e| {
                err(object_store::Error::Generic {
                    store: "local",
                    source: Box::new(e),
                })
            })?,
            Location::Store(store, path) => store
                .get(path)
                .await
                .map_err(err)?
                .bytes()
                .await
                .map_err(err)?,
        };
        if bytes.len() as u64 != f.size {
            return Err(IngestError::ChangedWhileRead {
                uri: f.uri.clone(),
                listed: f.size,
                read: bytes.len() as u64,
            });
        }
        decompressed(&f.rel, &f.uri, bytes)
    }
}

/// A file's contents, decompressed when its name ends in `.gz`, `.zst` or `.bz2` (as Auto Loader
/// and most producers name them); other files as they are.
fn decompressed(rel: &str, uri: &str, bytes: Bytes) -> Result<Bytes, IngestError> {
    use std::io::Read;
    let codec = match rel
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
    {
        Some(e) if e == "gz" || e == "gzip" => "gzip",
        Some(e) if e == "zst" || e == "zstd" => "zstd",
        Some(e) if e == "bz2" => "bzip2",
        _ => return Ok(bytes),
    };
    let mut out = Vec::new();
    let read = match codec {
        "gzip" => flate2::read::MultiGzDecoder::new(&bytes[..]).read_to_end(&mut out),
        "zstd" => {
            zstd::stream::read::Decoder::new(&bytes[..]).and_then(|mut d| d.read_to_end(&mut out))
        }
        _ => bzip2::read::MultiBzDecoder::new(&bytes[..]).read_to_end(&mut out),
    };
    match read {
        Ok(_) => Ok(Bytes::from(out)),
        Err(e) => Err(IngestError::Decompress {
            uri: uri.to_string(),
            codec,
            reason: e.to_string(),
        }),
    }
}

/// The content hash of a landing file's bytes (xxh3, folded to a non-negative i64).
pub fn content_hash(bytes: &[u8]) -> i64 {
    (twox_hash::XxHash3_64::oneshot(bytes) >> 1) as i64
}

/// A listed object's path relative to the landing prefix.
fn relative(prefix: Option<&StorePath>, location: &StorePath) -> Option<String> {
    let full = location.as_ref();
    match prefix {
        None => Some(full.to_string()),
        Some(p) => full
            .strip_prefix(p.as_ref())
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_string),
    }
}

/// How a landing file's path relative to the root is matched against `landing.glob` (a `*`
/// stays within its folder, `**` crosses folders).
pub const GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

fn is_hidden(name: &str) -> bool {
    name.starts_with('.') || name.starts_with('_')
}

/// Walks a local folder: hidden entries are skipped without descending, the glob is matched on
/// the name before anything else, and each matching file costs one `stat` (its size and
/// modification time), so a folder of many files lists fast.
fn list_local(
    root: &std::path::Path,
    glob: &glob::Pattern,
    root_uri: &str,
) -> Result<Vec<LandingFile>, IngestError> {
    let mut out = Vec::new();
    let walk = walkdir::WalkDir::new(root)
        .follow_links(true)
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !is_hidden(&e.file_name().to_string_lossy()));
    for entry in walk {
        let entry = entry.map_err(|e| {
            let source = match e.into_io_error() {
                Some(io) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                    object_store::Error::PermissionDenied {
                        path: root.display().to_string(),
                        source: Box::new(io),
                    }
                }
                Some(io) => object_store::Error::Generic {
                    store: "local",
                    source: Box::new(io),
                },
                None => object_store::Error::Generic {
                    store: "local",
                    source: "a symbolic link loops".into(),
                },
            };
            IngestError::Landing {
                action: "list",
                uri: root_uri.to_string(),
                source: Box::new(source),
            }
        })?;
        if entry.file_type().is_dir() {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(root) else {
            continue;
        };
        let rel = utf8_name(rel).replace(std::path::MAIN_SEPARATOR, "/");
        if !glob.matches_with(&rel, GLOB) {
            continue;
        }
        // A file removed between the listing and here is simply not there.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let modified: DateTime<Utc> = meta
            .modified()
            .map(DateTime::<Utc>::from)
            .unwrap_or_default();
        let identity = modified
            .timestamp_nanos_opt()
            .unwrap_or_default()
            .to_string();
        out.push(LandingFile {
            uri: format!("{root_uri}/{rel}"),
            fingerprint: fingerprint(meta.len(), &identity),
            content: None,
            size: meta.len(),
            modified,
            location: Location::Local(entry.path().to_path_buf()),
            rel,
        });
    }
    Ok(out)
}

/// A path as text: itself when it is UTF-8; else (a Latin-1 name from a Windows share, say)
/// its valid parts as they are and each other byte as `%XX`, with `%` itself written `%25` —
/// one stable name per file, for the ingest record and `_source_file`.
fn utf8_name(path: &std::path::Path) -> String {
    if let Some(s) = path.to_str() {
        return s.to_string();
    }
    #[cfg(unix)]
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    #[cfg(not(unix))]
    let bytes = path.to_string_lossy().into_owned().into_bytes();
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('%', "%25"));
        for b in chunk.invalid() {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// FNV-1a of the size and the identity text, folded to a non-negative i64 (`-1` is reserved).
fn fingerprint(size: u64, identity: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in size.to_le_bytes().iter().chain(identity.as_bytes().iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// A local landing file as a listing gives it, for the plan's tests.
#[cfg(test)]
pub(super) fn listed_for_test(rel: &str, size: u64, fingerprint: i64) -> LandingFile {
    LandingFile {
        rel: rel.to_string(),
        uri: format!("file:///landing/{rel}"),
        size,
        modified: DateTime::<Utc>::UNIX_EPOCH,
        fingerprint,
        content: None,
        location: Location::Local(std::path::PathBuf::from("/landing").join(rel)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_matching_visible_files_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("events/2024")).unwrap();
        std::fs::create_dir_all(root.join("_state")).unwrap();
        std::fs::write(root.join("events/2024/a.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("events/b.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("events/.b.jsonl.tmp"), "{}\n").unwrap();
        std::fs::write(root.join("events/_SUCCESS"), "").unwrap();
        std::fs::write(root.join("_state/x.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("other.csv"), "a\n").unwrap();
        let landing = Landing::open(root.to_str().unwrap(), "p").unwrap();
        let all = landing
            .list(&glob::Pattern::new("**/*.jsonl").unwrap())
            .await
            .unwrap();
        let mut rels: Vec<&str> = all.iter().map(|f| f.rel.as_str()).collect();
        rels.sort();
        assert_eq!(rels, vec!["events/2024/a.jsonl", "events/b.jsonl"]);
        let top = landing
            .list(&glob::Pattern::new("events/*.jsonl").unwrap())
            .await
            .unwrap();
        assert_eq!(top.len(), 1, "a single * stays in its folder");
        assert!(top[0].uri.starts_with("file:///") && top[0].uri.ends_with("/events/b.jsonl"));
        let again = landing.read(&top[0]).await.unwrap();
        assert_eq!(&again[..], b"{}\n");
        let err = Landing::open(root.join("nope").to_str().unwrap(), "p")
            .err()
            .unwrap();
        assert!(matches!(err, IngestError::LandingMissing { .. }), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn names_that_are_not_utf8_get_one_stable_text() {
        use std::os::unix::ffi::OsStrExt;
        let latin1 = std::path::Path::new(std::ffi::OsStr::from_bytes(b"caf\xe9 100%.jsonl"));
        assert_eq!(utf8_name(latin1), "caf%E9 100%25.jsonl");
        assert_eq!(
            utf8_name(std::path::Path::new("caf\u{e9} 100%.jsonl")),
            "caf\u{e9} 100%.jsonl"
        );
    }

    #[test]
    fn fingerprints_change_with_size_or_identity() {
        let a = fingerprint(10, "1");
        assert!(a >= 0);
        assert_ne!(a, fingerprint(11, "1"));
        assert_ne!(a, fingerprint(10, "2"));
        assert_eq!(a, fingerprint(10, "1"));
    }
}
