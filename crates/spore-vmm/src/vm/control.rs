//! Run control shared by the VMM and its vCPU threads: pause, resume, stop.
//!
//! vCPU threads check the requested state between `KVM_RUN` calls and park on
//! a condition variable while paused. To get a thread out of `KVM_RUN` (or out
//! of a signal-port `WAIT`), the controller sends it [`kick_signal`]; a kick
//! can race with the thread entering `KVM_RUN`, so the controller re-kicks
//! until every thread has acknowledged.

use std::sync::{Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use crate::host::lock;

/// Why the VM stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest asked to exit with this code (signal port).
    GuestExit(u8),
    /// The guest reset or powered off the machine (i8042 reset, triple fault
    /// of a Linux guest, KVM system event).
    Reset,
    /// The VMM stopped the VM (API request, host signal).
    Requested,
    /// A vCPU failed; the message names the exit reason.
    Error(String),
}

impl StopReason {
    /// Exit status of the VMM process for this stop.
    pub fn exit_code(&self) -> i32 {
        match self {
            StopReason::GuestExit(code) => *code as i32,
            StopReason::Reset | StopReason::Requested => 0,
            StopReason::Error(_) => 1,
        }
    }
}

/// A guest's `SNAPSHOT` signal, handed from its vCPU thread to the VMM's
/// main thread (a vCPU never snapshots the VM itself while others run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestSnapshotRequest {
    pub vcpu: u8,
    pub tag: u32,
}

/// What the VMM's main thread is woken for (see [`RunControl::wait_event`]).
#[derive(Debug, PartialEq, Eq)]
pub enum ControlEvent {
    Stopped(StopReason),
    GuestSnapshot(GuestSnapshotRequest),
}

/// Why a guest's snapshot request was not taken up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotRefused {
    /// No snapshot directory is configured.
    NotConfigured,
    /// Another vCPU's request is being served, or the VM is stopping.
    Busy,
}

#[derive(Default)]
struct State {
    paused: bool,
    parked: usize,
    stop: Option<StopReason>,
    /// Whether guest-triggered snapshots are configured.
    guest_snapshots: bool,
    /// A request not yet picked up by [`RunControl::wait_event`].
    snapshot_request: Option<GuestSnapshotRequest>,
    /// From a request until [`RunControl::finish_guest_snapshot`]: the VM
    /// stays paused whatever else asks it to resume.
    snapshot_active: bool,
}

/// Shared between the VMM and every vCPU thread.
#[derive(Default)]
pub struct RunControl {
    state: Mutex<State>,
    changed: Condvar,
}

/// What a vCPU thread must do before its next `KVM_RUN`.
#[derive(Debug, PartialEq, Eq)]
pub enum Directive {
    Run,
    Exit,
}

