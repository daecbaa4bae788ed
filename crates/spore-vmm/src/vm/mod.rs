//! A built VM: KVM handles, guest RAM, devices and vCPU threads, with
//! start, pause, resume and stop. [`crate::builder`] assembles it.

pub mod control;
pub mod vcpu;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use control::{PauseTimeout, RunControl, StopReason};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vcpu::{Vcpu, VcpuIo, VcpuThread};

use crate::arch::{self, GuestKind, Irqchip};
use crate::device_manager::VmDevices;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::serial::SerialDevice;
use crate::devices::legacy::signal::{Mark, SignalPort};
use crate::devices::tmem::TmemDevice;
use crate::devices::virtio::balloon::BalloonHandle;
use crate::devices::virtio::mem::MemHandle;
use crate::devices::virtio::mmio::MmioTransport;
use crate::host::lock;
use crate::memory::GuestRam;

/// Which boot protocol the guest uses; it decides how some exits are read.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    NotStarted,
    Running,
    Paused,
    Stopped,
}

/// The one answer to a request that needs a VM before there is one (the
/// API, cloning and snapshots all say it the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the microVM is not started")]
pub struct NotStarted;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("the VM is {0:?}; this needs it running")]
    NotRunning(RunState),
    #[error("the VM was already started")]
    AlreadyStarted,
    #[error("cannot start vCPU thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Pause(#[from] PauseTimeout),
    #[error("this guest has no i8042 keyboard controller")]
    NoKeyboard,
}

pub struct Vm {
    control: Arc<RunControl>,
    io: Arc<VcpuIo>,
    /// Created and configured, waiting for `start`.
    pending: Vec<Vcpu>,
    threads: Vec<VcpuThread>,
    /// Every device. The virtio ones are dropped before the VM fd and RAM:
    /// dropping one stops its device worker.
    devices: VmDevices,
    /// Every vCPU's KVM handle, in id order (a snapshot reads them while parked).
    vcpu_fds: Vec<Arc<Mutex<VcpuFd>>>,
    /// Every vCPU's signal-port result register, in id order.
    signal_results: Vec<Arc<AtomicU32>>,
    kind: GuestKind,
    irqchip: Irqchip,
    // Held for the VM's lifetime; the VM fd goes before the RAM it maps.
    vm_fd: VmFd,
    kvm: Kvm,
    // Last: guest RAM is unmapped only after KVM has let go of the slots.
    ram: GuestRam,
}

/// Everything the builder hands over to make a [`Vm`].
pub struct VmParts {
    pub kvm: Kvm,
    pub vm_fd: VmFd,
    pub ram: GuestRam,
    pub control: Arc<RunControl>,
    pub io: Arc<VcpuIo>,
    pub devices: VmDevices,
    pub vcpus: Vec<Vcpu>,
    pub kind: GuestKind,
    /// KVM's in-kernel interrupt controller, if the VM has one.
    pub irqchip: Irqchip,
}

impl Vm {
    pub fn from_parts(p: VmParts) -> Self {
        let vcpu_fds = p.vcpus.iter().map(Vcpu::fd).collect();
        let signal_results = p.vcpus.iter().map(Vcpu::signal_result).collect();
        Self {
            vcpu_fds,
            signal_results,
            kind: p.kind,
            irqchip: p.irqchip,
            control: p.control,
            io: p.io,
            devices: p.devices,
            pending: p.vcpus,
            threads: Vec::new(),
            vm_fd: p.vm_fd,
            kvm: p.kvm,
            ram: p.ram,
        }
    }

    pub fn state(&self) -> RunState {
        if self.control.stop_reason().is_some() {
            RunState::Stopped
        } else if self.threads.is_empty() {
            RunState::NotStarted
        } else if self.control.is_paused() {
            RunState::Paused
        } else {
            RunState::Running
        }
    }

    /// Starts every vCPU thread.
    pub fn start(&mut self) -> Result<(), VmError> {
        if !self.threads.is_empty() || self.pending.is_empty() {
            return Err(VmError::AlreadyStarted);
        }
        for vcpu in self.pending.drain(..) {
            match vcpu.start() {
                Ok(t) => self.threads.push(t),
                Err(e) => {
                    self.control
                        .stop(StopReason::Error(format!("cannot start vCPU: {e}")));
                    return Err(VmError::Thread(e));
                }
            }
        }
        Ok(())
    }

    pub fn pause(&self) -> Result<(), VmError> {
        match self.state() {
            RunState::Running | RunState::Paused => {}
            s => return Err(VmError::NotRunning(s)),
        }
        self.control.pause(self.threads.len(), || self.kick_all())?;
        // What the architecture tells the guest of a pause (x86: kvmclock's
        // "stopped on purpose"). Parked vCPUs do not hold their fd; one that
        // does (the VM is stopping) is skipped rather than waited for.
        for fd in &self.vcpu_fds {
            if let Ok(fd) = fd.try_lock() {
                arch::on_pause(self.kind, &fd);
            }
        }
        Ok(())
    }

