//! Intel MultiProcessor Specification 1.4 tables for a Linux guest.
//!
//! Without ACPI, Linux finds its CPUs, the IOAPIC and the ISA interrupt
//! routing in the MP table. The floating pointer structure sits at the start
//! of the EBDA (the last KiB of base memory, one of the places Linux scans),
//! and the configuration table follows it directly, so both stay inside the
//! range the e820 map marks reserved.
//!
//! The table describes: one processor entry per vCPU (APIC id = vCPU index,
//! vCPU 0 is the bootstrap processor), one ISA bus, one IOAPIC (APIC id
//! `num_cpus`, at [`IOAPIC_ADDR`]), ISA IRQ n wired to IOAPIC pin n for
//! n in 0..24, ExtINT on every LINT0 of the BSP and NMI on LINT1 of all CPUs.
//! This module only writes guest memory; it never touches KVM.

use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::layout::{EBDA_START, IOAPIC_ADDR, LAPIC_ADDR};
use crate::memory::GuestMemoryMmap;

/// Where the MP floating pointer structure is written.
pub const MPTABLE_START: u64 = EBDA_START;
/// End of the EBDA (start of the VGA hole): the tables must end below it.
const MPTABLE_LIMIT: u64 = 0xa_0000;
/// The APIC addresses as the tables' 32-bit fields.
#[allow(
    clippy::cast_possible_truncation,
    reason = "0xFEC0_0000 is below 4 GiB"
)]
const IOAPIC_ADDR32: u32 = IOAPIC_ADDR as u32;
#[allow(
    clippy::cast_possible_truncation,
    reason = "0xFEE0_0000 is below 4 GiB"
)]
const LAPIC_ADDR32: u32 = LAPIC_ADDR as u32;

/// Number of IOAPIC pins (KVM's in-kernel IOAPIC has 24).
const IOAPIC_PINS: u8 = 24;
/// Local APIC version reported by KVM's in-kernel LAPIC and IOAPIC.
const APIC_VERSION: u8 = 0x14;
/// MP specification revision 1.4.
const MP_SPEC_REV: u8 = 4;

const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;

const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
/// Family 6, model 0, stepping 0: only informative, Linux reads CPUID.
const CPU_STEPPING: u32 = 0x600;
const CPU_FEATURE_FPU: u32 = 1 << 0;
const CPU_FEATURE_APIC: u32 = 1 << 9;

const MPC_APIC_USABLE: u8 = 1;

const MP_IRQ_INT: u8 = 0;
const MP_IRQ_NMI: u8 = 1;
const MP_IRQ_EXTINT: u8 = 3;
/// Polarity and trigger "conform to the bus": ISA is active-high, edge.
const MP_IRQFLAG_CONFORMS: u16 = 0;
/// Destination APIC id meaning "every local APIC".
const MP_APIC_ALL: u8 = 0xff;

/// MP floating pointer structure (MP spec §4.1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpFloatingPointer {
    pub signature: [u8; 4],
    pub physptr: u32,
    /// Length in 16-byte paragraphs.
    pub length: u8,
    pub specification: u8,
    pub checksum: u8,
    pub feature1: u8,
    pub feature2: u8,
    pub feature3: u8,
    pub feature4: u8,
    pub feature5: u8,
}

/// MP configuration table header (MP spec §4.2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpConfigHeader {
    pub signature: [u8; 4],
    /// Length of the header plus all entries.
    pub length: u16,
    pub spec: u8,
    pub checksum: u8,
    pub oem: [u8; 8],
    pub product_id: [u8; 12],
    pub oem_table_ptr: u32,
    pub oem_table_size: u16,
    pub entry_count: u16,
    pub lapic_addr: u32,
    pub ext_table_length: u16,
    pub ext_table_checksum: u8,
    pub reserved: u8,
}

/// Processor entry (MP spec §4.3.1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpProcessor {
    pub entry_type: u8,
    pub apic_id: u8,
    pub apic_version: u8,
    pub cpu_flags: u8,
    pub signature: u32,
    pub feature_flags: u32,
    pub reserved: [u32; 2],
}

/// Bus entry (MP spec §4.3.2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpBus {
    pub entry_type: u8,
    pub bus_id: u8,
    pub bus_type: [u8; 6],
}

