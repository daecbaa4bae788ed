//! What the agent does as PID 1 of a function guest (replacing `/init`):
//! the basic mounts, loopback up, reaping every child, the function's code
//! device, reseeding after a clone, and a clean power-off on SIGTERM.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spore_abi::signal::{encode, SignalOp};

use super::runtime;
use super::state::Agent;
use crate::port::SignalPort;
use crate::reseed;

pub fn is_pid1() -> bool {
    std::process::id() == 1
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::ErrorKind::InvalidInput.into())
}

/// mount(2); an already mounted target (EBUSY) is fine.
fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f, d) = (cstr(source)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        return Ok(());
    }
    Err(e)
}

/// The mounts `/init` makes in the other guests (`guest/init.sh`).
pub fn mount_basics() {
    let nodev = libc::MS_NOSUID | libc::MS_NODEV;
    let mounts: [(&str, &str, &str, libc::c_ulong, &str); 6] = [
        ("proc", "/proc", "proc", nodev | libc::MS_NOEXEC, ""),
        ("sysfs", "/sys", "sysfs", nodev | libc::MS_NOEXEC, ""),
        ("devtmpfs", "/dev", "devtmpfs", libc::MS_NOSUID, "mode=0755"),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            libc::MS_NOSUID | libc::MS_NOEXEC,
            "gid=5,mode=620",
        ),
        ("tmpfs", "/dev/shm", "tmpfs", nodev, "mode=1777"),
        ("tmpfs", "/tmp", "tmpfs", nodev, "mode=1777"),
    ];
    for (source, target, fstype, flags, data) in mounts {
        if let Err(e) = mount(source, target, fstype, flags, data) {
            eprintln!("spore-agent: mount {fstype} on {target}: {e}");
        }
    }
}

/// IFF_UP | IFF_RUNNING in `ifr_flags`' type.
#[allow(
    clippy::cast_possible_truncation,
    reason = "IFF_UP | IFF_RUNNING is 0x41, within c_short"
)]
const UP_RUNNING: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;

/// Brings `lo` up with SIOCSIFFLAGS (the kernel gives it 127.0.0.1 itself),
/// so the Runtime API can listen on 127.0.0.1 without busybox `ip`.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: ifr is a valid ifreq naming "lo"; the kernel fills ifru_flags.
    if unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            crate::ioctl::request(libc::SIOCGIFFLAGS),
            &mut ifr,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS set the flags member of the union.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= UP_RUNNING;
    }
    // SAFETY: as above; the kernel only reads ifr.
    if unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            crate::ioctl::request(libc::SIOCSIFFLAGS),
            &ifr,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The signals that ask PID 1 to stop (busybox `poweroff`, `halt` and
/// `reboot` send USR2, USR1 and TERM). Blocked in every thread (call before
/// starting any) so that one thread takes them with sigwait; std's spawn
/// clears the mask in children.
pub fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

pub fn block_stop_signals() {
    let set = stop_signals();
    // SAFETY: set is initialised; changes only this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits for a stop signal, then powers off.
pub fn start_stop_handler(agent: Arc<Agent>) {
    std::thread::spawn(move || {
        let set = stop_signals();
        let mut sig = 0;
        // SAFETY: set is initialised and sig a valid out pointer.
        while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
        eprintln!("spore-agent: signal {sig}: powering off");
        power_off(&agent);
    });
}

/// Stops the runtime, then ends the VM ([`halt`] 0).
pub fn power_off(agent: &Agent) -> ! {
    if let Some(pid) = agent.runtime_pid() {
        // SAFETY: kill(2) on the runtime's process group.
        unsafe { libc::kill(-pid, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(2);
        while agent.runtime_pid().is_some() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(pid) = agent.runtime_pid() {
            runtime::kill_group(pid);
        }
    }
    halt(0)
}

/// Reaps every child (orphans are re-parented to PID 1) and tells the agent
/// about each, so that it notices its runtime's exit. It waits for a child
/// to end without reaping it (`WNOWAIT`), then reaps it outside a spawn
/// ([`runtime::SPAWNING`]).
pub fn start_reaper(agent: Arc<Agent>) {
    std::thread::spawn(move || loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid siginfo pointer; WNOWAIT leaves the child waitable.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                // No children yet (between runtimes): look again shortly.
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        // SAFETY: waitid succeeded for an exited child, so si_pid is set.
        let pid = unsafe { info.si_pid() };
        let mut status = 0;
        let reaped = {
            let _spawning = runtime::lock(&runtime::SPAWNING);
            // SAFETY: waitpid on one child with a valid status pointer.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) }
        };
        if reaped == pid {
            agent.on_child_exit(pid, status);
        }
    });
}

/// Ends the VM with `code` (signal-port EXIT; the guest has no ACPI), else
/// reboot(2); never returns, since PID 1 must not exit (the kernel would panic).
pub fn halt(code: u8) -> ! {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    // The agent's last words (an init error, say) must reach the host first.
    crate::console::drain(Duration::from_secs(2));
    if let Ok(port) = SignalPort::open() {
        port.write(encode(SignalOp::Exit, u32::from(code)));
    }
    // SAFETY: reboot(2) as PID 1 after syncing; it does not return on success.
    unsafe {
        libc::reboot(libc::RB_POWER_OFF);
        libc::reboot(libc::RB_AUTOBOOT);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// As PID 1 a panic (release builds abort) must stop the VM, not the kernel.
pub fn halt_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        halt(1);
    }));
}

/// Reseeds the RNG (and applies a new network identity) on each generation
/// notice, as `spore-reseed` does in the other guests.
pub fn start_generation_watcher() {
    std::thread::spawn(|| {
        if let Err(e) = reseed::watch_notices(reseed::handle_notice) {
            eprintln!("spore-agent: generation notices: {e}");
        }
    });
}

/// `BLKFLSBUF` = `_IO(0x12, 97)`.
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// Mounts the function's code (ext4, read-only) at `dir`. The host may have
/// swapped the drive's backing file just before Configure (PATCH /drives on
/// a VM restored from the base snapshot), so the device's cached blocks are
/// dropped first and the filesystem is mounted fresh.
pub fn mount_code(device: &str, dir: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {dir}: {e}"))?;
    let dev = std::fs::File::open(device).map_err(|e| format!("open {device}: {e}"))?;
    // SAFETY: an argument-less ioctl on our own descriptor.
    if unsafe { libc::ioctl(dev.as_raw_fd(), crate::ioctl::request(BLKFLSBUF)) } < 0 {
        eprintln!(
            "spore-agent: BLKFLSBUF {device}: {} (mounting anyway)",
            io::Error::last_os_error()
        );
    }
    drop(dev);
    mount(
        device,
        dir,
        "ext4",
        libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOSUID,
        "",
    )
    .map_err(|e| format!("mount {device} (ext4, read-only) on {dir}: {e}"))
}
