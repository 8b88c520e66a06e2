//! A function's schedule: a crontab line of five fields (`minute hour day-of-month month
//! day-of-week`), read in the site's time zone, and the ticks it gives.
//!
//! The fields mean what they mean in crontab(5): numbers, `*`, ranges `a-b`, steps `*/n` and
//! `a-b/n`, lists `a,b`, month and day names (`jan`, `mon`); day of week 0 or 7 is Sunday; when
//! both day of month and day of week are restricted, a day matching either fires (crontab's
//! rule). Written by hand rather than taken from a cron crate: the ones looked at (`cron`,
//! `jiff-cron`) read a six- or seven-field dialect with seconds and count days of the week in
//! their own way, and a site's crontab lines must mean here what they mean in cron. Time zones and daylight saving come from `jiff`: a
//! tick at a civil time that does not exist (the spring gap) fires at the first instant after
//! it, and one that exists twice (the autumn fold) fires once, at the first.
//!
//! Must not know: any other module of this crate, SQLite (`rusqlite`).

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan as _};

/// Days searched for a tick before giving up (a schedule such as `0 0 31 2 *` never fires).
const MAX_DAYS: i32 = 366 * 8 + 2;

/// A parsed crontab schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Day of month restricted (not `*`).
    days_restricted: bool,
    /// Day of week restricted (not `*`).
    weekdays_restricted: bool,
}

/// Why a schedule does not parse: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule {schedule:?}: {reason}")]
pub struct CronError {
    /// The schedule as given.
    pub schedule: String,
    /// What is wrong with it.
    pub reason: String,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field's set of values within `lo..=hi` (names, when given, stand for `lo + index`), as a
/// bit set, and whether it starts with `*`.
fn field(text: &str, what: &str, lo: u32, hi: u32, names: &[&str]) -> Result<(u64, bool), String> {
    let value = |s: &str| -> Result<u32, String> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            return Ok(lo + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| format!("{what}: {s:?} is not a number{}", name_hint(names)))?;
        if v < lo || v > hi {
            return Err(format!("{what}: {v} is outside {lo}-{hi}"));
        }
        Ok(v)
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| format!("{what}: step {s:?} is not a number"))?;
                if step == 0 {
                    return Err(format!("{what}: a step of 0"));
                }
                (r, step)
            }
            None => (part, 1),
        };
        let (from, to) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `a/n` runs from a to the end, as in cron.
                None if step > 1 => (value(r)?, hi),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if from > to {
            return Err(format!("{what}: the range {range} runs backwards"));
        }
        let mut v = from;
        while v <= to {
            set |= 1 << v;
            v += step;
        }
    }
    // As in cron, a field that starts with `*` (`*/2` too) counts as unrestricted for the
    // day-of-month or day-of-week rule.
    Ok((set, text.starts_with('*')))
}

fn name_hint(names: &[&str]) -> String {
    if names.is_empty() { String::new() } else { format!(" nor one of {}", names.join(",")) }
}

impl Cron {
    /// Parses a crontab schedule of five fields separated by blanks.
    pub fn parse(schedule: &str) -> Result<Cron, CronError> {
        let bad = |reason: String| CronError { schedule: schedule.to_owned(), reason };
        let fields: Vec<&str> = schedule.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(bad(format!(
                "want five fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            )));
        };
        let (minutes, _) = field(minute, "minute", 0, 59, &[]).map_err(bad)?;
        let (hours, _) = field(hour, "hour", 0, 23, &[]).map_err(bad)?;
        let (days, all_days) = field(day, "day of month", 1, 31, &[]).map_err(bad)?;
        let (months, _) = field(month, "month", 1, 12, &MONTHS).map_err(bad)?;
        let (mut weekdays, all_weekdays) = field(weekday, "day of week", 0, 7, &WEEKDAYS).map_err(bad)?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & 0x7f;
        }
        Ok(Cron {
            minutes,
            hours: u32::try_from(hours).unwrap_or(u32::MAX),
            days: u32::try_from(days).unwrap_or(u32::MAX),
            months: u16::try_from(months).unwrap_or(u16::MAX),
            weekdays: u8::try_from(weekdays).unwrap_or(u8::MAX),
            days_restricted: !all_days,
            weekdays_restricted: !all_weekdays,
        })
    }

    /// Whether the schedule fires on `date` (crontab's rule: with both day fields restricted,
    /// either may match).
    fn on(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let by_day = self.days & (1 << date.day()) != 0;
        let by_weekday = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => by_day || by_weekday,
            (true, false) => by_day,
            (false, true) => by_weekday,
            (false, false) => true,
        }
    }

    /// The civil minutes of `date` it fires at, in order.
    fn minutes_of(&self, date: Date) -> Vec<DateTime> {
        let hours = (0..24i8).filter(|h| self.hours & (1 << h) != 0);
        hours
            .flat_map(|h| (0..60i8).filter(|m| self.minutes & (1 << m) != 0).map(move |m| date.at(h, m, 0, 0)))
            .collect()
    }

