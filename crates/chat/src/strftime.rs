//! `strftime_now(format)` for chat templates.
//!
//! transformers exposes `datetime.now().strftime(format)` to templates (Llama 3
//! and others print today's date into the system prompt). We implement the
//! C `strftime` directives those templates use over UTC, without pulling a
//! date-time crate into the prompt path. The server runs in UTC; a template
//! rendered by transformers on a machine in another zone could show another
//! date around midnight, which no golden test pins.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

impl UtcTime {
    pub fn now() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Self::from_unix(secs)
    }

    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let jan1 = days_from_civil(year, 1, 1);
        UtcTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
            // 1970-01-01 was a Thursday (3 when Monday is 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: (days - jan1 + 1) as u32,
        }
    }
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `t` like C's `strftime` in the C locale. Supports the directives
/// chat templates use (`%Y %y %m %d %e %H %I %M %S %p %B %b %h %A %a %j %F %T
/// %D %%`) plus glibc's `%-d`-style "no padding" flag; unknown directives are
/// copied through, as glibc does.
pub fn strftime(format: &str, t: &UtcTime) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |n: u32, width: usize| {
            if no_pad {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = if t.hour % 12 == 0 { 12 } else { t.hour % 12 };
        let piece = match d {
            'Y' => t.year.to_string(),
            'y' => num(t.year.rem_euclid(100) as u32, 2),
            'm' => num(t.month, 2),
            'd' => num(t.day, 2),
            'e' => format!("{:>2}", t.day),
            'H' => num(t.hour, 2),
            'I' => num(hour12, 2),
            'M' => num(t.minute, 2),
            'S' => num(t.second, 2),
            'p' => (if t.hour < 12 { "AM" } else { "PM" }).to_string(),
            'B' => MONTHS[(t.month - 1) as usize].to_string(),
            'b' | 'h' => MONTHS[(t.month - 1) as usize][..3].to_string(),
            'A' => WEEKDAYS[t.weekday as usize].to_string(),
            'a' => WEEKDAYS[t.weekday as usize][..3].to_string(),
            'j' => num(t.yday, 3),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'D' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            '%' => "%".to_string(),
            other => format!("%{}{other}", if no_pad { "-" } else { "" }),
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instant() {
        // 2024-02-29T13:05:09Z, a Thursday, day 60 of a leap year.
        let t = UtcTime::from_unix(1_709_211_909);
        assert_eq!(
            t,
            UtcTime {
                year: 2024,
                month: 2,
                day: 29,
                hour: 13,
                minute: 5,
                second: 9,
                weekday: 3,
                yday: 60
            }
        );
        assert_eq!(strftime("%d %b %Y", &t), "29 Feb 2024");
        assert_eq!(
            strftime("%A, %B %-d %I:%M %p", &t),
            "Thursday, February 29 01:05 PM"
        );
        assert_eq!(
            strftime("%F %T %j %y %% %Q", &t),
            "2024-02-29 13:05:09 060 24 % %Q"
        );
    }

    #[test]
    fn epoch_and_negative() {
        assert_eq!(strftime("%F %a", &UtcTime::from_unix(0)), "1970-01-01 Thu");
        assert_eq!(
            strftime("%F %a", &UtcTime::from_unix(-86_400)),
            "1969-12-31 Wed"
        );
    }
}
