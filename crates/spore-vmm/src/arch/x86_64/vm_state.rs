//! VM-wide KVM state for snapshots: the in-kernel PICs and IOAPIC, the PIT
//! and the kvmclock. Per-vCPU state is in [`super::vcpu_state`].

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_CLOCK_REALTIME, KVM_IRQCHIP_IOAPIC,
    KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
#[error("cannot {what}: {source}")]
pub struct VmStateError {
    what: &'static str,
    #[source]
    source: kvm_ioctls::Error,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmStateError {
    move |source| VmStateError { what, source }
}

const CHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    /// PIC master, PIC slave, IOAPIC; empty without an in-kernel irqchip.
    pub irqchips: Vec<kvm_irqchip>,
    /// Only Linux guests get a PIT.
    pub pit: Option<kvm_pit_state2>,
    /// kvmclock: the guest's view of time at the snapshot, and (flag
    /// `KVM_CLOCK_REALTIME`) the host's wall clock at that moment.
    pub clock: kvm_clock_data,
    /// Restore with `KVM_CLOCK_REALTIME` (`clock_realtime` on load): KVM
    /// advances kvmclock by the wall-clock time since the snapshot. Not
    /// saved: a choice of each restore.
    #[serde(skip)]
    pub advance_to_realtime: bool,
}

impl VmState {
    pub fn save(vm: &VmFd, irqchip: bool, pit: bool) -> Result<Self, VmStateError> {
        let mut irqchips = Vec::new();
        if irqchip {
            for chip_id in CHIPS {
                let mut chip = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                vm.get_irqchip(&mut chip).map_err(kvm("read the irqchip"))?;
                irqchips.push(chip);
            }
        }
        let pit = if pit {
            Some(vm.get_pit2().map_err(kvm("read the PIT"))?)
        } else {
            None
        };
        let mut clock = vm.get_clock().map_err(kvm("read the kvmclock"))?;
        // The stable/host-TSC flags describe the source host and are not
        // accepted back: keep only whether `realtime` is valid (KVM gives
        // it when the host clocksource is the TSC).
        clock.flags &= KVM_CLOCK_REALTIME;
        Ok(Self {
            irqchips,
            pit,
            clock,
            advance_to_realtime: false,
        })
    }

    /// Whether the VM had an in-kernel irqchip (a restore must make one).
    pub fn has_irqchip(&self) -> bool {
        !self.irqchips.is_empty()
    }

    /// Asks [`VmState::restore`] to advance kvmclock to the host's wall
    /// clock; refused (Firecracker's words) for a snapshot taken without a
    /// wall-clock reading.
    pub fn set_clock_realtime(&mut self) -> Result<(), &'static str> {
        if self.clock.flags & KVM_CLOCK_REALTIME == 0 {
            return Err("clock_realtime requested but not present in the snapshot state");
        }
        self.advance_to_realtime = true;
        Ok(())
    }

    /// Applies the state to a VM whose irqchip and PIT were created as at
    /// capture. kvmclock resumes from the snapshot's value, so guest time does
    /// not jump by however long the snapshot sat on disk.
    pub fn restore(&self, vm: &VmFd) -> Result<(), VmStateError> {
        if let Some(pit) = &self.pit {
            vm.set_pit2(pit).map_err(kvm("set the PIT"))?;
        }
        let mut clock = self.clock;
        clock.flags = if self.advance_to_realtime {
            KVM_CLOCK_REALTIME
        } else {
            0
        };
        vm.set_clock(&clock).map_err(kvm("set the kvmclock"))?;
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(kvm("set the irqchip"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_state_round_trips_through_kvm() {
        // Named kvm_*: `make test` skips these, and says so, without /dev/kvm.
        let k = kvm_ioctls::Kvm::new().expect("this test needs /dev/kvm");
        let vm = k.create_vm().unwrap();
        let irqchip = vm.create_irq_chip().is_ok();
        let mut s = VmState::save(&vm, irqchip, false).unwrap();
        s.clock.clock += 1_000_000_000;
        let bytes = bincode::serialize(&s).unwrap();
        let back: VmState = bincode::deserialize(&bytes).unwrap();
        let vm2 = k.create_vm().unwrap();
        if irqchip {
            vm2.create_irq_chip().unwrap();
        }
        back.restore(&vm2).unwrap();
        let c = vm2.get_clock().unwrap();
        assert!(
            c.clock >= s.clock.clock,
            "kvmclock went back: {} < {}",
            c.clock,
            s.clock.clock
        );
    }
}
