//! Quartz cron schedules in a time zone, with one DST rule applied everywhere.
//!
//! Parsing and wall-clock matching are the `croner` crate's (Quartz mode: a seconds field,
//! optional year, `?`, ranges, steps, lists, `L`, `W`, `#`, weekdays 1 = SUN … 7 = SAT). This
//! module only turns wall-clock matches into instants, because croner's own DST handling fires
//! interval jobs twice in a repeated hour, and our rule is:
//!
//! - **Spring forward (gap):** a wall-clock fire time that does not exist runs once, at the first
//!   instant after the gap (every fire time inside one gap collapses into that single run).
//! - **Fall back (fold):** a wall-clock fire time that happens twice fires once, at its first
//!   occurrence.
//!
//! With that rule the mapping from wall-clock matches to instants is monotone, so "next fire
//! after t" is simply the first wall-clock match whose instant is later than t.

use std::str::FromStr;

use chrono::{DateTime, Datelike, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::{OffsetComponents, Tz};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Upper bound on wall-clock matches examined for one answer; only reachable with a pattern that
/// matches almost nothing (e.g. February 30th), which validation rejects first.
const MAX_STEPS: usize = 100_000;

/// How far a wall-clock match can lie from the instant it maps to (the largest DST shift in the
/// time zone database is 2 hours; margin added).
const FOLD_MARGIN: TimeDelta = TimeDelta::hours(3);

/// More than the largest UTC offset of any zone (+14 h / -12 h): a wall time read as UTC and
/// moved this far lies on a known side of the wall time in every zone.
const MAX_OFFSET: TimeDelta = TimeDelta::hours(16);

/// Why a schedule is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The expression does not parse as Quartz cron.
    #[error("`{expression}` is not a valid Quartz cron expression: {reason}. Quartz has 6 or 7 fields: seconds minutes hours day-of-month month day-of-week [year], e.g. \"0 5 * * * ?\" (hourly at :05)")]
    Expression { expression: String, reason: String },
    /// Quartz needs `?` in exactly one of day-of-month and day-of-week.
    #[error("`{expression}`: put `?` in exactly one of day-of-month (field 4) and day-of-week (field 6), as Quartz requires (e.g. \"0 5 * * * ?\")")]
    DayFields { expression: String },
    /// The time zone is not an IANA name.
    #[error("`{timezone_id}` is not a time zone; use an IANA name such as UTC, Europe/London or America/New_York")]
    TimeZone { timezone_id: String },
    /// The expression parses but never fires.
    #[error("`{expression}` never fires (no matching date in the next years); check day-of-month against the months")]
    NeverFires { expression: String },
}

impl crate::error::Classify for CronError {
    /// A bad schedule is a mistake in the bundle: configuration.
    fn class(&self) -> crate::error::ErrorClass {
        crate::error::ErrorClass::Config
    }
}

/// A validated Quartz cron expression bound to its time zone.
#[derive(Debug, Clone)]
pub struct QuartzSchedule {
    expression: String,
    cron: Cron,
    tz: Tz,
}

