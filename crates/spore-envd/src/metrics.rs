//! `/metrics`: the guest's resource use, from /proc and statvfs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One sample: CPU use over a short window, memory, and the root filesystem.
pub fn sample() -> std::io::Result<serde_json::Value> {
    let before = cpu_times()?;
    std::thread::sleep(Duration::from_millis(100));
    let after = cpu_times()?;
    let total = after.0.saturating_sub(before.0);
    let idle = after.1.saturating_sub(before.1);
    #[allow(clippy::cast_precision_loss, reason = "a percentage")]
    let cpu_used_pct = if total == 0 {
        0.0
    } else {
        100.0 * (total - idle) as f64 / total as f64
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib = |key: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
            * 1024
    };
    let mem_total = kib("MemTotal");
    let mem_used = mem_total.saturating_sub(kib("MemAvailable"));
    let (disk_total, disk_used) = disk("/")?;
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let cpu_count = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1);
    Ok(serde_json::json!({
        "ts": ts,
        "cpu_count": cpu_count,
        "cpu_used_pct": (cpu_used_pct * 100.0).round() / 100.0,
        "mem_total": mem_total,
        "mem_used": mem_used,
        "mem_cache": kib("Cached"),
        "mem_total_mib": mem_total >> 20,
        "mem_used_mib": mem_used >> 20,
        "disk_total": disk_total,
        "disk_used": disk_used,
    }))
}

/// (all jiffies, idle jiffies) from /proc/stat's first line.
fn cpu_times() -> std::io::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok((fields.iter().sum(), idle))
}

/// (total, used) bytes of the filesystem holding `path`.
fn disk(path: &str) -> std::io::Result<(u64, u64)> {
    let c_path = std::ffi::CString::new(path)?;
    // SAFETY: statvfs is plain data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a valid out-pointer.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(
        clippy::useless_conversion,
        reason = "the field widths differ between libcs"
    )]
    let frsize = u64::from(st.f_frsize);
    #[allow(clippy::useless_conversion, reason = "as above")]
    let (blocks, free) = (u64::from(st.f_blocks), u64::from(st.f_bfree));
    Ok((blocks * frsize, (blocks - free.min(blocks)) * frsize))
}