    /// The first tick met walking from the day of `from` in `tz`, forwards or backwards (the
    /// days, and each day's minutes, in that direction), for which `keep` holds; `None` within
    /// eight years. A civil time in a gap is its first instant after it, in a fold the first of
    /// the two.
    fn walk(
        &self,
        from: Timestamp,
        tz: &TimeZone,
        forwards: bool,
        keep: impl Fn(Timestamp) -> bool,
    ) -> Option<Timestamp> {
        let start = tz.to_datetime(from).date();
        for d in 0..MAX_DAYS {
            let date = if forwards { start.checked_add(d.days()) } else { start.checked_sub(d.days()) }.ok()?;
            if !self.on(date) {
                continue;
            }
            let mut times = self.minutes_of(date);
            if !forwards {
                times.reverse();
            }
            let mut instants = times.into_iter().filter_map(|time| tz.to_ambiguous_timestamp(time).compatible().ok());
            if let Some(t) = instants.find(|t| keep(*t)) {
                return Some(t);
            }
        }
        None
    }

    /// The first tick strictly after `after`, in `tz`; `None` if it never fires (within eight
    /// years).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        self.walk(after, tz, true, |t| t > after)
    }

    /// The last tick at or before `at`, in `tz`; `None` if there is none within eight years
    /// before it. Ticks missed while nothing ran collapse into this one.
    pub fn latest_at_or_before(&self, at: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        self.walk(at, tz, false, |t| t <= at)
    }
}

/// The tick to fire now for a schedule whose last fired tick was `last` (none yet: since
/// `since`, e.g. the registration): the latest tick at or before `now` if it is after both,
/// else none. However many ticks were missed, one fires.
pub fn due(cron: &Cron, tz: &TimeZone, last: Option<Timestamp>, since: Timestamp, now: Timestamp) -> Option<Timestamp> {
    let tick = cron.latest_at_or_before(now, tz)?;
    let floor = last.map_or(since, |l| l.max(since));
    (tick > floor).then_some(tick)
}

/// The site's time zone by its IANA name (`Europe/Berlin`), or UTC for `UTC`.
pub fn time_zone(name: &str) -> Result<TimeZone, String> {
    if name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|e| format!("time zone {name:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn crontab_lines_parse_and_bad_ones_name_the_field() {
        for ok in ["0 3 * * *", "*/15 * * * *", "0 9-17/2 * * mon-fri", "30 4 1,15 * 7", "0 0 * JAN,jul sun"] {
            assert!(Cron::parse(ok).is_ok(), "{ok}");
        }
        for (bad, says) in [
            ("0 3 * *", "five fields"),
            ("61 * * * *", "minute: 61 is outside 0-59"),
            ("* 24 * * *", "hour: 24"),
            ("* * 0 * *", "day of month: 0"),
            ("* * * 13 *", "month: 13"),
            ("* * * * 8", "day of week: 8"),
            ("*/0 * * * *", "a step of 0"),
            ("5-1 * * * *", "runs backwards"),
            ("x * * * *", "minute: \"x\" is not a number"),
            ("* * * foo *", "nor one of jan"),
        ] {
            let e = Cron::parse(bad).expect_err(bad);
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn ticks_follow_crontab_in_the_sites_time_zone() {
        let utc = TimeZone::UTC;
        let daily = Cron::parse("0 3 * * *").expect("parse");
        assert_eq!(daily.next_after(at("2026-11-30T03:00:00Z"), &utc), Some(at("2026-12-01T03:00:00Z")));
        assert_eq!(daily.latest_at_or_before(at("2026-11-30T02:59:59Z"), &utc), Some(at("2026-11-29T03:00:00Z")));
        assert_eq!(daily.latest_at_or_before(at("2026-11-30T03:00:00Z"), &utc), Some(at("2026-11-30T03:00:00Z")));
        // 03:00 in Berlin is 02:00 UTC in winter.
        let berlin = time_zone("Europe/Berlin").expect("tz");
        assert_eq!(daily.next_after(at("2026-11-30T00:00:00Z"), &berlin), Some(at("2026-11-30T02:00:00Z")));
        // The spring gap: 02:30 does not exist on 2026-03-29 in Berlin; it fires at 03:00 CEST.
        let gap = Cron::parse("30 2 * * *").expect("parse");
        assert_eq!(gap.next_after(at("2026-03-29T00:00:00Z"), &berlin), Some(at("2026-03-29T01:30:00Z")));
        // Day of month or day of week (crontab's rule); 7 is Sunday.
        let either = Cron::parse("0 0 1 * 7").expect("parse");
        assert_eq!(either.next_after(at("2026-11-30T00:00:00Z"), &utc), Some(at("2026-12-01T00:00:00Z")));
        assert_eq!(either.next_after(at("2026-12-01T00:00:00Z"), &utc), Some(at("2026-12-06T00:00:00Z")));
        assert_eq!(Cron::parse("0 0 31 2 *").expect("parse").next_after(at("2026-01-01T00:00:00Z"), &utc), None);
        assert!(time_zone("Mars/Olympus").is_err());
    }

    #[test]
    fn missed_ticks_fire_once_and_none_fires_twice() {
        let utc = TimeZone::UTC;
        let hourly = Cron::parse("0 * * * *").expect("parse");
        let since = at("2026-11-30T00:30:00Z");
        assert_eq!(due(&hourly, &utc, None, since, at("2026-11-30T00:59:00Z")), None, "no tick since registration");
        let first = due(&hourly, &utc, None, since, at("2026-11-30T01:00:10Z"));
        assert_eq!(first, Some(at("2026-11-30T01:00:00Z")));
        assert_eq!(due(&hourly, &utc, first, since, at("2026-11-30T01:59:00Z")), None, "fired already");
        // Down from 01:00 to 07:20: six ticks missed, one fires, the latest.
        assert_eq!(due(&hourly, &utc, first, since, at("2026-11-30T07:20:00Z")), Some(at("2026-11-30T07:00:00Z")));
    }
}