/// I/O APIC entry (MP spec §4.3.3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpIoApic {
    pub entry_type: u8,
    pub apic_id: u8,
    pub apic_version: u8,
    pub flags: u8,
    pub apic_addr: u32,
}

/// I/O interrupt assignment (§4.3.4) and local interrupt assignment
/// (§4.3.5) entries share this layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpInterrupt {
    pub entry_type: u8,
    pub irq_type: u8,
    pub irq_flags: u16,
    pub src_bus_id: u8,
    pub src_bus_irq: u8,
    pub dst_apic_id: u8,
    /// IOAPIC pin (type 3) or LINTn (type 4).
    pub dst_pin: u8,
}

// SAFETY: all of these are repr(C) structs of plain integers whose sizes (checked
// below) equal the sum of their fields, so they have no padding and every
// byte pattern is a valid value.
unsafe impl ByteValued for MpFloatingPointer {}
// SAFETY: as above.
unsafe impl ByteValued for MpConfigHeader {}
// SAFETY: as above.
unsafe impl ByteValued for MpProcessor {}
// SAFETY: as above.
unsafe impl ByteValued for MpBus {}
// SAFETY: as above.
unsafe impl ByteValued for MpIoApic {}
// SAFETY: as above.
unsafe impl ByteValued for MpInterrupt {}

const _: () = {
    assert!(std::mem::size_of::<MpFloatingPointer>() == 16);
    assert!(std::mem::size_of::<MpConfigHeader>() == 44);
    assert!(std::mem::size_of::<MpProcessor>() == 20);
    assert!(std::mem::size_of::<MpBus>() == 8);
    assert!(std::mem::size_of::<MpIoApic>() == 8);
    assert!(std::mem::size_of::<MpInterrupt>() == 8);
};

#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("an MP table needs at least one CPU")]
    NoCpus,
    #[error(
        "the MP table for {num_cpus} vCPUs is {size} bytes and does not fit in the 1 KiB EBDA \
         at {MPTABLE_START:#x}; use at most {max} vCPUs"
    )]
    TooManyCpus { num_cpus: u8, size: usize, max: u8 },
    #[error("cannot write the MP table at {addr:#x}: guest RAM does not cover it ({source})")]
    Write {
        addr: u64,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}

/// Size in bytes of the floating pointer plus the configuration table.
pub fn mptable_size(num_cpus: u8) -> usize {
    std::mem::size_of::<MpFloatingPointer>()
        + std::mem::size_of::<MpConfigHeader>()
        + usize::from(num_cpus) * std::mem::size_of::<MpProcessor>()
        + std::mem::size_of::<MpBus>()
        + std::mem::size_of::<MpIoApic>()
        + usize::from(IOAPIC_PINS) * std::mem::size_of::<MpInterrupt>()
        + 2 * std::mem::size_of::<MpInterrupt>()
}

/// Largest CPU count whose table fits in the EBDA.
pub fn max_mptable_cpus() -> u8 {
    let fixed = mptable_size(0) as u64;
    let per_cpu = std::mem::size_of::<MpProcessor>() as u64;
    let max = (MPTABLE_LIMIT - MPTABLE_START - fixed) / per_cpu;
    u8::try_from(max).unwrap_or(u8::MAX)
}

