//! The CPUID table each vCPU of a Linux guest sees.
//!
//! Starts from what KVM supports (`KVM_GET_SUPPORTED_CPUID`) and rewrites the
//! leaves that describe identity and topology, so that every vCPU reports its
//! own APIC id and all agree on one package of `num_vcpus` logical
//! processors: single-threaded cores, or (SMT, `machine-config.smt`) cores
//! of two threads, the APIC id's low bit numbering the thread:
//!
//! - leaf 0x1: initial APIC id, logical processor count, HTT, hypervisor bit,
//!   and the TSC-deadline timer where KVM's in-kernel LAPIC emulates it
//!   (`KVM_GET_SUPPORTED_CPUID` leaves it out; it is the VMM's to set). With it
//!   a Linux guest neither calibrates its LAPIC timer against the PIT (100 ms
//!   of ticks) nor checks the PIT's interrupt at boot;
//! - leaf 0x4 (Intel): cores per package and threads sharing each cache;
//! - leaf 0x6: no power management features (only ARAT, the APIC timer that
//!   keeps running, which KVM emulates);
//! - leaves 0xB and 0x1F: x2APIC topology (SMT level of 1 or 2 threads, core
//!   level of `num_vcpus` logical processors, EDX = x2APIC id);
//! - leaves 0x8000_0008, 0x8000_001D and 0x8000_001E (AMD, when present):
//!   core count, cache sharing and extended APIC id.
//!
//! KVM's own leaves (0x4000_0000 onwards: signature, kvmclock and PV features)
//! are kept as KVM reports them. Pure data transformation: no ioctls here.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

/// Leaf 1 ECX: running under a hypervisor.
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 ECX bit 24: the LAPIC timer has TSC-deadline mode.
const LEAF1_ECX_TSC_DEADLINE: u32 = 1 << 24;
/// Leaf 1 EDX: the logical processor count in EBX[23:16] is valid.
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaf 1 EBX[15:8]: CLFLUSH line size in 8-byte units (64 bytes).
const CLFLUSH_LINE_QWORDS: u32 = 8;
/// Leaf 6 EAX bit 2: APIC timer always running (ARAT).
const LEAF6_EAX_ARAT: u32 = 1 << 2;
/// Leaf 0xB/0x1F ECX[15:8] level types.
const LEVEL_TYPE_INVALID: u32 = 0;
const LEVEL_TYPE_SMT: u32 = 1;
const LEVEL_TYPE_CORE: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vendor {
    Intel,
    /// AMD and Hygon, which share AMD's topology leaves.
    Amd,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    #[error("the vCPU CPUID table needs {entries} entries, more than KVM accepts ({max})")]
    TooManyEntries { entries: usize, max: usize },
}

