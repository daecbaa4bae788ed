//! Guest-physical layout of an aarch64 spore VM.
//!
//! Everything below 2 GiB is MMIO: the GIC, the console UART, the PL031 RTC,
//! the signal register and the virtio-mmio windows (close to QEMU's `virt`
//! machine, whose addresses guests and tools know). RAM starts at 2 GiB
//! ([`RAM_START`]), as on Firecracker and Cloud Hypervisor; the kernel is
//! loaded at its start and the device tree (and initrd) at its end.

pub use spore_abi::signal::{SIGNAL_MMIO_ADDR, SIGNAL_MMIO_SIZE};

use crate::arch::{BusKind, LegacyPlace};

/// Where RAM starts; the kernel `Image` is loaded at this 2 MiB-aligned base.
pub const RAM_START: u64 = 0x8000_0000;
/// End of the guest-physical space KVM gives a VM by default (a 40-bit
/// IPA space); boot RAM and the virtio-mem region must end below it.
pub const IPA_END: u64 = 1 << 40;

/// GIC distributor (GICv3 and GICv2).
pub const GIC_DIST_BASE: u64 = 0x0800_0000;
pub const GIC_DIST_SIZE: u64 = 0x1_0000;
/// GICv2 CPU interface (the GICv2 fallback only).
pub const GIC_CPU_BASE: u64 = 0x0801_0000;
pub const GIC_CPU_SIZE: u64 = 0x1_0000;
/// GICv3 redistributors: two 64 KiB frames per vCPU, from here up to the UART.
pub const GIC_REDIST_BASE: u64 = 0x080A_0000;
pub const GIC_REDIST_SIZE_PER_CPU: u64 = 0x2_0000;

/// The console: a 16550-compatible UART (`ns16550a`), byte registers.
pub const SERIAL_MMIO_BASE: u64 = 0x0900_0000;
pub const SERIAL_MMIO_SIZE: u64 = 0x1000;
/// The PL031 real-time clock (the guest's wall clock at boot).
pub const RTC_MMIO_BASE: u64 = 0x0901_0000;
pub const RTC_MMIO_SIZE: u64 = 0x1000;

/// The legacy devices as the device manager places them: the UART and the
/// RTC on MMIO, no i8042 (PSCI resets), the signal register in MMIO.
pub const SERIAL: LegacyPlace = LegacyPlace {
    bus: BusKind::Mmio,
    base: SERIAL_MMIO_BASE,
    len: SERIAL_MMIO_SIZE,
    irq: SERIAL_IRQ,
};
/// What `spore snapshot inspect` calls the console.
pub const SERIAL_NAME: &str = "ns16550a";
pub const I8042: Option<LegacyPlace> = None;
pub const RTC: Option<LegacyPlace> = Some(LegacyPlace {
    bus: BusKind::Mmio,
    base: RTC_MMIO_BASE,
    len: RTC_MMIO_SIZE,
    irq: RTC_IRQ,
});
pub const SIGNAL_MMIO: Option<u64> = Some(SIGNAL_MMIO_ADDR);

/// virtio-mmio device windows: one 4 KiB page each, from here up.
pub const VIRTIO_MMIO_BASE: u64 = 0x0A00_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// At most this many virtio-mmio devices.
pub const VIRTIO_MMIO_MAX: usize = 32;

/// Interrupts are GIC shared peripheral interrupts (SPIs), numbered as the
/// device tree and KVM's irqfd routing number them (INTID − 32).
pub const SERIAL_IRQ: u32 = 1;
pub const RTC_IRQ: u32 = 2;
/// First SPI of the virtio-mmio devices.
pub const VIRTIO_IRQ_BASE: u32 = 16;
/// SPIs the GIC is created with (a multiple of 32, KVM's rule).
pub const GIC_NR_SPIS: u32 = 64;

/// The architected timer's private interrupts (PPIs, INTID − 16): secure
/// physical, non-secure physical, virtual, hypervisor.
pub const TIMER_PPIS: [u32; 4] = [13, 14, 11, 10];

/// The device tree's place: the last 2 MiB of RAM (Linux's limit on its size).
pub const FDT_MAX_SIZE: u64 = 0x20_0000;

/// Guest-physical address of virtio-mmio device `index`.
pub const fn virtio_mmio_addr(index: usize) -> u64 {
    VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE
}

/// SPI of virtio-mmio device `index`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "index counts the VM's virtio-mmio devices, a few dozen at most"
)]
pub const fn virtio_mmio_irq(index: usize) -> u32 {
    VIRTIO_IRQ_BASE + index as u32
}

/// (guest address, size) of the RAM regions for `mem_bytes` of guest RAM.
pub fn ram_regions(mem_bytes: u64) -> Vec<(u64, u64)> {
    vec![(RAM_START, mem_bytes)]
}

/// Guest address of the virtio-mem hotplug region: above boot RAM, 1 GiB
/// aligned (Linux hotplugs arm64 memory in 128 MiB sections).
pub fn hotplug_region_addr(mem_bytes: u64) -> u64 {
    const ALIGN: u64 = 1 << 30;
    (RAM_START + mem_bytes).div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_sit_below_ram_and_do_not_overlap() {
        const {
            let redist_end = GIC_REDIST_BASE + 32 * GIC_REDIST_SIZE_PER_CPU;
            assert!(GIC_DIST_BASE + GIC_DIST_SIZE <= GIC_CPU_BASE);
            assert!(GIC_CPU_BASE + GIC_CPU_SIZE <= GIC_REDIST_BASE);
            assert!(redist_end <= SERIAL_MMIO_BASE);
            assert!(SERIAL_MMIO_BASE + SERIAL_MMIO_SIZE <= RTC_MMIO_BASE);
            assert!(RTC_MMIO_BASE + RTC_MMIO_SIZE <= SIGNAL_MMIO_ADDR);
            assert!(SIGNAL_MMIO_ADDR + SIGNAL_MMIO_SIZE <= VIRTIO_MMIO_BASE);
            assert!(virtio_mmio_addr(VIRTIO_MMIO_MAX) <= RAM_START);
            assert!(virtio_mmio_irq(VIRTIO_MMIO_MAX - 1) < GIC_NR_SPIS);
        }
        assert_eq!(hotplug_region_addr(512 << 20), 3 << 30);
        assert_eq!(hotplug_region_addr(1 << 30), 3 << 30);
        assert_eq!(ram_regions(1 << 30), vec![(RAM_START, 1 << 30)]);
    }

    /// KVM gives a VM made with type 0 (as spore makes them) a 40-bit IPA
    /// space: the largest boot RAM and virtio-mem region the configuration
    /// accepts must end below it, or KVM would refuse the memory slot.
    #[test]
    fn largest_configuration_fits_the_default_ipa_space() {
        use crate::config::{MAX_HOTPLUG_MIB, MAX_MEM_MIB};
        let end = hotplug_region_addr(MAX_MEM_MIB << 20) + (MAX_HOTPLUG_MIB << 20);
        assert!(end <= 1 << 40, "{end:#x}");
    }
}
