//! The in-kernel GIC (KVM's vGIC): GICv3, or GICv2 where the host cannot
//! emulate v3, at the addresses of [`super::layout`]; and its state for
//! snapshots, read and written through the device's register attributes
//! (Documentation/virt/kvm/devices/arm-vgic-v3.rst and arm-vgic.rst).
//!
//! Order of use: [`Gic::create`] (before or after the vCPUs are created),
//! `KVM_ARM_VCPU_INIT` of every vCPU, [`Gic::finalize`], then either the
//! first `KVM_RUN` or, for a snapshot, every vCPU's register restore and
//! then [`Gic::restore`]. [`Gic::save`] and [`Gic::restore`] need every
//! vCPU outside `KVM_RUN` (KVM answers `EBUSY` otherwise).

use kvm_bindings::{
    kvm_create_device, kvm_device_attr, kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V2,
    kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3, KVM_DEV_ARM_VGIC_CPUID_SHIFT,
    KVM_DEV_ARM_VGIC_CTRL_INIT, KVM_DEV_ARM_VGIC_GRP_ADDR, KVM_DEV_ARM_VGIC_GRP_CPU_REGS,
    KVM_DEV_ARM_VGIC_GRP_CPU_SYSREGS, KVM_DEV_ARM_VGIC_GRP_CTRL, KVM_DEV_ARM_VGIC_GRP_DIST_REGS,
    KVM_DEV_ARM_VGIC_GRP_LEVEL_INFO, KVM_DEV_ARM_VGIC_GRP_NR_IRQS,
    KVM_DEV_ARM_VGIC_GRP_REDIST_REGS, KVM_DEV_ARM_VGIC_LINE_LEVEL_INFO_SHIFT,
    KVM_VGIC_V2_ADDR_TYPE_CPU, KVM_VGIC_V2_ADDR_TYPE_DIST, KVM_VGIC_V3_ADDR_TYPE_DIST,
    KVM_VGIC_V3_ADDR_TYPE_REDIST, VGIC_LEVEL_INFO_LINE_LEVEL,
};
use kvm_ioctls::{DeviceFd, VmFd};
use serde::{Deserialize, Serialize};

use super::fdt::{GicDesc, GicVersion, GICV2_MAX_CPUS};
use super::layout;
use super::regs::{sys_reg_encoding, vgic_v3_mpidr_attr};

// The MPIDR packing of regs.rs is the one KVM documents.
const _: () =
    assert!(kvm_bindings::KVM_DEV_ARM_VGIC_V3_MPIDR_MASK as u64 == vgic_v3_mpidr_attr(!0));

/// SGIs and PPIs: the private interrupts, banked per vCPU.
const NR_PRIVATE_IRQS: u32 = 32;
/// The vGIC maintenance interrupt's PPI, as KVM and QEMU declare it.
const MAINT_IRQ_PPI: u32 = 9;

/// Distributor registers (GICv2 and GICv3 share these offsets).
const GICD_CTLR: u64 = 0x0000;
const GICD_IIDR: u64 = 0x0008;
const GICD_IGROUPR: u64 = 0x0080;
const GICD_ISENABLER: u64 = 0x0100;
const GICD_ISPENDR: u64 = 0x0200;
const GICD_ISACTIVER: u64 = 0x0300;
const GICD_IPRIORITYR: u64 = 0x0400;
/// GICv2 only: the target CPUs of each SPI.
const GICD_ITARGETSR: u64 = 0x0800;
const GICD_ICFGR: u64 = 0x0c00;
/// GICv2 only: pending SGIs by source CPU (banked).
const GICD_SPENDSGIR: u64 = 0x0f20;
/// GICv3 only: the affinity each SPI is routed to (64 bits per SPI).
const GICD_IROUTER: u64 = 0x6000;
/// The clear-enable and clear-active registers sit 0x80 above the set ones.
const CLEAR_OFFSET: u64 = 0x80;

/// GICv3 redistributor: the RD frame, then the SGI frame 64 KiB above it,
/// whose registers have the distributor's offsets.
const GICR_CTLR: u64 = 0x0000;
const GICR_SGI: u64 = 0x1_0000;

