//! One vCPU thread: `KVM_RUN` in a loop, exits dispatched to the buses.
//!
//! The loop never panics on what the guest does: an exit it cannot handle
//! stops the VM with a [`StopReason::Error`] naming the exit reason.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvm_ioctls::{VcpuExit, VcpuFd};
use spore_abi::signal::{SIGNAL_PORT, SNAPSHOT_FAILED, SNAPSHOT_NOT_CONFIGURED};
use spore_abi::tmem::TMEM_PORT;

use super::control::{
    install_kick_handler, Directive, GuestSnapshotRequest, RunControl, SnapshotRefused, StopReason,
};
use super::GuestKind;
use crate::devices::bus::Bus;
use crate::devices::legacy::signal::{SignalAction, SignalPort};
use crate::devices::tmem::TmemDevice;
use crate::host::lock;
use crate::memory::GuestMemoryMmap;

/// What every vCPU of a VM shares: the buses, the signal port, the tmem
/// device and guest memory (for the calls handled on the vCPU thread).
pub struct VcpuIo {
    pub pio: Bus,
    pub mmio: Bus,
    pub signal: Arc<SignalPort>,
    pub tmem: Arc<TmemDevice>,
    pub mem: GuestMemoryMmap,
}

pub struct Vcpu {
    id: u8,
    /// Locked by the vCPU thread around each `KVM_RUN`; a snapshot locks it
    /// while the vCPU is parked to read or write its state.
    fd: Arc<Mutex<VcpuFd>>,
    kind: GuestKind,
    io: Arc<VcpuIo>,
    control: Arc<RunControl>,
    /// Result register of the signal port for this vCPU; shared so that the
    /// VMM sets a `SNAPSHOT` result while the vCPU is parked, and so that a
    /// snapshot saves and restores it.
    signal_result: Arc<AtomicU32>,
    /// Status of this vCPU's last tmem call (what an `in` from the port reads).
    tmem_status: u32,
}

/// A thread started ahead for the vCPU with this id: its handle and where
/// it waits for the vCPU.
type SpareThread = (u8, JoinHandle<()>, std::sync::mpsc::SyncSender<Vcpu>);

/// Threads started ahead of time that each run the first vCPU handed to them.
static SPARE_THREADS: Mutex<Vec<SpareThread>> = Mutex::new(Vec::new());

/// Starts threads for vCPUs 0 to `n - 1` that wait for their vCPU to run
/// (named as the vCPU's own thread): a process that will boot or restore a
/// VM soon takes thread creation and the vCPU filter's installation off the
/// path to the guest's first instruction.
pub fn prespawn_threads(n: usize) -> std::io::Result<()> {
    for id in (0..=u8::MAX).take(n) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vcpu>(1);
        let handle = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vcpu,
            format!("vcpu{id}"),
            move || {
                if let Ok(vcpu) = rx.recv() {
                    vcpu.run_loop();
                }
            },
        )?;
        lock(&SPARE_THREADS).push((id, handle, tx));
    }
    Ok(())
}

/// A started vCPU thread.
pub struct VcpuThread {
    pub id: u8,
    pub handle: JoinHandle<()>,
}

impl VcpuThread {
    /// Interrupts the thread's `KVM_RUN` (or `WAIT`) so it sees a new directive.
    pub fn kick(&self) {
        use std::os::unix::thread::JoinHandleExt;
        // SAFETY: the pthread is alive until joined, and the kick signal has a
        // no-op handler installed before any vCPU thread starts.
        unsafe {
            libc::pthread_kill(
                self.handle.as_pthread_t() as libc::pthread_t,
                super::control::kick_signal(),
            )
        };
    }
}

impl Vcpu {
    pub fn new(
        id: u8,
        fd: VcpuFd,
        kind: GuestKind,
        io: Arc<VcpuIo>,
        control: Arc<RunControl>,
    ) -> Self {
        Self {
            id,
            fd: Arc::new(Mutex::new(fd)),
            kind,
            io,
            control,
            signal_result: Arc::new(AtomicU32::new(0)),
            tmem_status: 0,
        }
    }

