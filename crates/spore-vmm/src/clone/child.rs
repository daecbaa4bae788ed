//! The clone side: a `spore vmm --clone-handoff FD` process receives its
//! template, maps it, restores the VM, gives it its identity and reports
//! back to the source.

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use super::handoff::{send_ready, Handoff, HandoffError, Ready};
use super::{identity, CloneError, SourceState};
use crate::builder::{build_from_state, prepare_kvm, BuildOptions, PreparedKvm};
use crate::config::VmConfig;
use crate::memory::template::MemoryLayer;
use crate::memory::GuestRam;
use crate::snapshot::MicrovmState;
use crate::vm::Vm;

/// Takes ownership of the inherited handoff socket `fd`; messages are then
/// read with [`super::handoff::recv_message`] (a standby process waits
/// there until it is used).
pub fn adopt_socket(fd: RawFd) -> Result<UnixStream, HandoffError> {
    // SAFETY: fcntl F_GETFD only checks that `fd` is open.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(HandoffError::Malformed(format!(
            "--clone-handoff {fd} is not an open socket (it is passed by the source VMM)"
        )));
    }
    // SAFETY: the fd was passed to this process for this purpose only.
    let sock = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: fcntl on the fd we now own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(sock)
}

/// What a clone process makes while it waits for its template: the KVM VM,
/// its vCPUs and memory slots over a placeholder of the source's RAM size.
/// With it, a clone only maps memory and loads state.
pub struct Prepared {
    ram: GuestRam,
    kvm: PreparedKvm,
}

impl Prepared {
    pub fn new(mem_bytes: u64, vcpus: u8) -> Result<Self, CloneError> {
        let ram = GuestRam::placeholder(mem_bytes)?;
        let kvm = prepare_kvm(&ram, vcpus)
            .map_err(|e| CloneError::Capture(format!("cannot prepare the clone's VM: {e}")))?;
        crate::vm::vcpu::prespawn_threads(usize::from(vcpus)).map_err(|source| CloneError::Io {
            what: "start the clone's vCPU threads",
            source,
        })?;
        Ok(Prepared { ram, kvm })
    }
}

/// A restored clone, still paused (its vCPUs are not started).
pub struct Restored {
    pub vm: Vm,
    pub config: VmConfig,
    /// Its start as a source: its parent's clone settings, its layers
    /// and generation.
    pub source: SourceState,
}

/// Maps the template and rebuilds the VM from the handed-over state, on
/// the prepared VM when it fits.
pub fn restore(
    handoff: &Handoff,
    layers: Vec<MemoryLayer>,
    prepared: Option<Prepared>,
    opts: BuildOptions,
) -> Result<Restored, CloneError> {
    let t0 = std::time::Instant::now();
    let bad = |what: &str, e: &dyn std::fmt::Display| CloneError::Capture(format!("{what}: {e}"));
    let state: MicrovmState = bincode::deserialize(&handoff.state)
        .map_err(|e| bad("the VM state does not decode", &e))?;
    let config: VmConfig = serde_json::from_str(&handoff.config_json)
        .map_err(|e| bad("the configuration does not decode", &e))?;
    let vm = match prepared.filter(|p| p.kvm.fits(&config, &state)) {
        Some(Prepared { mut ram, kvm }) => {
            tracing::debug!("clone {}: restoring on the prepared VM", handoff.name);
            ram.adopt_layers(&layers)?;
            if handoff.prestart {
                // Restored ahead of its request: fill the host page tables
                // now rather than on the guest's first accesses.
                ram.prefault_layers(&layers);
            }
            build_from_state(&config, &state, ram, Some(kvm), opts)
        }
        None => {
            let ram = GuestRam::from_template_layers(&layers, state.mem_size)?;
            build_from_state(&config, &state, ram, None, opts)
        }
    };
    let vm = vm.map_err(|e| bad("cannot restore the clone", &e))?;
    tracing::debug!(
        "clone {}: restored in {} µs",
        handoff.name,
        t0.elapsed().as_micros()
    );
    let source = SourceState {
        config: handoff.clone_config.clone(),
        ram_layers: layers,
        generation: handoff.generation,
        // Set again by the go of a clone restored ahead.
        tree_budget: Some(handoff.budget),
        ..Default::default()
    };
    Ok(Restored { vm, config, source })
}

/// Makes a restored (still paused) VM clone number `index`: what its
/// `FORK` returns, and its identity. Called right before it starts.
pub fn activate(
    vm: &Vm,
    config: &mut VmConfig,
    awaiting: &super::AwaitingGo,
    index: u64,
) -> Result<(), CloneError> {
    if let Some(v) = awaiting.fork_vcpu {
        // What its FORK returns: the clone number (fits: the cap is u64, but
        // a template serving 4 billion clones is not a use case).
        vm.signal().set_pending_result(
            v,
            u32::try_from(index).map_or(u32::MAX - 1, |i| i.min(u32::MAX - 1)),
        );
    }
    let net = match &awaiting.network {
        Some(n) => n
            .identities(index)
            .map_err(|e| CloneError::Capture(e.to_string()))?,
        None => Vec::new(),
    };
    identity::apply_to_clone(vm, config, index, awaiting.generation, net)
}

/// Tells the source how the clone went.
pub fn report(sock: &UnixStream, start_ns: u64, error: Option<String>) {
    let ready = Ready {
        pid: std::process::id(),
        start_ns,
        error,
    };
    if let Err(e) = send_ready(sock, &ready) {
        tracing::warn!("cannot report to the source VMM: {e}");
    }
}
