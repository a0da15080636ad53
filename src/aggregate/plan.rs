//! Which days a run recomputes, and which closed days it adjusts instead.

use super::*;

/// What a run recomputes (gold's days) and adjusts (closed days, `after_close: adjust`).
pub(super) struct Plan {
    pub(super) days: Days,
    pub(super) adjust: BTreeSet<NaiveDate>,
    /// Closed days the source changed that are older than `max_lookback` (`after_close:
    /// restate`): not restated, but their late rows are still kept (`late_rows:`).
    pub(super) beyond: BTreeSet<NaiveDate>,
}

impl Run<'_, '_> {
    /// The days to recompute and those to adjust: the lookback window (or `--from/--to`, or
    /// with `recompute.touched` only the changed open days), the days turning final, and the
    /// final days the source changed since the last run — restated (within `max_lookback`) or
    /// adjusted per `after_close`.
    pub(super) async fn plan_days(
        &mut self,
        source: &deltalake::DeltaTable,
        recorded_in: Option<&deltalake::DeltaTable>,
        old_status: &BTreeMap<NaiveDate, status::DayStatus>,
        logical: NaiveDate,
        full: bool,
    ) -> Result<Plan, RunError> {
        let spec = self.spec;
        self.check_logical_date(old_status, logical);
        // The days the newest earlier run left open, rows or none: a day still empty then that
        // turns final now gets its one last restatement, like a published one.
        let newest = match recorded_in {
            Some(t) => newest_logical(t, &self.p.app_id())
                .await
                .map_err(RunError::delta(Phase::Plan, &spec.status_uri))?,
            None => None,
        };
        self.newest_logical = Some(newest.map_or(logical, |n| n.max(logical)));
        let open_before = match &self.clock {
            Some(t) => t.open_before(spec),
            None => newest.map(|n| days::open_from(spec, n)),
        };
        let oldest_open = old_status
            .values()
            .find(|s| !s.is_final() && s.event_date <= logical)
            .map(|s| s.event_date)
            .into_iter()
            .chain(open_before.filter(|_| !full))
            .min();
        let (touched, unknown) = match full {
            true => (BTreeSet::new(), false),
            false => self.touched_since(source, recorded_in, logical).await?,
        };
        self.c.num_days_touched = touched.len() as u64;
        let mut days = self.chosen_days(logical, oldest_open, &touched);
        // A day is closed once a run labelled it final; one never published is closed when it
        // lies before the lookback.
        // ... and one never published is closed when the newest earlier run had it final.
        let open_from = days.open_from;
        let closed = |d: &NaiveDate| {
            old_status.get(d).map_or(
                open_before.map_or(*d < open_from, |o| *d < o.min(open_from)),
                status::DayStatus::is_final,
            )
        };
        let late: Vec<NaiveDate> = touched
            .iter()
            .copied()
            .filter(|d| closed(d) && !days.set.contains(d))
            .collect();
        let (adjust, beyond_cap) = self.after_close(&mut days, late, logical, closed);
        // A change the run neither restates nor adjusts (a day after an older logical date: a
        // backfill) stays unconsumed — the run records the version the last run read, so the
        // next run reads it again. (Days past max_lookback are left on purpose, and counted.)
        let uncovered: Vec<NaiveDate> = touched
            .iter()
            .copied()
            .filter(|d| !days.set.contains(d) && !adjust.contains(d) && !beyond_cap.contains(d))
            .collect();
        let newer_known = old_status.keys().next_back().is_some_and(|d| *d > logical);
        if !uncovered.is_empty() || (unknown && newer_known) {
            self.keep_unconsumed = true;
            if let Some(first) = uncovered.first() {
                self.warn(format!(
                    "the source changed {} day(s) this run does not restate (the first {first}, after the logical date {logical}): left for the next run with a later logical date",
                    uncovered.len()
                ));
            }
        }
        Ok(Plan {
            days,
            adjust,
            beyond: beyond_cap.into_iter().collect(),
        })
    }

    /// The event days the source changed since the version the last run recorded (and whether
    /// that is unknown: then every day back to `max_lookback`). None after `--from/--to`, which
    /// restates days on purpose and leaves the source's changes since the last run to the next
    /// scheduled one (its commits record the version the last run read).
    async fn touched_since(
        &mut self,
        source: &deltalake::DeltaTable,
        recorded_in: Option<&deltalake::DeltaTable>,
        logical: NaiveDate,
    ) -> Result<(BTreeSet<NaiveDate>, bool), RunError> {
        let spec = self.spec;
        let on_purpose = self.opts.restate_from.is_some();
        // The status table is committed last: the version it records was fully applied (a
        // crash after gold's commit leaves it behind, and the rerun reads the changes again —
        // comparing, it writes only what is missing).
        let mut previous: Option<i64> = None;
        if let Some(t) = recorded_in {
            let r = lake::record::read(t, &self.p.app_id())
                .await
                .map_err(RunError::delta(Phase::Plan, &spec.status_uri))?;
            if !on_purpose {
                self.a.check_source(&r, source, &spec.source_uri)?;
            }
            previous = r.version;
        }
        let since = previous.and_then(|v| u64::try_from(v).ok());
        self.c.previous_source_version = since;
        let Some(since) = since.filter(|_| !on_purpose) else {
            return Ok((BTreeSet::new(), false));
        };
        Ok(
            match touched::since(&self.a.ctx, source, spec, since).await? {
                touched::Touched::Days(d) => (d, false),
                touched::Touched::Unknown(why) => {
                    let cap = logical - chrono::Duration::days(i64::from(spec.max_lookback_days));
                    self.warn(format!(
                    "which days the source changed since version {since} is unknown ({why}): restating every day back to {cap} (max_lookback)"
                ));
                    (
                        cap.iter_days().take_while(|d| *d <= logical).collect(),
                        true,
                    )
                }
            },
        )
    }

