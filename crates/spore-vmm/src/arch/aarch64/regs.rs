//! Encodings of arm64 KVM register ids and vGIC device attributes.
//!
//! Pure arithmetic, so it builds and is tested on any host; `vcpu.rs` and
//! `gic.rs` (aarch64 only) check at compile time that the constants agree
//! with `kvm-bindings` and with the layout of `kvm_regs`.

/// `KVM_REG_ARM64`: architecture field of a register id.
pub const KVM_REG_ARM64: u64 = 0x6000_0000_0000_0000;
/// `KVM_REG_SIZE_*`: log2 of the register's size in bytes, bits 55:52.
pub const KVM_REG_SIZE_SHIFT: u32 = 52;
pub const KVM_REG_SIZE_MASK: u64 = 0x00f0_0000_0000_0000;
pub const KVM_REG_SIZE_U32: u64 = 0x0020_0000_0000_0000;
pub const KVM_REG_SIZE_U64: u64 = 0x0030_0000_0000_0000;
pub const KVM_REG_SIZE_U128: u64 = 0x0040_0000_0000_0000;
/// Register classes (bits 31:16).
pub const KVM_REG_ARM_CORE: u64 = 0x0010 << 16;
pub const KVM_REG_ARM64_SYSREG: u64 = 0x0013 << 16;

/// Byte offsets in `struct kvm_regs` (whose first member is `user_pt_regs
/// { u64 regs[31]; u64 sp; u64 pc; u64 pstate; }`).
pub const X0_OFFSET: usize = 0;
pub const PC_OFFSET: usize = 32 * 8;
pub const PSTATE_OFFSET: usize = 33 * 8;

/// Id of the 64-bit core register at `byte_offset` in `struct kvm_regs`:
/// KVM numbers core registers in 32-bit words.
pub const fn core_reg_id(byte_offset: usize) -> u64 {
    KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | (byte_offset / 4) as u64
}

/// Id of general-purpose register `Xn`.
pub const fn x_reg_id(n: usize) -> u64 {
    core_reg_id(X0_OFFSET + n * 8)
}

/// The 16-bit `op0:op1:CRn:CRm:op2` encoding of a system register, as in
/// `MRS`/`MSR` and in the vGIC's `KVM_DEV_ARM_VGIC_GRP_CPU_SYSREGS` attr.
pub const fn sys_reg_encoding(op0: u64, op1: u64, crn: u64, crm: u64, op2: u64) -> u64 {
    ((op0 & 3) << 14) | ((op1 & 7) << 11) | ((crn & 0xf) << 7) | ((crm & 0xf) << 3) | (op2 & 7)
}

/// `ARM64_SYS_REG(...)`: the one-reg id of a 64-bit system register.
pub const fn sys_reg_id(op0: u64, op1: u64, crn: u64, crm: u64, op2: u64) -> u64 {
    KVM_REG_ARM64
        | KVM_REG_SIZE_U64
        | KVM_REG_ARM64_SYSREG
        | sys_reg_encoding(op0, op1, crn, crm, op2)
}

pub const MPIDR_EL1: u64 = sys_reg_id(3, 0, 0, 0, 5);

/// The architected timers as KVM exposes them. CNT and CVAL of the virtual
/// timer have each other's encodings in the uapi header (a historical
/// mistake KVM keeps for ABI's sake); these are its values.
pub const KVM_REG_ARM_TIMER_CTL: u64 = sys_reg_id(3, 3, 14, 3, 1);
pub const KVM_REG_ARM_TIMER_CNT: u64 = sys_reg_id(3, 3, 14, 3, 2);
pub const KVM_REG_ARM_TIMER_CVAL: u64 = sys_reg_id(3, 3, 14, 0, 2);
pub const KVM_REG_ARM_PTIMER_CTL: u64 = sys_reg_id(3, 3, 14, 2, 1);
pub const KVM_REG_ARM_PTIMER_CNT: u64 = sys_reg_id(3, 3, 14, 0, 1);
pub const KVM_REG_ARM_PTIMER_CVAL: u64 = sys_reg_id(3, 3, 14, 2, 2);

/// The order in which a saved register list goes back into a vCPU, as
/// indices into `ids`: the timers' counters first, then every other
/// register as listed, then the timers' compare values, then their
/// controls. KVM turns a counter write into the VM's counter offset, and a
/// timer's CVAL and CTL mean something only against the restored counter.
pub fn restore_order(ids: &[u64]) -> Vec<usize> {
    const COUNTERS: [u64; 2] = [KVM_REG_ARM_TIMER_CNT, KVM_REG_ARM_PTIMER_CNT];
    const CVALS: [u64; 2] = [KVM_REG_ARM_TIMER_CVAL, KVM_REG_ARM_PTIMER_CVAL];
    const CTLS: [u64; 2] = [KVM_REG_ARM_TIMER_CTL, KVM_REG_ARM_PTIMER_CTL];
    let rank = |id: &u64| {
        if COUNTERS.contains(id) {
            0
        } else if CVALS.contains(id) {
            2
        } else if CTLS.contains(id) {
            3
        } else {
            1
        }
    };
    let mut order: Vec<usize> = (0..ids.len()).collect();
    // Stable: the list's own order holds within each rank.
    order.sort_by_key(|&i| rank(&ids[i]));
    order
}

