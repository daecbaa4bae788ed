//! What `/proc` says about a VMM process the bench started: resident
//! memory, CPU time, whether it is gone. Proportional memory (PSS) is
//! spore-serve's reader, [`spore_serve::vmm::proc_pss_bytes`].

use std::path::Path;
use std::time::{Duration, Instant};

/// Guest-RAM mappings are named after the memfd (see `spore_vmm::memory`).
const GUEST_RAM_MAPPING: &str = "spore-guest-ram";

/// `VmRSS:` of `/proc/PID/status`, in KiB.
pub(crate) fn rss_kib(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The process's proportional set size in KiB, `None` if unreadable
/// (a running process's is never 0).
pub(crate) fn pss_kib(pid: i32) -> Option<u64> {
    match spore_serve::vmm::proc_pss_bytes(pid) {
        0 => None,
        bytes => Some(bytes / 1024),
    }
}

/// Sum of `Rss:` over the process's mappings, in KiB, without guest RAM:
/// what the VMM itself costs.
pub(crate) fn rss_excluding_guest_kib(pid: u32) -> anyhow::Result<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut total = 0u64;
    let mut in_guest_ram = false;
    for line in smaps.lines() {
        if let Some(rest) = line.strip_prefix("Rss:") {
            if !in_guest_ram {
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse()?;
                total += kib;
            }
        } else if is_mapping_header(line) {
            in_guest_ram = line.contains(GUEST_RAM_MAPPING);
        }
    }
    Ok(total)
}

/// Mapping header lines of `smaps` start with "start-end perms".
fn is_mapping_header(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|range| {
        range.contains('-') && range.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

/// CPU time of a process so far (all its threads), in ms: the first
/// field of `/proc/PID/task/*/schedstat`, in ns (clock ticks of `stat` are
/// 10 ms, more than a clone costs). A thread that ends between the listing
/// and its read is skipped, not taken for a vanished process; `None` only
/// when the process itself is gone.
pub(crate) fn cpu_ms(pid: u32) -> Option<f64> {
    let total: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Some(total as f64 / 1e6)
}

/// Waits until the process has exited (gone, or a zombie its parent has
/// not reaped yet); false if it still runs after `timeout`.
pub(crate) fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        if t.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_headers() {
        assert!(is_mapping_header(
            "7f0000000000-7f0008000000 rw-s 00000000 00:01 5 /memfd:spore-guest-ram (deleted)"
        ));
        assert!(!is_mapping_header("Rss:                 123 kB"));
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let pid = std::process::id();
        assert!(rss_kib(pid as i32).is_some_and(|k| k > 0));
        assert!(pss_kib(pid as i32).is_some_and(|k| k > 0));
        assert!(rss_excluding_guest_kib(pid).is_ok_and(|k| k > 0));
        assert!(cpu_ms(pid).is_some());
    }

    #[test]
    fn cpu_time_survives_threads_that_come_and_go() {
        let pid = std::process::id();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::thread::spawn(|| ()).join();
                }
            })
        };
        let all_read = (0..2000).all(|_| cpu_ms(pid).is_some());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = churn.join();
        assert!(
            all_read,
            "a thread ending mid-read made the process look gone"
        );
    }
}