/// Value that makes the byte sum of `bytes` plus itself zero (mod 256).
fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Builds the configuration table (header and entries) to be placed at
/// `table_addr`, with a correct checksum.
fn build_config_table(num_cpus: u8) -> Vec<u8> {
    let ioapic_id = num_cpus;
    let mut entries: Vec<u8> = Vec::with_capacity(mptable_size(num_cpus));
    let mut entry_count: u16 = 0;

    for cpu in 0..num_cpus {
        let processor = MpProcessor {
            entry_type: MP_PROCESSOR,
            apic_id: cpu,
            apic_version: APIC_VERSION,
            cpu_flags: CPU_ENABLED | if cpu == 0 { CPU_BOOTPROCESSOR } else { 0 },
            signature: CPU_STEPPING,
            feature_flags: CPU_FEATURE_APIC | CPU_FEATURE_FPU,
            reserved: [0; 2],
        };
        entries.extend_from_slice(processor.as_slice());
        entry_count += 1;
    }

    let bus = MpBus {
        entry_type: MP_BUS,
        bus_id: 0,
        bus_type: *b"ISA   ",
    };
    entries.extend_from_slice(bus.as_slice());
    entry_count += 1;

    let ioapic = MpIoApic {
        entry_type: MP_IOAPIC,
        apic_id: ioapic_id,
        apic_version: APIC_VERSION,
        flags: MPC_APIC_USABLE,
        apic_addr: IOAPIC_ADDR32,
    };
    entries.extend_from_slice(ioapic.as_slice());
    entry_count += 1;

    for irq in 0..IOAPIC_PINS {
        let intsrc = MpInterrupt {
            entry_type: MP_INTSRC,
            irq_type: MP_IRQ_INT,
            irq_flags: MP_IRQFLAG_CONFORMS,
            src_bus_id: 0,
            src_bus_irq: irq,
            dst_apic_id: ioapic_id,
            dst_pin: irq,
        };
        entries.extend_from_slice(intsrc.as_slice());
        entry_count += 1;
    }

    // The 8259 output reaches the BSP through LINT0 (virtual wire mode); NMI
    // goes to LINT1 of every CPU.
    let extint = MpInterrupt {
        entry_type: MP_LINTSRC,
        irq_type: MP_IRQ_EXTINT,
        irq_flags: MP_IRQFLAG_CONFORMS,
        src_bus_id: 0,
        src_bus_irq: 0,
        dst_apic_id: 0,
        dst_pin: 0,
    };
    let nmi = MpInterrupt {
        irq_type: MP_IRQ_NMI,
        dst_apic_id: MP_APIC_ALL,
        dst_pin: 1,
        ..extint
    };
    entries.extend_from_slice(extint.as_slice());
    entries.extend_from_slice(nmi.as_slice());
    entry_count += 2;

    let length = std::mem::size_of::<MpConfigHeader>() + entries.len();
    // Bounded by max_mptable_cpus() (checked by the caller), far below u16::MAX.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "at most mptable_size(u8::MAX), under 6 KiB"
    )]
    let length16 = length as u16;
    let mut header = MpConfigHeader {
        signature: *b"PCMP",
        length: length16,
        spec: MP_SPEC_REV,
        checksum: 0,
        oem: *b"SPORE   ",
        product_id: *b"SPOREVM     ",
        oem_table_ptr: 0,
        oem_table_size: 0,
        entry_count,
        lapic_addr: LAPIC_ADDR32,
        ext_table_length: 0,
        ext_table_checksum: 0,
        reserved: 0,
    };
    let mut table = Vec::with_capacity(length);
    table.extend_from_slice(header.as_slice());
    table.extend_from_slice(&entries);
    header.checksum = checksum(&table);
    table[..std::mem::size_of::<MpConfigHeader>()].copy_from_slice(header.as_slice());
    table
}

