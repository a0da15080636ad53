//! A Parquet data file's footer in one request.
//!
//! A Parquet reader that knows a file's size reads its last 8 bytes (the footer's length and
//! the magic), then the footer, then often the page index just before it: three requests one
//! after another. DataFusion can read a larger tail at once (its metadata size hint), but
//! delta-rs' scan does not pass one. So an 8-byte read at the end of a data file fetches the
//! last [`WINDOW`] bytes instead, and the reads that follow inside that tail are served from
//! it. The last [`KEPT`] tails are kept (data files are never rewritten in place).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{Attributes, GetOptions, GetRange, GetResult, ObjectMeta};

use super::result;
use crate::lake::ranges::slice_of;

/// Bytes fetched from the end of a data file on its footer-length read.
pub const WINDOW: u64 = 64 * 1024;
/// Tails kept (at most `KEPT * WINDOW` bytes).
pub const KEPT: usize = 64;

struct Tail {
    path: Path,
    range: Range<u64>,
    bytes: Bytes,
    meta: ObjectMeta,
    attributes: Attributes,
}

#[derive(Default)]
pub struct Footers {
    tails: Mutex<VecDeque<Tail>>,
}

/// A data file (not a log file): where footers are worth fetching ahead.
pub fn is_data_file(location: &Path) -> bool {
    let p = location.as_ref();
    p.ends_with(".parquet") && !p.contains("_delta_log/")
}

/// For a read of a file's last 8 bytes: the larger tail to fetch instead.
pub fn widened(options: &GetOptions) -> Option<GetRange> {
    if options.head {
        return None;
    }
    match options.range.as_ref()? {
        GetRange::Bounded(r) if r.end.checked_sub(r.start) == Some(8) => {
            Some(GetRange::Bounded(r.end.saturating_sub(WINDOW)..r.end))
        }
        GetRange::Suffix(8) => Some(GetRange::Suffix(WINDOW)),
        _ => None,
    }
}

impl Footers {
    /// `wanted` of `location`, when a kept tail holds all of it.
    pub fn find(
        &self,
        location: &Path,
        wanted: &Range<u64>,
    ) -> Option<(Bytes, ObjectMeta, Attributes)> {
        let tails = self.tails.lock().unwrap_or_else(|e| e.into_inner());
        tails.iter().find_map(|t| {
            let bytes = (t.path == *location)
                .then(|| slice_of(&t.range, &t.bytes, wanted))
                .flatten()?;
            Some((bytes, t.meta.clone(), t.attributes.clone()))
        })
    }

    /// A read served from a kept tail, if one holds it.
    pub fn serve(&self, location: &Path, options: &GetOptions) -> Option<GetResult> {
        let GetRange::Bounded(r) = options.range.as_ref()? else {
            return None;
        };
        if options.head || r.end <= r.start {
            return None;
        }
        let (bytes, meta, attributes) = self.find(location, r)?;
        Some(result(meta, attributes, r.clone(), bytes))
    }

    /// Keeps the tail `got` (fetched for `requested`, the 8-byte read) and answers that read.
    pub async fn keep(
        &self,
        location: &Path,
        requested: &GetRange,
        got: GetResult,
    ) -> object_store::Result<GetResult> {
        let (meta, attributes, range) =
            (got.meta.clone(), got.attributes.clone(), got.range.clone());
        let bytes = got.bytes().await?;
        let size = meta.size;
        let asked = match requested {
            GetRange::Suffix(n) => size.saturating_sub(*n)..size,
            GetRange::Bounded(r) => r.start..r.end.min(size),
            GetRange::Offset(o) => *o..size,
        };
        let body = (asked.start < asked.end && bytes.len() as u64 == range.end - range.start)
            .then(|| slice_of(&range, &bytes, &asked))
            .flatten()
            .ok_or_else(|| object_store::Error::Generic {
                store: "RemoteReads",
                source: format!(
                    "{location}: asked for bytes {asked:?}, the store returned {range:?}"
                )
                .into(),
            })?;
        let mut tails = self.tails.lock().unwrap_or_else(|e| e.into_inner());
        if tails.len() >= KEPT {
            tails.pop_front();
        }
        tails.push_back(Tail {
            path: location.clone(),
            range,
            bytes,
            meta: meta.clone(),
            attributes: attributes.clone(),
        });
        Ok(result(meta, attributes, asked, body))
    }
}
