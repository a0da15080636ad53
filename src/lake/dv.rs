//! Deletion vectors, written by tidemark (delta-rs reads them but cannot write them): the
//! Delta protocol's "Deletion Vector Format" and "Deletion Vectors" sections.
//!
//! A DV marks rows of one data file deleted by their 0-based position in the file. Its bytes
//! are a 4-byte little-endian magic (1681511377) followed by the 64-bit roaring bitmap in its
//! portable serialization (8-byte LE bucket count; per bucket a 4-byte LE high key and a
//! standard 32-bit portable roaring bitmap). A small DV is kept **inline** in the log
//! (`storageType: "i"`, the bytes as Z85, padded with zeros to a multiple of 4; `sizeInBytes`
//! the unpadded length); others go to a **DV file** (`"u"`): `deletion_vector_<uuid>.bin` at the
//! table root, a version byte (1), then per DV a 4-byte big-endian size, its bytes and a 4-byte
//! big-endian CRC-32 of them; the descriptor names the file by the Z85 of the UUID's 16 bytes
//! (20 characters) and the DV by the offset of its size field. The format was checked against
//! the Python `deltalake` package (tests/it/common/delta_fixture.rs says how), and the tests
//! below read tables with these DVs back through delta-rs.

use bytes::Bytes;
use deltalake::kernel::{Action, Add, DeletionVectorDescriptor, Remove, StorageType};
use deltalake::logstore::ObjectStoreRef;
use deltalake::DeltaTable;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use roaring::RoaringTreemap;

/// The table property that lets writers add deletion vectors (set with the feature).
pub const ENABLE: &str = "delta.enableDeletionVectors";

/// Whether `table`'s protocol has the `deletionVectors` writer feature, so deletion vectors
/// may be written into it.
pub fn enabled(table: &DeltaTable) -> bool {
    table.snapshot().is_ok_and(|s| {
        serde_json::to_value(s.protocol()).is_ok_and(|p| {
            p["writerFeatures"]
                .as_array()
                .is_some_and(|f| f.iter().any(|v| v == "deletionVectors"))
        })
    })
}

/// The `add` that keeps `file` in the table with `rows` deleted (`d` their descriptor): the
/// same file, size and statistics, the statistics marked wide (`tightBounds: false`, their
/// bounds may still count deleted rows; `numRecords` stays the file's physical row count, as
/// the protocol asks).
pub fn marked_add(file: &Add, d: DeletionVectorDescriptor) -> Add {
    let mut add = file.clone();
    add.deletion_vector = Some(d);
    add.data_change = true;
    add.modification_time = file.modification_time;
    add.stats = file.stats.as_deref().map(|raw| {
        match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(raw) {
            Ok(mut stats) => {
                stats.insert("tightBounds".into(), serde_json::Value::Bool(false));
                serde_json::Value::Object(stats).to_string()
            }
            Err(_) => raw.to_string(),
        }
    });
    add
}

/// The magic number that starts a DV's bytes (little-endian).
pub const MAGIC: u32 = 1_681_511_377;

/// DVs at most this many bytes are kept inline in the log.
pub const INLINE_MAX: usize = 64;

/// What can go wrong with a deletion vector.
#[derive(Debug, thiserror::Error)]
pub enum DvError {
    #[error("deletion vector {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("deletion vector file {path}: {source}")]
    Store {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("deletion vector {what} is damaged: {why}")]
    Damaged { what: String, why: String },
}

fn damaged(what: &str, why: impl Into<String>) -> DvError {
    DvError::Damaged {
        what: what.to_string(),
        why: why.into(),
    }
}

/// The DV bytes of `rows`: the magic, then the portable serialization.
pub fn to_bytes(rows: &RoaringTreemap) -> Result<Vec<u8>, DvError> {
    let mut out = MAGIC.to_le_bytes().to_vec();
    rows.serialize_into(&mut out)
        .map_err(|source| DvError::Io {
            what: "serialization".into(),
            source,
        })?;
    Ok(out)
}

/// The rows of DV bytes (checks the magic).
pub fn from_bytes(bytes: &[u8], what: &str) -> Result<RoaringTreemap, DvError> {
    let (magic, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| damaged(what, "shorter than its magic number"))?;
    if u32::from_le_bytes(*magic) != MAGIC {
        return Err(damaged(what, "wrong magic number"));
    }
    RoaringTreemap::deserialize_from(rest).map_err(|source| DvError::Io {
        what: what.to_string(),
        source,
    })
}