/// Writes the MP floating pointer and configuration table for `num_cpus`
/// vCPUs into the EBDA of `mem`.
pub fn setup_mptable(mem: &GuestMemoryMmap, num_cpus: u8) -> Result<(), MpTableError> {
    if num_cpus == 0 {
        return Err(MpTableError::NoCpus);
    }
    let size = mptable_size(num_cpus);
    if MPTABLE_START + size as u64 > MPTABLE_LIMIT {
        return Err(MpTableError::TooManyCpus {
            num_cpus,
            size,
            max: max_mptable_cpus(),
        });
    }

    let fp_size = std::mem::size_of::<MpFloatingPointer>() as u64;
    let table_addr = MPTABLE_START + fp_size;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "MPTABLE_START (0x9_fc00) plus a 16-byte pointer, below 1 MiB"
    )]
    let table_addr32 = table_addr as u32;
    let mut fp = MpFloatingPointer {
        signature: *b"_MP_",
        physptr: table_addr32,
        length: 1,
        specification: MP_SPEC_REV,
        // feature1 = 0: a configuration table is present (no default config);
        // feature2 = 0: virtual wire mode, no IMCR.
        ..Default::default()
    };
    fp.checksum = checksum(fp.as_slice());

    let mut bytes = Vec::with_capacity(size);
    bytes.extend_from_slice(fp.as_slice());
    bytes.extend_from_slice(&build_config_table(num_cpus));
    debug_assert_eq!(bytes.len(), size);

    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|source| MpTableError::Write {
            addr: MPTABLE_START,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap()
    }

    fn byte_sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    #[test]
    fn floating_pointer_and_table_checksums() {
        for cpus in [1u8, 2, 4, max_mptable_cpus()] {
            let m = mem();
            setup_mptable(&m, cpus).unwrap();
            let fp: MpFloatingPointer = m.read_obj(GuestAddress(MPTABLE_START)).unwrap();
            assert_eq!(&fp.signature, b"_MP_");
            assert_eq!(fp.length, 1);
            assert_eq!(fp.specification, 4);
            assert_eq!(byte_sum(&read(&m, MPTABLE_START, 16)), 0);

            let hdr: MpConfigHeader = m.read_obj(GuestAddress(u64::from(fp.physptr))).unwrap();
            assert_eq!(&hdr.signature, b"PCMP");
            assert_eq!(usize::from(hdr.length), mptable_size(cpus) - 16);
            assert_eq!(byte_sum(&read(&m, fp.physptr.into(), hdr.length.into())), 0);
            assert_eq!(hdr.lapic_addr as u64, LAPIC_ADDR);
            assert_eq!(hdr.entry_count, u16::from(cpus) + 2 + 24 + 2);
            assert!(u64::from(fp.physptr) + u64::from(hdr.length) <= MPTABLE_LIMIT);
        }
    }

    #[test]
    fn entries_describe_cpus_ioapic_and_irqs() {
        let m = mem();
        let cpus = 3u8;
        setup_mptable(&m, cpus).unwrap();
        let mut addr = MPTABLE_START + 16 + 44;
        for cpu in 0..cpus {
            let p: MpProcessor = m.read_obj(GuestAddress(addr)).unwrap();
            assert_eq!(p.entry_type, MP_PROCESSOR);
            assert_eq!(p.apic_id, cpu);
            assert_eq!(p.cpu_flags & CPU_ENABLED, CPU_ENABLED);
            assert_eq!(p.cpu_flags & CPU_BOOTPROCESSOR != 0, cpu == 0);
            addr += 20;
        }
        let bus: MpBus = m.read_obj(GuestAddress(addr)).unwrap();
        assert_eq!((bus.entry_type, &bus.bus_type), (MP_BUS, b"ISA   "));
        addr += 8;
        let io: MpIoApic = m.read_obj(GuestAddress(addr)).unwrap();
        assert_eq!(io.entry_type, MP_IOAPIC);
        assert_eq!(io.apic_id, cpus);
        assert_eq!(io.flags, MPC_APIC_USABLE);
        assert_eq!(u64::from(io.apic_addr), IOAPIC_ADDR);
        addr += 8;
        for irq in 0..24u8 {
            let i: MpInterrupt = m.read_obj(GuestAddress(addr)).unwrap();
            assert_eq!((i.entry_type, i.irq_type), (MP_INTSRC, MP_IRQ_INT));
            assert_eq!((i.src_bus_irq, i.dst_apic_id, i.dst_pin), (irq, cpus, irq));
            addr += 8;
        }
        let l0: MpInterrupt = m.read_obj(GuestAddress(addr)).unwrap();
        assert_eq!(
            (l0.entry_type, l0.irq_type, l0.dst_pin),
            (MP_LINTSRC, MP_IRQ_EXTINT, 0)
        );
        let l1: MpInterrupt = m.read_obj(GuestAddress(addr + 8)).unwrap();
        assert_eq!((l1.entry_type, l1.irq_type), (MP_LINTSRC, MP_IRQ_NMI));
        assert_eq!((l1.dst_apic_id, l1.dst_pin), (0xff, 1));
        assert_eq!(addr + 16, MPTABLE_START + mptable_size(cpus) as u64);
    }

    #[test]
    fn too_many_cpus_and_zero_cpus_are_errors() {
        let m = mem();
        assert!(max_mptable_cpus() >= crate::config::MAX_VCPUS);
        let too_many = max_mptable_cpus() + 1;
        assert!(matches!(
            setup_mptable(&m, too_many),
            Err(MpTableError::TooManyCpus { .. })
        ));
        assert!(matches!(setup_mptable(&m, 0), Err(MpTableError::NoCpus)));
    }

    #[test]
    fn memory_without_ebda_is_an_error() {
        let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x9_0000)]).unwrap();
        assert!(matches!(
            setup_mptable(&m, 1),
            Err(MpTableError::Write { .. })
        ));
    }
}
