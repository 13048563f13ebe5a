//! Human durations: `500ms`, `30s`, `5m`, `2h`, `1d`; a bare number is seconds.

use std::time::Duration;

use crate::errors::CliError;

/// Parses a duration.
pub fn parse(text: &str) -> Result<Duration, CliError> {
    let bad = || {
        CliError::invalid(
            format!("`{text}` is not a duration"),
            "use a number with ms, s, m, h or d, e.g. `30s` or `24h`",
        )
    };
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        _ => return Err(bad()),
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "abc", "5 weeks", "0s", "-1s", "1y"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
