//! Waiting for the guest's console to drain before the VM ends.
//!
//! A `write()` to a tty returns once the bytes are in the kernel's tty
//! buffer, not once the UART sent them: the 8250 driver feeds the UART one
//! transmit interrupt at a time. A scenario that prints its result and then
//! asks the VMM to exit (`spore-signal exit`) could end the VM with its last
//! lines still buffered in the guest (under nested TCG, where each byte is a
//! slow exit, whole scenario outputs were lost that way). `tcdrain` waits
//! until the tty layer and the UART driver report everything transmitted.

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

/// The consoles a guest's output can be waiting in.
const CONSOLES: &[&str] = &["/dev/console", "/dev/ttyS0"];

/// Waits up to `limit` for every console in [`CONSOLES`] to drain; returns
/// whether they all did. A console that is missing or not a tty counts as
/// drained. The wait is bounded because a UART whose transmit interrupt
/// never comes would otherwise keep the VM from ending at all.
pub fn drain(limit: Duration) -> bool {
    let (done_tx, done_rx) = mpsc::channel();
    // A detached thread: if tcdrain never returns, the process exits anyway.
    let spawned = std::thread::Builder::new()
        .name("console-drain".into())
        .spawn(move || {
            for path in CONSOLES {
                drain_one(path);
            }
            let _ = done_tx.send(());
        });
    spawned.is_ok() && done_rx.recv_timeout(limit).is_ok()
}

fn drain_one(path: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NOCTTY: opening the console must not make it our controlling tty;
    // O_NONBLOCK: the open never waits for carrier.
    let Ok(tty) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    // SAFETY: tcdrain only waits on the descriptor, which `tty` keeps open.
    unsafe {
        libc::tcdrain(tty.as_raw_fd());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_returns_within_its_limit() {
        // Whatever the test machine's consoles are (or none), the call is
        // bounded and never panics.
        let start = std::time::Instant::now();
        let _ = drain(Duration::from_millis(300));
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