/// GICv3 CPU interface system registers (op0, op1, CRn, CRm, op2).
const ICC_SRE_EL1: u64 = sys_reg_encoding(3, 0, 12, 12, 5);
const ICC_CTLR_EL1: u64 = sys_reg_encoding(3, 0, 12, 12, 4);
const ICC_PMR_EL1: u64 = sys_reg_encoding(3, 0, 4, 6, 0);
const ICC_BPR0_EL1: u64 = sys_reg_encoding(3, 0, 12, 8, 3);
const ICC_BPR1_EL1: u64 = sys_reg_encoding(3, 0, 12, 12, 3);
const ICC_IGRPEN0_EL1: u64 = sys_reg_encoding(3, 0, 12, 12, 6);
const ICC_IGRPEN1_EL1: u64 = sys_reg_encoding(3, 0, 12, 12, 7);
const fn icc_ap0r(n: u64) -> u64 {
    sys_reg_encoding(3, 0, 12, 8, 4 | n)
}
const fn icc_ap1r(n: u64) -> u64 {
    sys_reg_encoding(3, 0, 12, 9, n)
}
/// ICC_CTLR_EL1.PRIbits: priority bits implemented, minus one.
const ICC_CTLR_PRIBITS_SHIFT: u64 = 8;

/// GICv2 CPU interface registers.
const GICC_CTLR: u64 = 0x00;
const GICC_PMR: u64 = 0x04;
const GICC_BPR: u64 = 0x08;
const GICC_ABPR: u64 = 0x1c;
const GICC_APR: u64 = 0xd0;

#[derive(Debug, thiserror::Error)]
pub enum GicError {
    #[error("cannot create the in-kernel GIC (GICv3: {v3}; GICv2: {v2})")]
    Create { v3: kvm_ioctls::Error, v2: String },
    #[error("cannot {op} GIC attribute {group}/{attr:#x}: {source}")]
    Attr {
        op: &'static str,
        group: &'static str,
        attr: u64,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("GIC: {0}")]
    Invalid(String),
}

/// The vGIC's state, as plain (register, value) lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GicState {
    pub version: GicVersion,
    /// Interrupts the GIC has (SGIs, PPIs and SPIs).
    pub nr_irqs: u32,
    /// Distributor registers (offset, value): GICD_IIDR, GICD_CTLR, then
    /// the SPIs' configuration, pending, active and enable bits.
    pub dist: Vec<(u64, u32)>,
    /// GICv3: the SPIs' input line levels (first INTID, 32-bit bitmap),
    /// for level-triggered SPIs a device holds asserted. The PPIs' levels
    /// are not kept: their sources (timers, PMU) are KVM's own, and KVM
    /// sets their levels again from the restored timer registers each time
    /// a vCPU is loaded; a restored stale level could only hold a PPI high.
    pub spi_levels: Vec<(u32, u32)>,
    /// Per vCPU, in the order of the MPIDRs given to [`Gic::save`].
    pub vcpus: Vec<GicVcpuState>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GicVcpuState {
    /// MPIDR_EL1 of the vCPU.
    pub mpidr: u64,
    /// GICv3: its redistributor's registers; GICv2: the distributor
    /// registers banked for it (SGIs and PPIs). (offset, value).
    pub redist: Vec<(u64, u32)>,
    /// GICv3: CPU-interface system registers (op0:op1:CRn:CRm:op2, value);
    /// GICv2: CPU-interface registers (offset, value). In restore order.
    pub cpu: Vec<(u64, u64)>,
}

pub struct Gic {
    fd: DeviceFd,
    version: GicVersion,
    vcpu_count: u8,
}

