//! Process-level plumbing shared by the subcommands: logging, host signals,
//! console input, the marks file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use spore_vmm::devices::legacy::signal::Mark;
use spore_vmm::seccomp::SeccompSetting;
use spore_vmm::vmm::Vmm;

/// The seccomp flags of the subcommands that run a VMM in this process.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SeccompArgs {
    /// Run without seccomp filters (they are on by default: a syscall
    /// outside a thread's allow list kills the VMM process).
    #[arg(long, conflicts_with = "seccomp_filter")]
    pub no_seccomp: bool,
    /// Replace the built-in seccomp filters with this file's: seccompiler
    /// JSON or Firecracker's compiled form (`seccompiler-bin`), one filter
    /// per thread kind (keys "vmm", "api", "vcpu").
    #[arg(long, value_name = "FILE")]
    pub seccomp_filter: Option<PathBuf>,
}

impl SeccompArgs {
    /// The choice these flags make (a filter file as an absolute path, so
    /// that clone processes find it too).
    pub fn setting(&self) -> std::io::Result<SeccompSetting> {
        Ok(match (&self.seccomp_filter, self.no_seccomp) {
            (Some(p), _) => SeccompSetting::File(std::path::absolute(p)?),
            (None, true) => SeccompSetting::Off,
            (None, false) => SeccompSetting::Default,
        })
    }
}

/// Sets this process's seccomp choice (compiling the filters) before any
/// thread starts; the main thread installs its own later
/// ([`spore_vmm::seccomp::apply_main`]), before the guest runs.
pub fn configure_seccomp(setting: SeccompSetting) -> anyhow::Result<()> {
    spore_vmm::seccomp::configure(setting)?;
    Ok(())
}

/// Logs go to stderr; `SPORE_LOG` sets the filter (default `warn`). Beside
/// it, Firecracker's logger (`PUT /logger`, `firecracker --log-path`) writes
/// to its own path at its own level once configured. Both outputs share one
/// per-call-site rate limit ([`spore_vmm::log_limit`]).
pub fn init_logging() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPORE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    tracing_subscriber::registry()
        .with(stderr)
        .with(spore_vmm::logger::layer())
        .with(spore_vmm::log_limit::layer())
        .init();
}

/// The host signal that stopped the VM, 0 if none.
static HOST_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Exit status for a VM stopped by a host signal (128 + signal), if one was.
pub fn host_signal_status() -> Option<u8> {
    match HOST_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        // Signal numbers are small and positive; anything else saturates.
        s => Some(u8::try_from(128_i32.saturating_add(s)).unwrap_or(u8::MAX)),
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in every thread and turns them into a
/// clean stop of the VM from one dedicated thread. Call before starting any
/// other thread so that they inherit the mask.
pub fn stop_on_host_signals(vmm: Arc<Vmm>) -> std::io::Result<()> {
    // SAFETY: plain sigset manipulation on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        set
    };
    spore_vmm::seccomp::spawn(
        spore_vmm::seccomp::ThreadKind::Vmm,
        "host-signals".into(),
        move || {
            let mut sig = 0;
            // SAFETY: set is a valid, initialised sigset.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                HOST_SIGNAL.store(sig, Ordering::SeqCst);
                vmm.request_stop();
            }
        },
    )?;
    Ok(())
}

/// Forwards this process's stdin to the guest's serial port.
pub fn forward_stdin(vmm: Arc<Vmm>) {
    let _ = spore_vmm::seccomp::spawn(
        spore_vmm::seccomp::ThreadKind::Vmm,
        "serial-in".into(),
        move || {
            let mut stdin = std::io::stdin();
            let mut buf = [0u8; 64];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let mut rest = &buf[..n];
                while !rest.is_empty() {
                    let taken = vmm.serial_input(rest);
                    rest = &rest[taken..];
                    if taken == 0 {
                        // The guest's FIFO is full (or the VM is gone).
                        if vmm.control().stop_reason().is_some() {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            }
        },
    );
}

/// Writes the guest's marks as JSON, atomically (temp file, fsync, rename).
pub fn write_marks(path: &Path, marks: &[Mark]) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(marks).map_err(std::io::Error::other)?;
    write_atomic(path, &json)
}

pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    let tmp = dir.unwrap_or(Path::new(".")).join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
