//! Byte sizes as users write them on the command line: `1GiB`, `512MB`, `4096`.

/// Parses a size: a number (a decimal fraction is allowed with a unit), then an
/// optional unit `B`, `KB`, `MB`, `GB`, `TB` (powers of 1000) or `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 1024); units are case-insensitive and may follow a
/// space. Returns an error message naming what was wrong.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "tb" | "t" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {unit:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    if number.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a number, e.g. 1GiB or 500MB"
        ));
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(multiplier)
            .ok_or_else(|| format!("size {s:?} is too large"));
    }
    let x: f64 = number
        .parse()
        .map_err(|_| format!("invalid size {s:?}: {number:?} is not a number"))?;
    let bytes = x * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

/// A byte count for people: `1.50 GiB`, `12.3 MiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1KB"), Ok(1000));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2gb"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5MiB"), Ok(1_572_864));
        assert_eq!(parse_size("10B"), Ok(10));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse_size("1XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("GiB").unwrap_err().contains("expected a number"));
        assert!(parse_size("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("1.2.3MB").unwrap_err().contains("not a number"));
    }

    /// fixtures/sizes/cases.json is the table the Python package's
    /// `prep.streaming.parse_size` is tested against too: one rule in two
    /// languages.
    #[test]
    fn the_shared_table_of_cases() {
        let text = include_str!("../fixtures/sizes/cases.json");
        let table: serde_json::Value = serde_json::from_str(text).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() > 20);
        for case in cases {
            let (input, want) = (case[0].as_str().unwrap(), case[1].as_u64());
            match (parse_size(input), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{input:?}"),
                (Err(_), None) => {}
                (got, want) => panic!("{input:?}: got {got:?}, the table says {want:?}"),
            }
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }
}
