//! Other processes as the tests see them: which process serves a socket
//! (SO_PEERCRED), whether a pid still runs, and the memory processes hold.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The pid of the process serving a Unix socket (SO_PEERCRED).
pub fn peer_pid(sock: &Path) -> Option<i32> {
    let s = UnixStream::connect(sock).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len =
        libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).expect("a ucred is 12 bytes");
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Sum of the PSS of these processes, bytes (0 for one that is gone).
pub fn pss_bytes(pids: &[i32]) -> u64 {
    pids.iter()
        .map(|&pid| spore_serve::vmm::proc_pss_bytes(pid))
        .sum()
}

/// Sum of the private memory (`Private_Clean` + `Private_Dirty`, bytes) of
/// these processes: what the host gets back when they end.
pub fn private_bytes(pids: &[i32]) -> u64 {
    smaps_bytes(pids, &["Private_Clean:", "Private_Dirty:"])
}

/// Sum of the shared memory (`Shared_Clean` + `Shared_Dirty`, bytes) of
/// these processes: pages another process maps too, which become private
/// to the last one left mapping them.
pub fn shared_bytes(pids: &[i32]) -> u64 {
    smaps_bytes(pids, &["Shared_Clean:", "Shared_Dirty:"])
}

/// Sum over `pids` of the `smaps_rollup` fields named (0 for a process that
/// is gone).
fn smaps_bytes(pids: &[i32], fields: &[&str]) -> u64 {
    pids.iter()
        .map(|pid| {
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            text.lines()
                .filter(|l| fields.iter().any(|f| l.starts_with(f)))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
                * 1024
        })
        .sum()
}

/// The resident set (`VmRSS`) of process `pid` in bytes, None once it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