fn group_name(group: u32) -> &'static str {
    match group {
        KVM_DEV_ARM_VGIC_GRP_ADDR => "ADDR",
        KVM_DEV_ARM_VGIC_GRP_DIST_REGS => "DIST_REGS",
        KVM_DEV_ARM_VGIC_GRP_CPU_REGS => "CPU_REGS",
        KVM_DEV_ARM_VGIC_GRP_NR_IRQS => "NR_IRQS",
        KVM_DEV_ARM_VGIC_GRP_CTRL => "CTRL",
        KVM_DEV_ARM_VGIC_GRP_REDIST_REGS => "REDIST_REGS",
        KVM_DEV_ARM_VGIC_GRP_CPU_SYSREGS => "CPU_SYSREGS",
        KVM_DEV_ARM_VGIC_GRP_LEVEL_INFO => "LEVEL_INFO",
        _ => "?",
    }
}

/// Registers written after the line levels: pending, active and enable
/// (set registers; the low 16 bits are the offset within a frame).
fn is_state_reg(offset: u64) -> bool {
    let o = offset & 0xffff;
    let block = |base: u64| (base..base + CLEAR_OFFSET).contains(&o);
    block(GICD_ISPENDR)
        || block(GICD_ISACTIVER)
        || block(GICD_ISENABLER)
        || (GICD_SPENDSGIR..GICD_SPENDSGIR + 16).contains(&o)
}

/// Offsets of the 32-bit registers that hold `bits` per interrupt for
/// INTIDs `first..last`, in a block at `base`.
fn per_irq_regs(base: u64, bits: u64, first: u32, last: u32) -> impl Iterator<Item = u64> {
    let start = base + u64::from(first) * bits / 8;
    let end = base + u64::from(last) * bits / 8;
    (start..end).step_by(4)
}

impl Gic {
    /// Creates the vGIC (GICv3, else GICv2) and places it; KVM initializes
    /// it in [`Gic::finalize`].
    pub fn create(vm: &VmFd, vcpu_count: u8) -> Result<Gic, GicError> {
        if vcpu_count == 0 {
            return Err(GicError::Invalid("no vCPU".into()));
        }
        let redist_end =
            layout::GIC_REDIST_BASE + u64::from(vcpu_count) * layout::GIC_REDIST_SIZE_PER_CPU;
        if redist_end > layout::SERIAL_MMIO_BASE {
            return Err(GicError::Invalid(format!(
                "{vcpu_count} redistributors do not fit below the UART"
            )));
        }
        let mut v3 = kvm_create_device {
            type_: kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3,
            fd: 0,
            flags: 0,
        };
        let (fd, version) = match vm.create_device(&mut v3) {
            Ok(fd) => (fd, GicVersion::V3),
            Err(v3) => {
                if usize::from(vcpu_count) > GICV2_MAX_CPUS {
                    return Err(GicError::Create {
                        v3,
                        v2: format!("not tried: it serves {GICV2_MAX_CPUS} vCPUs at most"),
                    });
                }
                let mut v2 = kvm_create_device {
                    type_: kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V2,
                    fd: 0,
                    flags: 0,
                };
                let fd = vm.create_device(&mut v2).map_err(|e| GicError::Create {
                    v3,
                    v2: e.to_string(),
                })?;
                tracing::info!("the host cannot emulate a GICv3 ({v3}): using a GICv2");
                (fd, GicVersion::V2)
            }
        };
        let gic = Gic {
            fd,
            version,
            vcpu_count,
        };
        let (first, second) = match version {
            GicVersion::V3 => (
                (KVM_VGIC_V3_ADDR_TYPE_DIST, layout::GIC_DIST_BASE),
                (KVM_VGIC_V3_ADDR_TYPE_REDIST, layout::GIC_REDIST_BASE),
            ),
            GicVersion::V2 => (
                (KVM_VGIC_V2_ADDR_TYPE_DIST, layout::GIC_DIST_BASE),
                (KVM_VGIC_V2_ADDR_TYPE_CPU, layout::GIC_CPU_BASE),
            ),
        };
        for (kind, addr) in [first, second] {
            gic.set64(KVM_DEV_ARM_VGIC_GRP_ADDR, u64::from(kind), addr)?;
        }
        gic.set32(KVM_DEV_ARM_VGIC_GRP_NR_IRQS, 0, nr_irqs())?;
        Ok(gic)
    }

