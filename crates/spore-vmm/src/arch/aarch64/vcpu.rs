//! arm64 vCPUs: `KVM_ARM_VCPU_INIT` with PSCI, the boot registers of the
//! Linux arm64 boot protocol, the MPIDR, and the complete register state
//! for snapshots (every register `KVM_GET_REG_LIST` names, plus the MP
//! state).
//!
//! Save runs while the vCPU is parked outside `KVM_RUN`; restore runs on a
//! fresh vCPU that went through [`init_vcpu`], before it first runs, with
//! the GIC finalized (the timer registers signal their interrupts to it).

use std::mem::offset_of;

use kvm_bindings::{
    kvm_mp_state, kvm_reg_list, kvm_regs, kvm_vcpu_init, user_pt_regs, PSR_MODE_EL1h, KVMIO,
    KVM_ARM_VCPU_POWER_OFF, KVM_ARM_VCPU_PSCI_0_2, PSR_A_BIT, PSR_D_BIT, PSR_F_BIT, PSR_I_BIT,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vmm_sys_util::errno;
use vmm_sys_util::ioctl::{ioctl_expr, ioctl_with_mut_ptr, _IOC_READ, _IOC_WRITE};

use super::regs::{self, core_reg_id, reg_size, x_reg_id, MPIDR_EL1, PC_OFFSET, PSTATE_OFFSET};

// regs.rs's encodings are KVM's.
const _: () = {
    assert!(regs::KVM_REG_ARM64 == kvm_bindings::KVM_REG_ARM64);
    assert!(regs::KVM_REG_SIZE_SHIFT == kvm_bindings::KVM_REG_SIZE_SHIFT);
    assert!(regs::KVM_REG_SIZE_MASK == kvm_bindings::KVM_REG_SIZE_MASK);
    assert!(regs::KVM_REG_SIZE_U32 == kvm_bindings::KVM_REG_SIZE_U32);
    assert!(regs::KVM_REG_SIZE_U64 == kvm_bindings::KVM_REG_SIZE_U64);
    assert!(regs::KVM_REG_SIZE_U128 == kvm_bindings::KVM_REG_SIZE_U128);
    assert!(regs::KVM_REG_ARM_CORE == kvm_bindings::KVM_REG_ARM_CORE as u64);
    assert!(regs::KVM_REG_ARM64_SYSREG == kvm_bindings::KVM_REG_ARM64_SYSREG as u64);
    assert!(regs::X0_OFFSET == offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, regs));
    assert!(regs::PC_OFFSET == offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pc));
    assert!(regs::PSTATE_OFFSET == offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pstate));
};

/// `KVM_GET_REG_LIST` (`_IOWR(KVMIO, 0xb0, struct kvm_reg_list)`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "size_of::<kvm_reg_list>() is 8 (the value is asserted below)"
)]
const KVM_GET_REG_LIST: std::os::raw::c_ulong = ioctl_expr(
    _IOC_READ | _IOC_WRITE,
    KVMIO,
    0xb0,
    std::mem::size_of::<kvm_reg_list>() as u32,
);
const _: () = assert!(KVM_GET_REG_LIST == 0xc008_aeb0);

/// Sanity bound on KVM's register count (a vCPU with SVE at the largest
/// vector length lists a few thousand).
const MAX_REGS: usize = 1 << 16;

