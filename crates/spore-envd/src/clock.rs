//! Setting the guest's clock from the host's timestamp (`/init` after a
//! resume: a restored VM wakes with the time it was paused at).

/// Sets CLOCK_REALTIME to an RFC 3339 timestamp (`2026-11-30T09:00:00.123Z`).
pub fn set_from_rfc3339(ts: &str) -> Result<(), String> {
    let (secs, nanos) = parse_rfc3339(ts).ok_or_else(|| format!("invalid timestamp {ts:?}"))?;
    let spec = libc::timespec {
        tv_sec: secs,
        tv_nsec: nanos,
    };
    // SAFETY: a valid timespec for the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &spec) } != 0 {
        return Err(format!(
            "setting the clock: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Seconds and nanoseconds since the epoch of an RFC 3339 timestamp.
fn parse_rfc3339(ts: &str) -> Option<(libc::time_t, libc::c_long)> {
    let t = chrono::DateTime::parse_from_rfc3339(ts).ok()?;
    Some((
        t.timestamp(),
        libc::c_long::from(t.timestamp_subsec_nanos()),
    ))
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339;

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(
            parse_rfc3339("2026-11-30T09:00:00.5Z"),
            Some((1_796_029_200, 500_000_000))
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T10:00:00+01:00"),
            Some((1_796_029_200, 0))
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
    }
}