    /// `KVM_DEV_ARM_VGIC_CTRL_INIT`. Call once, after every vCPU has been
    /// created and initialized (`KVM_ARM_VCPU_INIT`) and before any runs:
    /// KVM sizes the redistributors and per-vCPU interrupt state by the
    /// vCPUs it sees then. [`Gic::restore`] needs it done too (KVM refuses
    /// register access to an uninitialized GICv3).
    pub fn finalize(&self) -> Result<(), GicError> {
        self.set_attr(
            KVM_DEV_ARM_VGIC_GRP_CTRL,
            u64::from(KVM_DEV_ARM_VGIC_CTRL_INIT),
            0,
        )
    }

    pub fn version(&self) -> GicVersion {
        self.version
    }

    /// What the device tree says of this GIC.
    pub fn desc(&self) -> GicDesc {
        let second = match self.version {
            GicVersion::V3 => (
                layout::GIC_REDIST_BASE,
                u64::from(self.vcpu_count) * layout::GIC_REDIST_SIZE_PER_CPU,
            ),
            GicVersion::V2 => (layout::GIC_CPU_BASE, layout::GIC_CPU_SIZE),
        };
        GicDesc {
            version: self.version,
            regions: vec![(layout::GIC_DIST_BASE, layout::GIC_DIST_SIZE), second],
            maint_irq_ppi: Some(MAINT_IRQ_PPI),
        }
    }

    /// Reads the GIC's state. `vcpu_mpidrs`: MPIDR_EL1 of each vCPU, in
    /// vCPU id order (GICv2 addresses vCPUs by that index).
    pub fn save(&self, vcpu_mpidrs: &[u64]) -> Result<GicState, GicError> {
        self.check_vcpus(vcpu_mpidrs.len())?;
        let nr_irqs = self.get32(KVM_DEV_ARM_VGIC_GRP_NR_IRQS, 0)?;
        if nr_irqs % 32 != 0 || !(64..=1024).contains(&nr_irqs) {
            return Err(GicError::Invalid(format!(
                "KVM reports {nr_irqs} interrupts"
            )));
        }
        match self.version {
            GicVersion::V3 => self.save_v3(vcpu_mpidrs, nr_irqs),
            GicVersion::V2 => self.save_v2(vcpu_mpidrs, nr_irqs),
        }
    }

    /// Writes `state` into this GIC, which must be freshly created and
    /// finalized, with the vCPUs' registers already restored (so they have
    /// the MPIDRs the state was saved with). `vcpu_mpidrs` as for
    /// [`Gic::save`].
    pub fn restore(&self, state: &GicState, vcpu_mpidrs: &[u64]) -> Result<(), GicError> {
        if state.version != self.version {
            return Err(GicError::Invalid(format!(
                "the snapshot has a {:?} GIC, this host gives a {:?}",
                state.version, self.version
            )));
        }
        self.check_vcpus(vcpu_mpidrs.len())?;
        if state.vcpus.len() != vcpu_mpidrs.len() {
            return Err(GicError::Invalid(format!(
                "the snapshot has GIC state for {} vCPUs, the VM has {}",
                state.vcpus.len(),
                vcpu_mpidrs.len()
            )));
        }
        for (i, (saved, &now)) in state.vcpus.iter().zip(vcpu_mpidrs).enumerate() {
            if saved.mpidr != now {
                return Err(GicError::Invalid(format!(
                    "vCPU {i} has MPIDR {now:#x}, the snapshot's had {:#x}",
                    saved.mpidr
                )));
            }
        }
        let nr_irqs = self.get32(KVM_DEV_ARM_VGIC_GRP_NR_IRQS, 0)?;
        if state.nr_irqs != nr_irqs {
            return Err(GicError::Invalid(format!(
                "the snapshot's GIC has {} interrupts, this one {nr_irqs}",
                state.nr_irqs
            )));
        }
        match self.version {
            GicVersion::V3 => self.restore_v3(state, vcpu_mpidrs),
            GicVersion::V2 => self.restore_v2(state),
        }
    }