    /// The days recomputed: `--from/--to`, the changed open days (`recompute.touched`), or the
    /// lookback window.
    fn chosen_days(
        &self,
        logical: NaiveDate,
        oldest_open: Option<NaiveDate>,
        touched: &BTreeSet<NaiveDate>,
    ) -> Days {
        let spec = self.spec;
        match (self.opts.restate_from, self.opts.restate_to) {
            (Some(from), Some(to)) => Days::range(spec, logical, from, to),
            _ if spec.touched => {
                let open = days::Days::window(spec, logical, None).open_from;
                Days::only(
                    spec,
                    logical,
                    oldest_open,
                    touched
                        .iter()
                        .copied()
                        .filter(|d| *d >= open && *d <= logical),
                )
            }
            _ => Days::window(spec, logical, oldest_open),
        }
    }

    /// Closed days the source changed (`late`), and closed days asked for: restated within
    /// `max_lookback` (`after_close: restate`, the older ones counted and left) or adjusted
    /// (`after_close: adjust`, never rewritten). The days adjusted, and those left past the cap.
    fn after_close(
        &mut self,
        days: &mut Days,
        late: Vec<NaiveDate>,
        logical: NaiveDate,
        closed: impl Fn(&NaiveDate) -> bool,
    ) -> (BTreeSet<NaiveDate>, Vec<NaiveDate>) {
        let spec = self.spec;
        let mut adjust = BTreeSet::new();
        match spec.after_close {
            AfterClose::Restate => {
                let cap = logical - chrono::Duration::days(i64::from(spec.max_lookback_days));
                let (within, beyond): (Vec<NaiveDate>, Vec<NaiveDate>) =
                    late.iter().partition(|d| **d >= cap);
                days.set.extend(within);
                if !beyond.is_empty() {
                    self.c.num_days_beyond_max_lookback = beyond.len() as u64;
                    self.warn(format!(
                        "the source changed {} final day(s) older than max_lookback ({} days; the oldest {}): not restated",
                        beyond.len(),
                        spec.max_lookback_days,
                        beyond[0]
                    ));
                }
                (adjust, beyond)
            }
            AfterClose::Adjust => {
                // Closed days are never rewritten: what they owe is booked instead (whatever
                // their age), --from/--to included.
                adjust.extend(late);
                let closed_asked: Vec<NaiveDate> =
                    days.set.iter().copied().filter(|d| closed(d)).collect();
                for d in closed_asked {
                    days.set.remove(&d);
                    adjust.insert(d);
                }
                (adjust, Vec::new())
            }
        }
    }

    /// Warns when the logical date closes days it should not: far past every arrival gold has
    /// seen (a clock ahead, or today's date on old data), or before days an earlier run closed
    /// (which stay closed), or `--to` after it.
    fn check_logical_date(
        &mut self,
        old_status: &BTreeMap<NaiveDate, status::DayStatus>,
        logical: NaiveDate,
    ) {
        let spec = self.spec;
        let newest = old_status
            .values()
            .filter_map(|s| s.last_arrival)
            .max()
            .and_then(chrono::DateTime::from_timestamp_micros)
            .map(|t| t.with_timezone(&spec.time_zone).date_naive());
        let open: Vec<NaiveDate> = old_status
            .values()
            .filter(|s| !s.is_final())
            .map(|s| s.event_date)
            .collect();
        if let Some(newest) = newest {
            let gap = (logical - newest).num_days();
            if gap > i64::from(spec.lookback_days) + 1 && !open.is_empty() {
                let head = format!(
                    "the logical date {logical} is {gap} days after the newest arrival gold has seen ({newest})"
                );
                let message = match (self.opts.dry_run, self.gold_version) {
                    (true, _) => format!(
                        "{head}: a run with it would close the {} open day(s), final since {logical}. If the clock or --logical-date is wrong, run with the right --logical-date",
                        open.len()
                    ),
                    (false, Some(v)) => format!(
                        "{head}: the {} open day(s) close now, final since {logical}. If the clock or --logical-date is wrong, undo this run with `tidemark restore {path}{vars} --version {v}` (gold, its status and adjustments tables go back together), then run with the right --logical-date",
                        open.len(),
                        path = self.p.path.display(),
                        vars = self.opts.var_args,
                    ),
                    (false, None) => format!(
                        "{head}: the {} open day(s) close now, final since {logical}",
                        open.len()
                    ),
                };
                self.warn(message);
            }
        }
        if let Some(last) = old_status.values().filter_map(|s| s.final_since).max() {
            if logical < last {
                self.warn(format!(
                    "the logical date {logical} is before {last}, when an earlier run closed days: those stay closed (a closed day is not reopened by an older logical date)"
                ));
            }
        }
        if let Some(to) = self.opts.restate_to.filter(|to| *to > logical) {
            self.warn(format!(
                "--to {to} is after the logical date {logical}: those days are labelled open as of {logical}"
            ));
        }
    }