    pub fn resume(&self) -> Result<(), VmError> {
        match self.state() {
            RunState::Running | RunState::Paused => {}
            s => return Err(VmError::NotRunning(s)),
        }
        self.control.resume();
        Ok(())
    }

    /// Stops the vCPUs and joins their threads; returns why the VM stopped.
    pub fn stop(&mut self, reason: StopReason) -> StopReason {
        self.control.stop(reason);
        for t in &self.threads {
            t.kick();
        }
        for t in self.threads.drain(..) {
            // A vCPU thread may sit in KVM_RUN until a kick lands; re-kick until it leaves.
            while !t.handle.is_finished() {
                t.kick();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let _ = t.handle.join();
        }
        self.control.stop_reason().unwrap_or(StopReason::Requested)
    }

    pub fn send_ctrl_alt_del(&self) -> Result<(), VmError> {
        let kbd = self.devices.i8042().ok_or(VmError::NoKeyboard)?;
        lock(kbd).send_ctrl_alt_del();
        Ok(())
    }

    /// The signal port (clones install the guest-`FORK` handler on it).
    pub fn signal(&self) -> &Arc<SignalPort> {
        &self.io.signal
    }

    /// The VM's clone generation (0 for a booted VM).
    pub fn generation(&self) -> u64 {
        self.io.signal.generation()
    }

    /// Every drive's disk, in attach order (cloning freezes them).
    pub fn drives(&self) -> &[crate::devices::virtio::blk::BlockHandle] {
        &self.devices.handles().drives
    }

    /// Every network interface, in attach order (PATCH limits, a clone's MAC).
    pub fn nets(&self) -> &[crate::devices::virtio::net::NetHandle] {
        &self.devices.handles().nets
    }

    /// The vsock device's handle, if the VM has one (a clone's new CID).
    pub fn vsock(&self) -> Option<&crate::devices::virtio::vsock::VsockHandle> {
        self.devices.handles().vsock.as_ref()
    }

    pub fn marks(&self) -> Vec<Mark> {
        self.io.signal.marks()
    }

    /// The balloon device's handle, if the VM has one.
    pub fn balloon(&self) -> Option<&BalloonHandle> {
        self.devices.handles().balloon.as_ref()
    }

    /// The virtio-mem device, if configured.
    pub fn mem_hotplug(&self) -> Option<&MemHandle> {
        self.devices.handles().mem.as_ref()
    }

    pub fn serial(&self) -> &Arc<Mutex<SerialDevice>> {
        self.devices.serial()
    }

    /// The VM's tmem device (disabled ones answer every call with DISABLED).
    pub fn tmem(&self) -> &Arc<TmemDevice> {
        &self.io.tmem
    }

    pub fn kind(&self) -> GuestKind {
        self.kind
    }

    pub fn has_irqchip(&self) -> bool {
        self.irqchip.present()
    }

    /// The in-kernel interrupt controller (its state is part of a snapshot).
    pub fn irqchip(&self) -> &Irqchip {
        &self.irqchip
    }

    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    pub fn vm_fd(&self) -> &VmFd {
        &self.vm_fd
    }

    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    pub fn vcpu_fds(&self) -> &[Arc<Mutex<VcpuFd>>] {
        &self.vcpu_fds
    }

    /// The signal-port result register of each vCPU, in id order.
    pub fn signal_results(&self) -> Vec<u32> {
        self.signal_results
            .iter()
            .map(|r| r.load(Ordering::SeqCst))
            .collect()
    }

    /// Sets what vCPU `id`'s next `in` from the signal port reads (a
    /// snapshot's result, or a restored value). Ignores unknown ids.
    pub fn set_signal_result(&self, id: u8, value: u32) {
        if let Some(r) = self.signal_results.get(id as usize) {
            r.store(value, Ordering::SeqCst);
        }
    }

    pub fn i8042(&self) -> Option<&Arc<Mutex<I8042>>> {
        self.devices.i8042()
    }

    /// Every device, for captures ([`crate::device_manager::PausedDevices`]).
    pub fn devices(&self) -> &VmDevices {
        &self.devices
    }

    pub fn virtio(&self) -> &[Arc<Mutex<MmioTransport>>] {
        self.devices.transports()
    }

    /// Starts the vCPU threads parked, as a restored VM waits for a resume.
    pub fn start_paused(&mut self) -> Result<(), VmError> {
        self.control.pause(0, || {})?;
        self.start()
    }

    fn kick_all(&self) {
        for t in &self.threads {
            t.kick();
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.stop(StopReason::Requested);
        self.devices.detach_virtio();
    }
}
