//! What a delivery is: a landing file complete (its last line ended), and a file's identity by
//! its bytes — a copied folder is not a change, a re-delivered copy under a new name delivers
//! nothing new.

use std::collections::{HashMap, HashSet};

use super::landing::{self, Landing, LandingFile};
use super::record::{self, Recorded};
use super::rows::{self, Parsed};
use super::Run;
use crate::config::pipeline::ingest::Format;
use crate::run::RunError;

/// How long a text landing file whose last line has no line end is waited for (its producer is
/// still writing it) before it is read without that line.
pub(super) const CUT_FILE_GRACE: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// Where the unterminated last line of a JSON or CSV file starts (`None`: the file ends with a
/// line end, is empty, or is Parquet).
pub(super) fn cut_tail(body: &[u8], format: Format) -> Option<usize> {
    if format == Format::Parquet || body.is_empty() || body.ends_with(b"\n") {
        return None;
    }
    Some(body.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1))
}

/// `parsed` (of the file up to its last line end) with the unterminated last line quarantined.
pub(super) fn with_cut_tail(mut parsed: Parsed, tail: Option<(u64, bytes::Bytes)>) -> Parsed {
    if let Some((line, tail)) = tail {
        parsed.rejects.push(rows::Reject::new(
            Some(line),
            &tail,
            "the file's last line has no line end: the file was cut while it was written (or the producer omits the final line end), so the line may be incomplete; it was not ingested. Deliver the record again in a complete file".to_string(),
        ));
        parsed.records += 1;
    }
    parsed
}

/// A landing file read for parsing: its body up to its last line end, and the unterminated
/// last line with its number (quarantined: the file stayed cut past [`CUT_FILE_GRACE`]).
pub(super) struct Loaded {
    pub f: LandingFile,
    pub body: bytes::Bytes,
    pub tail: Option<(u64, bytes::Bytes)>,
}

