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

/// Ends the VMMs of a previous daemon and removes its leftovers. It needs
/// no room on disk (it only removes), so it runs before the catalogue is
/// opened: a full disk must not keep a dead daemon's VMMs running. The
/// catalogue's records of their pids are dropped afterwards
/// ([`forget_processes`]): every process of ours is found by its command
/// line, recorded or not (clones and standby processes of an old zygote are
/// not recorded by pid).
pub fn recover(state: &Path) -> anyhow::Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    let run = state.join("run");
    // VMMs run under `run/`, and restored sandboxes' under `sbx/` (whose
    // paused sandboxes stay: `crate::sandboxes`).
    let markers = [
        run.display().to_string(),
        format!("{}/", state.join("sbx").display()),
    ];
    // SIGKILL takes effect asynchronously, and a zygote being ended may still
    // start a standby clone: scan and kill until a scan finds none, so that
    // no VMM of the old daemon is left once this returns.
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..250 {
        let alive = our_vmms(&markers);
        if alive.is_empty() {
            break;
        }
        for pid in alive {
            // SAFETY: the pid was just checked to be a running spore VMM of
            // this state directory.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.insert(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    report.killed = killed.len();
    if let Some(pid) = our_vmms(&markers).first() {
        anyhow::bail!("VMM process {pid} of a previous daemon does not end");
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

/// Drops the catalogue's records of a previous daemon's VMM processes
/// (after [`recover`] ended them). A catalogue that cannot take the write (a
/// full disk) keeps them: harmless, as the next start checks each recorded
/// pid's command line before it ends anything, and no reason not to start.
pub fn forget_processes(catalog: &Catalog) -> anyhow::Result<()> {
    if let Err(e) = catalog.take_processes() {
        tracing::warn!("records of the previous daemon's VMMs kept for the next start: {e}");
    }
    Ok(())
}

/// Running (not zombie) processes of the spore binary with an argument under
/// `run_dir`, other than this one.
fn our_vmms(markers: &[String]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && markers.iter().any(|m| is_our_vmm(pid, m)) && !is_zombie(pid))
        .collect()
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
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