impl QuartzSchedule {
    /// Parses `expression` (Quartz syntax) for the IANA zone `timezone_id`.
    pub fn parse(expression: &str, timezone_id: &str) -> Result<Self, CronError> {
        let tz = Tz::from_str(timezone_id.trim()).map_err(|_| CronError::TimeZone {
            timezone_id: timezone_id.to_string(),
        })?;
        let cron = parse_quartz(expression)?;
        let schedule = QuartzSchedule {
            expression: expression.trim().to_string(),
            cron,
            tz,
        };
        // A pattern like "0 0 0 30 2 ?" parses but has no date: refuse it now rather than let
        // the scheduler search forever.
        let probe = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).single();
        if probe.and_then(|p| schedule.next_after(p)).is_none() {
            return Err(CronError::NeverFires {
                expression: schedule.expression,
            });
        }
        Ok(schedule)
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The schedule's time zone.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The first fire strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut cursor = t.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_STEPS {
            let wall = self.cron.find_next_occurrence(&cursor, false).ok()?;
            let instant = self.instant_of(wall)?;
            if instant > t {
                return Some(instant);
            }
            cursor = wall;
        }
        None
    }

    /// The last fire at or before `t`.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // A wall-clock match up to one fold later than t's wall time can map to an instant <= t.
        let mut cursor = t.with_timezone(&self.tz).naive_local() + FOLD_MARGIN;
        for _ in 0..MAX_STEPS {
            let wall = self.cron.find_previous_occurrence(&cursor, false).ok()?;
            let instant = self.instant_of(wall)?;
            if instant <= t {
                return Some(instant);
            }
            cursor = wall;
        }
        None
    }

    /// The next `count` fires strictly after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, count: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(count);
        let mut cursor = t;
        while out.len() < count {
            match self.next_after(cursor) {
                Some(next) => {
                    out.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        out
    }

    /// Whether the time zone observes daylight saving time (in 2027, a year every test uses).
    pub fn observes_dst(&self) -> bool {
        (1..=12).any(|month| {
            Utc.with_ymd_and_hms(2027, month, 1, 12, 0, 0)
                .single()
                .is_some_and(|t| {
                    !self
                        .tz
                        .offset_from_utc_datetime(&t.naive_utc())
                        .dst_offset()
                        .is_zero()
                })
        })
    }

    /// Whether the expression can fire with the local hour `hour` (0-23).
    pub fn may_fire_in_hour(&self, hour: u32) -> bool {
        self.cron.pattern.hour_match(hour).unwrap_or(false)
    }

    /// The instant a wall-clock match fires at, by the module's DST rule.
    fn instant_of(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
            LocalResult::None => self.end_of_gap(wall),
        }
    }

    /// The first instant after the DST gap that contains the wall time `wall`: the first instant
    /// whose wall time is later than `wall`.
    fn end_of_gap(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        // Any instant whose wall time is before the gap, and one after it (in whole seconds:
        // zone transitions happen on whole seconds).
        let mut lo = (wall - MAX_OFFSET).and_utc().timestamp();
        let mut hi = (wall + MAX_OFFSET).and_utc().timestamp();
        let wall_of = |secs: i64| {
            Utc.timestamp_opt(secs, 0)
                .single()
                .map(|t| t.with_timezone(&self.tz).naive_local())
        };
        if wall_of(lo)? > wall || wall_of(hi)? <= wall {
            return None;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if wall_of(mid)? > wall {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Utc.timestamp_opt(hi, 0).single()
    }
}

fn parse_quartz(expression: &str) -> Result<Cron, CronError> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let invalid = |reason: String| CronError::Expression {
        expression: expression.trim().to_string(),
        reason,
    };
    if !(6..=7).contains(&fields.len()) {
        return Err(invalid(format!("it has {} fields", fields.len())));
    }
    let dom_unspecified = fields[3] == "?";
    let dow_unspecified = fields[5] == "?";
    if dom_unspecified == dow_unspecified {
        return Err(CronError::DayFields {
            expression: expression.trim().to_string(),
        });
    }
    if let Some(year) = fields.get(6) {
        // croner refuses years before 1970 and after 2099 differently from Quartz; Quartz's own
        // range is 1970-2099.
        if year.chars().all(|c| c.is_ascii_digit())
            && year
                .parse::<i32>()
                .is_ok_and(|y| !(1970..=2099).contains(&y))
        {
            return Err(invalid(format!("year {year} is outside 1970-2099")));
        }
    }
    CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Optional)
        .alternative_weekdays(true)
        .sloppy_ranges(true)
        .build()
        .parse(expression)
        .map_err(|e| invalid(e.to_string().trim_end_matches('.').to_string()))
}

