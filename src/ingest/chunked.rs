//! JSON lines (and Debezium events) streamed within a file: each file of a wave is parsed in
//! line-aligned chunks of about [`CHUNK_BYTES`], a few at a time, and each chunk's rows are
//! written before the next chunks are parsed — so a run holds a wave's bytes, a few chunks'
//! rows and one data file being encoded, whatever the size of its files. A chunk's line numbers
//! (in the quarantine) are the file's.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::delivery::{self, Loaded};
use super::error::IngestError;
use super::landing::LandingFile;
use super::rows::Parsed;
use super::schema::Col;
use super::stream::{Acc, Out};
use super::{Planned, Run};
use crate::config::pipeline::ingest::Format;
use crate::run::RunError;

/// About this many bytes of a file are parsed at a time (cut at a line end).
const CHUNK_BYTES: usize = 4 << 20;
/// Tests only: the chunk size instead of [`CHUNK_BYTES`], so small files cross chunks.
const CHUNK_BYTES_ENV: &str = "TIDEMARK_INGEST_CHUNK_BYTES";

impl Run<'_, '_> {
    /// Reads a wave's files, then parses and writes each in chunks; `true` when a chunk
    /// carries fields bronze lacks (the run then reads whole).
    pub(super) async fn chunked_wave(
        &mut self,
        plan: &Planned,
        wave: &[LandingFile],
        cols: &[Col],
        out: &mut Out<'_>,
        acc: &mut Acc,
    ) -> Result<bool, RunError> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let (format, now) = (self.spec.format, self.now);
        let loaded: Vec<Result<Loaded, LandingFile>> = futures::stream::iter(wave.iter().cloned())
            .map(|f| delivery::load(&plan.landing, f, format, now))
            .buffered(workers)
            .try_collect()
            .await?;
        let mut ready = Vec::new();
        for l in loaded {
            match l {
                Ok(l) => ready.push(l),
                Err(later) => acc.deferred.push(later),
            }
        }
        let contents: Vec<i64> = ready.iter().filter_map(|l| l.f.content).collect();
        let mut seen = self
            .delivered(&plan.book, &plan.record, &contents, &acc.earlier)
            .await?;
        let cols = Arc::new(cols.to_vec());
        for l in ready {
            // (a file without records has nothing to deliver twice)
            if let (Some(c), true) = (l.f.content, has_records(&l)) {
                if let Some(original) = delivery::copy_of(&mut seen, &mut acc.earlier, c, &l.f.rel)
                {
                    acc.copies.push((l.f.uri.clone(), original));
                    self.record_file(&l.f, acc);
                    continue;
                }
            }
            if self.chunked_file(l, &cols, out, acc).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Parses one file chunk by chunk (a few in parallel, taken in order) and writes each
    /// chunk's rows; `true` when a chunk carries fields bronze lacks.
    async fn chunked_file(
        &mut self,
        l: Loaded,
        cols: &Arc<Vec<Col>>,
        out: &mut Out<'_>,
        acc: &mut Acc,
    ) -> Result<bool, RunError> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let Loaded { f, body, mut tail } = l;
        let size = std::env::var(CHUNK_BYTES_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(CHUNK_BYTES)
            .max(1);
        let pieces = chunks(&body, size);
        drop(body);
        let last = pieces.len() - 1;
        let parser = self.parser();
        let mut parsed =
            futures::stream::iter(pieces.into_iter().enumerate())
                .map(|(i, (lines, chunk))| {
                    let cols = cols.clone();
                    async move {
                        Ok::<_, RunError>((i, shifted(parser.parse(chunk, cols).await?, lines)))
                    }
                })
                .buffered(workers);
        let (mut any, mut all_plain) = (false, true);
        self.record_file(&f, acc);
        while let Some(next) = parsed.next().await {
            let (i, mut p) = next?;
            if !p.unknown.is_empty() {
                return Ok(true);
            }
            if p.records > 0 {
                any = true;
                all_plain &= p.not_debezium;
            }
            // (a file is plain rows only when every chunk is)
            p.not_debezium = false;
            let mut p = delivery::checked(p, &f)?;
            if i == last {
                p = delivery::with_cut_tail(p, tail.take());
            }
            self.take_rows(&f, p, out, acc).await?;
        }
        if any && all_plain && self.spec.format == Format::Debezium {
            return Err(IngestError::NotDebezium { uri: f.uri.clone() }.into());
        }
        Ok(false)
    }
}

/// Whether a loaded file holds a record (a line that is not blank, or a cut last line).
fn has_records(l: &Loaded) -> bool {
    l.tail.is_some()
        || l.body
            .split(|b| *b == b'\n')
            .any(|line| !line.iter().all(u8::is_ascii_whitespace))
}

/// `body` cut after a line end about every `size` bytes (at least one piece, maybe empty),
/// each with the number of lines before it.
fn chunks(body: &Bytes, size: usize) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let (mut start, mut lines) = (0usize, 0u64);
    while start < body.len() {
        let mut end = (start + size).min(body.len());
        if end < body.len() {
            end = match body[end..].iter().position(|b| *b == b'\n') {
                Some(i) => end + i + 1,
                None => body.len(),
            };
        }
        let piece = body.slice(start..end);
        let in_piece = piece.iter().filter(|b| **b == b'\n').count() as u64;
        out.push((lines, piece));
        lines += in_piece;
        start = end;
    }
    if out.is_empty() {
        out.push((0, Bytes::new()));
    }
    out
}

/// A chunk's parse with its line numbers made the file's.
fn shifted(mut p: Parsed, lines: u64) -> Parsed {
    for r in &mut p.rejects {
        if let Some(l) = &mut r.line {
            *l += lines;
        }
    }
    if let Some(t) = &mut p.truncate_at {
        *t += lines;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_end_at_line_ends_and_count_the_lines_before_them() {
        let line = "x".repeat(1000) + "\n";
        let body = Bytes::from(line.repeat(10_000)); // ~10 MB
        let pieces = chunks(&body, CHUNK_BYTES);
        assert!(pieces.len() >= 2, "{}", pieces.len());
        let mut lines = 0;
        let mut joined = Vec::new();
        for (before, p) in &pieces {
            assert_eq!(*before, lines);
            assert!(p.ends_with(b"\n"));
            lines += p.iter().filter(|b| **b == b'\n').count() as u64;
            joined.extend_from_slice(p);
        }
        assert_eq!(joined, body.to_vec());
        assert_eq!(chunks(&Bytes::new(), 10).len(), 1);
        let no_end = Bytes::from_static(b"a\nb");
        assert_eq!(chunks(&no_end, 10), vec![(0, no_end.clone())]);
        assert_eq!(chunks(&no_end, 1).len(), 2);
    }
}