    /// Books what the final days to adjust owe: their fresh rows against gold's and the
    /// adjustments already booked.
    pub(super) async fn adjustments_due(
        &mut self,
        plan: &Plan,
        closed: &BTreeMap<NaiveDate, i64>,
        rows: &[arrow::array::RecordBatch],
        gold: Option<&deltalake::DeltaTable>,
        adjustments: Option<&deltalake::DeltaTable>,
    ) -> Result<Vec<arrow::array::RecordBatch>, RunError> {
        if plan.adjust.is_empty() {
            return Ok(Vec::new());
        }
        let spec = self.spec;
        let set = Days {
            logical: plan.days.logical,
            open_from: plan.days.open_from,
            set: plan.adjust.clone(),
        };
        let keep = set.contains_expr(datafusion::prelude::ident(EVENT_DATE));
        let fresh = write::rows_of(rows, &plan.adjust)?;
        let published = match gold {
            Some(g) => Some(
                crate::run::frame(&self.a.ctx, g, &spec.target_uri, Phase::Compare)
                    .await?
                    .filter(keep.clone())
                    .map_err(RunError::query(Phase::Compare))?,
            ),
            None => None,
        };
        let booked = adjust::booked(&self.a.ctx, adjustments, &spec.adjustments_uri, keep).await?;
        let (rows, stuck) = adjust::deltas(
            &self.a.ctx,
            spec,
            fresh,
            published,
            booked,
            plan.days.logical,
            &self.a.summary.run_id,
            self.now,
            closed,
        )
        .await?;
        if stuck > 0 {
            self.warn(format!(
                "{stuck} group(s) of closed days have a published total that is NaN while a fresh recompute's is not (a NaN row was corrected after close): no adjustment can change a NaN total, so none was booked. Rebuild the days with `--full-reload` (gold then holds the fresh totals)"
            ));
        }
        Ok(rows)
    }
}

/// The transaction recording the newest logical date of `pipeline_app`'s runs (days since the
/// epoch), in each commit of its tables.
fn newest_logical_app(pipeline_app: &str) -> String {
    format!("{pipeline_app}/newest_logical_date")
}

pub(super) fn newest_logical_transaction(
    pipeline_app: &str,
    day: NaiveDate,
) -> deltalake::kernel::Transaction {
    deltalake::kernel::Transaction::new(
        newest_logical_app(pipeline_app),
        i64::from(days::days_since_epoch(day)),
    )
}

/// The newest logical date a run of `pipeline_app` recorded in `table` (`None` before it was
/// recorded).
pub(super) async fn newest_logical(
    table: &deltalake::DeltaTable,
    pipeline_app: &str,
) -> Result<Option<NaiveDate>, deltalake::DeltaTableError> {
    let v = table
        .snapshot()?
        .transaction_version(
            table.log_store().as_ref(),
            &newest_logical_app(pipeline_app),
        )
        .await?;
    Ok(v.and_then(|v| i32::try_from(v).ok()).and_then(|d| {
        NaiveDate::from_ymd_opt(1970, 1, 1)?
            .checked_add_signed(chrono::Duration::days(i64::from(d)))
    }))
}

/// The settings that give gold's rows their meaning: what a day's measures count, and in which
/// day and group. (Where the tables live, the lookback and finality steer the runs only.)
pub(super) fn definition(spec: &Aggregate) -> crate::run::definition::Definition {
    let mut d = crate::run::definition::Definition::default()
        .with("event_date.column", spec.event_date.as_str())
        .with("event_date.time_zone", spec.time_zone.name())
        .with("group_by", spec.group_by.join("\u{1f}"))
        .with("where", spec.where_sql.as_deref().unwrap_or_default());
    for m in &spec.measures {
        d = d.with(
            format!("measures.{}", m.name),
            format!(
                "{}\u{1f}{}\u{1f}{}",
                m.agg.as_str(),
                m.column.as_deref().unwrap_or_default(),
                m.filter.as_deref().unwrap_or_default()
            ),
        );
    }
    let lookups: Vec<String> = spec
        .lookups
        .iter()
        .map(|l| {
            let placeholder: Vec<String> = l
                .placeholder
                .iter()
                .map(|(c, v)| format!("{c}={v}"))
                .collect();
            format!(
                "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}",
                l.dimension_key,
                l.key,
                l.as_of.as_deref().unwrap_or_default(),
                l.columns.join(","),
                placeholder.join(",")
            )
        })
        .collect();
    d.with("lookups", lookups.join("\u{1e}"))
        .with_newer("window", spec.window.map(|w| w.label()).unwrap_or_default())
}
