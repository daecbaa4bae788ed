//! Guest-physical layout of an x86_64 spore VM.
//!
//! RAM starts at 0. A hole below 4 GiB holds MMIO (virtio-mmio devices, the
//! IOAPIC and LAPIC); RAM that does not fit below the hole continues at 4 GiB.

use crate::arch::{BusKind, LegacyPlace};

/// Start of the MMIO hole below 4 GiB; RAM below it is "low RAM".
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;

/// virtio-mmio device windows: one 4 KiB page each, from here up.
pub const VIRTIO_MMIO_BASE: u64 = 0xD000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// At most this many virtio-mmio devices (one IOAPIC pin each).
pub const VIRTIO_MMIO_MAX: usize = 16;
/// First IOAPIC pin for virtio-mmio devices; pins 0-4 are legacy (PIT, i8042,
/// serial), so devices use 5..=20.
pub const VIRTIO_IRQ_BASE: u32 = 5;

/// Legacy port-I/O devices: the console UART (COM1) and, for Linux guests,
/// the i8042 (reboot through it). No RTC device: Linux reads the time from
/// kvmclock. The signal register is a port ([`spore_abi::signal::SIGNAL_PORT`]),
/// not MMIO.
pub const SERIAL: LegacyPlace = LegacyPlace {
    bus: BusKind::Pio,
    base: 0x3f8,
    len: 8,
    irq: 4,
};
pub const I8042: Option<LegacyPlace> = Some(LegacyPlace {
    bus: BusKind::Pio,
    base: 0x60,
    len: 5,
    irq: 1,
});
/// What `spore snapshot inspect` calls the console.
pub const SERIAL_NAME: &str = "COM1";
pub const RTC: Option<LegacyPlace> = None;
pub const SIGNAL_MMIO: Option<u64> = None;

/// Start of the Extended BIOS Data Area (last KiB of base memory): the MP
/// table is written there, and the e820 map reserves it.
pub const EBDA_START: u64 = 0x9_fc00;

/// IOAPIC and LAPIC addresses (MP table and KVM defaults).
pub const IOAPIC_ADDR: u64 = 0xFEC0_0000;
pub const LAPIC_ADDR: u64 = 0xFEE0_0000;
/// KVM's TSS and identity-map pages live at the top of the hole.
pub const KVM_TSS_ADDR: u64 = 0xFFFB_D000;
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xFFFB_C000;

/// Guest-physical address of virtio-mmio device `index`.
pub const fn virtio_mmio_addr(index: usize) -> u64 {
    VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE
}

/// IOAPIC pin of virtio-mmio device `index`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "index counts the VM's virtio-mmio devices, a few dozen at most"
)]
pub const fn virtio_mmio_irq(index: usize) -> u32 {
    VIRTIO_IRQ_BASE + index as u32
}

/// (guest address, size) of the RAM regions for `mem_bytes` of guest RAM.
pub fn ram_regions(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_HOLE_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_HOLE_START),
            (MMIO_HOLE_END, mem_bytes - MMIO_HOLE_START),
        ]
    }
}

/// Guest address of the virtio-mem hotplug region: above boot RAM and the
/// MMIO hole, 1 GiB aligned (Linux hotplugs in 128 MiB sections and wants
/// the region section-aligned). It is never in the e820 map.
pub fn hotplug_region_addr(mem_bytes: u64) -> u64 {
    const ALIGN: u64 = 1 << 30;
    let ram_end = ram_regions(mem_bytes)
        .last()
        .map_or(0, |&(gpa, len)| gpa + len);
    ram_end.max(MMIO_HOLE_END).div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_split_around_hole() {
        assert_eq!(ram_regions(256 << 20), vec![(0, 256 << 20)]);
        assert_eq!(
            ram_regions(4 << 30),
            vec![
                (0, MMIO_HOLE_START),
                (MMIO_HOLE_END, (4 << 30) - MMIO_HOLE_START)
            ]
        );
        assert!(virtio_mmio_addr(VIRTIO_MMIO_MAX) <= IOAPIC_ADDR);
        assert_eq!(hotplug_region_addr(512 << 20), 4 << 30);
        assert_eq!(hotplug_region_addr(4 << 30), 5 << 30);
        assert_eq!(hotplug_region_addr((4 << 30) + 1), 6 << 30);
        assert!(virtio_mmio_irq(VIRTIO_MMIO_MAX - 1) < 24);
    }
}
