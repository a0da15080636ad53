use std::sync::Arc;

use deltalake::logstore::object_store::ObjectStore;
use deltalake::logstore::{object_store_factories, StorageConfig};
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use url::Url;

use super::LakeError;

/// The URL of an existing table location (local paths must exist).
pub fn table_url(uri: &str) -> Result<Url, DeltaTableError> {
    deltalake::table::builder::parse_table_uri(strip_file_scheme(uri))
}

/// The URL of a location we are about to create a table in; creates local directories. A local
/// location must be new, empty, or hold only what an interrupted tidemark write leaves behind.
pub fn create_url(uri: &str) -> Result<Url, LakeError> {
    if let Some(path) = local_path(uri) {
        std::fs::create_dir_all(&path).map_err(|e| LakeError::CannotCreate {
            uri: uri.to_string(),
            reason: e.to_string(),
        })?;
        if let Some(example) = foreign_entry(&path) {
            return Err(LakeError::NotEmpty {
                uri: uri.to_string(),
                example,
            });
        }
    }
    deltalake::ensure_table_uri(strip_file_scheme(uri)).map_err(|e| LakeError::BadUri {
        uri: uri.to_string(),
        reason: e.to_string(),
    })
}

/// The local directories a table creation at `uri` would make: those of its path that do not
/// exist yet. Dropped (a failed creation, or a run stopped by a signal, which drops its work
/// half-way) it removes those still empty, so a failed bootstrap does not leave an empty target
/// folder behind; after a creation they hold the table and stay.
#[derive(Debug, Default)]
pub struct NewDirs(Vec<std::path::PathBuf>);

impl NewDirs {
    /// Records the missing directories of `uri` (none for object storage), before creating it.
    pub fn before_create(uri: &str) -> Self {
        let mut missing = Vec::new();
        let mut dir = local_path(uri);
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            dir = d.parent().map(std::path::Path::to_path_buf);
            missing.push(d);
        }
        NewDirs(missing)
    }

    /// Removes the recorded directories that are still empty, deepest first. A directory that
    /// holds anything (the table, another writer's files, a crashed write's orphans) is kept.
    pub fn remove_empty(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        for dir in std::mem::take(&mut self.0) {
            if std::fs::remove_dir(&dir).is_err() {
                return;
            }
        }
    }
}

impl Drop for NewDirs {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The URL of a storage location that is not a table (e.g. the lease store); creates local
/// directories, accepts whatever is already there.
pub fn location_url(uri: &str) -> Result<Url, LakeError> {
    deltalake::ensure_table_uri(strip_file_scheme(uri)).map_err(|e| LakeError::BadUri {
        uri: uri.to_string(),
        reason: e.to_string(),
    })
}

/// The local directory a URI names, if it is local (a plain path or `file://`).
pub fn local_path(uri: &str) -> Option<std::path::PathBuf> {
    let path = strip_file_scheme(uri);
    (!path.contains("://")).then(|| std::path::PathBuf::from(path))
}

/// The first entry of `dir` that a Delta writer would not have put there: anything but
/// `_delta_log` and `part-*.parquet` data files (which a crashed write leaves as orphans, and a
/// rerun must be able to write next to).
fn foreign_entry(dir: &std::path::Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.filter_map(Result::ok).find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours =
            name == "_delta_log" || (name.starts_with("part-") && name.ends_with(".parquet"));
        (!ours).then_some(name)
    })
}

/// Whether a failure to open a table means its log is damaged, rather than the storage being
/// out of reach (the object store's or the OS's own error somewhere in the chain).
fn is_damaged_log(err: &DeltaTableError) -> bool {
    if matches!(
        err,
        DeltaTableError::ObjectStore { .. } | DeltaTableError::Io { .. }
    ) {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.downcast_ref::<deltalake::ObjectStoreError>().is_some()
            || e.downcast_ref::<std::io::Error>().is_some()
        {
            return false;
        }
        source = e.source();
    }
    matches!(
        err,
        DeltaTableError::KernelError(_)
            | DeltaTableError::InvalidJsonLog { .. }
            | DeltaTableError::InvalidVersion(_)
            | DeltaTableError::Generic(_)
            | DeltaTableError::MetadataError(_)
    )
}

/// Refuses URI schemes tidemark has no storage for, before delta-rs reads them as "no table".
pub fn check_scheme(uri: &str) -> Result<(), LakeError> {
    // `s3:/bucket`, `s3:bucket` or `s3://` without a bucket: delta-rs cannot place them.
    let lower = uri.to_ascii_lowercase();
    for scheme in ["s3", "s3a"] {
        if let Some(rest) = lower.strip_prefix(&format!("{scheme}:")) {
            let bucket = rest
                .strip_prefix("//")
                .map(|r| r.split('/').next().unwrap_or(""));
            if bucket.is_none_or(str::is_empty) {
                return Err(LakeError::BadUri {
                    uri: uri.to_string(),
                    reason: format!("an S3 URI is {scheme}://<bucket>/<path>"),
                });
            }
        }
    }
    match uri.split_once("://") {
        Some((scheme, _))
            if !["file", "s3", "s3a"].contains(&scheme.to_ascii_lowercase().as_str()) =>
        {
            Err(LakeError::UnsupportedScheme {
                uri: uri.to_string(),
                scheme: scheme.to_string(),
            })
        }
        _ => Ok(()),
    }
}