    /// The vCPU's KVM handle, shared with its thread (see the `fd` field).
    pub fn fd(&self) -> Arc<Mutex<VcpuFd>> {
        self.fd.clone()
    }

    /// The vCPU's signal-port result register (see the field).
    pub fn signal_result(&self) -> Arc<AtomicU32> {
        self.signal_result.clone()
    }

    /// Starts the run loop on its own thread (the one [`prespawn_threads`]
    /// made for this vCPU, if there is one).
    pub fn start(self) -> std::io::Result<VcpuThread> {
        install_kick_handler();
        let id = self.id;
        let spare = {
            let mut spares = lock(&SPARE_THREADS);
            let at = spares.iter().position(|(for_id, ..)| *for_id == id);
            at.map(|i| spares.swap_remove(i))
        };
        let mut me = self;
        if let Some((_, handle, tx)) = spare {
            match tx.send(me) {
                Ok(()) => return Ok(VcpuThread { id, handle }),
                // The spare thread is gone: start one the ordinary way.
                Err(std::sync::mpsc::SendError(v)) => me = v,
            }
        }
        let this = me;
        let handle = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vcpu,
            format!("vcpu{id}"),
            move || this.run_loop(),
        )?;
        Ok(VcpuThread { id, handle })
    }

    fn run_loop(mut self) {
        crate::phase::mark(format_args!("vCPU {} thread running", self.id));
        while self.control.checkpoint() == Directive::Run {
            // A restored clone (or its source) gets its FORK result here.
            if let Some(r) = self.io.signal.take_pending_result(self.id) {
                self.signal_result.store(r, Ordering::SeqCst);
            }
            if let Some(reason) = self.run_once() {
                self.control.stop(reason);
                break;
            }
            if self.control.is_paused() {
                if let Some(reason) = self.complete_pending_exit() {
                    self.control.stop(reason);
                    break;
                }
            }
        }
    }

    /// Before parking, re-enters `KVM_RUN` with `immediate_exit` set so that
    /// KVM finishes the port I/O or MMIO exit just handled (stores an `in`
    /// result, advances RIP). Only then is the vCPU state consistent enough
    /// to save (KVM API docs, `KVM_EXIT_IO`), and a restored guest does not
    /// repeat or lose the instruction.
    fn complete_pending_exit(&mut self) -> Option<StopReason> {
        lock(&self.fd).set_kvm_immediate_exit(1);
        // An exit that needs yet another completion (string I/O) is handled
        // like any other; a few rounds always suffice.
        let mut result = None;
        for _ in 0..16 {
            match self.run_inner() {
                Step::Interrupted => break,
                Step::Stop(r) => {
                    result = Some(r);
                    break;
                }
                Step::Continue => {}
            }
        }
        lock(&self.fd).set_kvm_immediate_exit(0);
        result
    }

    /// One `KVM_RUN`; `Some` when the VM must stop.
    fn run_once(&mut self) -> Option<StopReason> {
        match self.run_inner() {
            Step::Stop(r) => Some(r),
            Step::Continue | Step::Interrupted => None,
        }
    }

    fn run_inner(&mut self) -> Step {
        let fd = self.fd.clone();
        let mut fd = lock(&fd);
        match self.handle_exit(&mut fd) {
            Ok(None) => Step::Continue,
            Ok(Some(r)) => Step::Stop(r),
            Err(()) => Step::Interrupted,
        }
    }

    /// Runs once and handles the exit; `Err` when KVM_RUN was interrupted.
    fn handle_exit(&mut self, fd: &mut VcpuFd) -> Result<Option<StopReason>, ()> {
        let id = self.id;
        let exit = match fd.run() {
            Ok(exit) => exit,
            // Kicked out of KVM_RUN: re-check the directives.
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => return Err(()),
            Err(e) => {
                return Ok(Some(StopReason::Error(format!(
                    "vCPU {id}: KVM_RUN failed: {e}"
                ))))
            }
        };
        let m = &crate::metrics::METRICS;
        match &exit {
            VcpuExit::IoIn(..) => m.exit_io_in.inc(),
            VcpuExit::IoOut(..) => m.exit_io_out.inc(),
            VcpuExit::MmioRead(..) => m.exit_mmio_read.inc(),
            VcpuExit::MmioWrite(..) => m.exit_mmio_write.inc(),
            VcpuExit::FailEntry(..) | VcpuExit::InternalError => m.vcpu_failures.inc(),
            _ => {}
        }
        Ok(match exit {
            VcpuExit::IoOut(port, data) if port == SIGNAL_PORT => self.signal_write(data),
            VcpuExit::IoIn(port, data) if port == SIGNAL_PORT => {
                self.signal_read(data);
                None
            }
            // aarch64 has no port I/O: the same register is an MMIO word.
            VcpuExit::MmioWrite(addr, data) if is_signal_mmio(addr) => self.signal_write(data),
            VcpuExit::MmioRead(addr, data) if is_signal_mmio(addr) => {
                self.signal_read(data);
                None
            }
            // tmem calls copy between guest memory and the pool on this
            // thread, without the bus lock, so vCPUs call in parallel.
            VcpuExit::IoOut(port, data) if port == TMEM_PORT => {
                self.tmem_status = self.io.tmem.port_write(&self.io.mem, data) as u32;
                None
            }
            VcpuExit::IoIn(port, data) if port == TMEM_PORT => {
                let bytes = self.tmem_status.to_le_bytes();
                for (i, b) in data.iter_mut().enumerate() {
                    *b = bytes.get(i).copied().unwrap_or(0);
                }
                None
            }
            VcpuExit::IoOut(port, data) => {
                self.io.pio.write(port as u64, data);
                None
            }
            VcpuExit::IoIn(port, data) => {
                self.io.pio.read(port as u64, data);
                None
            }
            VcpuExit::MmioWrite(addr, data) => {
                if !self.io.mmio.write(addr, data) {
                    return Ok(stray_mmio(self.kind, id, addr, data.len(), "write"));
                }
                None
            }
            VcpuExit::MmioRead(addr, data) => {
                if !self.io.mmio.read(addr, data) {
                    return Ok(stray_mmio(self.kind, id, addr, data.len(), "read"));
                }
                None
            }
            VcpuExit::Hlt => match self.kind {
                // The in-kernel irqchip handles HLT; seeing it means interrupts are off for good.
                GuestKind::Linux => Some(StopReason::Error(format!(
                    "vCPU {id}: guest halted with interrupts disabled (KVM_EXIT_HLT)"
                ))),
                GuestKind::Unikernel => Some(StopReason::Error(format!(
                    "vCPU {id}: unikernel executed HLT; use the signal port's WAIT"
                ))),
            },
            VcpuExit::Shutdown => {
                // Where it stopped, so that a crash can be traced to its code.
                let report = if crate::seccomp::vcpu_may_read_registers() {
                    crate::arch::crash_report(fd)
                } else {
                    String::new()
                };
                let at = if report.is_empty() {
                    "a place not known (registers not read)".to_string()
                } else {
                    report
                };
                match self.kind {
                    // A reboot=t reset, or a guest that crashed past its own
                    // panic handling. Both end the VM like a reboot, so say
                    // which it was: otherwise a crash leaves no trace at all.
                    GuestKind::Linux => {
                        tracing::warn!(
                            "vCPU {id}: the guest reset the VM by a triple fault \
                             (KVM_EXIT_SHUTDOWN): a reboot=t reboot, or a crashed guest; \
                             stopped at {at}"
                        );
                        Some(StopReason::Reset)
                    }
                    GuestKind::Unikernel => Some(StopReason::Error(format!(
                        "vCPU {id}: unikernel triple-faulted (KVM_EXIT_SHUTDOWN) at {at}"
                    ))),
                }
            }
            VcpuExit::SystemEvent(kind, _) => {
                tracing::info!("vCPU {id}: system event {kind}");
                Some(StopReason::Reset)
            }
            VcpuExit::FailEntry(reason, cpu) => Some(StopReason::Error(format!(
                "vCPU {id}: KVM_EXIT_FAIL_ENTRY (hardware reason {reason:#x}, cpu {cpu})"
            ))),
            VcpuExit::InternalError => Some(StopReason::Error(format!(
                "vCPU {id}: KVM_EXIT_INTERNAL_ERROR (KVM could not emulate an instruction)"
            ))),
            VcpuExit::Intr => None,
            other => Some(StopReason::Error(format!(
                "vCPU {id}: unhandled exit {other:?}"
            ))),
        })
    }
}

