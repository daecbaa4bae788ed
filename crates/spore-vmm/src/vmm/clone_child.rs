//! This process becoming a clone (`spore vmm --clone-handoff`, driven by
//! `clone::process`): KVM objects made ahead of the template, the restore
//! from the handoff, and the go that numbers and starts it.
//!
//! What the clone restores and how it gets its identity are `clone::child`'s;
//! here they are put in the VMM's state, under its lock.

use super::{BuiltVm, Inner, Phase, Vmm};
use crate::builder::BuildOptions;
use crate::clone::handoff::Handoff;
use crate::clone::{child, AwaitingGo, CloneError};
use crate::memory::template::MemoryLayer;

/// The answer when a go comes with no clone restored ahead.
const NOTHING_AWAITS_GO: &str = "no restored clone waits to start";

impl Vmm {
    /// Makes a clone process's KVM VM, vCPUs and memory slots for a
    /// `mem_bytes`, `vcpus` VM while it waits for its template.
    pub fn prepare_clone(&self, mem_bytes: u64, vcpus: u8) -> Result<(), CloneError> {
        let prepared = child::Prepared::new(mem_bytes, vcpus)?;
        self.lock().child.prepared = Some(prepared);
        Ok(())
    }

    /// Runs this VMM as a clone: maps the template that came over the
    /// handoff socket, restores the VM and starts it. Returns the host
    /// monotonic time right before its vCPUs started.
    pub fn start_clone(
        &self,
        handoff: &Handoff,
        layers: Vec<MemoryLayer>,
    ) -> Result<u64, CloneError> {
        if let Some(n) = &handoff.network {
            // Before the restore opens the taps: they are this
            // namespace's (the main thread's, which opens them), or come
            // from descriptors opened there.
            n.join(handoff.index, taps_of(&handoff.config_json))
                .map_err(|e| CloneError::Capture(e.to_string()))?;
        }
        self.restore_clone(handoff, layers)?;
        self.go_clone(handoff.index, handoff.budget)
    }

    /// Restores the clone that came over the handoff socket, paused, until
    /// [`Vmm::go_clone`] gives it its number and starts it (a zygote's
    /// standby process restores ahead of the request).
    pub fn restore_clone(
        &self,
        handoff: &Handoff,
        layers: Vec<MemoryLayer>,
    ) -> Result<(), CloneError> {
        let mut inner = self.lock();
        let serial_out = inner.take_serial_out(&self.control).map_err(|_| {
            CloneError::BadRequest("this VMM already runs (or ran) a microVM".into())
        })?;
        let opts = BuildOptions {
            serial_out,
            control: self.control.clone(),
            mmds: inner.mmds.clone(),
        };
        let prepared = inner.child.prepared.take();
        let restored = child::restore(handoff, layers, prepared, opts)?;
        self.install_fork_handler(&restored.vm);
        let Inner {
            config,
            phase,
            source,
            child,
            ..
        } = &mut *inner;
        let api_socket = source.api_socket.take();
        *source = restored.source;
        source.api_socket = api_socket;
        self.set_guest_fork(source.config.guest_fork);
        child.awaiting_go = Some(AwaitingGo {
            fork_vcpu: handoff.fork_vcpu,
            generation: handoff.generation,
            network: handoff.network.clone(),
        });
        *config = restored.config;
        let mut built = BuiltVm::new(restored.vm);
        // Its memory is its template's: a diff continues the source's chain.
        built.chain = handoff.chain.clone();
        *phase = Phase::Built(built);
        Ok(())
    }

    /// Makes the restored clone clone number `index`, with `budget` for its
    /// own subtree, and starts it; returns the host monotonic time right
    /// before its vCPUs started.
    pub fn go_clone(&self, index: u64, budget: u64) -> Result<u64, CloneError> {
        let mut inner = self.lock();
        let Inner {
            config,
            phase,
            child,
            source,
            ..
        } = &mut *inner;
        let awaiting = child
            .awaiting_go
            .take()
            .ok_or_else(|| CloneError::BadRequest(NOTHING_AWAITS_GO.into()))?;
        let vm = &mut phase
            .built_mut()
            .map_err(|_| CloneError::BadRequest(NOTHING_AWAITS_GO.into()))?
            .vm;
        child::activate(vm, config, &awaiting, index)?;
        source.tree_budget = Some(budget);
        let start_ns = crate::host::monotonic_ns();
        vm.start()
            .map_err(|e| CloneError::Capture(format!("cannot start the clone: {e}")))?;
        Ok(start_ns)
    }
}

/// How many taps the clone's configuration has (its network interfaces).
fn taps_of(config_json: &str) -> usize {
    serde_json::from_str::<crate::config::VmConfig>(config_json)
        .map_or(0, |c| c.network_interfaces.len())
}
