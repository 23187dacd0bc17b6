//! `strftime_now(format)`: transformers' `datetime.now().strftime(format)`,
//! here formatting the fixed [`Now`] of the render (the C locale, a naive
//! time: `%Z` and `%z` are empty, as Python gives them for `datetime.now()`).

use std::fmt::Write;

use crate::Now;

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
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

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

impl Now {
    /// Refuses a date or time that Python's `datetime` would refuse.
    fn check(&self) -> Result<(), String> {
        let ok = (1..=9999).contains(&self.year)
            && (1..=12).contains(&self.month)
            && self.day >= 1
            && self.day <= days_in_month(self.year, self.month)
            && self.hour < 24
            && self.minute < 60
            && self.second < 60;
        if ok {
            Ok(())
        } else {
            Err(format!(
                "strftime_now: {self:?} is not a valid date and time"
            ))
        }
    }

    /// 0 for Sunday to 6 for Saturday.
    fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday.
        (days_from_civil(self.year, self.month, self.day) + 4).rem_euclid(7) as usize
    }

    /// 0-based day of the year.
    fn yday(&self) -> u32 {
        (1..self.month)
            .map(|m| days_in_month(self.year, m))
            .sum::<u32>()
            + self.day
            - 1
    }
}

/// Formats `now` as Python's `strftime(format)` does on Linux (glibc),
/// including the `-`, `_` and `0` padding flags. A directive it does not
/// know is refused rather than guessed.
pub fn strftime(now: &Now, format: &str) -> Result<String, String> {
    now.check()?;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let flag = match spec {
            Some(f @ ('-' | '_' | '0')) => {
                spec = chars.next();
                Some(f)
            }
            _ => None,
        };
        let Some(spec) = spec else {
            // A lone trailing '%' is kept, as glibc keeps it.
            out.push('%');
            if let Some(f) = flag {
                out.push(f);
            }
            break;
        };
        directive(&mut out, now, spec, flag).ok_or_else(|| {
            format!(
                "strftime_now: unsupported directive %{}{spec}",
                flag.map(String::from).unwrap_or_default()
            )
        })?;
    }
    Ok(out)
}

/// Appends one directive; `None` for one prep does not format.
fn directive(out: &mut String, now: &Now, spec: char, flag: Option<char>) -> Option<()> {
    let num = |out: &mut String, n: i64, width: usize, pad: char| {
        let pad = match flag {
            Some('-') => return write!(out, "{n}").ok(),
            Some('_') => ' ',
            Some('0') => '0',
            _ => pad,
        };
        let s = n.to_string();
        for _ in s.len()..width {
            out.push(pad);
        }
        out.push_str(&s);
        Some(())
    };
    let hour12 = i64::from(if now.hour.is_multiple_of(12) {
        12
    } else {
        now.hour % 12
    });
    let wday = now.weekday();
    let yday = i64::from(now.yday());
    match spec {
        'Y' => num(out, i64::from(now.year), 1, '0')?,
        'C' => num(out, i64::from(now.year / 100), 2, '0')?,
        'y' => num(out, i64::from(now.year % 100), 2, '0')?,
        'm' => num(out, i64::from(now.month), 2, '0')?,
        'd' => num(out, i64::from(now.day), 2, '0')?,
        'e' => num(out, i64::from(now.day), 2, ' ')?,
        'H' => num(out, i64::from(now.hour), 2, '0')?,
        'k' => num(out, i64::from(now.hour), 2, ' ')?,
        'I' => num(out, hour12, 2, '0')?,
        'l' => num(out, hour12, 2, ' ')?,
        'M' => num(out, i64::from(now.minute), 2, '0')?,
        'S' => num(out, i64::from(now.second), 2, '0')?,
        'j' => num(out, yday + 1, 3, '0')?,
        'u' => num(out, if wday == 0 { 7 } else { wday as i64 }, 1, '0')?,
        'w' => num(out, wday as i64, 1, '0')?,
        'U' => num(out, (yday + 7 - wday as i64) / 7, 2, '0')?,
        'W' => num(out, (yday + 7 - ((wday as i64 + 6) % 7)) / 7, 2, '0')?,
        'f' => out.push_str("000000"),
        'a' => out.push_str(&DAYS[wday][..3]),
        'A' => out.push_str(DAYS[wday]),
        'b' | 'h' => out.push_str(&MONTHS[now.month as usize - 1][..3]),
        'B' => out.push_str(MONTHS[now.month as usize - 1]),
        'p' => out.push_str(if now.hour < 12 { "AM" } else { "PM" }),
        'P' => out.push_str(if now.hour < 12 { "am" } else { "pm" }),
        'F' => out.push_str(&strftime(now, "%Y-%m-%d").ok()?),
        'T' | 'X' => out.push_str(&strftime(now, "%H:%M:%S").ok()?),
        'D' | 'x' => out.push_str(&strftime(now, "%m/%d/%y").ok()?),
        'R' => out.push_str(&strftime(now, "%H:%M").ok()?),
        'r' => out.push_str(&strftime(now, "%I:%M:%S %p").ok()?),
        'c' => out.push_str(&strftime(now, "%a %b %e %H:%M:%S %Y").ok()?),
        'Z' | 'z' => {}
        'n' => out.push('\n'),
        't' => out.push('\t'),
        '%' if flag.is_none() => out.push('%'),
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected outputs came from CPython 3.11 on Linux:
    // datetime(2025, 3, 7, 9, 5, 3).strftime(f).
    #[test]
    fn formats_as_python() {
        let now = Now {
            year: 2025,
            month: 3,
            day: 7,
            hour: 9,
            minute: 5,
            second: 3,
        };
        for (f, want) in [
            ("%Y-%m-%d %H:%M:%S", "2025-03-07 09:05:03"),
            ("%d %B %Y", "07 March 2025"),
            ("%b %a %A %y %j %p %I", "Mar Fri Friday 25 066 AM 09"),
            ("%e|%-d|%-m|%-H|%-I|%-j|%k|%l", " 7|7|3|9|9|66| 9| 9"),
            (
                "%F %T %D %R %C %u %w",
                "2025-03-07 09:05:03 03/07/25 09:05 20 5 5",
            ),
            ("%Z%z|%f|%h|%U|%W", "|000000|Mar|09|09"),
            (
                "%c|%x|%X|%r|%P|%_d|%0e|%%",
                "Fri Mar  7 09:05:03 2025|03/07/25|09:05:03|09:05:03 AM|am| 7|07|%",
            ),
            ("100%", "100%"),
        ] {
            assert_eq!(strftime(&now, f).unwrap(), want, "{f}");
        }
        assert!(strftime(&now, "%Q").is_err());
        assert!(strftime(&now, "%5d").is_err());
    }

    #[test]
    fn weeks_and_days_at_year_ends() {
        // datetime(2024, 12, 31).strftime("%a %j %U %W") == 'Tue 366 52 53'
        let now = Now {
            year: 2024,
            month: 12,
            day: 31,
            hour: 23,
            minute: 59,
            second: 59,
        };
        assert_eq!(
            strftime(&now, "%a %j %U %W %p %I").unwrap(),
            "Tue 366 52 53 PM 11"
        );
    }
}