/// An inline descriptor of `rows`.
pub fn inline(rows: &RoaringTreemap) -> Result<DeletionVectorDescriptor, DvError> {
    let bytes = to_bytes(rows)?;
    let size = bytes.len();
    let mut padded = bytes;
    padded.resize(size.div_ceil(4) * 4, 0);
    Ok(DeletionVectorDescriptor {
        storage_type: StorageType::Inline,
        path_or_inline_dv: z85::encode(&padded),
        offset: None,
        size_in_bytes: size as i32,
        cardinality: rows.len() as i64,
    })
}

/// Writes `dvs` into one new DV file at the table root and returns their descriptors, in order.
pub async fn write_file(
    store: &ObjectStoreRef,
    dvs: &[RoaringTreemap],
) -> Result<Vec<DeletionVectorDescriptor>, DvError> {
    let uuid = uuid::Uuid::new_v4();
    let name = format!("deletion_vector_{uuid}.bin");
    let mut file = vec![1u8];
    let mut out = Vec::with_capacity(dvs.len());
    for rows in dvs {
        let bytes = to_bytes(rows)?;
        let offset = file.len();
        file.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        file.extend_from_slice(&bytes);
        file.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
        out.push(DeletionVectorDescriptor {
            storage_type: StorageType::UuidRelativePath,
            path_or_inline_dv: z85::encode(uuid.as_bytes()),
            offset: Some(offset as i32),
            size_in_bytes: bytes.len() as i32,
            cardinality: rows.len() as i64,
        });
    }
    store
        .put(&Path::from(name.as_str()), Bytes::from(file).into())
        .await
        .map_err(|source| DvError::Store { path: name, source })?;
    Ok(out)
}

/// A descriptor for `rows`: inline when small, else in a DV file of its own.
pub async fn store(
    store_ref: &ObjectStoreRef,
    rows: &RoaringTreemap,
) -> Result<DeletionVectorDescriptor, DvError> {
    let d = inline(rows)?;
    if d.size_in_bytes as usize <= INLINE_MAX {
        return Ok(d);
    }
    let mut v = write_file(store_ref, std::slice::from_ref(rows)).await?;
    v.pop()
        .ok_or_else(|| damaged("file", "no descriptor was written"))
}

/// Descriptors for many DVs, in order: small ones inline in the log, the others together in
/// one DV file (one write, however many files a commit marks).
pub async fn store_many(
    store_ref: &ObjectStoreRef,
    dvs: &[RoaringTreemap],
) -> Result<Vec<DeletionVectorDescriptor>, DvError> {
    let mut out: Vec<Option<DeletionVectorDescriptor>> = Vec::with_capacity(dvs.len());
    let mut big = Vec::new();
    for rows in dvs {
        let d = inline(rows)?;
        if d.size_in_bytes as usize <= INLINE_MAX {
            out.push(Some(d));
        } else {
            out.push(None);
            big.push(rows.clone());
        }
    }
    if !big.is_empty() {
        let mut stored = write_file(store_ref, &big).await?.into_iter();
        for slot in out.iter_mut().filter(|o| o.is_none()) {
            *slot = stored.next();
        }
    }
    out.into_iter()
        .map(|d| d.ok_or_else(|| damaged("file", "a deletion vector was not stored")))
        .collect()
}

/// A live data file whose deletion vector grows: its log entry, every row now deleted in it
/// (the earlier vector's and the new ones) and its physical row count.
pub struct Grown {
    pub remove: Remove,
    pub add: Add,
    pub deleted: RoaringTreemap,
    pub rows: u64,
}

/// The log actions of files whose deletion vectors grow: each file's `remove` and, unless
/// every row of it is now deleted, its `add` again with the grown vector (stored first, see
/// [`store_many`]). Also returns how many files leave whole.
pub async fn grow(
    store_ref: &ObjectStoreRef,
    files: Vec<Grown>,
) -> Result<(Vec<Action>, u64), DvError> {
    let (whole, partial): (Vec<Grown>, Vec<Grown>) =
        files.into_iter().partition(|g| g.deleted.len() >= g.rows);
    let dvs: Vec<RoaringTreemap> = partial.iter().map(|g| g.deleted.clone()).collect();
    let stored = store_many(store_ref, &dvs).await?;
    let emptied = whole.len() as u64;
    let mut actions: Vec<Action> = whole
        .into_iter()
        .map(|g| Action::Remove(g.remove))
        .collect();
    for (g, d) in partial.into_iter().zip(stored) {
        actions.push(Action::Remove(g.remove));
        actions.push(Action::Add(marked_add(&g.add, d)));
    }
    Ok((actions, emptied))
}