impl Vcpu {
    /// A write to the signal register; `Some` when the VM must stop.
    fn signal_write(&mut self, data: &[u8]) -> Option<StopReason> {
        let mut result = self.signal_result.load(Ordering::SeqCst);
        let action = self.io.signal.write(self.id, data, &mut result);
        self.signal_result.store(result, Ordering::SeqCst);
        match action {
            SignalAction::Continue => None,
            SignalAction::Exit(code) => Some(StopReason::GuestExit(code)),
            SignalAction::Snapshot(tag) => {
                self.request_snapshot(tag);
                None
            }
            // Park at this instruction boundary; the fork handler
            // pauses the rest of the VM and clones it.
            SignalAction::Fork(_) => {
                self.control.request_pause();
                None
            }
        }
    }

    /// A read of the signal register: this vCPU's last result.
    fn signal_read(&self, data: &mut [u8]) {
        self.io
            .signal
            .read(self.id, data, self.signal_result.load(Ordering::SeqCst));
    }

    /// A guest `SNAPSHOT`: the VM pauses (this vCPU parks as soon as its
    /// `out` is complete, see `run_loop`) and the VMM's main thread takes the
    /// snapshot and sets this vCPU's result; a refused request is answered
    /// at once.
    fn request_snapshot(&mut self, tag: u32) {
        let req = GuestSnapshotRequest { vcpu: self.id, tag };
        let refused = match self.control.request_guest_snapshot(req) {
            Ok(()) => return,
            Err(SnapshotRefused::NotConfigured) => {
                self.io.signal.snapshot_refused(
                    self.id,
                    tag,
                    "no snapshot directory is configured",
                );
                SNAPSHOT_NOT_CONFIGURED
            }
            Err(SnapshotRefused::Busy) => {
                self.io
                    .signal
                    .snapshot_refused(self.id, tag, "another snapshot is being taken");
                SNAPSHOT_FAILED
            }
        };
        self.signal_result.store(refused, Ordering::SeqCst);
    }
}

enum Step {
    Continue,
    Interrupted,
    Stop(StopReason),
}

/// Whether an MMIO address is the signal register (architectures without
/// port I/O place it in MMIO: `layout::SIGNAL_MMIO`).
fn is_signal_mmio(addr: u64) -> bool {
    crate::arch::layout::SIGNAL_MMIO == Some(addr)
}

/// An MMIO access outside every device and outside RAM.
fn stray_mmio(kind: GuestKind, id: u8, addr: u64, len: usize, what: &str) -> Option<StopReason> {
    match kind {
        // Linux probes absent hardware; reads of all-ones are what it expects.
        GuestKind::Linux => None,
        // A unikernel has no business there: stop it rather than let it run
        // on with garbage.
        GuestKind::Unikernel => Some(StopReason::Error(format!(
            "vCPU {id}: {len}-byte MMIO {what} at {addr:#x} hits no device or RAM"
        ))),
    }
}
