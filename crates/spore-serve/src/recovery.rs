//! Starting after a daemon that died (SIGKILL, crash): its VMM processes are
//! ended and its run directories and temporary files removed. Deployed
//! functions are in the catalogue and survive; instances never do.
//!
//! A recorded pid is signalled only if `/proc/PID/cmdline` shows a `spore
//! vmm` serving a socket under this state directory: a pid reused by an
//! unrelated process is left alone. Clones started by a zygote (not the
//! daemon's children) are found the same way, by their command line.

use std::path::Path;

use crate::catalog::Catalog;

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub killed: usize,
    pub removed: usize,
}

pub fn recover(state: &Path, catalog: &Catalog) -> anyhow::Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    let run = state.join("run");
    let marker = run.display().to_string();
    let mut pids: Vec<i32> = catalog
        .take_processes()?
        .into_iter()
        .map(|p| p.pid)
        .collect();
    // Clones and standby processes of an old zygote are not recorded by
    // pid: find every process whose command line names our run directory.
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                pids.push(pid);
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    let me = std::process::id() as i32;
    for pid in pids {
        if pid != me && is_our_vmm(pid, &marker) {
            // SAFETY: the pid was just checked to be a spore VMM of this
            // state directory.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                report.killed += 1;
            }
        }
    }
    if run.exists() {
        if let Ok(entries) = std::fs::read_dir(&run) {
            report.removed += entries.count();
        }
        std::fs::remove_dir_all(&run)?;
    }
    // Half-written code (a daemon killed while storing a zip).
    if let Ok(entries) = std::fs::read_dir(state.join("code")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = std::fs::remove_dir_all(e.path());
                report.removed += 1;
            }
        }
    }
    Ok(report)
}

/// Whether `pid` runs the spore binary with an argument under `run_dir`.
fn is_our_vmm(pid: i32, run_dir: &str) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    let is_spore = args
        .first()
        .and_then(|a| std::str::from_utf8(a).ok())
        .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "spore"));
    is_spore
        && args
            .iter()
            .any(|a| std::str::from_utf8(a).is_ok_and(|a| a.contains(run_dir)))
}
