//! Wall-clock time, once for the workspace: Unix seconds and milliseconds now ([`now_s`],
//! [`now_ms`]), and the proleptic Gregorian date of a day count ([`civil_from_days`]) with the
//! UTC renderings built on it ([`utc_timestamp`], [`utc_timestamp_ms`],
//! [`utc_timestamp_ms_offset`]), and back ([`days_from_civil`], [`parse_rfc3339_ms`]: every
//! RFC 3339 time read anywhere in the workspace, such as a macaroon's `before:`).
//!
//! The date arithmetic is Howard Hinnant's `civil_from_days`, total on every `u64` day count:
//! the `time` crate (in the tree) represents years up to 9999 only without its `large-dates`
//! feature, and callers render any Unix time they are given.
//!
//! Must not know: anything else of this crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 before 1970).
pub fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Unix milliseconds now (0 before 1970, capped at `u64::MAX`).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Year, month (1–12) and day (1–31) of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days only).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC, second precision).
pub fn utc_timestamp(unix_s: u64) -> String {
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds, e.g. `2026-11-22T10:00:00.250Z`.
pub fn utc_timestamp_ms(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// Days from 1970-01-01 to year `y`, month `m` (1–12), day `d` (Howard Hinnant's
/// `days_from_civil`); `None` before 1970.
pub fn days_from_civil(y: u64, m: u64, d: u64) -> Option<u64> {
    let y = if m <= 2 { y.checked_sub(1)? } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d.checked_sub(1)?;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).checked_sub(719_468)
}

/// Unix milliseconds of an RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS` (`T` or `t`), optional
/// fractional seconds (beyond milliseconds dropped), then `Z`, `z` or an offset `±HH:MM`.
/// `None` for anything else (a date or offset out of range, a time before 1970, trailing bytes).
/// Every RFC 3339 time the workspace reads goes through here: macaroons' `before:` caveats
/// (whoever added them), `--since`/`--until`, events' times.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || !s.is_char_boundary(19) {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) { part.parse().ok() } else { None }
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut milli = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3 = format!("{:0<3}", &frac[..digits.min(3)]);
        milli = first3.parse::<u64>().ok()?;
        rest = &frac[digits..];
    }
    let local_ms = (days_from_civil(y, mo, d)? * 86_400 + h * 3600 + mi * 60 + sec) * 1000 + milli;
    if rest == "Z" || rest == "z" {
        return Some(local_ms);
    }
    let ob = rest.as_bytes();
    if ob.len() != 6 || ob[3] != b':' || !ob.iter().enumerate().all(|(i, c)| i == 0 || i == 3 || c.is_ascii_digit()) {
        return None;
    }
    let (oh, om) = (rest[1..3].parse::<u64>().ok()?, rest[4..6].parse::<u64>().ok()?);
    if oh > 23 || om > 59 {
        return None;
    }
    let offset_ms = (oh * 60 + om) * 60_000;
    match ob[0] {
        b'+' => local_ms.checked_sub(offset_ms),
        b'-' => local_ms.checked_add(offset_ms),
        _ => None,
    }
}

/// Unix seconds of an RFC 3339 date-time ([`parse_rfc3339_ms`], fractions dropped).
pub fn parse_utc_timestamp(s: &str) -> Option<u64> {
    parse_rfc3339_ms(s).map(|ms| ms / 1000)
}

