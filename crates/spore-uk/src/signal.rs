//! The spore signal port (see [`spore_abi::signal`]): exit, boot marks,
//! sleeping until a device has work, and snapshot points.

use spore_abi::signal::{
    encode, SignalOp, ARG_MASK, FORK_FAILED, RESTORED, SIGNAL_PORT, SNAPSHOT_NOT_CONFIGURED,
    SNAPSHOT_RESTORED, SNAPSHOT_TAKEN, WAIT_WOKEN,
};

use crate::port::{inl, outl};

/// What runs before the guest sleeps ([`wait`], [`wait_status`]) or exits:
/// set by the function SDK (its `serve`), which sends what a running
/// handler logged then. A hook, so that this module, which every driver
/// sleeps through, depends on none of them.
static BEFORE_SLEEP: spin::Once<fn()> = spin::Once::new();

/// Sets the hook run before the guest sleeps or exits (the first call only).
pub(crate) fn set_before_sleep(hook: fn()) {
    BEFORE_SLEEP.call_once(|| hook);
}

#[inline]
fn before_sleep() {
    if let Some(hook) = BEFORE_SLEEP.get() {
        hook();
    }
}

/// Stops the VM; the VMM exits with the low 8 bits of `code`.
pub fn exit(code: u32) -> ! {
    before_sleep();
    outl(SIGNAL_PORT, encode(SignalOp::Exit, code & 0xff));
    // A VMM that ignored the write (it must not) gets a guest that spins
    // quietly instead of running off the end of the program.
    loop {
        core::hint::spin_loop();
    }
}

/// Asks the VMM to record mark `n` (24 bits) with its host monotonic time.
pub fn mark(n: u32) {
    outl(SIGNAL_PORT, encode(SignalOp::Mark, n));
}

/// Sleeps in the VMM until a device has work or `timeout_us` passed (capped
/// at [`ARG_MASK`] µs, about 16.7 s). Returns true if a device woke it.
pub fn wait(timeout_us: u32) -> bool {
    before_sleep();
    outl(
        SIGNAL_PORT,
        encode(SignalOp::Wait, timeout_us.min(ARG_MASK)),
    );
    inl(SIGNAL_PORT) == WAIT_WOKEN
}

/// What a [`wait_status`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStatus {
    Woken,
    TimedOut,
    /// The VM was restored from a snapshot since the last read of the port.
    Restored,
}

/// Like [`wait`], but also tells whether the VM was restored from a
/// snapshot (the VMM reports it once, on the first read after a restore).
pub fn wait_status(timeout_us: u32) -> WaitStatus {
    before_sleep();
    outl(
        SIGNAL_PORT,
        encode(SignalOp::Wait, timeout_us.min(ARG_MASK)),
    );
    match inl(SIGNAL_PORT) {
        RESTORED => WaitStatus::Restored,
        WAIT_WOKEN => WaitStatus::Woken,
        _ => WaitStatus::TimedOut,
    }
}

/// Asks the VMM to clone this VM `n` times (0: the count configured with
/// `PUT /clone/config`), like `fork()`: returns `Some(k)` with the clone
/// number k ≥ 1 in each clone, `Some(0)` in the source when it goes on
/// (continue mode; a zygote source never returns), and `None` when no
/// clone was made.
pub fn fork(n: u32) -> Option<u32> {
    outl(SIGNAL_PORT, encode(SignalOp::Fork, n.min(ARG_MASK)));
    match inl(SIGNAL_PORT) {
        FORK_FAILED => None,
        k => Some(k),
    }
}

/// Ends this VM without a shutdown (a clone whose job is done); the VMM
/// exits with status 0.
pub fn done() -> ! {
    outl(SIGNAL_PORT, encode(SignalOp::Done, 0));
    loop {
        core::hint::spin_loop();
    }
}

/// What [`snapshot_point`] returned to this run of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotPoint {
    /// The snapshot was written; this VM goes on (unless the host stops it).
    Taken,
    /// This VM was restored from the snapshot taken here.
    Restored,
    /// The VMM could not write the snapshot (its log says why).
    Failed,
    /// The host configured no snapshot directory; nothing happened.
    NotConfigured,
}

/// Asks the VMM to snapshot the whole VM right here, tagged `tag` (24 bits).
/// Returns twice, like `fork`: [`SnapshotPoint::Taken`] in this VM and
/// [`SnapshotPoint::Restored`] in every VM later restored from the snapshot.
/// The host decides where snapshots go and whether this VM goes on
/// afterwards (`PUT /snapshot/guest-triggered`).
pub fn snapshot_point(tag: u32) -> SnapshotPoint {
    outl(SIGNAL_PORT, encode(SignalOp::Snapshot, tag & ARG_MASK));
    match inl(SIGNAL_PORT) {
        SNAPSHOT_TAKEN => SnapshotPoint::Taken,
        SNAPSHOT_RESTORED => SnapshotPoint::Restored,
        SNAPSHOT_NOT_CONFIGURED => SnapshotPoint::NotConfigured,
        _ => SnapshotPoint::Failed,
    }
}
