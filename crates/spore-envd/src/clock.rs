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
fn parse_rfc3339(ts: &str) -> Option<(i64, i64)> {
    let (date, rest) = ts.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    let (year, month, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let offset_at = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(offset_at);
    let mut t = time.splitn(3, ':');
    let (hour, minute): (i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let (sec, frac) = t
        .next()?
        .split_once('.')
        .unwrap_or((t.next().unwrap_or("0"), ""));
    let sec: i64 = sec.parse().ok()?;
    let nanos: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").get(..9)?.parse().ok()?
    };
    let offset = match zone.as_bytes().first() {
        None | Some(b'Z' | b'z') => 0,
        Some(sign) => {
            let (h, m) = zone[1..].split_once(':')?;
            let minutes = h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?;
            if *sign == b'-' {
                -minutes * 60
            } else {
                minutes * 60
            }
        }
    };
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || sec > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((
        days * 86_400 + hour * 3600 + minute * 60 + sec - offset,
        nanos,
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