/// Size in bytes of register `id`, from its `KVM_REG_SIZE` field (1 to
/// 2048 bytes: SVE's Z registers are the largest).
pub const fn reg_size(id: u64) -> usize {
    1 << ((id & KVM_REG_SIZE_MASK) >> KVM_REG_SIZE_SHIFT)
}

/// The MPIDR field of a GICv3 vGIC attr (redistributor, CPU sysreg and
/// level-info groups): Aff3..Aff0 packed into bits 63:32.
pub const fn vgic_v3_mpidr_attr(mpidr: u64) -> u64 {
    let aff3 = (mpidr >> 32) & 0xff;
    let aff2_0 = mpidr & 0xff_ffff;
    ((aff3 << 24) | aff2_0) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_register_ids_match_kvm() {
        // Values from the kernel's arm64 KVM selftests / QEMU.
        assert_eq!(core_reg_id(PC_OFFSET), 0x6030_0000_0010_0040);
        assert_eq!(core_reg_id(PSTATE_OFFSET), 0x6030_0000_0010_0042);
        assert_eq!(x_reg_id(0), 0x6030_0000_0010_0000);
        assert_eq!(x_reg_id(1), 0x6030_0000_0010_0002);
        assert_eq!(x_reg_id(30), 0x6030_0000_0010_003c);
    }

    #[test]
    fn system_register_ids_match_kvm() {
        assert_eq!(MPIDR_EL1, 0x6030_0000_0013_c005);
        assert_eq!(KVM_REG_ARM_TIMER_CTL, 0x6030_0000_0013_df19);
        assert_eq!(KVM_REG_ARM_TIMER_CNT, 0x6030_0000_0013_df1a);
        assert_eq!(KVM_REG_ARM_TIMER_CVAL, 0x6030_0000_0013_df02);
        assert_eq!(KVM_REG_ARM_PTIMER_CNT, 0x6030_0000_0013_df01);
        // ICC_CTLR_EL1 as the vGIC's CPU_SYSREGS attr encodes it.
        assert_eq!(sys_reg_encoding(3, 0, 12, 12, 4), 0xc664);
    }

    #[test]
    fn register_sizes_come_from_the_id() {
        assert_eq!(reg_size(MPIDR_EL1), 8);
        // FPSR (a 32-bit core register) and V0 (128 bits).
        assert_eq!(reg_size(0x6020_0000_0010_00d4), 4);
        assert_eq!(reg_size(0x6040_0000_0010_0054), 16);
        // An SVE Z register (2048 bits).
        assert_eq!(reg_size(0x6080_0000_0015_0000), 256);
    }

    #[test]
    fn timers_restore_counter_first_control_last() {
        let ids = [
            x_reg_id(0),
            KVM_REG_ARM_PTIMER_CNT,
            KVM_REG_ARM_TIMER_CVAL,
            MPIDR_EL1,
            KVM_REG_ARM_PTIMER_CTL,
            KVM_REG_ARM_PTIMER_CVAL,
            KVM_REG_ARM_TIMER_CTL,
            KVM_REG_ARM_TIMER_CNT,
            core_reg_id(PC_OFFSET),
        ];
        let order: Vec<u64> = restore_order(&ids).into_iter().map(|i| ids[i]).collect();
        assert_eq!(
            order,
            [
                KVM_REG_ARM_PTIMER_CNT,
                KVM_REG_ARM_TIMER_CNT,
                x_reg_id(0),
                MPIDR_EL1,
                core_reg_id(PC_OFFSET),
                KVM_REG_ARM_TIMER_CVAL,
                KVM_REG_ARM_PTIMER_CVAL,
                KVM_REG_ARM_PTIMER_CTL,
                KVM_REG_ARM_TIMER_CTL,
            ]
        );
    }

    #[test]
    fn vgic_mpidr_attr_packs_the_affinity_levels() {
        assert_eq!(vgic_v3_mpidr_attr(0x8000_0000), 0);
        assert_eq!(vgic_v3_mpidr_attr(0x8000_0101), 0x0000_0101_0000_0000);
        assert_eq!(vgic_v3_mpidr_attr(0x12_8003_0201), 0x1203_0201_0000_0000);
    }
}