/// Upgrades `table` to deletion vectors (`delta.enableDeletionVectors = true`, which delta-rs
/// turns into reader version 3 / writer version 7 with the feature), in a commit of its own.
pub async fn enable(table: DeltaTable) -> Result<DeltaTable, deltalake::DeltaTableError> {
    table
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            ENABLE.to_string(),
            "true".to_string(),
        )]))
        .await
}

/// The warning a run gives after [`enable`] committed `version` of `uri`.
pub fn upgraded(uri: &str, version: Option<u64>) -> String {
    format!(
        "upgraded {uri} to deletion vectors (delta.enableDeletionVectors = true; Delta reader version 3 / writer version 7, in a commit of its own, version {}): readers must support the deletionVectors feature",
        version.unwrap_or_default()
    )
}

/// The DV file a `"u"` descriptor names, relative to the table root.
pub fn file_name(d: &DeletionVectorDescriptor) -> Result<String, DvError> {
    let p = &d.path_or_inline_dv;
    let split = p
        .len()
        .checked_sub(20)
        .ok_or_else(|| damaged(p, "path shorter than a Z85 UUID"))?;
    let (prefix, encoded) = p.split_at(split);
    let raw = z85::decode(encoded).map_err(|e| damaged(p, e.to_string()))?;
    let uuid = uuid::Uuid::from_slice(&raw).map_err(|e| damaged(p, e.to_string()))?;
    Ok(if prefix.is_empty() {
        format!("deletion_vector_{uuid}.bin")
    } else {
        format!("{prefix}/deletion_vector_{uuid}.bin")
    })
}

