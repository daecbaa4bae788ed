//! What every child of the agent gets between fork and exec.

use std::io;

/// For a child between fork and exec: an empty signal mask. PID 1's threads
/// block the stop signals (`pid1::block_stop_signals`) and a forked child keeps
/// its parent's mask across exec, so a child left alone could not be
/// stopped with SIGTERM.
pub fn unblock_signals_in_child() -> io::Result<()> {
    // SAFETY: sigemptyset and sigprocmask are async-signal-safe and touch
    // only this (single-threaded, forked) process.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
