//! The benches' handle on one `spore vmm` process: spore-serve's
//! [`VmmProcess`] (how spore starts, calls and ends a VMM process), driven
//! from the benches' plain threads, plus what a bench reads beyond it: the
//! guest's console lines, the process's VmRSS, its exit status.

use std::cell::Cell;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use spore_serve::vmm::VmmProcess;

/// A `spore vmm` process; ended (and its run directory removed) on drop.
pub(crate) struct BenchVmm {
    process: VmmProcess,
    /// The runtime spore-serve's async handle runs on: one thread, this one.
    runtime: tokio::runtime::Runtime,
    /// Bytes of the console log already read by [`BenchVmm::expect`].
    console_read: Cell<usize>,
}

impl BenchVmm {
    /// Starts `spore vmm --api-sock <run_dir>/api.sock` (its console in
    /// `<run_dir>/vmm.log`) and waits for its API.
    pub(crate) fn spawn(spore: &Path, run_dir: &Path) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a runtime for the VMM handle")?;
        let _ = std::fs::remove_dir_all(run_dir);
        let process = runtime.block_on(VmmProcess::spawn(spore, run_dir, None, None, None))?;
        Ok(BenchVmm {
            process,
            runtime,
            console_read: Cell::new(0),
        })
    }

    /// One API call; fails on an HTTP error (naming the VMM's fault message).
    pub(crate) fn api(&self, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
        let body = (!body.is_empty()).then(|| body.to_string());
        self.runtime.block_on(self.process.api(method, path, body))
    }

    /// `GET path`, parsed.
    pub(crate) fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.api("GET", path, "")?)?)
    }

    /// Runs `f` (spore-serve's async calls about this VMM) to its end.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Where the VM's vsock device is to put its host socket.
    pub(crate) fn vsock_uds(&self) -> &Path {
        &self.process.vsock_uds
    }

    /// Waits for a console line containing `want` (after the lines earlier
    /// calls read); returns it.
    pub(crate) fn expect(&self, want: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        let log = self.process.run_dir.join("vmm.log");
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            let (found, read) = next_line_with(&text, self.console_read.get(), want);
            self.console_read.set(read);
            if let Some(line) = found {
                return Ok(line);
            }
            if Instant::now() >= deadline {
                bail!("no console line with {want:?} within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The process's resident memory (`VmRSS`), KiB.
    pub(crate) fn rss_kib(&self) -> anyhow::Result<u64> {
        crate::procfs::rss_kib(self.process.pid).context("no VmRSS")
    }

    /// Waits for the process to exit by itself (its guest ended); its status.
    pub(crate) fn wait_exit(&self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = peek_exit(self.process.pid)? {
                return Ok(status);
            }
            if start.elapsed() > timeout {
                bail!("the VMM did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for BenchVmm {
    fn drop(&mut self) {
        self.runtime.block_on(self.process.kill());
    }
}

/// The first whole line of `text` after byte `from` that contains `want`
/// (without its line end), and where reading stops: after that line, or
/// after the last whole line when none has it (a line still being written
/// is read again next time).
fn next_line_with(text: &[u8], from: usize, want: &str) -> (Option<String>, usize) {
    let mut read = from.min(text.len());
    for line in text[read..].split_inclusive(|&b| b == b'\n') {
        if !line.ends_with(b"\n") {
            break;
        }
        read += line.len();
        let line = String::from_utf8_lossy(line);
        if line.contains(want) {
            return (Some(line.trim_end_matches(['\n', '\r']).to_string()), read);
        }
    }
    (None, read)
}

/// The exit status of our child `pid` once it exited, left unreaped
/// (`WNOWAIT`): the [`VmmProcess`] reaps it when it is ended.
fn peek_exit(pid: i32) -> anyhow::Result<Option<ExitStatus>> {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only `info`; WNOWAIT leaves the child unreaped.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("waiting for the VMM");
    }
    // SAFETY: waitid filled `info` for a child state change (or left it
    // zeroed: no child exited yet, si_pid 0).
    let (child, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if child == 0 {
        return Ok(None);
    }
    // Back to a wait(2) status: an exit code in bits 8..16, else the signal.
    let raw = if code == libc::CLD_EXITED {
        (status & 0xff) << 8
    } else {
        status & 0x7f
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_are_read_whole_and_once() {
        let log = b"boot\r\nmemtest: filled\nmemtest: recl";
        let (line, at) = next_line_with(log, 0, "filled");
        assert_eq!(line.as_deref(), Some("memtest: filled"));
        assert_eq!(at, 22);
        // Not again, and not the line still being written.
        assert_eq!(next_line_with(log, at, "filled"), (None, at));
        assert_eq!(next_line_with(log, at, "memtest"), (None, at));
        let log = b"boot\r\nmemtest: filled\nmemtest: reclaimed\n";
        assert_eq!(
            next_line_with(log, at, "memtest").0.as_deref(),
            Some("memtest: reclaimed")
        );
        assert_eq!(next_line_with(log, 99, "x"), (None, log.len()));
    }

    #[test]
    fn exit_status_of_an_unreaped_child() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let t = Instant::now();
        let status = loop {
            if let Some(s) = peek_exit(pid).unwrap() {
                break s;
            }
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(status.code(), Some(3));
        // Still ours to reap, with the same status.
        assert_eq!(child.wait().unwrap().code(), Some(3));
    }
}