/// EL1 with SP_EL1, debug, SError, IRQ and FIQ masked: the state
/// Documentation/arch/arm64/booting.rst asks for at kernel entry.
const BOOT_PSTATE: u64 = (PSR_MODE_EL1h | PSR_D_BIT | PSR_A_BIT | PSR_I_BIT | PSR_F_BIT) as u64;

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("cannot {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot read register {id:#x}: {source}")]
    GetReg {
        id: u64,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot set register {id:#x} to {value}: {source}")]
    SetReg {
        id: u64,
        /// The value, hex, most significant byte first.
        value: String,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("vCPU state: {0}")]
    Invalid(String),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
    move |source| VcpuError::Kvm { what, source }
}

/// `KVM_ARM_VCPU_INIT` as the host prefers it, with PSCI 0.2+ (SMP
/// bring-up, power-off and reset through HVC). vCPUs other than 0 start
/// powered off until the guest starts them with PSCI CPU_ON.
pub fn init_vcpu(vm: &VmFd, fd: &VcpuFd, id: u8) -> Result<(), VcpuError> {
    let mut kvi = kvm_vcpu_init::default();
    vm.get_preferred_target(&mut kvi)
        .map_err(kvm("get the preferred vCPU target"))?;
    kvi.features[0] |= 1 << KVM_ARM_VCPU_PSCI_0_2;
    if id > 0 {
        kvi.features[0] |= 1 << KVM_ARM_VCPU_POWER_OFF;
    }
    fd.vcpu_init(&kvi)
        .map_err(kvm("initialize the vCPU (KVM_ARM_VCPU_INIT)"))
}

/// Entry state of the boot vCPU (booting.rst): EL1h with D, A, I and F
/// masked, PC at the kernel's entry, X0 the device tree's address, X1–X3
/// zero. The others need nothing: PSCI CPU_ON sets theirs.
pub fn set_boot_regs(fd: &VcpuFd, entry: u64, fdt_addr: u64) -> Result<(), VcpuError> {
    let regs = [
        (core_reg_id(PSTATE_OFFSET), BOOT_PSTATE),
        (core_reg_id(PC_OFFSET), entry),
        (x_reg_id(0), fdt_addr),
        (x_reg_id(1), 0),
        (x_reg_id(2), 0),
        (x_reg_id(3), 0),
    ];
    for (id, value) in regs {
        let bytes = value.to_ne_bytes();
        fd.set_one_reg(id, &bytes)
            .map_err(|source| VcpuError::SetReg {
                id,
                value: hex(&bytes),
                source,
            })?;
    }
    Ok(())
}

/// MPIDR_EL1: the vCPU's affinity, which the device tree's `reg` and the
/// GIC's redistributor attributes name it by.
pub fn mpidr(fd: &VcpuFd) -> Result<u64, VcpuError> {
    let mut bytes = [0u8; 8];
    fd.get_one_reg(MPIDR_EL1, &mut bytes)
        .map_err(|source| VcpuError::GetReg {
            id: MPIDR_EL1,
            source,
        })?;
    Ok(u64::from_ne_bytes(bytes))
}

/// Everything KVM holds for one vCPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuState {
    /// (id, value) of every register in `KVM_GET_REG_LIST`: core (X0–X30,
    /// SP, PC, PSTATE, SP_EL1, ELR_EL1, SPSRs, V0–V31, FPSR, FPCR), system,
    /// timer and firmware registers. Values are `KVM_REG_SIZE(id)` bytes in
    /// the host's byte order, as KVM gives them.
    pub regs: Vec<(u64, Vec<u8>)>,
    /// `KVM_GET_MP_STATE`: a secondary vCPU the guest has not started (or
    /// has stopped) is `KVM_MP_STATE_STOPPED` and stays so.
    pub mp_state: u32,
}

impl VcpuState {
    pub fn save(fd: &VcpuFd) -> Result<Self, VcpuError> {
        let ids = reg_list(fd)?;
        let mut regs = Vec::with_capacity(ids.len());
        for id in ids {
            let mut value = vec![0u8; reg_size(id)];
            fd.get_one_reg(id, &mut value)
                .map_err(|source| VcpuError::GetReg { id, source })?;
            regs.push((id, value));
        }
        let mp_state = fd
            .get_mp_state()
            .map_err(kvm("read the MP state"))?
            .mp_state;
        Ok(Self { regs, mp_state })
    }

    /// Writes the state into a fresh, initialized vCPU.
    ///
    /// The architected counter: each vCPU's `KVM_REG_ARM_TIMER_CNT` (and
    /// `_PTIMER_CNT` where listed, Linux ≥ 6.4) is written before anything
    /// else, and the timers' CVAL and then CTL after everything else, so
    /// they are taken against the restored count. KVM turns a counter write
    /// into the VM-wide counter offset (the last vCPU's write wins; all were
    /// read within microseconds of each other at save), so the guest's
    /// counter resumes where it stopped, on every kernel. The newer
    /// `KVM_ARM_SET_COUNTER_OFFSET` (KVM_CAP_COUNTER_OFFSET) would set the
    /// same offset once for the VM but needs the host counter read in user
    /// space and an ioctl kvm-ioctls 0.25 does not wrap; it also makes KVM
    /// ignore these writes, so do not mix the two.
    ///
    /// A write KVM refuses fails the restore unless the register already
    /// holds the saved value (read-only registers such as MIDR_EL1, and ID
    /// registers, which are writable from Linux 6.7 on and invariant
    /// before): then the vCPU is as saved anyway.
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), VcpuError> {
        for (id, value) in &self.regs {
            if value.len() != reg_size(*id) {
                return Err(VcpuError::Invalid(format!(
                    "register {id:#x} has {} bytes, its id says {}",
                    value.len(),
                    reg_size(*id)
                )));
            }
        }
        let ids: Vec<u64> = self.regs.iter().map(|(id, _)| *id).collect();
        for i in regs::restore_order(&ids) {
            let (id, value) = &self.regs[i];
            set_reg(fd, *id, value)?;
        }
        fd.set_mp_state(kvm_mp_state {
            mp_state: self.mp_state,
        })
        .map_err(kvm("set the MP state"))
    }

    /// The guest's virtual counter (CNTVCT_EL0) when it was saved.
    pub fn counter(&self) -> Option<u64> {
        self.regs
            .iter()
            .find(|(id, _)| *id == regs::KVM_REG_ARM_TIMER_CNT)
            .and_then(|(_, v)| v.as_slice().try_into().ok())
            .map(u64::from_ne_bytes)
    }
}