    fn check_vcpus(&self, n: usize) -> Result<(), GicError> {
        if n != usize::from(self.vcpu_count) {
            return Err(GicError::Invalid(format!(
                "{n} MPIDRs given for a GIC made for {} vCPUs",
                self.vcpu_count
            )));
        }
        Ok(())
    }

    fn save_v3(&self, mpidrs: &[u64], nr_irqs: u32) -> Result<GicState, GicError> {
        const DIST: u32 = KVM_DEV_ARM_VGIC_GRP_DIST_REGS;
        const REDIST: u32 = KVM_DEV_ARM_VGIC_GRP_REDIST_REGS;
        const SYSREGS: u32 = KVM_DEV_ARM_VGIC_GRP_CPU_SYSREGS;
        let spis = |base, bits| per_irq_regs(base, bits, NR_PRIVATE_IRQS, nr_irqs);
        // GICD_STATUSR and GICD_IGRPMODR are RAO/WI and RAZ/WI in KVM.
        let dist_offsets = [GICD_IIDR, GICD_CTLR]
            .into_iter()
            .chain(spis(GICD_IGROUPR, 1))
            .chain(spis(GICD_IPRIORITYR, 8))
            .chain(spis(GICD_ICFGR, 2))
            .chain(spis(GICD_IROUTER, 64))
            .chain(spis(GICD_ISPENDR, 1))
            .chain(spis(GICD_ISACTIVER, 1))
            .chain(spis(GICD_ISENABLER, 1));
        let mut dist = Vec::new();
        for offset in dist_offsets {
            dist.push((offset, self.get32(DIST, offset)?));
        }

        // SPI levels are global; the attr still has to name a vCPU.
        let any_vcpu = vgic_v3_mpidr_attr(mpidrs[0]);
        let mut spi_levels = Vec::new();
        for intid in (NR_PRIVATE_IRQS..nr_irqs).step_by(32) {
            spi_levels.push((
                intid,
                self.get32(KVM_DEV_ARM_VGIC_GRP_LEVEL_INFO, level_attr(any_vcpu, intid))?,
            ));
        }

        let mut vcpus = Vec::with_capacity(mpidrs.len());
        for &mpidr in mpidrs {
            let who = vgic_v3_mpidr_attr(mpidr);
            // No ITS, so no LPIs: PROPBASER/PENDBASER are not used, and
            // GICR_STATUSR and GICR_WAKER are RAZ/WI in KVM.
            let sgi = |o: u64| GICR_SGI + o;
            let redist_offsets = [GICR_CTLR, sgi(GICD_IGROUPR)]
                .into_iter()
                .chain(per_irq_regs(sgi(GICD_IPRIORITYR), 8, 0, NR_PRIVATE_IRQS))
                .chain(per_irq_regs(sgi(GICD_ICFGR), 2, 0, NR_PRIVATE_IRQS))
                .chain([sgi(GICD_ISPENDR), sgi(GICD_ISACTIVER), sgi(GICD_ISENABLER)]);
            let mut redist = Vec::new();
            for offset in redist_offsets {
                redist.push((offset, self.get32(REDIST, who | offset)?));
            }

            // CTLR says how many active-priority registers exist (KVM
            // refuses the others); it and SRE go back first.
            let ctlr = self.get64(SYSREGS, who | ICC_CTLR_EL1)?;
            let apr_count = match (ctlr >> ICC_CTLR_PRIBITS_SHIFT) & 7 {
                6 => 4,
                5 => 2,
                _ => 1,
            };
            let sysregs = [
                ICC_SRE_EL1,
                ICC_CTLR_EL1,
                ICC_PMR_EL1,
                ICC_BPR0_EL1,
                ICC_BPR1_EL1,
            ]
            .into_iter()
            .chain((0..apr_count).map(icc_ap0r))
            .chain((0..apr_count).map(icc_ap1r))
            .chain([ICC_IGRPEN0_EL1, ICC_IGRPEN1_EL1]);
            let mut cpu = Vec::new();
            for reg in sysregs {
                cpu.push((reg, self.get64(SYSREGS, who | reg)?));
            }
            vcpus.push(GicVcpuState { mpidr, redist, cpu });
        }
        Ok(GicState {
            version: GicVersion::V3,
            nr_irqs,
            dist,
            spi_levels,
            vcpus,
        })
    }

