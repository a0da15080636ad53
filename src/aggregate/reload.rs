//! A bootstrap or full reload of gold: every day, streamed from the aggregate into one
//! overwrite commit, in chunks of days.

use super::*;

/// Days per aggregate of a full restatement: a month of groups in one hash table at a time.
const FULL_CHUNK_DAYS: i64 = 31;

impl Run<'_, '_> {
    /// A bootstrap or full reload: every day, streamed from the aggregate into gold's one
    /// overwrite commit (the day facts for the status table noted on the way), then the
    /// adjustments cleared and the status rebuilt.
    pub(super) async fn restate_all(&mut self, o: Opened) -> Result<(), RunError> {
        let Opened {
            gold,
            status_table,
            old_status,
            missed,
            closed,
            logical,
            df,
            plan,
            ..
        } = o;
        let old_status = &old_status;
        let observed = self
            .all_days(df, &closed, logical, plan.days.open_from)
            .await?;
        let seen = observed.seen();
        self.write_all(observed, gold).await?;
        self.clear_adjustments().await?;
        let facts = seen.lock().map(|d| d.clone()).unwrap_or_default();
        let mut new_status = self.status_after_reload(&facts, old_status, logical);
        repair::count_after_reload(&mut new_status, &missed, &facts, logical, self.now);
        self.end_phase(Phase::Write)?;
        // (always: the status table records what the reload read — a recreated source's new
        // table id included — and the next run reads that record)
        self.commit_status(status_table, old_status, &new_status, true)
            .await
    }

    /// Every day's groups as one stream: the days in chunks, one aggregate after the other
    /// (the source is clustered by time when it is a tidemark silver: each chunk's files are
    /// pruned by their statistics), observed on the way for the day facts.
    async fn all_days(
        &mut self,
        df: datafusion::prelude::DataFrame,
        closed: &BTreeMap<NaiveDate, i64>,
        logical: NaiveDate,
        open_from: NaiveDate,
    ) -> Result<Arc<stream::Observed>, RunError> {
        let spec = self.spec;
        let final_before = self.clock.and_then(|t| t.windows_final_before);
        let source = |df: datafusion::prelude::DataFrame| compute::Source {
            p: self.p,
            spec,
            df,
            closed,
            final_before,
        };
        let mut chunks = Vec::new();
        if let Some((first, last)) = compute::day_bounds(source(df.clone())).await? {
            let mut from = first;
            while from <= last {
                let to = (from + chrono::Duration::days(FULL_CHUNK_DAYS - 1)).min(last);
                let days = Days::range(spec, logical, from, to);
                chunks.push(compute::grouped(
                    source(df.clone()),
                    Some(&days),
                    open_from,
                )?);
                from = to + chrono::Duration::days(1);
            }
        }
        let grouped = compute::grouped(
            source(df),
            Some(&Days::only(spec, logical, None, [])),
            open_from,
        )?;
        let schema = compute::gold_schema(&grouped);
        let with_helper: arrow::datatypes::SchemaRef =
            Arc::new(grouped.schema().as_arrow().clone());
        let input: datafusion::execution::SendableRecordBatchStream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                with_helper,
                futures::stream::iter(chunks)
                    .then(|df| df.execute_stream())
                    .try_flatten(),
            ),
        );
        Ok(Arc::new(stream::Observed::new(schema, input)))
    }

    /// The stream into gold's one overwrite commit (a dry run reads it to its end).
    async fn write_all(
        &mut self,
        observed: Arc<stream::Observed>,
        gold: Option<deltalake::DeltaTable>,
    ) -> Result<(), RunError> {
        let spec = self.spec;
        let q = |e| RunError::query(Phase::Read)(e);
        if self.opts.dry_run {
            let mut s = datafusion::physical_plan::streaming::PartitionStream::execute(
                observed.as_ref(),
                self.a.ctx.task_ctx(),
            );
            while let Some(b) = s.next().await {
                b.map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
            }
            return Ok(());
        }
        let facts_seen = observed.seen();
        let table = datafusion::catalog::streaming::StreamingTable::try_new(
            observed.schema_ref(),
            vec![observed],
        )
        .map_err(q)?;
        let plan = self
            .a
            .ctx
            .read_table(Arc::new(table))
            .map_err(q)?
            .into_unoptimized_plan();
        let facts: lake::facts::FinalFacts = Arc::new(move || {
            let days = facts_seen.lock().ok()?;
            let mut m = serde_json::Map::new();
            m.insert("num_days_changed".into(), days.len().into());
            m.insert(
                "num_rows_written".into(),
                days.values().map(|f| f.groups).sum::<i64>().into(),
            );
            Some(m)
        });
        self.a.summary.target_version = write::overwrite_all(
            &self.a.ctx,
            gold,
            &spec.target_uri,
            &self.p.name,
            plan,
            facts,
            self.commit_properties(),
        )
        .await?;
        Ok(())
    }

    /// Under `after_close: adjust` the closed days now hold everything booked for them: the
    /// adjustments are folded in, and cleared (after gold's commit; an interrupted reload is
    /// run again).
    async fn clear_adjustments(&mut self) -> Result<(), RunError> {
        let spec = self.spec;
        if self.opts.dry_run || spec.after_close != AfterClose::Adjust {
            return Ok(());
        }
        let Some(t) = lake::open_if_exists(&spec.adjustments_uri).await? else {
            return Ok(());
        };
        if lake::row_count_from_stats(&t).ok().flatten().unwrap_or(1) == 0 {
            return Ok(());
        }
        let (t, _) = t
            .delete()
            .with_commit_properties(self.commit_properties())
            .await
            .map_err(RunError::write(Phase::Write, &spec.adjustments_uri))?;
        self.c.adjustments_version = t.version();
        self.warn(format!(
            "the closed days were rebuilt from the source, so the adjustments booked for them are now in gold: {} was cleared",
            spec.adjustments_uri
        ));
        Ok(())
    }

    /// The counts of a reload and the day status after it: days gold held that the source no
    /// longer has are gone from it too, and a day rebuilt on purpose is not "restated after
    /// close".
    fn status_after_reload(
        &mut self,
        facts: &BTreeMap<NaiveDate, compute::DayFacts>,
        old_status: &BTreeMap<NaiveDate, status::DayStatus>,
        logical: NaiveDate,
    ) -> BTreeMap<NaiveDate, status::DayStatus> {
        let spec = self.spec;
        self.a.summary.num_source_rows_read = facts.values().map(|f| f.rows.max(0) as u64).sum();
        let first = facts.keys().next().copied().unwrap_or(logical);
        let last = facts
            .keys()
            .next_back()
            .copied()
            .unwrap_or(logical)
            .max(logical);
        let span = Days::range(spec, logical, first.min(last), last);
        let changed: BTreeSet<NaiveDate> = facts.keys().copied().collect();
        self.c.days_from = span.first();
        self.c.days_to = span.last();
        self.c.num_days_recomputed = span.count();
        self.c.num_days_changed = changed.len() as u64;
        self.c.num_rows_written = facts.values().map(|f| f.groups.max(0) as u64).sum();
        let mut new_status = status::next(old_status, &span, facts, &changed, self.now);
        new_status.retain(|d, _| facts.contains_key(d));
        for (d, s) in new_status.iter_mut() {
            s.restated_after_close = old_status.get(d).map_or(0, |o| o.restated_after_close);
        }
        self.count_status(old_status, &new_status);
        new_status
    }
}