fn vendor(entries: &[kvm_cpuid_entry2]) -> Vendor {
    let Some(leaf0) = entries.iter().find(|e| e.function == 0) else {
        return Vendor::Other;
    };
    let mut id = [0u8; 12];
    id[0..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
    id[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
    id[8..12].copy_from_slice(&leaf0.ecx.to_le_bytes());
    match &id {
        b"GenuineIntel" => Vendor::Intel,
        b"AuthenticAMD" | b"HygonGenuine" => Vendor::Amd,
        _ => Vendor::Other,
    }
}

/// Bits needed to number `n` ids: ceil(log2(n)), 0 for n <= 1.
fn id_bits(n: u8) -> u32 {
    match n {
        0 | 1 => 0,
        n => u32::BITS - u32::from(n - 1).leading_zeros(),
    }
}

/// EAX[7:5] of a cache descriptor (leaf 0x4 or 0x8000_001D): 0 = no cache.
fn cache_level(eax: u32) -> u32 {
    (eax >> 5) & 0x7
}

/// Sets EAX[25:14] of a cache descriptor, logical processors sharing the
/// cache - 1: L1 and L2 are private to a core (shared by its threads), L3
/// is shared by the whole package.
fn set_cache_sharing(eax: u32, num_vcpus: u8, threads: u8) -> u32 {
    let sharing = match cache_level(eax) {
        0 => return eax,
        1 | 2 => u32::from(threads) - 1,
        _ => u32::from(num_vcpus) - 1,
    };
    (eax & !(0xfff << 14)) | (sharing.min(0xfff) << 14)
}

/// Subleaves of leaf 0xB or 0x1F: thread level, core level, terminator.
fn topology_subleaves(
    function: u32,
    vcpu_id: u8,
    num_vcpus: u8,
    threads: u8,
) -> [kvm_cpuid_entry2; 3] {
    let x2apic_id = u32::from(vcpu_id);
    let entry = |index: u32, eax: u32, ebx: u32, level_type: u32| kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        // EAX[4:0]: shift of the x2APIC id to reach the next level's id.
        eax,
        // EBX[15:0]: logical processors at this level.
        ebx,
        // ECX[15:8]: level type, ECX[7:0]: level number.
        ecx: (level_type << 8) | index,
        edx: x2apic_id,
        ..Default::default()
    };
    [
        entry(0, id_bits(threads), u32::from(threads), LEVEL_TYPE_SMT),
        entry(1, id_bits(num_vcpus), u32::from(num_vcpus), LEVEL_TYPE_CORE),
        entry(2, 0, 0, LEVEL_TYPE_INVALID),
    ]
}

/// What a vCPU's CPUID is made for, beside KVM's supported table.
#[derive(Debug, Clone, Copy)]
pub struct CpuidShape {
    pub vcpu_id: u8,
    pub num_vcpus: u8,
    /// Two threads per core (with more than one vCPU; the count is even, as
    /// the configuration requires).
    pub smt: bool,
    /// KVM emulates the LAPIC's TSC-deadline mode (`KVM_CAP_TSC_DEADLINE_TIMER`).
    pub tsc_deadline: bool,
}

/// The CPUID table for vCPU `shape.vcpu_id` of a VM with `shape.num_vcpus`
/// vCPUs, derived from KVM's supported CPUID.
pub fn vcpu_cpuid(supported: &CpuId, shape: CpuidShape) -> Result<CpuId, CpuidError> {
    let CpuidShape {
        vcpu_id,
        num_vcpus,
        smt,
        tsc_deadline,
    } = shape;
    let num_vcpus = num_vcpus.max(1);
    let threads: u8 = if smt && num_vcpus > 1 { 2 } else { 1 };
    let source = supported.as_slice();
    let vendor = vendor(source);
    let mut out: Vec<kvm_cpuid_entry2> = Vec::with_capacity(source.len() + 4);
    // Leaves 0xB and 0x1F are replaced as a whole (KVM reports only subleaf
    // 0, zeroed, meaning "no topology"); remember which ones to emit.
    let mut topology_leaves: Vec<u32> = Vec::new();

    for e in source {
        let mut e = *e;
        match e.function {
            0x1 => {
                e.ebx = (u32::from(vcpu_id) << 24)
                    | (u32::from(num_vcpus) << 16)
                    | (CLFLUSH_LINE_QWORDS << 8);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= LEAF1_ECX_TSC_DEADLINE;
                }
                if num_vcpus > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                } else {
                    e.edx &= !LEAF1_EDX_HTT;
                }
            }
            // EAX[31:26]: cores per package - 1.
            0x4 if vendor == Vendor::Intel && cache_level(e.eax) != 0 => {
                let cores = (u32::from(num_vcpus / threads) - 1).min(0x3f);
                e.eax =
                    (set_cache_sharing(e.eax, num_vcpus, threads) & 0x03ff_ffff) | (cores << 26);
            }
            0x8000_001d if vendor == Vendor::Amd => {
                // AMD's cache topology leaf has the same EAX[25:14] field.
                e.eax = set_cache_sharing(e.eax, num_vcpus, threads);
            }
            0x6 => {
                e.eax &= LEAF6_EAX_ARAT;
                e.ebx = 0;
                e.ecx = 0;
                e.edx = 0;
            }
            0xb | 0x1f => {
                if !topology_leaves.contains(&e.function) {
                    topology_leaves.push(e.function);
                    out.extend(topology_subleaves(e.function, vcpu_id, num_vcpus, threads));
                }
                continue;
            }
            0x8000_0008 if vendor == Vendor::Amd => {
                // ECX[15:12] ApicIdCoreIdSize, ECX[7:0] NC = cores - 1.
                e.ecx = (e.ecx & !0xf0ff) | (id_bits(num_vcpus) << 12) | (u32::from(num_vcpus) - 1);
            }
            0x8000_001e if vendor == Vendor::Amd => {
                // Extended APIC id; EBX[15:8] threads per compute unit (core)
                // - 1, EBX[7:0] the unit's id; one node.
                e.eax = u32::from(vcpu_id);
                e.ebx = (u32::from(threads - 1) << 8) | u32::from(vcpu_id / threads);
                e.ecx = 0;
                e.edx = 0;
            }
            _ => {}
        }
        out.push(e);
    }

    CpuId::from_entries(&out).map_err(|_| CpuidError::TooManyEntries {
        entries: out.len(),
        max: kvm_bindings::KVM_MAX_CPUID_ENTRIES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    fn vendor_leaf(id: &[u8; 12]) -> kvm_cpuid_entry2 {
        let w = |i: usize| u32::from_le_bytes([id[i], id[i + 1], id[i + 2], id[i + 3]]);
        leaf(0, 0, [0x1f, w(0), w(8), w(4)])
    }

    /// What KVM reports on an Intel host, reduced to the leaves we touch.
    fn intel_supported() -> CpuId {
        let l4 = |index: u32, level: u32| leaf(4, index, [(level << 5) | 0x1, 0, 0, 0]);
        let entries = vec![
            vendor_leaf(b"GenuineIntel"),
            // Host APIC id 7 and 16 logical CPUs leak through EBX.
            leaf(1, 0, [0x906ea, 0x0710_0800, 0x7ffa_3203, 0x0f8b_fbff]),
            l4(0, 1),
            l4(1, 1),
            l4(2, 2),
            l4(3, 3),
            leaf(4, 4, [0, 0, 0, 0]),
            leaf(6, 0, [0x77, 0x2, 0x9, 0]),
            leaf(0xb, 0, [0, 0, 0, 0]),
            leaf(0x1f, 0, [0, 0, 0, 0]),
            leaf(
                0x4000_0000,
                0,
                [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d],
            ),
            leaf(0x4000_0001, 0, [0x0100_07fb, 0, 0, 0]),
        ];
        CpuId::from_entries(&entries).unwrap()
    }

    fn amd_supported() -> CpuId {
        let entries = vec![
            vendor_leaf(b"AuthenticAMD"),
            leaf(1, 0, [0xa20f12, 0x0c10_0800, 0x7ef8_3203, 0x178b_fbff]),
            leaf(4, 0, [0x121, 0, 0, 0]),
            leaf(0x8000_0008, 0, [0x3030, 0, 0x700f, 0]),
            leaf(0x8000_001d, 0, [0x121, 0x01c0_003f, 0x3f, 0]),
            leaf(0x8000_001d, 3, [0x4163, 0x03c0_003f, 0x7fff, 1]),
            leaf(0x8000_001d, 4, [0, 0, 0, 0]),
            leaf(0x8000_001e, 0, [12, 0x106, 0x3, 0]),
        ];
        CpuId::from_entries(&entries).unwrap()
    }

    fn shape(vcpu_id: u8, num_vcpus: u8, smt: bool) -> CpuidShape {
        CpuidShape {
            vcpu_id,
            num_vcpus,
            smt,
            tsc_deadline: false,
        }
    }

    #[test]
    fn tsc_deadline_is_offered_only_where_kvm_emulates_it() {
        // KVM leaves the bit out of its supported table.
        let mut entries = intel_supported().as_slice().to_vec();
        for e in entries.iter_mut().filter(|e| e.function == 1) {
            e.ecx &= !LEAF1_ECX_TSC_DEADLINE;
        }
        let sup = CpuId::from_entries(&entries).unwrap();
        let without = find(&vcpu_cpuid(&sup, shape(0, 1, false)).unwrap(), 1, 0);
        assert_eq!(without.ecx & LEAF1_ECX_TSC_DEADLINE, 0);
        let with = CpuidShape {
            tsc_deadline: true,
            ..shape(0, 1, false)
        };
        let l1 = find(&vcpu_cpuid(&sup, with).unwrap(), 1, 0);
        assert_ne!(l1.ecx & LEAF1_ECX_TSC_DEADLINE, 0);
        assert_ne!(l1.ecx & LEAF1_ECX_HYPERVISOR, 0);
    }

    fn find(c: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *c.as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap_or_else(|| panic!("leaf {function:#x}.{index} missing"))
    }

    #[test]
    fn leaf1_identity_per_vcpu() {
        let sup = intel_supported();
        for id in 0..4u8 {
            let c = vcpu_cpuid(&sup, shape(id, 4, false)).unwrap();
            let l1 = find(&c, 1, 0);
            assert_eq!(l1.ebx >> 24, u32::from(id));
            assert_eq!((l1.ebx >> 16) & 0xff, 4);
            assert_eq!((l1.ebx >> 8) & 0xff, 8);
            assert_ne!(l1.ecx & LEAF1_ECX_HYPERVISOR, 0);
            assert_ne!(l1.edx & LEAF1_EDX_HTT, 0);
            assert_eq!(l1.eax, 0x906ea, "signature untouched");
        }
        let single = find(&vcpu_cpuid(&sup, shape(0, 1, false)).unwrap(), 1, 0);
        assert_eq!(single.edx & LEAF1_EDX_HTT, 0);
        assert_eq!((single.ebx >> 16) & 0xff, 1);
    }

    #[test]
    fn x2apic_topology_leaves() {
        let sup = intel_supported();
        for function in [0xb, 0x1f] {
            for (id, n, shift) in [(0u8, 1u8, 0u32), (1, 2, 1), (2, 3, 2), (4, 5, 3), (7, 8, 3)] {
                let c = vcpu_cpuid(&sup, shape(id, n, false)).unwrap();
                let smt = find(&c, function, 0);
                assert_eq!(
                    (smt.eax, smt.ebx, smt.ecx, smt.edx),
                    (0, 1, 0x100, u32::from(id))
                );
                let core = find(&c, function, 1);
                assert_eq!(core.eax, shift);
                assert_eq!(core.ebx, u32::from(n));
                assert_eq!(core.ecx, 0x201);
                assert_eq!(core.edx, u32::from(id));
                let end = find(&c, function, 2);
                assert_eq!(
                    (end.eax, end.ebx, end.ecx >> 8, end.ecx & 0xff),
                    (0, 0, 0, 2)
                );
                for e in [smt, core, end] {
                    assert_eq!(e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX, 1);
                }
                let count = c
                    .as_slice()
                    .iter()
                    .filter(|e| e.function == function)
                    .count();
                assert_eq!(count, 3);
            }
        }
    }

    #[test]
    fn intel_cache_leaf_and_power_leaf() {
        let c = vcpu_cpuid(&intel_supported(), shape(1, 4, false)).unwrap();
        for index in 0..3 {
            let l4 = find(&c, 4, index);
            assert_eq!(l4.eax >> 26, 3, "cores per package - 1");
            assert_eq!((l4.eax >> 14) & 0xfff, 0, "L1/L2 private per core");
            assert_eq!(l4.eax & 0x3fff, (l4.eax & 0xe0) | 1, "low bits kept");
        }
        let l3 = find(&c, 4, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 3, "L3 shared by all 4");
        assert_eq!(find(&c, 4, 4).eax, 0, "terminator untouched");
        let l6 = find(&c, 6, 0);
        assert_eq!((l6.eax, l6.ebx, l6.ecx, l6.edx), (LEAF6_EAX_ARAT, 0, 0, 0));
    }

    #[test]
    fn kvm_leaves_kept() {
        let sup = intel_supported();
        let c = vcpu_cpuid(&sup, shape(0, 2, false)).unwrap();
        assert_eq!(find(&c, 0x4000_0000, 0), find(&sup, 0x4000_0000, 0));
        assert_eq!(find(&c, 0x4000_0001, 0), find(&sup, 0x4000_0001, 0));
        // Only the two topology leaves grow (1 subleaf -> 3 each).
        assert_eq!(c.as_slice().len(), sup.as_slice().len() + 4);
    }

    #[test]
    fn amd_core_count_and_extended_apic_id() {
        let sup = amd_supported();
        let c = vcpu_cpuid(&sup, shape(2, 3, false)).unwrap();
        let l8 = find(&c, 0x8000_0008, 0);
        assert_eq!(l8.ecx & 0xff, 2);
        assert_eq!((l8.ecx >> 12) & 0xf, 2);
        let l1e = find(&c, 0x8000_001e, 0);
        assert_eq!((l1e.eax, l1e.ebx, l1e.ecx, l1e.edx), (2, 2, 0, 0));
        let l1d = find(&c, 0x8000_001d, 0);
        assert_eq!((l1d.eax, l1d.ebx), (0x121, 0x01c0_003f), "L1 private");
        let l3 = find(&c, 0x8000_001d, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 2, "L3 shared by 3");
        assert_eq!(l3.eax & 0x3fff, 0x163);
        assert_eq!(find(&c, 0x8000_001d, 4).eax, 0);
        // Leaf 4 belongs to Intel; AMD's is left alone.
        assert_eq!(find(&c, 4, 0).eax, 0x121);
        assert_eq!(find(&c, 1, 0).ebx >> 24, 2);
    }

    #[test]
    fn id_bits_rounds_up() {
        let got: Vec<u32> = [1u8, 2, 3, 4, 5, 8, 9, 32, 255]
            .iter()
            .map(|n| id_bits(*n))
            .collect();
        assert_eq!(got, vec![0, 1, 2, 2, 3, 3, 4, 5, 8]);
    }

    #[test]
    fn smt_makes_cores_of_two_threads() {
        let sup = intel_supported();
        for id in 0..4u8 {
            let c = vcpu_cpuid(&sup, shape(id, 4, true)).unwrap();
            let thread = find(&c, 0xb, 0);
            assert_eq!((thread.eax, thread.ebx, thread.edx), (1, 2, u32::from(id)));
            let core = find(&c, 0xb, 1);
            assert_eq!((core.eax, core.ebx), (2, 4));
            // Two cores of two threads; L1 shared by a core's threads.
            let l1 = find(&c, 4, 0);
            assert_eq!(l1.eax >> 26, 1);
            assert_eq!((l1.eax >> 14) & 0xfff, 1);
        }
        let amd = amd_supported();
        let c = vcpu_cpuid(&amd, shape(3, 4, true)).unwrap();
        let ext = find(&c, 0x8000_001e, 0);
        assert_eq!((ext.ebx >> 8) & 0xff, 1, "threads per compute unit - 1");
        assert_eq!(ext.ebx & 0xff, 1, "vCPU 3 is core 1's second thread");
        // One vCPU with smt stays one thread.
        let one = vcpu_cpuid(&sup, shape(0, 1, true)).unwrap();
        assert_eq!(find(&one, 0xb, 0).ebx, 1);
    }
}