    /// Order (QEMU's, and what the vGIC's code needs): GICD_IIDR first (it
    /// selects KVM's behaviour for the rest), GICD_CTLR next (KVM queues a
    /// pending interrupt to a vCPU only while the distributor is enabled,
    /// and a user-space CTLR write does not requeue), then per interrupt
    /// its group, priority, trigger and routing before its line level,
    /// pending, active and enable bits; the CPU interfaces last, each with
    /// ICC_CTLR_EL1 before the registers whose meaning it sets.
    fn restore_v3(&self, state: &GicState, mpidrs: &[u64]) -> Result<(), GicError> {
        const DIST: u32 = KVM_DEV_ARM_VGIC_GRP_DIST_REGS;
        const REDIST: u32 = KVM_DEV_ARM_VGIC_GRP_REDIST_REGS;
        self.restore_regs(DIST, 0, &state.dist, false)?;
        for (vcpu, &mpidr) in state.vcpus.iter().zip(mpidrs) {
            let who = vgic_v3_mpidr_attr(mpidr);
            self.restore_regs(REDIST, who, &vcpu.redist, false)?;
            self.restore_regs(REDIST, who, &vcpu.redist, true)?;
        }
        let any_vcpu = vgic_v3_mpidr_attr(mpidrs[0]);
        for &(intid, levels) in &state.spi_levels {
            if intid % 32 != 0 || intid < NR_PRIVATE_IRQS || intid >= state.nr_irqs {
                return Err(GicError::Invalid(format!("line levels for INTID {intid}")));
            }
            self.set32(
                KVM_DEV_ARM_VGIC_GRP_LEVEL_INFO,
                level_attr(any_vcpu, intid),
                levels,
            )?;
        }
        self.restore_regs(DIST, 0, &state.dist, true)?;
        for (vcpu, &mpidr) in state.vcpus.iter().zip(mpidrs) {
            let who = vgic_v3_mpidr_attr(mpidr);
            for &(reg, value) in &vcpu.cpu {
                if reg > 0xffff {
                    return Err(GicError::Invalid(format!("CPU system register {reg:#x}")));
                }
                self.set64(KVM_DEV_ARM_VGIC_GRP_CPU_SYSREGS, who | reg, value)?;
            }
        }
        Ok(())
    }

    fn save_v2(&self, mpidrs: &[u64], nr_irqs: u32) -> Result<GicState, GicError> {
        const DIST: u32 = KVM_DEV_ARM_VGIC_GRP_DIST_REGS;
        let spis = |base, bits| per_irq_regs(base, bits, NR_PRIVATE_IRQS, nr_irqs);
        let dist_offsets = [GICD_IIDR, GICD_CTLR]
            .into_iter()
            .chain(spis(GICD_IGROUPR, 1))
            .chain(spis(GICD_IPRIORITYR, 8))
            .chain(spis(GICD_ITARGETSR, 8))
            .chain(spis(GICD_ICFGR, 2))
            .chain(spis(GICD_ISPENDR, 1))
            .chain(spis(GICD_ISACTIVER, 1))
            .chain(spis(GICD_ISENABLER, 1));
        let mut dist = Vec::new();
        for offset in dist_offsets {
            dist.push((offset, self.get32(DIST, offset)?));
        }

        let mut vcpus = Vec::with_capacity(mpidrs.len());
        for (index, &mpidr) in mpidrs.iter().enumerate() {
            let who = v2_cpu_attr(index);
            // The private interrupts' targets and trigger are fixed in KVM.
            let banked = [GICD_IGROUPR]
                .into_iter()
                .chain(per_irq_regs(GICD_IPRIORITYR, 8, 0, NR_PRIVATE_IRQS))
                .chain(per_irq_regs(GICD_SPENDSGIR, 8, 0, 16))
                .chain([GICD_ISPENDR, GICD_ISACTIVER, GICD_ISENABLER]);
            let mut redist = Vec::new();
            for offset in banked {
                let mut value = self.get32(DIST, who | offset)?;
                if offset == GICD_ISPENDR {
                    // Pending SGIs are restored with their sources through
                    // GICD_SPENDSGIR; KVM would invent a source for them here.
                    value &= !0xffff;
                }
                redist.push((offset, value));
            }
            let mut cpu = Vec::new();
            for offset in [GICC_CTLR, GICC_PMR, GICC_BPR, GICC_ABPR]
                .into_iter()
                .chain((0..4).map(|n| GICC_APR + 4 * n))
            {
                let value = self.get32(KVM_DEV_ARM_VGIC_GRP_CPU_REGS, who | offset)?;
                cpu.push((offset, u64::from(value)));
            }
            vcpus.push(GicVcpuState { mpidr, redist, cpu });
        }
        Ok(GicState {
            version: GicVersion::V2,
            nr_irqs,
            dist,
            // KVM offers no line levels for GICv2: the devices' irqfds
            // raise edges, which the pending bits hold.
            spi_levels: Vec::new(),
            vcpus,
        })
    }

