//! The times a manifest records: RFC 3339 UTC, from the clock or from
//! `SOURCE_DATE_EPOCH` for reproducible outputs.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as RFC 3339 UTC, e.g. `2026-11-21T09:30:00Z`.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// The time a manifest records as its writing (`provenance.created`):
/// `SOURCE_DATE_EPOCH` where it is set, so that two runs with the same
/// inputs and options write byte-identical manifests, else the clock.
/// The command line refuses a malformed value before any work
/// ([`source_date_epoch`]); a library caller's is taken as unset.
pub fn created_time() -> String {
    match source_date_epoch() {
        Ok(Some(secs)) => rfc3339(secs),
        _ => now_rfc3339(),
    }
}

/// `SOURCE_DATE_EPOCH`, the reproducible-builds convention: seconds since
/// 1970-01-01 UTC as a whole decimal number. `None` when unset or empty.
pub fn source_date_epoch() -> Result<Option<u64>, String> {
    let Some(value) = std::env::var_os("SOURCE_DATE_EPOCH") else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<u64>() {
        // Years past 9999 do not fit RFC 3339's four digits.
        Ok(secs) if secs < 253_402_300_800 => Ok(Some(secs)),
        _ => Err(format!(
            "SOURCE_DATE_EPOCH is {text:?}: it must be whole seconds since 1970-01-01 UTC, \
             before the year 10000 (manifests record it as the time they were written)"
        )),
    }
}

/// `secs` since 1970-01-01 as RFC 3339 UTC.
fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_shape() {
        let t = super::now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'), "{t}");
    }

    #[test]
    fn dates_are_the_civil_calendars() {
        // Checked against `date -u -d @SECS`.
        for (secs, date) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_798_761_599, "2026-12-31T23:59:59Z"),
            (253_402_300_799, "9999-12-31T23:59:59Z"),
        ] {
            assert_eq!(super::rfc3339(secs), date);
        }
    }
}