impl RunControl {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records why the VM stops; the first reason wins.
    pub fn stop(&self, reason: StopReason) {
        let mut s = lock(&self.state);
        if s.stop.is_none() {
            s.stop = Some(reason);
        }
        self.changed.notify_all();
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.state).stop.clone()
    }

    /// Enables or disables guest-triggered snapshots.
    pub fn set_guest_snapshots(&self, enabled: bool) {
        lock(&self.state).guest_snapshots = enabled;
    }

    /// Called by a vCPU thread on a `SNAPSHOT` signal: pauses the VM at once
    /// (this vCPU parks after completing its `out`, before running another
    /// guest instruction) and queues the request for the main thread.
    pub fn request_guest_snapshot(&self, req: GuestSnapshotRequest) -> Result<(), SnapshotRefused> {
        let mut s = lock(&self.state);
        if !s.guest_snapshots {
            return Err(SnapshotRefused::NotConfigured);
        }
        if s.snapshot_active || s.stop.is_some() {
            return Err(SnapshotRefused::Busy);
        }
        s.snapshot_request = Some(req);
        s.snapshot_active = true;
        s.paused = true;
        self.changed.notify_all();
        Ok(())
    }

    /// Ends a guest snapshot: the VM may be resumed again.
    pub fn finish_guest_snapshot(&self) {
        let mut s = lock(&self.state);
        s.snapshot_active = false;
        s.snapshot_request = None;
        self.changed.notify_all();
    }

    /// Blocks until the VM stops or a guest asks for a snapshot. A stop wins
    /// over a pending request.
    pub fn wait_event(&self) -> ControlEvent {
        let mut s = lock(&self.state);
        loop {
            if let Some(r) = &s.stop {
                return ControlEvent::Stopped(r.clone());
            }
            if let Some(req) = s.snapshot_request.take() {
                return ControlEvent::GuestSnapshot(req);
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the VM stops.
    pub fn wait_stopped(&self) -> StopReason {
        let mut s = lock(&self.state);
        loop {
            if let Some(r) = &s.stop {
                return r.clone();
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Called by a vCPU thread between runs: parks while paused.
    pub fn checkpoint(&self) -> Directive {
        let mut s = lock(&self.state);
        if s.stop.is_some() {
            return Directive::Exit;
        }
        if !s.paused {
            return Directive::Run;
        }
        s.parked += 1;
        self.changed.notify_all();
        while s.paused && s.stop.is_none() {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.parked -= 1;
        self.changed.notify_all();
        if s.stop.is_some() {
            Directive::Exit
        } else {
            Directive::Run
        }
    }

    pub fn is_paused(&self) -> bool {
        lock(&self.state).paused
    }

    /// Requests a pause and waits until `vcpus` threads are parked, calling
    /// `kick` (which interrupts every vCPU thread) until they are.
    pub fn pause(&self, vcpus: usize, kick: impl Fn()) -> Result<(), PauseTimeout> {
        lock(&self.state).paused = true;
        let deadline = Instant::now() + Duration::from_secs(5);
        // A kick that lands just before a vCPU enters `KVM_RUN` is lost, so
        // kicks repeat until every vCPU parked; spaced out (1, 2, 4, 8 ms)
        // so that a vCPU slow to leave the guest is not hit by a signal
        // per millisecond on its way out, and not on every other vCPU's
        // parking notice either.
        let mut interval = Duration::from_millis(1);
        loop {
            kick();
            let kicked = Instant::now();
            let mut s = lock(&self.state);
            loop {
                if s.parked >= vcpus || s.stop.is_some() {
                    return Ok(());
                }
                let left = interval.saturating_sub(kicked.elapsed());
                if left.is_zero() {
                    break;
                }
                s = self
                    .changed
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(s);
            if Instant::now() > deadline {
                return Err(PauseTimeout);
            }
            interval = (interval * 2).min(MAX_KICK_INTERVAL);
        }
    }

    /// Asks every vCPU to park at its next checkpoint without waiting (a
    /// vCPU thread pausing its own VM, e.g. on a guest `FORK`).
    pub fn request_pause(&self) {
        lock(&self.state).paused = true;
        self.changed.notify_all();
    }

    /// Lets parked vCPUs run again, except while a guest snapshot is being
    /// taken: that ends with its own resume (or stop).
    pub fn resume(&self) {
        let mut s = lock(&self.state);
        if s.snapshot_active {
            tracing::info!("resume deferred: a guest-triggered snapshot is being written");
            return;
        }
        s.paused = false;
        self.changed.notify_all();
    }
}

/// The longest wait between two kicks of a pause.
const MAX_KICK_INTERVAL: Duration = Duration::from_millis(8);

#[derive(Debug, thiserror::Error)]
#[error("vCPUs did not pause within 5 s")]
pub struct PauseTimeout;

/// The real-time signal used to kick vCPU threads out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

/// Installs a no-op handler for the kick signal, without SA_RESTART, so the
/// signal makes `KVM_RUN` and `poll` return EINTR instead of killing the process.
pub fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        extern "C" fn noop(_: libc::c_int) {}
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = noop as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(kick_signal(), &sa, std::ptr::null_mut());
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn guest_snapshot_requests() {
        let c = RunControl::new();
        let req = GuestSnapshotRequest { vcpu: 1, tag: 9 };
        assert_eq!(
            c.request_guest_snapshot(req),
            Err(SnapshotRefused::NotConfigured)
        );
        assert!(!c.is_paused());
        c.set_guest_snapshots(true);
        c.request_guest_snapshot(req).unwrap();
        assert!(c.is_paused(), "the asking vCPU must park at once");
        // One at a time.
        assert_eq!(
            c.request_guest_snapshot(GuestSnapshotRequest { vcpu: 0, tag: 1 }),
            Err(SnapshotRefused::Busy)
        );
        assert_eq!(c.wait_event(), ControlEvent::GuestSnapshot(req));
        // Nobody resumes the VM under the snapshot.
        c.resume();
        assert!(c.is_paused());
        c.finish_guest_snapshot();
        c.resume();
        assert!(!c.is_paused());
        // A stop wins over a pending request.
        c.request_guest_snapshot(req).unwrap();
        c.stop(StopReason::Requested);
        assert_eq!(c.wait_event(), ControlEvent::Stopped(StopReason::Requested));
        assert_eq!(c.request_guest_snapshot(req), Err(SnapshotRefused::Busy));
    }

    #[test]
    fn pause_resume_stop() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let c = Arc::new(RunControl::new());
        let runs = Arc::new(AtomicU64::new(0));
        let (c2, runs2) = (c.clone(), runs.clone());
        let t = std::thread::spawn(move || {
            while c2.checkpoint() == Directive::Run {
                runs2.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let wait_for_runs = |n: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while runs.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "vCPU stand-in never ran");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_for_runs(1);
        c.pause(1, || {}).unwrap();
        assert!(c.is_paused());
        let frozen = runs.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), frozen, "ran while paused");
        c.resume();
        wait_for_runs(frozen + 1);
        c.stop(StopReason::GuestExit(3));
        c.stop(StopReason::Reset);
        assert_eq!(c.wait_stopped(), StopReason::GuestExit(3));
        t.join().unwrap();
        assert_eq!(StopReason::GuestExit(3).exit_code(), 3);
        assert_eq!(StopReason::Error("x".into()).exit_code(), 1);
    }
}