/// `KVM_SET_ONE_REG`; a refusal is an error only if the register does not
/// already hold `value`.
fn set_reg(fd: &VcpuFd, id: u64, value: &[u8]) -> Result<(), VcpuError> {
    let source = match fd.set_one_reg(id, value) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let mut now = vec![0u8; value.len()];
    match fd.get_one_reg(id, &mut now) {
        Ok(_) if now == value => {
            tracing::debug!("register {id:#x}: KVM refused a write of its own value ({source})");
            Ok(())
        }
        _ => Err(VcpuError::SetReg {
            id,
            value: hex(value),
            source,
        }),
    }
}

/// `KVM_GET_REG_LIST`, issued here rather than through kvm-ioctls: its
/// `RegList` holds at most 500 ids, and KVM has no such bound (SVE alone
/// adds over 500). Asks with an empty list first; KVM answers E2BIG with
/// the count it needs.
fn reg_list(fd: &VcpuFd) -> Result<Vec<u64>, VcpuError> {
    // struct kvm_reg_list { __u64 n; __u64 reg[]; }: the count, then room.
    let mut buf: Vec<u64> = vec![0];
    // KVM's list is fixed once the vCPU is initialized: two rounds do.
    for _ in 0..3 {
        let room = buf.len() - 1;
        buf[0] = room as u64;
        // SAFETY: `buf` is a kvm_reg_list whose `n` is the number of u64
        // slots that follow it in the same allocation; KVM writes at most
        // `n` ids there (or none, with E2BIG) and the count into `n`.
        let ret = unsafe { ioctl_with_mut_ptr(fd, KVM_GET_REG_LIST, buf.as_mut_ptr()) };
        if ret == 0 {
            let n = usize::try_from(buf[0]).unwrap_or(usize::MAX);
            if n > room {
                return Err(VcpuError::Invalid(format!(
                    "KVM_GET_REG_LIST returned {n} ids into {room} slots"
                )));
            }
            buf.truncate(n + 1);
            buf.remove(0);
            return Ok(buf);
        }
        let err = errno::Error::last();
        if err.errno() != libc::E2BIG {
            return Err(VcpuError::Kvm {
                what: "list the vCPU's registers (KVM_GET_REG_LIST)",
                source: err,
            });
        }
        let needed = usize::try_from(buf[0]).unwrap_or(usize::MAX);
        if needed > MAX_REGS {
            return Err(VcpuError::Invalid(format!("KVM lists {needed} registers")));
        }
        buf.resize(needed + 1, 0);
    }
    Err(VcpuError::Invalid(
        "KVM_GET_REG_LIST kept asking for more room".into(),
    ))
}

/// `value` (host byte order) as hex, most significant byte first.
fn hex(value: &[u8]) -> String {
    let mut bytes = value.to_vec();
    if cfg!(target_endian = "little") {
        bytes.reverse();
    }
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_serde() {
        let s = VcpuState {
            regs: vec![
                (
                    core_reg_id(PC_OFFSET),
                    0x8020_0000u64.to_ne_bytes().to_vec(),
                ),
                (0x6040_0000_0010_0054, vec![7; 16]),
            ],
            mp_state: kvm_bindings::KVM_MP_STATE_STOPPED,
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<VcpuState>(&json).unwrap(), s);
    }

    #[test]
    fn boot_pstate_is_el1h_all_masked() {
        assert_eq!(BOOT_PSTATE, 0x3c5);
        assert_eq!(hex(&0x1234u64.to_ne_bytes()), "0x0000000000001234");
    }

    #[test]
    fn kvm_state_round_trips_through_a_vcpu() {
        // Named kvm_*: needs /dev/kvm on an arm64 host.
        let kvm = kvm_ioctls::Kvm::new().expect("this test needs /dev/kvm");
        let vm = kvm.create_vm().unwrap();
        let fd = vm.create_vcpu(0).unwrap();
        init_vcpu(&vm, &fd, 0).unwrap();
        set_boot_regs(&fd, 0x8020_0000, 0x8fe0_0000).unwrap();
        let saved = VcpuState::save(&fd).unwrap();
        assert!(saved.regs.len() > 100);
        assert!(saved.counter().is_some());
        // A fresh VM, as a restore in a new process gets.
        let vm2 = kvm.create_vm().unwrap();
        let fd2 = vm2.create_vcpu(0).unwrap();
        init_vcpu(&vm2, &fd2, 0).unwrap();
        saved.restore(&fd2).unwrap();
        let mut pc = [0u8; 8];
        fd2.get_one_reg(core_reg_id(PC_OFFSET), &mut pc).unwrap();
        assert_eq!(u64::from_ne_bytes(pc), 0x8020_0000);
        assert_eq!(fd2.get_mp_state().unwrap().mp_state, saved.mp_state);
    }
}
