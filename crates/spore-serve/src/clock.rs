//! The daemon's clock: wall-clock milliseconds (deadlines sent to guests,
//! records, request signing) and Lambda's timestamp form.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Lambda's timestamp form, e.g. `2026-11-24T22:30:00.123+0000`.
pub fn lambda_time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}+0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Now, in Lambda's timestamp form.
pub fn lambda_now() -> String {
    lambda_time(SystemTime::now())
}

/// Now, as ISO 8601 in UTC with milliseconds (`2026-11-24T22:30:00.123Z`):
/// the form of Lambda's destination records.
pub fn iso_now() -> String {
    lambda_now().replace("+0000", "Z")
}

/// Milliseconds since the epoch as RFC 3339 in UTC (`2026-11-24T22:30:00.123Z`).
pub fn iso_ms(unix_ms: u64) -> String {
    lambda_time(UNIX_EPOCH + std::time::Duration::from_millis(unix_ms)).replace("+0000", "Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_lambdas() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_998_600_123);
        assert_eq!(lambda_time(t), "2026-11-30T00:30:00.123+0000");
        assert_eq!(lambda_time(UNIX_EPOCH), "1970-01-01T00:00:00.000+0000");
    }
}
