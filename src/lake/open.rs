use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use url::Url;

use super::LakeError;

/// The URL of an existing table location (local paths must exist).
pub fn table_url(uri: &str) -> Result<Url, DeltaTableError> {
    deltalake::table::builder::parse_table_uri(strip_file_scheme(uri))
}

/// The URL of a location we are about to create a table in; creates local directories.
pub fn create_url(uri: &str) -> Result<Url, LakeError> {
    deltalake::ensure_table_uri(strip_file_scheme(uri)).map_err(|e| LakeError::BadUri {
        uri: uri.to_string(),
        reason: e.to_string(),
    })
}

fn strip_file_scheme(uri: &str) -> &str {
    // `file:///abs/path` and `/abs/path` name the same table; delta-rs handles both, but a plain
    // path gets the friendlier "does not exist" check.
    uri.strip_prefix("file://").unwrap_or(uri)
}

/// A table builder for `url`. Every table tidemark touches is opened through here, so the
/// fault-injection store (failpoints builds only) sits under all of them.
pub fn builder(url: Url) -> Result<DeltaTableBuilder, DeltaTableError> {
    #[cfg(feature = "failpoints")]
    if let Some(store) = super::faulty::store_for(&url) {
        return Ok(DeltaTableBuilder::from_url(url.clone())?.with_storage_backend(store, url));
    }
    DeltaTableBuilder::from_url(url)
}

/// Opens the table at `uri`, or `None` when there is no Delta table there yet.
pub async fn open_if_exists(uri: &str) -> Result<Option<DeltaTable>, LakeError> {
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
