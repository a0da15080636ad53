//! The dedup's partial-updates fill ([`crate::keyed::partial`]): a key's winner completed from
//! its older rows as they stream past, newest first.

use arrow::array::RecordBatch;
use arrow::error::ArrowError;

use super::{Current, Deduper, EncodedBatch, Fill, Older, Winner};
use crate::keyed::partial::{self, Filler};

impl Deduper {
    /// The winner as its own row (`batch`/`e`: the batch at hand, for a winner in it), and
    /// whether it is a delete.
    pub(super) fn winner_row(
        &self,
        c: &Current,
        batch: &RecordBatch,
        e: &EncodedBatch,
    ) -> Result<(RecordBatch, bool), ArrowError> {
        Ok(match &c.winner {
            Winner::Here(w) => (partial::own_row(batch, *w), e.is_deleted(*w)),
            Winner::Carried(row) => {
                let deleted = self.enc.encode_order(row)?.is_deleted(0);
                (row.clone(), deleted)
            }
        })
    }

    /// Ends the ties of the current key: a filler over its winner with the tie losers applied,
    /// or `Done` when nothing can change it.
    pub(super) fn start_filling(
        &self,
        c: &Current,
        losers: Vec<Older>,
        batch: &RecordBatch,
        e: &EncodedBatch,
    ) -> Result<Fill, ArrowError> {
        let Some(carrier) = &self.partial else {
            return Ok(Fill::Done);
        };
        let (row, deleted) = self.winner_row(c, batch, e)?;
        let open = carrier.open_in(&row, 0);
        if deleted || open.is_empty() {
            return Ok(Fill::Done);
        }
        let mut filler = Filler::with_open(row, open, false);
        self.apply_group(&mut filler, losers)?;
        Ok(Fill::Filling {
            filler,
            group: Vec::new(),
            tuple: None,
        })
    }

    /// Applies rows of one tuple to `filler`, the greatest content (the newest) first.
    pub(super) fn apply_group(
        &self,
        filler: &mut Filler,
        group: Vec<Older>,
    ) -> Result<(), ArrowError> {
        let Some(carrier) = &self.partial else {
            return Ok(());
        };
        let mut ranked = Vec::with_capacity(group.len());
        let several = group.len() > 1;
        for (row, i, deleted) in group {
            // (contents are encoded only to order several rows of one tuple, which is rare)
            let content = match several {
                true => Some(self.enc.encode_content(&row.slice(i, 1))?.row(0).owned()),
                false => None,
            };
            ranked.push((content, row, i, deleted));
        }
        ranked.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, row, i, deleted) in ranked {
            filler.older(carrier, &row, i, deleted)?;
        }
        Ok(())
    }

    /// Row `i` of `batch` is older than its key's winner: it fills what the winner lacks.
    pub(super) fn fill_older(
        &mut self,
        batch: &RecordBatch,
        e: &EncodedBatch,
        i: usize,
    ) -> Result<(), ArrowError> {
        let Some(mut c) = self.current.take() else {
            return Ok(());
        };
        let result = self.advance(&mut c, batch, e, i);
        self.current = Some(c);
        result
    }

    pub(super) fn advance(
        &self,
        c: &mut Current,
        batch: &RecordBatch,
        e: &EncodedBatch,
        i: usize,
    ) -> Result<(), ArrowError> {
        let fill = match c.fill.take() {
            None => return Ok(()),
            Some(Fill::Ties(losers)) => self.start_filling(c, losers, batch, e)?,
            Some(other) => other,
        };
        c.fill = Some(match fill {
            Fill::Filling {
                mut filler,
                mut group,
                mut tuple,
            } if filler.wants_more() => {
                let t = e.tuples.row(i);
                if tuple.as_ref().is_none_or(|held| held.row() != t) {
                    self.apply_group(&mut filler, std::mem::take(&mut group))?;
                    tuple = Some(t.owned());
                }
                group.push((batch.clone(), i, e.is_deleted(i)));
                Fill::Filling {
                    filler,
                    group,
                    tuple,
                }
            }
            other => other,
        });
        Ok(())
    }

    /// A key's fill once its last row has passed: the filled winner (`None`: unchanged), its
    /// still-open columns recorded for the target to fill.
    pub(super) fn close_fill(
        &mut self,
        c: &Current,
        fill: Fill,
        batch: &RecordBatch,
        e: &EncodedBatch,
    ) -> Result<Option<RecordBatch>, ArrowError> {
        let fill = match fill {
            Fill::Ties(losers) if losers.is_empty() => {
                // The winner alone: unchanged, though the target may fill it.
                let (row, deleted) = self.winner_row(c, batch, e)?;
                let open = match &self.partial {
                    Some(carrier) if !deleted => carrier.open_in(&row, 0),
                    _ => Vec::new(),
                };
                if !open.is_empty() {
                    self.open.insert(c.key.row().as_ref().into(), open);
                }
                return Ok(None);
            }
            Fill::Ties(losers) => self.start_filling(c, losers, batch, e)?,
            other => other,
        };
        let Fill::Filling {
            mut filler, group, ..
        } = fill
        else {
            return Ok(None);
        };
        self.apply_group(&mut filler, group)?;
        let (row, open) = filler.finish();
        if !open.is_empty() {
            self.open.insert(c.key.row().as_ref().into(), open);
        }
        Ok(Some(row))
    }
}
