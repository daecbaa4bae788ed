//! Sandbox mode (`spore.mode=sandbox` on the kernel command line): PID 1 of a
//! Linux sandbox guest. Instead of relaying function invocations it keeps
//! spore-envd running (E2B's envd: the sandbox's API, on vsock port 49983),
//! restarting it should it die, reaps orphans, reseeds after a clone, and
//! powers off on a stop signal. Its network, if the kernel command line
//! names one, is configured first ([`guest_net`]).

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::Duration;

use super::config::cmdline_value;
use super::{child, guest_net, pid1};

/// Where the images put spore-envd (`spore.envd=` overrides).
const DEFAULT_ENVD: &str = "/usr/local/bin/spore-envd";

/// Runs the sandbox's PID 1; never returns.
pub fn run(cmdline: &str) -> ! {
    if let Err(e) = pid1::loopback_up() {
        eprintln!("spore-agent: bringing lo up: {e}");
    }
    // Before envd starts: the commands it runs find the network there.
    match guest_net::from_cmdline(cmdline) {
        Ok(Some(net)) => match guest_net::apply(&net) {
            Ok(()) => eprintln!("spore-agent: {} is {}/{}", net.iface, net.addr, net.prefix),
            Err(e) => eprintln!("spore-agent: configuring the network: {e}"),
        },
        Ok(None) => {}
        Err(e) => eprintln!("spore-agent: {e}"),
    }
    pid1::start_generation_watcher();
    start_stop_handler();
    let envd = cmdline_value(cmdline, "spore.envd")
        .unwrap_or(DEFAULT_ENVD)
        .to_owned();
    let default_user = cmdline_value(cmdline, "spore.user").map(str::to_owned);
    let mut child = start_envd(&envd, default_user.as_deref());
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                std::thread::sleep(Duration::from_millis(100));
                child = start_envd(&envd, default_user.as_deref());
            }
            continue;
        }
        if child
            .as_ref()
            .is_some_and(|c| u32::try_from(pid).ok() == Some(c.id()))
        {
            eprintln!("spore-agent: spore-envd ended (wait status {status}); restarting it");
            // Not in a tight loop should it fail at once.
            std::thread::sleep(Duration::from_millis(200));
            child = start_envd(&envd, default_user.as_deref());
        }
    }
}

/// Starts spore-envd; `None` (and a line on the console) if it cannot start,
/// to be tried again when the reaper finds no child.
fn start_envd(envd: &str, default_user: Option<&str>) -> Option<Child> {
    let mut command = Command::new(envd);
    command.arg("--manage-clock");
    // SAFETY: the hook only resets the signal mask (async-signal-safe).
    unsafe {
        command.pre_exec(child::unblock_signals_in_child);
    }
    if let Some(user) = default_user {
        command.args(["--default-user", user]);
    }
    match command.spawn() {
        Ok(child) => {
            eprintln!(
                "spore-agent: sandbox mode, spore-envd is pid {}",
                child.id()
            );
            Some(child)
        }
        Err(e) => {
            eprintln!("spore-agent: starting {envd}: {e}");
            None
        }
    }
}

/// On a stop signal (blocked in every thread, see `pid1::block_stop_signals`),
/// ends every process and powers off.
fn start_stop_handler() {
    std::thread::spawn(|| {
        let set = pid1::stop_signals();
        let mut sig = 0;
        // SAFETY: set is initialised and sig a valid out pointer.
        while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
        eprintln!("spore-agent: signal {sig}: powering off");
        // SAFETY: kill(2) of every process but PID 1, then give them a moment.
        unsafe { libc::kill(-1, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(500));
        pid1::halt(0)
    });
}