    /// As [`Gic::restore_v3`]; GICv2 addresses vCPUs by index.
    fn restore_v2(&self, state: &GicState) -> Result<(), GicError> {
        const DIST: u32 = KVM_DEV_ARM_VGIC_GRP_DIST_REGS;
        self.restore_regs(DIST, 0, &state.dist, false)?;
        for (index, vcpu) in state.vcpus.iter().enumerate() {
            self.restore_regs(DIST, v2_cpu_attr(index), &vcpu.redist, false)?;
        }
        for (index, vcpu) in state.vcpus.iter().enumerate() {
            self.restore_regs(DIST, v2_cpu_attr(index), &vcpu.redist, true)?;
        }
        self.restore_regs(DIST, 0, &state.dist, true)?;
        for (index, vcpu) in state.vcpus.iter().enumerate() {
            for &(offset, value) in &vcpu.cpu {
                let value = u32::try_from(value).map_err(|_| {
                    GicError::Invalid(format!("GICv2 CPU register {offset:#x} = {value:#x}"))
                })?;
                self.set32(
                    KVM_DEV_ARM_VGIC_GRP_CPU_REGS,
                    v2_cpu_attr(index) | offset,
                    value,
                )?;
            }
        }
        Ok(())
    }

    /// Writes the configuration registers of `regs` (`state` false) or its
    /// pending/active/enable registers (`state` true), in the saved order.
    /// Enable and active bits are cleared before they are set: KVM starts
    /// with the SGIs enabled.
    fn restore_regs(
        &self,
        group: u32,
        who: u64,
        regs: &[(u64, u32)],
        state: bool,
    ) -> Result<(), GicError> {
        for &(offset, value) in regs.iter().filter(|r| is_state_reg(r.0) == state) {
            if offset > 0xffff_ffff {
                return Err(GicError::Invalid(format!("register offset {offset:#x}")));
            }
            if group == KVM_DEV_ARM_VGIC_GRP_DIST_REGS && offset == GICD_IIDR {
                // The revision says how KVM treats the guest's interrupt
                // groups. One this kernel does not know is refused; the
                // guest then gets this kernel's behaviour, which Linux
                // guests do not notice.
                if let Err(e) = self.set32(group, who | offset, value) {
                    tracing::warn!("GIC: keeping this kernel's GICD_IIDR ({e})");
                }
                continue;
            }
            let o = offset & 0xffff;
            let clear_first = (GICD_ISENABLER..GICD_ISENABLER + CLEAR_OFFSET).contains(&o)
                || (GICD_ISACTIVER..GICD_ISACTIVER + CLEAR_OFFSET).contains(&o);
            if clear_first {
                self.set32(group, who | (offset + CLEAR_OFFSET), !value)?;
            }
            self.set32(group, who | offset, value)?;
        }
        Ok(())
    }