/// Formats an instant in a time zone as `2027-03-28 02:00:00 BST`, for summaries and logs.
pub fn local_label(t: DateTime<Utc>, tz: Tz) -> String {
    let local = t.with_timezone(&tz);
    format!(
        "{:04}-{:02}-{:02} {} {}",
        local.year(),
        local.month(),
        local.day(),
        local.format("%H:%M:%S"),
        local.format("%Z")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn fires(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        QuartzSchedule::parse(expr, tz)
            .unwrap()
            .upcoming(utc(from), n)
            .into_iter()
            .map(|t| t.to_rfc3339())
            .collect()
    }

    #[test]
    fn hourly_at_five_past_with_question_mark() {
        assert_eq!(
            fires("0 5 * * * ?", "UTC", "2027-01-01T00:05:00Z", 3),
            [
                "2027-01-01T01:05:00+00:00",
                "2027-01-01T02:05:00+00:00",
                "2027-01-01T03:05:00+00:00"
            ]
        );
    }

    #[test]
    fn ranges_steps_lists_and_seconds() {
        // every 20 s in minutes 0-1 of 10:00 and 14:00, weekdays only (Quartz 2-6 = MON-FRI)
        assert_eq!(
            fires("0/20 0-1 10,14 ? * 2-6", "UTC", "2027-01-01T09:00:00Z", 7),
            [
                "2027-01-01T10:00:00+00:00",
                "2027-01-01T10:00:20+00:00",
                "2027-01-01T10:00:40+00:00",
                "2027-01-01T10:01:00+00:00",
                "2027-01-01T10:01:20+00:00",
                "2027-01-01T10:01:40+00:00",
                "2027-01-01T14:00:00+00:00",
            ]
        );
        // 2027-01-01 is a Friday, so the next weekday after Friday 14:01:40 is Monday the 4th
        let after_friday = fires("0 0 10 ? * MON-FRI", "UTC", "2027-01-01T10:00:00Z", 1);
        assert_eq!(after_friday, ["2027-01-04T10:00:00+00:00"]);
    }

    #[test]
    fn last_day_nearest_weekday_and_nth_weekday() {
        // L: last day of month
        assert_eq!(
            fires("0 0 6 L * ?", "UTC", "2027-01-31T12:00:00Z", 2),
            ["2027-02-28T06:00:00+00:00", "2027-03-31T06:00:00+00:00"]
        );
        // 15W: weekday nearest the 15th; 2027-05-15 is a Saturday -> Friday the 14th
        assert_eq!(
            fires("0 0 6 15W * ?", "UTC", "2027-05-01T00:00:00Z", 1),
            ["2027-05-14T06:00:00+00:00"]
        );
        // 6#3: third Friday (Quartz: 6 = FRI) of the month; January 2027 -> the 15th
        assert_eq!(
            fires("0 0 6 ? * 6#3", "UTC", "2027-01-01T00:00:00Z", 1),
            ["2027-01-15T06:00:00+00:00"]
        );
    }

    #[test]
    fn spring_forward_in_london_runs_a_missing_time_at_the_end_of_the_gap() {
        // 2027-03-28: 01:00 GMT jumps to 02:00 BST (01:00 UTC). 01:05 local does not exist.
        assert_eq!(
            fires("0 5 * * * ?", "Europe/London", "2027-03-27T23:30:00Z", 4),
            [
                "2027-03-28T00:05:00+00:00", // 00:05 GMT
                "2027-03-28T01:00:00+00:00", // 01:05 missing -> 02:00 BST, the end of the gap
                "2027-03-28T01:05:00+00:00", // 02:05 BST
                "2027-03-28T02:05:00+00:00", // 03:05 BST
            ]
        );
        // a daily job inside the gap runs once that day, at 02:00 BST
        assert_eq!(
            fires("0 30 1 * * ?", "Europe/London", "2027-03-27T12:00:00Z", 2),
            ["2027-03-28T01:00:00+00:00", "2027-03-29T00:30:00+00:00"]
        );
        // every minute inside the gap collapses into one run at its end
        assert_eq!(
            fires("0 * 1 * * ?", "Europe/London", "2027-03-27T23:00:00Z", 3),
            [
                "2027-03-28T01:00:00+00:00",
                "2027-03-29T00:00:00+00:00",
                "2027-03-29T00:01:00+00:00"
            ]
        );
    }

    #[test]
    fn fall_back_in_london_fires_a_repeated_time_once() {
        // 2027-10-31: 02:00 BST goes back to 01:00 GMT (01:00 UTC). 01:05 happens twice.
        assert_eq!(
            fires("0 5 * * * ?", "Europe/London", "2027-10-30T23:30:00Z", 3),
            [
                "2027-10-31T00:05:00+00:00", // 01:05 BST, the first 01:05
                "2027-10-31T02:05:00+00:00", // 02:05 GMT; 01:05 GMT (01:05 UTC) does not fire
                "2027-10-31T03:05:00+00:00",
            ]
        );
        // a daily 01:30 fires once, at the first occurrence
        assert_eq!(
            fires("0 30 1 * * ?", "Europe/London", "2027-10-30T12:00:00Z", 2),
            ["2027-10-31T00:30:00+00:00", "2027-11-01T01:30:00+00:00"]
        );
    }

    #[test]
    fn new_york_spring_forward_and_fall_back() {
        // 2027-03-14: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 does not exist.
        assert_eq!(
            fires(
                "0 30 * * * ?",
                "America/New_York",
                "2027-03-14T06:00:00Z",
                3
            ),
            [
                "2027-03-14T06:30:00+00:00", // 01:30 EST
                "2027-03-14T07:00:00+00:00", // 02:30 missing -> 03:00 EDT
                "2027-03-14T07:30:00+00:00", // 03:30 EDT
            ]
        );
        assert_eq!(
            fires(
                "0 30 2 * * ?",
                "America/New_York",
                "2027-03-13T12:00:00Z",
                2
            ),
            ["2027-03-14T07:00:00+00:00", "2027-03-15T06:30:00+00:00"]
        );
        // 2027-11-07: 02:00 EDT goes back to 01:00 EST (06:00 UTC); 01:30 happens twice.
        assert_eq!(
            fires(
                "0 30 * * * ?",
                "America/New_York",
                "2027-11-07T04:00:00Z",
                3
            ),
            [
                "2027-11-07T04:30:00+00:00", // 00:30 EDT
                "2027-11-07T05:30:00+00:00", // 01:30 EDT, the first 01:30
                "2027-11-07T07:30:00+00:00", // 02:30 EST; 01:30 EST (06:30 UTC) does not fire
            ]
        );
    }

    #[test]
    fn starting_inside_the_repeated_hour_does_not_refire_it() {
        // at 01:10 GMT (second pass), 01:05 already fired at 00:05 UTC: next is 02:05 GMT
        let s = QuartzSchedule::parse("0 5 * * * ?", "Europe/London").unwrap();
        assert_eq!(
            s.next_after(utc("2027-10-31T01:10:00Z")),
            Some(utc("2027-10-31T02:05:00Z"))
        );
        // and the latest fire at or before then is that first 01:05
        assert_eq!(
            s.latest_at_or_before(utc("2027-10-31T01:10:00Z")),
            Some(utc("2027-10-31T00:05:00Z"))
        );
        assert_eq!(
            s.latest_at_or_before(utc("2027-03-28T01:02:00Z")),
            Some(utc("2027-03-28T01:00:00Z"))
        );
    }

    #[test]
    fn invalid_expressions_and_zones() {
        let err = |e: &str, tz: &str| QuartzSchedule::parse(e, tz).unwrap_err();
        assert!(matches!(
            err("0 5 * * *", "UTC"),
            CronError::Expression { .. }
        ));
        assert!(err("0 5 * * *", "UTC").to_string().contains("5 fields"));
        assert!(matches!(
            err("0 5 * * * *", "UTC"),
            CronError::DayFields { .. }
        ));
        assert!(matches!(
            err("0 5 * ? * ?", "UTC"),
            CronError::DayFields { .. }
        ));
        assert!(matches!(
            err("0 61 * * * ?", "UTC"),
            CronError::Expression { .. }
        ));
        assert!(matches!(
            err("0 5 * * * ? 1900", "UTC"),
            CronError::Expression { .. }
        ));
        assert!(matches!(
            err("zero 5 * * * ?", "UTC"),
            CronError::Expression { .. }
        ));
        assert!(matches!(
            err("0 0 0 30 2 ?", "UTC"),
            CronError::NeverFires { .. }
        ));
        assert!(matches!(
            err("0 5 * * * ?", "Mars/Olympus"),
            CronError::TimeZone { .. }
        ));
    }

    #[test]
    fn dst_detection_and_hours() {
        let london = QuartzSchedule::parse("0 30 1 * * ?", "Europe/London").unwrap();
        assert!(london.observes_dst());
        assert!(london.may_fire_in_hour(1));
        assert!(!london.may_fire_in_hour(2));
        assert!(!QuartzSchedule::parse("0 5 * * * ?", "UTC")
            .unwrap()
            .observes_dst());
        assert!(!QuartzSchedule::parse("0 5 * * * ?", "Asia/Tokyo")
            .unwrap()
            .observes_dst());
    }

    #[test]
    fn local_labels_name_the_zone() {
        let tz: Tz = "Europe/London".parse().unwrap();
        assert_eq!(
            local_label(utc("2027-03-28T01:00:00Z"), tz),
            "2027-03-28 02:00:00 BST"
        );
    }
}