/// The rows a descriptor marks deleted (inline, or read from its file at the table root; the
/// CRC is checked).
pub async fn read(
    store: &ObjectStoreRef,
    d: &DeletionVectorDescriptor,
) -> Result<RoaringTreemap, DvError> {
    let size =
        usize::try_from(d.size_in_bytes).map_err(|_| damaged("descriptor", "negative size"))?;
    match d.storage_type {
        StorageType::Inline => {
            let bytes =
                z85::decode(&d.path_or_inline_dv).map_err(|e| damaged("inline", e.to_string()))?;
            let bytes = bytes
                .get(..size)
                .ok_or_else(|| damaged("inline", "shorter than its size"))?;
            from_bytes(bytes, "inline")
        }
        StorageType::UuidRelativePath => {
            let name = file_name(d)?;
            let file = store
                .get(&Path::from(name.as_str()))
                .await
                .map_err(|source| DvError::Store {
                    path: name.clone(),
                    source,
                })?
                .bytes()
                .await
                .map_err(|source| DvError::Store {
                    path: name.clone(),
                    source,
                })?;
            let at = d.offset.unwrap_or(1) as usize;
            let field = file
                .get(at..at + 4)
                .ok_or_else(|| damaged(&name, "offset past the end"))?;
            let stored = u32::from_be_bytes([field[0], field[1], field[2], field[3]]) as usize;
            if stored != size {
                return Err(damaged(
                    &name,
                    format!("size {stored} where the log says {size}"),
                ));
            }
            let bytes = file
                .get(at + 4..at + 4 + size)
                .ok_or_else(|| damaged(&name, "cut short"))?;
            let crc = file
                .get(at + 4 + size..at + 8 + size)
                .ok_or_else(|| damaged(&name, "no checksum"))?;
            if crc32fast::hash(bytes).to_be_bytes() != crc {
                return Err(damaged(&name, "checksum mismatch"));
            }
            from_bytes(bytes, &name)
        }
        StorageType::AbsolutePath => Err(damaged(
            &d.path_or_inline_dv,
            "absolute-path DVs are not supported",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
    use deltalake::kernel::Action;
    use deltalake::protocol::DeltaOperation;
    use deltalake::DeltaTable;

    use super::*;

    #[test]
    fn bytes_round_trip_and_are_checked() {
        let rows: RoaringTreemap = [0u64, 3, 4_000_000_000, 70_000].into_iter().collect();
        let b = to_bytes(&rows).expect("bytes");
        assert_eq!(&b[..4], &MAGIC.to_le_bytes());
        assert_eq!(from_bytes(&b, "t").expect("rows"), rows);
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(from_bytes(&bad, "t").is_err());
        assert!(from_bytes(&b[..2], "t").is_err());
    }

    /// A table of ids 0..n in one file, with deletion vectors enabled.
    async fn table(dir: &std::path::Path, n: i64) -> DeltaTable {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..n))])
                .expect("batch");
        let url = url::Url::from_directory_path(dir).expect("url");
        deltalake::DeltaTableBuilder::from_url(url)
            .expect("builder")
            .build()
            .expect("table")
            .write(vec![batch])
            .with_configuration([("delta.enableDeletionVectors", Some("true"))])
            .await
            .expect("write")
    }

    /// Marks `rows` of the table's only file deleted with `d`, in one commit (the `add` copied
    /// from the log's own, which delta-rs still offers through a deprecated helper).
    #[allow(deprecated)]
    async fn delete_with(table: &DeltaTable, d: DeletionVectorDescriptor) -> DeltaTable {
        let snapshot = table.snapshot().expect("snapshot");
        let view = snapshot.log_data().iter().next().expect("a file");
        let remove = view.remove_action(true);
        let mut add = view.add_action();
        add.deletion_vector = Some(d);
        add.data_change = true;
        let actions = vec![Action::Remove(remove), Action::Add(add)];
        let v = CommitBuilder::from(CommitProperties::default())
            .with_actions(actions)
            .build(
                Some(snapshot),
                table.log_store(),
                DeltaOperation::Delete { predicate: None },
            )
            .await
            .expect("commit")
            .version();
        let mut t = table.clone();
        t.load_version(v).await.expect("load");
        t
    }

    async fn ids(table: &DeltaTable) -> Vec<i64> {
        let ctx = datafusion::prelude::SessionContext::new();
        table
            .update_datafusion_session(&ctx.state())
            .expect("session");
        let batches = ctx
            .read_table(table.table_provider().await.expect("provider"))
            .expect("read")
            .collect()
            .await
            .expect("collect");
        let mut out: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("ids")
                    .values()
                    .to_vec()
            })
            .collect();
        out.sort_unstable();
        out
    }

    #[tokio::test]
    async fn delta_rs_reads_the_rows_our_dvs_delete_inline_and_in_a_file() {
        for big in [false, true] {
            let dir = tempfile::tempdir().expect("tmp");
            let t = table(dir.path(), 5_000).await;
            let rows: RoaringTreemap = if big {
                (0..5_000u64).filter(|i| i % 3 == 0).collect()
            } else {
                [1u64, 7, 4_999].into_iter().collect()
            };
            let store = t.log_store().object_store(None);
            let d = super::store(&store, &rows).await.expect("store");
            assert_eq!(
                d.storage_type,
                if big {
                    StorageType::UuidRelativePath
                } else {
                    StorageType::Inline
                }
            );
            assert_eq!(read(&store, &d).await.expect("read back"), rows);
            let t = delete_with(&t, d).await;
            let want: Vec<i64> = (0..5_000i64)
                .filter(|i| !rows.contains(*i as u64))
                .collect();
            assert_eq!(ids(&t).await, want, "big: {big}");
        }
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[tokio::test]
    async fn a_damaged_dv_file_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let store: ObjectStoreRef = std::sync::Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(dir.path()).expect("store"),
        );
        let rows: RoaringTreemap = (0..10_000u64).step_by(7).collect();
        let d = write_file(&store, std::slice::from_ref(&rows))
            .await
            .expect("write")
            .remove(0);
        assert_eq!(read(&store, &d).await.expect("read"), rows);
        let file = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("deletion_vector_")
            })
            .expect("the DV file")
            .path();
        let mut bytes = std::fs::read(&file).expect("read file");
        let last = bytes.len() - 6;
        bytes[last] ^= 0xff;
        std::fs::write(&file, bytes).expect("damage");
        let err = read(&store, &d).await.expect_err("damaged");
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