    fn set_attr(&self, group: u32, attr: u64, addr: u64) -> Result<(), GicError> {
        let da = kvm_device_attr {
            group,
            attr,
            addr,
            flags: 0,
        };
        self.fd
            .set_device_attr(&da)
            .map_err(|source| GicError::Attr {
                op: "write",
                group: group_name(group),
                attr,
                source,
            })
    }

    fn set32(&self, group: u32, attr: u64, value: u32) -> Result<(), GicError> {
        self.set_attr(group, attr, &value as *const u32 as u64)
    }

    fn set64(&self, group: u32, attr: u64, value: u64) -> Result<(), GicError> {
        self.set_attr(group, attr, &value as *const u64 as u64)
    }

    fn get32(&self, group: u32, attr: u64) -> Result<u32, GicError> {
        self.get(group, attr)
    }

    fn get64(&self, group: u32, attr: u64) -> Result<u64, GicError> {
        self.get(group, attr)
    }

    /// One attribute read into a `T`: u32 for the 32-bit groups (registers,
    /// NR_IRQS, line levels), u64 for the CPU system registers — exactly the
    /// sizes KVM writes for them.
    fn get<T: Copy + Default>(&self, group: u32, attr: u64) -> Result<T, GicError> {
        let mut value = T::default();
        let mut da = kvm_device_attr {
            group,
            attr,
            addr: &mut value as *mut T as u64,
            flags: 0,
        };
        // SAFETY: `addr` points at `value`, a live T as large as what KVM
        // writes for this group (above).
        unsafe { self.fd.get_device_attr(&mut da) }.map_err(|source| GicError::Attr {
            op: "read",
            group: group_name(group),
            attr,
            source,
        })?;
        Ok(value)
    }
}

/// SGIs, PPIs and the layout's SPIs.
fn nr_irqs() -> u32 {
    NR_PRIVATE_IRQS + layout::GIC_NR_SPIS
}

/// KVM_DEV_ARM_VGIC_GRP_LEVEL_INFO attr: the vCPU, "line level", and the
/// first of the 32 INTIDs.
fn level_attr(who: u64, intid: u32) -> u64 {
    who | u64::from(VGIC_LEVEL_INFO_LINE_LEVEL << KVM_DEV_ARM_VGIC_LINE_LEVEL_INFO_SHIFT)
        | u64::from(intid)
}

/// The vCPU field of a GICv2 register attr: the vCPU's index.
fn v2_cpu_attr(index: usize) -> u64 {
    (index as u64) << KVM_DEV_ARM_VGIC_CPUID_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_serde() {
        let s = GicState {
            version: GicVersion::V3,
            nr_irqs: 96,
            dist: vec![(GICD_IIDR, 0x3_043b), (GICD_CTLR, 0x12)],
            spi_levels: vec![(32, 1), (64, 0)],
            vcpus: vec![GicVcpuState {
                mpidr: 0x8000_0000,
                redist: vec![(GICR_SGI + GICD_ISENABLER, 0xffff)],
                cpu: vec![(ICC_SRE_EL1, 7), (ICC_CTLR_EL1, 0x400)],
            }],
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<GicState>(&json).unwrap(), s);
    }

    #[test]
    fn register_lists() {
        assert!(is_state_reg(GICR_SGI + GICD_ISENABLER));
        assert!(is_state_reg(GICD_ISPENDR + 4));
        assert!(is_state_reg(GICD_SPENDSGIR + 12));
        assert!(!is_state_reg(GICD_IROUTER + 0x100));
        assert!(!is_state_reg(GICR_CTLR));
        assert!(!is_state_reg(GICD_IIDR));
        // 64 SPIs: 2 enable words, 16 priority words, 128 routing words.
        assert_eq!(per_irq_regs(GICD_ISENABLER, 1, 32, 96).count(), 2);
        assert_eq!(per_irq_regs(GICD_IPRIORITYR, 8, 32, 96).next(), Some(0x420));
        assert_eq!(per_irq_regs(GICD_IROUTER, 64, 32, 96).count(), 128);
        assert_eq!(icc_ap1r(3), sys_reg_encoding(3, 0, 12, 9, 3));
    }
}