/// Unix milliseconds as dCache's billing writes a date (Java's `ISO_OFFSET_DATE_TIME`), in
/// UTC: `2026-11-22T10:00:00.250+00:00`.
pub fn utc_timestamp_ms_offset(unix_ms: u64) -> String {
    let mut t = utc_timestamp_ms(unix_ms);
    t.pop();
    t.push_str("+00:00");
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn timestamps_parse_back() {
        for t in [0, 951_782_400, 1_709_251_199, 4_102_444_800, 1_234_567_890] {
            assert_eq!(parse_utc_timestamp(&utc_timestamp(t)), Some(t), "{t}");
        }
        assert_eq!(parse_utc_timestamp("2009-02-13T23:31:30.250Z"), Some(1_234_567_890));
        assert_eq!(parse_utc_timestamp("2009-02-13T23:31:30+00:00"), Some(1_234_567_890));
        assert_eq!(parse_utc_timestamp("2009-02-14T00:31:30+01:00"), Some(1_234_567_890));
        assert_eq!(parse_utc_timestamp("2009-02-13t22:01:30-01:30"), Some(1_234_567_890));
        assert_eq!(parse_rfc3339_ms("2009-02-13T23:31:30.25z"), Some(1_234_567_890_250));
        assert_eq!(parse_rfc3339_ms("2009-02-13T23:31:30.123999Z"), Some(1_234_567_890_123));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:30:00+00:30"), Some(0));
        assert_eq!(utc_timestamp_ms_offset(1_234_567_890_250), "2009-02-13T23:31:30.250+00:00");
        for bad in [
            "",
            "2009-02-13T23:31:30",
            "1970-01-01T00:00:00+01:00",
            "2009-02-13T23:31:30+24:00",
            "2009-02-13T23:31:30+0100",
            "2009-02-13T23:31:30 01:00",
            "2009-02-13T23:31:30+01:0x",
            "2009-02-13 23:31:30Z",
            "2009-13-13T23:31:30Z",
            "1969-12-31T23:59:59Z",
            "2009-02-13T23:31:30.Z",
            "2009-02-13T23:31:30Zx",
            "20é9-02-13T23:31:30Z",
        ] {
            assert_eq!(parse_utc_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(253_402_300_799), "9999-12-31T23:59:59Z");
        assert_eq!(utc_timestamp_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp_ms(1_795_341_600_250), "2026-11-22T10:00:00.250Z");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
    }

    /// The CloudEvents `time` the bridges stamp: milliseconds, fixed width, so it sorts as text.
    #[test]
    fn millisecond_timestamps_are_fixed_width_and_sort_as_text() {
        assert_eq!(utc_timestamp_ms(1_795_300_515_630), "2026-11-21T22:35:15.630Z");
        assert_eq!(utc_timestamp_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_timestamp_ms(1_795_300_515_007), "2026-11-21T22:35:15.007Z");
        let times: Vec<String> = [9, 10, 999, 1000, 86_399_999].into_iter().map(utc_timestamp_ms).collect();
        assert!(times.iter().all(|t| t.len() == 24), "{times:?}");
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    }

    #[test]
    fn now_is_after_2020() {
        assert!(now_s() > 1_577_836_800);
        assert!(now_ms() / 1000 >= now_s() - 1);
    }

    proptest! {
        /// Any offset and fraction reads as the `time` crate reads it.
        #[test]
        fn rfc3339_parses_as_the_time_crate_does(ms in 200_000_000u64..4_102_444_800_000, offset_min in -1439i32..1439) {
            use time::format_description::well_known::Rfc3339;
            let offset = time::UtcOffset::from_whole_seconds(offset_min * 60).expect("in range");
            let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).expect("in range").to_offset(offset);
            let text = t.format(&Rfc3339).expect("formats");
            let back = time::OffsetDateTime::parse(&text, &Rfc3339).expect("the time crate parses it");
            let expected = u64::try_from(back.unix_timestamp_nanos() / 1_000_000).expect("after 1970");
            prop_assert_eq!(parse_rfc3339_ms(&text), Some(expected), "{}", text);
        }

        /// The arithmetic agrees with the `time` crate on every day it represents.
        #[test]
        fn civil_from_days_matches_the_time_crate(days in 0u64..2_932_897) {
            let julian = i32::try_from(days).expect("small") + 2_440_588;
            let date = time::Date::from_julian_day(julian).expect("in range");
            let expected = (u64::try_from(date.year()).expect("after 1970"), u64::from(u8::from(date.month())), u64::from(date.day()));
            prop_assert_eq!(civil_from_days(days), expected);
        }
    }
}