/// Reads `f` (and its content hash); `Err(f)` when its last line is still being written.
pub(super) async fn load(
    landing: &Landing,
    mut f: LandingFile,
    format: Format,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Result<Loaded, LandingFile>, RunError> {
    let body = landing.read(&f).await?;
    f.content = Some(landing::content_hash(&body));
    let (body, tail) = match cut_tail(&body, format) {
        None => (body, None),
        Some(_) if now - f.modified < CUT_FILE_GRACE => return Ok(Err(f)),
        Some(at) => (body.slice(..at), Some(body.slice(at..))),
    };
    let tail_line = tail
        .as_ref()
        .map(|_| body.iter().filter(|b| **b == b'\n').count() as u64 + 1);
    Ok(Ok(Loaded {
        f,
        body,
        tail: tail_line.zip(tail),
    }))
}

/// The file whose bytes a file of `content` at `rel` repeats (it is a copy), or `None` — then it
/// is the first to deliver them, noted in `seen` and in this run's `earlier`.
pub(super) fn copy_of(
    seen: &mut HashMap<i64, String>,
    earlier: &mut HashMap<i64, String>,
    content: i64,
    rel: &str,
) -> Option<String> {
    match seen.get(&content) {
        Some(original) if original != rel => Some(original.clone()),
        Some(_) => None,
        None => {
            seen.insert(content, rel.to_string());
            earlier.insert(content, rel.to_string());
            None
        }
    }
}

/// A file's parse, or the error that stops the run: a Debezium truncate event, or a
/// `format: debezium` file of plain rows.
pub(super) fn checked(parsed: Parsed, f: &LandingFile) -> Result<Parsed, RunError> {
    if let Some(line) = parsed.truncate_at {
        return Err(super::error::IngestError::Truncate {
            uri: f.uri.clone(),
            line,
        }
        .into());
    }
    if parsed.not_debezium {
        return Err(super::error::IngestError::NotDebezium { uri: f.uri.clone() }.into());
    }
    Ok(parsed)
}

impl Run<'_, '_> {
    /// The changed files (another fingerprint than recorded) whose contents are the recorded
    /// ones: read and hashed.
    pub(super) async fn same_contents(
        &self,
        landing: &Landing,
        changed: &[LandingFile],
        record: &HashMap<String, Recorded>,
    ) -> Result<HashSet<String>, RunError> {
        let mut same = HashSet::new();
        for f in changed {
            let Some(recorded) = record.get(&f.rel).and_then(|r| r.content) else {
                continue;
            };
            let body = landing.read(f).await?;
            if landing::content_hash(&body) == recorded {
                same.insert(f.rel.clone());
            }
        }
        Ok(same)
    }

    /// A file byte-identical to one ingested before (or earlier in this run) under another
    /// name — a producer's at-least-once retry — is recorded but delivers no rows: its rows
    /// would be new versions of nothing (new `_ingested_at`, new `_source_file`).
    ///
    /// `earlier`: the contents delivered by earlier waves of this run (by file), extended with
    /// this wave's. Returns the copies: (file, the file whose bytes it repeats).
    pub(super) async fn redelivered(
        &mut self,
        book: &record::Record,
        record: &HashMap<String, Recorded>,
        parsed: &mut [(LandingFile, Parsed)],
        earlier: &mut HashMap<i64, String>,
    ) -> Result<Vec<(String, String)>, RunError> {
        let contents: Vec<i64> = parsed.iter().filter_map(|(f, _)| f.content).collect();
        let mut seen = self.delivered(book, record, &contents, earlier).await?;
        let mut copies: Vec<(String, String)> = Vec::new();
        for (f, p) in parsed.iter_mut() {
            let Some(c) = f.content else { continue };
            if p.records == 0 {
                continue; // nothing to deliver twice
            }
            if let Some(original) = copy_of(&mut seen, earlier, c, &f.rel) {
                copies.push((f.uri.clone(), original));
                p.empty();
            }
        }
        Ok(copies)
    }

    /// Which file first delivered each content: of the recorded files, the first to arrive
    /// (a later one is a copy recorded without rows), then `earlier` (this run's), then the
    /// record's index for `contents`.
    pub(super) async fn delivered(
        &self,
        book: &record::Record,
        record: &HashMap<String, Recorded>,
        contents: &[i64],
        earlier: &HashMap<i64, String>,
    ) -> Result<HashMap<i64, String>, RunError> {
        let mut first: HashMap<i64, (i64, &String)> = Default::default();
        for (rel, r) in record {
            if let Some(c) = r.content {
                let e = first.entry(c).or_insert((r.ingested_ms, rel));
                if (r.ingested_ms, rel) < (e.0, e.1) {
                    *e = (r.ingested_ms, rel);
                }
            }
        }
        let mut seen: HashMap<i64, String> = first
            .into_iter()
            .map(|(c, (_, rel))| (c, rel.clone()))
            .collect();
        for (c, rel) in earlier.iter() {
            seen.entry(*c).or_insert_with(|| rel.clone());
        }
        for (c, rel) in book.by_content(&self.a.ctx, contents).await? {
            seen.entry(c).or_insert(rel);
        }
        Ok(seen)
    }

    /// Counts the re-delivered copies and says so.
    pub(super) fn warn_copies(&mut self, copies: &[(String, String)]) {
        self.c.num_files_duplicate = copies.len() as u64;
        if let Some((first, original)) = copies.first() {
            self.warn(format!(
                "{} landing file(s) are byte-identical to files already ingested (first: {first}, the same bytes as {original}): a producer delivered them again; they are recorded, and their rows are not appended a second time",
                copies.len()
            ));
        }
    }

    /// Says which files were left for a later run, their last line still being written.
    pub(super) fn warn_pending(&mut self, deferred: &[LandingFile]) {
        if let Some(first) = deferred.first() {
            self.c.num_files_pending += deferred.len() as u64;
            self.warn(format!(
                "{} landing file(s) end in a line without its line end (first: {}): a producer is still writing them, so they are left for a later run (after an hour unchanged they are read, and that last line is quarantined)",
                deferred.len(),
                first.uri
            ));
        }
    }
}
