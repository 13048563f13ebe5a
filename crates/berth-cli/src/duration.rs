//! Human durations: `500ms`, `30s`, `5m`, `2h`, `1d`; a bare number is seconds.

use std::time::Duration;

use crate::errors::CliError;

/// Parses a duration (one parser for the CLI and mission files; bounded, never panics).
pub fn parse(text: &str) -> Result<Duration, CliError> {
    berth_mission::file::parse_duration(text).ok_or_else(|| {
        CliError::invalid(
            format!("`{text}` is not a duration between 1ms and 366d"),
            "use a number with ms, s, m, h or d, e.g. `30s` or `24h`",
        )
    })
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
        for bad in [
            "",
            "abc",
            "5 weeks",
            "0s",
            "-1s",
            "1y",
            "99999999999999999999",
            "300000000d",
            "99999999999999999999h",
            "1e400",
            "NaN",
            "367d",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