fn strip_file_scheme(uri: &str) -> &str {
    // `file:///abs/path` and `/abs/path` name the same table; delta-rs handles both, but a plain
    // path gets the friendlier "does not exist" check.
    uri.strip_prefix("file://").unwrap_or(uri)
}

/// A table builder for `url`. Every table tidemark touches is opened through here, so the
/// fault-injection store (failpoints builds only) sits under all of them, and on an object
/// store [`super::remote::RemoteReads`] (each immutable log file read once, whole; a Parquet footer in one request).
pub fn builder(url: Url) -> Result<DeltaTableBuilder, DeltaTableError> {
    #[cfg(feature = "failpoints")]
    if let Some(store) = super::faulty::store_for(&url) {
        return Ok(DeltaTableBuilder::from_url(url.clone())?.with_storage_backend(store, url));
    }
    let builder = DeltaTableBuilder::from_url(url.clone())?;
    if url.scheme() == "file" {
        return Ok(builder);
    }
    // The store delta-rs would build for this location (same factory, same options), under
    // the remote reads wrapper.
    let config = StorageConfig::parse_options(builder.storage_options())?;
    let scheme = Url::parse(&format!("{}://", url.scheme()))
        .map_err(|_| DeltaTableError::InvalidTableLocation(url.to_string()))?;
    let factories = object_store_factories();
    let Some(factory) = factories.get(&scheme) else {
        return Ok(builder);
    };
    let (root, _prefix) = factory.value().parse_url_opts(&url, &config)?;
    let cached: Arc<dyn ObjectStore> = Arc::new(super::remote::RemoteReads::new(root));
    Ok(builder.with_storage_backend(cached, url))
}

/// `existing`, or a table handle to create at `uri` (its first write creates it).
pub fn or_new(existing: Option<DeltaTable>, uri: &str) -> Result<DeltaTable, LakeError> {
    match existing {
        Some(t) => Ok(t),
        None => builder(create_url(uri)?)
            .and_then(|b| b.build())
            .map_err(|e| LakeError::delta("cannot create", uri, e)),
    }
}

/// Opens the table at `uri`, or `None` when there is no Delta table there yet.
pub async fn open_if_exists(uri: &str) -> Result<Option<DeltaTable>, LakeError> {
    check_scheme(uri)?;
    let url = match table_url(uri) {
        Ok(url) => url,
        Err(DeltaTableError::InvalidTableLocation(_)) => return Ok(None),
        Err(e) => {
            return Err(LakeError::BadUri {
                uri: uri.to_string(),
                reason: e.to_string(),
            })
        }
    };
    let builder = builder(url).map_err(|e| LakeError::delta("cannot open", uri, e))?;
    match builder.load().await {
        Ok(t) => Ok(Some(t)),
        Err(DeltaTableError::NotATable(_)) | Err(DeltaTableError::InvalidTableLocation(_)) => {
            Ok(None)
        }
        // A store that cannot be reached or refuses access says nothing about the log: checked
        // first, because the kernel hides the store's error from `is_damaged_log`'s chain walk.
        Err(e) if super::store_fault(&e).is_some() => Err(LakeError::delta("open", uri, e)),
        Err(e) if is_damaged_log(&e) => Err(LakeError::CorruptLog {
            uri: uri.to_string(),
            reason: shorten(&e.to_string()),
        }),
        Err(e) => Err(LakeError::delta("cannot open", uri, e)),
    }
}

/// Opens a table that must exist; `role` ("source", "target") goes into the message.
pub async fn open_required(uri: &str, role: &'static str) -> Result<DeltaTable, LakeError> {
    match open_if_exists(uri).await? {
        Some(t) => Ok(t),
        None => Err(LakeError::NotFound {
            role,
            uri: uri.to_string(),
            reason: "no Delta table (no _delta_log) at that location".to_string(),
        }),
    }
}

/// The first few hundred characters of an upstream message: some embed whole debug dumps of
/// log paths, which would bury the advice that follows them.
fn shorten(message: &str) -> String {
    const MAX: usize = 240;
    match message.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &message[..i]),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::NewDirs;

    #[test]
    fn new_dirs_left_empty_go_when_dropped_and_a_table_stays() {
        let tmp = tempfile::tempdir().expect("tmp");
        let uri = tmp.path().join("silver/payments");
        let dirs = NewDirs::before_create(&uri.display().to_string());
        std::fs::create_dir_all(&uri).expect("mkdir");
        drop(dirs); // a run stopped half-way drops it
        assert!(!tmp.path().join("silver").exists(), "empty folders removed");

        let dirs = NewDirs::before_create(&uri.display().to_string());
        std::fs::create_dir_all(uri.join("_delta_log")).expect("mkdir");
        drop(dirs);
        assert!(uri.join("_delta_log").exists(), "a table's folder stays");
    }
}
