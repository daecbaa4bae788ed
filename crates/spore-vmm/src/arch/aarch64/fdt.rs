//! The flattened device tree an arm64 Linux guest boots with: CPUs, memory,
//! `/chosen`, the GIC, the architected timer, PSCI, the console UART, the
//! PL031 RTC and the virtio-mmio devices.
//!
//! Pure data: built with `vm-fdt`, no KVM, so it is tested on any host.
//! Addresses and interrupt numbers come from the caller (see `layout`);
//! interrupts are GIC SPI numbers (INTID − 32), as KVM's irqfd routing
//! numbers them.

use serde::{Deserialize, Serialize};
use vm_fdt::FdtWriter;

use super::layout;

/// phandles: the GIC (every node's `interrupt-parent`) and the APB clock.
const GIC_PHANDLE: u32 = 1;
const CLOCK_PHANDLE: u32 = 2;

/// First cell of a GIC interrupt specifier.
const GIC_FDT_IRQ_TYPE_SPI: u32 = 0;
const GIC_FDT_IRQ_TYPE_PPI: u32 = 1;
/// Third cell: trigger (include/dt-bindings/interrupt-controller/irq.h).
const IRQ_TYPE_EDGE_RISING: u32 = 1;
const IRQ_TYPE_LEVEL_HIGH: u32 = 4;
const IRQ_TYPE_LEVEL_LOW: u32 = 8;
/// GICv2 PPI specifiers carry a CPU mask in bits 15:8 (GICv3's do not).
const GICV2_PPI_CPU_MASK_SHIFT: u32 = 8;
/// GICv2 routes interrupts to at most 8 CPUs.
pub const GICV2_MAX_CPUS: usize = 8;

/// The 16550's input clock: 1.8432 MHz, the PC value (divisor 1 = 115200).
const SERIAL_CLOCK_HZ: u32 = 1_843_200;
/// The APB clock the PL031 is declared with (its driver wants one).
const APB_PCLK_HZ: u32 = 24_000_000;

/// PSCI 0.1 function ids, for guests that only know `arm,psci`; PSCI 0.2+
/// guests use the standard ids (these are those ids).
const PSCI_0_1_CPU_SUSPEND: u32 = 0xc400_0001;
const PSCI_0_1_CPU_OFF: u32 = 0x8400_0002;
const PSCI_0_1_CPU_ON: u32 = 0xc400_0003;
const PSCI_0_1_MIGRATE: u32 = 0xc400_0005;

/// Linux arm64 copies at most COMMAND_LINE_SIZE − 1 bytes of `bootargs`
/// and silently drops the rest.
pub const CMDLINE_MAX: usize = 2047;

/// MPIDR_EL1 affinity bits as the cpus binding wants them in `reg`:
/// Aff3 (bits 39:32) and Aff2..Aff0 (bits 23:0).
const MPIDR_AFFINITY_MASK: u64 = 0xff_00ff_ffff;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GicVersion {
    V2,
    V3,
}

/// What the device tree says about the GIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GicDesc {
    pub version: GicVersion,
    /// (address, size): v3: distributor, redistributors; v2: distributor,
    /// CPU interface.
    pub regions: Vec<(u64, u64)>,
    /// The vGIC maintenance interrupt (PPI number), if declared.
    pub maint_irq_ppi: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct FdtParams {
    /// (guest address, size) of each RAM region.
    pub mem_regions: Vec<(u64, u64)>,
    /// MPIDR_EL1 of each vCPU, in vCPU order.
    pub vcpu_mpidrs: Vec<u64>,
    pub cmdline: String,
    /// (guest address, size) of the initrd.
    pub initrd: Option<(u64, u64)>,
    pub gic: GicDesc,
    /// (address, SPI) of the 16550 console.
    pub serial: Option<(u64, u32)>,
    /// (address, SPI) of the PL031.
    pub rtc: Option<(u64, u32)>,
    /// (address, size, SPI) of each virtio-mmio device.
    pub virtio: Vec<(u64, u64, u32)>,
}

#[derive(Debug, thiserror::Error)]
pub enum FdtError {
    #[error("cannot write the device tree: {0}")]
    Writer(#[from] vm_fdt::Error),
    #[error("the device tree takes {size} bytes, more than its {max}-byte place")]
    TooLarge { size: usize, max: u64 },
    #[error("cannot describe this VM in a device tree: {0}")]
    Invalid(String),
}

/// Builds the DTB. Its place in guest memory (the last
/// [`layout::FDT_MAX_SIZE`] of RAM) and the `X0` that points at it are the
/// caller's.
pub fn create_fdt(p: &FdtParams) -> Result<Vec<u8>, FdtError> {
    validate(p)?;
    let mut fdt = FdtWriter::new()?;
    let root = fdt.begin_node("")?;
    // The guest tools find out they run under spore from this string.
    fdt.property_string("compatible", "spore,microvm")?;
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 2)?;
    fdt.property_u32("interrupt-parent", GIC_PHANDLE)?;

    cpus_node(&mut fdt, &p.vcpu_mpidrs)?;
    memory_node(&mut fdt, &p.mem_regions)?;
    chosen_node(&mut fdt, p)?;
    if let Some((addr, _)) = p.serial {
        // serial0 makes the UART ttyS0 whatever order drivers probe in.
        let aliases = fdt.begin_node("aliases")?;
        fdt.property_string("serial0", &serial_path(addr))?;
        fdt.end_node(aliases)?;
    }
    gic_node(&mut fdt, &p.gic)?;
    timer_node(&mut fdt, p.gic.version, p.vcpu_mpidrs.len())?;
    psci_node(&mut fdt)?;
    clock_node(&mut fdt)?;
    if let Some((addr, spi)) = p.serial {
        serial_node(&mut fdt, addr, spi)?;
    }
    if let Some((addr, spi)) = p.rtc {
        rtc_node(&mut fdt, addr, spi)?;
    }
    for &(addr, size, spi) in &p.virtio {
        virtio_node(&mut fdt, addr, size, spi)?;
    }
    fdt.end_node(root)?;

    let blob = fdt.finish()?;
    if blob.len() as u64 > layout::FDT_MAX_SIZE {
        return Err(FdtError::TooLarge {
            size: blob.len(),
            max: layout::FDT_MAX_SIZE,
        });
    }
    Ok(blob)
}

fn validate(p: &FdtParams) -> Result<(), FdtError> {
    let invalid = |s: String| Err(FdtError::Invalid(s));
    if p.vcpu_mpidrs.is_empty() {
        return invalid("no vCPU".into());
    }
    if p.mem_regions.is_empty() || p.mem_regions.iter().any(|&(_, size)| size == 0) {
        return invalid("no RAM, or an empty RAM region".into());
    }
    if p.gic.regions.len() != 2 {
        return invalid(format!(
            "the GIC needs 2 regions, got {}",
            p.gic.regions.len()
        ));
    }
    if p.gic.version == GicVersion::V2 && p.vcpu_mpidrs.len() > GICV2_MAX_CPUS {
        return invalid(format!(
            "{} vCPUs, GICv2 serves at most {GICV2_MAX_CPUS}",
            p.vcpu_mpidrs.len()
        ));
    }
    if p.cmdline.len() > CMDLINE_MAX {
        return invalid(format!(
            "the command line is {} bytes, Linux keeps {CMDLINE_MAX}",
            p.cmdline.len()
        ));
    }
    if let Some((addr, size)) = p.initrd {
        if addr.checked_add(size).is_none() {
            return invalid(format!("initrd at {addr:#x} + {size:#x} wraps"));
        }
    }
    Ok(())
}

fn serial_path(addr: u64) -> String {
    format!("/serial@{addr:x}")
}

fn cpus_node(fdt: &mut FdtWriter, mpidrs: &[u64]) -> Result<(), FdtError> {
    let cpus = fdt.begin_node("cpus")?;
    // arm64: two address cells (the MPIDR affinity), no size.
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 0)?;
    for &mpidr in mpidrs {
        let reg = mpidr & MPIDR_AFFINITY_MASK;
        let cpu = fdt.begin_node(&format!("cpu@{reg:x}"))?;
        fdt.property_string("device_type", "cpu")?;
        fdt.property_string("compatible", "arm,arm-v8")?;
        // Secondaries start powered off and are started by PSCI CPU_ON.
        fdt.property_string("enable-method", "psci")?;
        fdt.property_u64("reg", reg)?;
        fdt.end_node(cpu)?;
    }
    fdt.end_node(cpus)?;
    Ok(())
}

fn memory_node(fdt: &mut FdtWriter, regions: &[(u64, u64)]) -> Result<(), FdtError> {
    let first = regions[0].0;
    let mem = fdt.begin_node(&format!("memory@{first:x}"))?;
    fdt.property_string("device_type", "memory")?;
    let reg: Vec<u64> = regions.iter().flat_map(|&(a, s)| [a, s]).collect();
    fdt.property_array_u64("reg", &reg)?;
    fdt.end_node(mem)?;
    Ok(())
}

fn chosen_node(fdt: &mut FdtWriter, p: &FdtParams) -> Result<(), FdtError> {
    let chosen = fdt.begin_node("chosen")?;
    fdt.property_string("bootargs", &p.cmdline)?;
    if let Some((addr, _)) = p.serial {
        // Also what a bare `earlycon` on the command line uses.
        fdt.property_string("stdout-path", &serial_path(addr))?;
    }
    if let Some((addr, size)) = p.initrd {
        fdt.property_u64("linux,initrd-start", addr)?;
        fdt.property_u64("linux,initrd-end", addr + size)?;
    }
    fdt.end_node(chosen)?;
    Ok(())
}

fn gic_node(fdt: &mut FdtWriter, gic: &GicDesc) -> Result<(), FdtError> {
    let base = gic.regions[0].0;
    let intc = fdt.begin_node(&format!("intc@{base:x}"))?;
    let compatible = match gic.version {
        GicVersion::V3 => "arm,gic-v3",
        GicVersion::V2 => "arm,cortex-a15-gic",
    };
    fdt.property_string("compatible", compatible)?;
    fdt.property_null("interrupt-controller")?;
    fdt.property_u32("#interrupt-cells", 3)?;
    // Parent unit-address cells of an interrupt-map entry: none (dtc asks).
    fdt.property_u32("#address-cells", 0)?;
    let reg: Vec<u64> = gic.regions.iter().flat_map(|&(a, s)| [a, s]).collect();
    fdt.property_array_u64("reg", &reg)?;
    fdt.property_phandle(GIC_PHANDLE)?;
    if let Some(ppi) = gic.maint_irq_ppi {
        fdt.property_array_u32(
            "interrupts",
            &[GIC_FDT_IRQ_TYPE_PPI, ppi, IRQ_TYPE_LEVEL_HIGH],
        )?;
    }
    fdt.end_node(intc)?;
    Ok(())
}

fn timer_node(fdt: &mut FdtWriter, gic: GicVersion, vcpus: usize) -> Result<(), FdtError> {
    let cpu_mask = match gic {
        GicVersion::V3 => 0,
        // validate() keeps a GICv2 VM at 8 vCPUs or fewer.
        GicVersion::V2 => ((1u32 << vcpus) - 1) << GICV2_PPI_CPU_MASK_SHIFT,
    };
    let irqs: Vec<u32> = layout::TIMER_PPIS
        .iter()
        .flat_map(|&ppi| [GIC_FDT_IRQ_TYPE_PPI, ppi, IRQ_TYPE_LEVEL_LOW | cpu_mask])
        .collect();
    let timer = fdt.begin_node("timer")?;
    fdt.property_string("compatible", "arm,armv8-timer")?;
    fdt.property_array_u32("interrupts", &irqs)?;
    // The counter keeps counting in every idle state a guest can enter.
    fdt.property_null("always-on")?;
    fdt.end_node(timer)?;
    Ok(())
}

fn psci_node(fdt: &mut FdtWriter) -> Result<(), FdtError> {
    let psci = fdt.begin_node("psci")?;
    fdt.property_string_list("compatible", vec!["arm,psci-0.2".into(), "arm,psci".into()])?;
    // KVM answers PSCI calls made with HVC.
    fdt.property_string("method", "hvc")?;
    fdt.property_u32("cpu_suspend", PSCI_0_1_CPU_SUSPEND)?;
    fdt.property_u32("cpu_off", PSCI_0_1_CPU_OFF)?;
    fdt.property_u32("cpu_on", PSCI_0_1_CPU_ON)?;
    fdt.property_u32("migrate", PSCI_0_1_MIGRATE)?;
    fdt.end_node(psci)?;
    Ok(())
}

fn clock_node(fdt: &mut FdtWriter) -> Result<(), FdtError> {
    let clock = fdt.begin_node("apb-pclk")?;
    fdt.property_string("compatible", "fixed-clock")?;
    fdt.property_u32("#clock-cells", 0)?;
    fdt.property_u32("clock-frequency", APB_PCLK_HZ)?;
    fdt.property_string("clock-output-names", "clk24mhz")?;
    fdt.property_phandle(CLOCK_PHANDLE)?;
    fdt.end_node(clock)?;
    Ok(())
}

/// The VMM raises device interrupts through irqfds, which KVM delivers as
/// a rising edge (its fast path never lowers the line): declared
/// level-triggered, such an SPI would stay asserted for good.
fn spi(spi: u32, trigger: u32) -> [u32; 3] {
    [GIC_FDT_IRQ_TYPE_SPI, spi, trigger]
}

fn serial_node(fdt: &mut FdtWriter, addr: u64, irq: u32) -> Result<(), FdtError> {
    let serial = fdt.begin_node(&format!("serial@{addr:x}"))?;
    fdt.property_string("compatible", "ns16550a")?;
    fdt.property_array_u64("reg", &[addr, layout::SERIAL_MMIO_SIZE])?;
    // Byte-wide registers, one byte apart.
    fdt.property_u32("reg-shift", 0)?;
    fdt.property_u32("reg-io-width", 1)?;
    fdt.property_array_u32("interrupts", &spi(irq, IRQ_TYPE_EDGE_RISING))?;
    fdt.property_u32("clock-frequency", SERIAL_CLOCK_HZ)?;
    fdt.end_node(serial)?;
    Ok(())
}

fn rtc_node(fdt: &mut FdtWriter, addr: u64, irq: u32) -> Result<(), FdtError> {
    let rtc = fdt.begin_node(&format!("rtc@{addr:x}"))?;
    // "arm,primecell" makes Linux probe it on the AMBA bus, which reads
    // the PrimeCell id registers and enables `apb_pclk`.
    fdt.property_string_list(
        "compatible",
        vec!["arm,pl031".into(), "arm,primecell".into()],
    )?;
    fdt.property_array_u64("reg", &[addr, layout::RTC_MMIO_SIZE])?;
    // The PL031's alarm line is a level (and not driven by an irqfd).
    fdt.property_array_u32("interrupts", &spi(irq, IRQ_TYPE_LEVEL_HIGH))?;
    fdt.property_u32("clocks", CLOCK_PHANDLE)?;
    fdt.property_string("clock-names", "apb_pclk")?;
    fdt.end_node(rtc)?;
    Ok(())
}

fn virtio_node(fdt: &mut FdtWriter, addr: u64, size: u64, irq: u32) -> Result<(), FdtError> {
    let node = fdt.begin_node(&format!("virtio_mmio@{addr:x}"))?;
    fdt.property_string("compatible", "virtio,mmio")?;
    fdt.property_array_u64("reg", &[addr, size])?;
    fdt.property_array_u32("interrupts", &spi(irq, IRQ_TYPE_EDGE_RISING))?;
    // The VMM reads and writes guest memory coherently.
    fdt.property_null("dma-coherent")?;
    fdt.end_node(node)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::layout::*;
    use super::*;

    const FDT_MAGIC: u32 = 0xd00d_feed;

    /// KVM's MPIDR for vCPU `i`: 16 vCPUs per Aff1 cluster, bit 31 RES1.
    fn kvm_mpidr(i: u64) -> u64 {
        (1 << 31) | ((i >> 4) << 8) | (i & 0xf)
    }

    fn params(vcpus: u64, virtio: usize, gic: GicVersion) -> FdtParams {
        let regions = match gic {
            GicVersion::V3 => vec![
                (GIC_DIST_BASE, GIC_DIST_SIZE),
                (GIC_REDIST_BASE, vcpus * GIC_REDIST_SIZE_PER_CPU),
            ],
            GicVersion::V2 => vec![(GIC_DIST_BASE, GIC_DIST_SIZE), (GIC_CPU_BASE, GIC_CPU_SIZE)],
        };
        FdtParams {
            mem_regions: ram_regions(512 << 20),
            vcpu_mpidrs: (0..vcpus).map(kvm_mpidr).collect(),
            cmdline: "console=ttyS0 earlycon reboot=k panic=1".into(),
            initrd: Some((0x9000_0000, 0x12_3456)),
            gic: GicDesc {
                version: gic,
                regions,
                maint_irq_ppi: Some(9),
            },
            serial: Some((SERIAL_MMIO_BASE, SERIAL_IRQ)),
            rtc: Some((RTC_MMIO_BASE, RTC_IRQ)),
            virtio: (0..virtio)
                .map(|i| (virtio_mmio_addr(i), VIRTIO_MMIO_SIZE, virtio_mmio_irq(i)))
                .collect(),
        }
    }

    fn be32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    fn be64(b: &[u8]) -> u64 {
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    fn cells(b: &[u8]) -> Vec<u32> {
        b.chunks(4).map(be32).collect()
    }

    fn prop<'a>(dt: &fdt::Fdt<'a>, node: &str, name: &str) -> &'a [u8] {
        dt.find_node(node)
            .unwrap_or_else(|| panic!("no node {node}"))
            .property(name)
            .unwrap_or_else(|| panic!("no {name} in {node}"))
            .value
    }

    #[test]
    fn header_is_a_dtb_and_fits_its_place() {
        let blob = create_fdt(&params(8, VIRTIO_MMIO_MAX, GicVersion::V3)).unwrap();
        assert_eq!(be32(&blob[0..4]), FDT_MAGIC);
        assert_eq!(be32(&blob[4..8]) as usize, blob.len());
        assert!(blob.len() as u64 <= FDT_MAX_SIZE);
        let dt = fdt::Fdt::new(&blob).unwrap();
        assert_eq!(dt.total_size(), blob.len());
    }

    #[test]
    fn nodes_and_properties_linux_needs() {
        let p = params(8, VIRTIO_MMIO_MAX, GicVersion::V3);
        let blob = create_fdt(&p).unwrap();
        let dt = fdt::Fdt::new(&blob).unwrap();

        assert!(dt.root().compatible().all().any(|c| c.contains("spore")));
        assert_eq!(dt.chosen().bootargs(), Some(p.cmdline.as_str()));
        assert_eq!(
            be64(prop(&dt, "/chosen", "linux,initrd-start")),
            0x9000_0000
        );
        assert_eq!(be64(prop(&dt, "/chosen", "linux,initrd-end")), 0x9012_3456);
        let stdout = dt.chosen().stdout().unwrap();
        assert_eq!(stdout.name, "serial@9000000");
        assert_eq!(
            dt.aliases().unwrap().resolve("serial0"),
            Some("/serial@9000000")
        );

        let cpus: Vec<_> = dt.find_node("/cpus").unwrap().children().collect();
        assert_eq!(cpus.len(), 8);
        for (i, cpu) in cpus.iter().enumerate() {
            assert_eq!(cpu.name, format!("cpu@{i:x}"));
            assert_eq!(be64(cpu.property("reg").unwrap().value), i as u64);
            assert_eq!(
                cpu.property("enable-method").unwrap().as_str(),
                Some("psci")
            );
        }

        let mem: Vec<_> = dt.memory().regions().collect();
        assert_eq!(mem.len(), 1);
        assert_eq!(mem[0].starting_address as u64, RAM_START);
        assert_eq!(mem[0].size, Some(512 << 20));

        // The GIC is everyone's interrupt parent.
        let gic = dt.find_node("/intc@8000000").unwrap();
        assert_eq!(gic.compatible().unwrap().first(), "arm,gic-v3");
        assert_eq!(gic.interrupt_cells(), Some(3));
        assert_eq!(
            be32(prop(&dt, "/", "interrupt-parent")),
            be32(gic.property("phandle").unwrap().value)
        );
        assert_eq!(
            cells(prop(&dt, "/intc@8000000", "reg")),
            vec![0, 0x0800_0000, 0, 0x1_0000, 0, 0x080a_0000, 0, 0x10_0000]
        );

        assert_eq!(
            cells(prop(&dt, "/timer", "interrupts")),
            vec![1, 13, 8, 1, 14, 8, 1, 11, 8, 1, 10, 8]
        );
        assert!(dt
            .find_node("/timer")
            .unwrap()
            .property("always-on")
            .is_some());
        let psci = dt.find_node("/psci").unwrap();
        assert_eq!(psci.compatible().unwrap().first(), "arm,psci-0.2");
        assert_eq!(psci.property("method").unwrap().as_str(), Some("hvc"));

        assert_eq!(
            cells(prop(&dt, "/serial@9000000", "interrupts")),
            vec![0, SERIAL_IRQ, 1]
        );
        let rtc = dt.find_node("/rtc@9010000").unwrap();
        assert!(rtc
            .compatible()
            .unwrap()
            .all()
            .any(|c| c == "arm,primecell"));
        assert_eq!(
            be32(rtc.property("clocks").unwrap().value),
            be32(prop(&dt, "/apb-pclk", "phandle"))
        );
        assert_eq!(
            rtc.property("clock-names").unwrap().as_str(),
            Some("apb_pclk")
        );

        let virtio: Vec<_> = dt
            .all_nodes()
            .filter(|n| n.name.starts_with("virtio_mmio@"))
            .collect();
        assert_eq!(virtio.len(), VIRTIO_MMIO_MAX);
        let last = dt.find_node("/virtio_mmio@a01f000").unwrap();
        assert_eq!(
            cells(last.property("interrupts").unwrap().value),
            vec![0, virtio_mmio_irq(VIRTIO_MMIO_MAX - 1), 1]
        );
        assert!(last.property("dma-coherent").is_some());
    }

    #[test]
    fn optional_devices_and_initrd_can_be_left_out() {
        let mut p = params(1, 0, GicVersion::V3);
        p.initrd = None;
        p.serial = None;
        p.rtc = None;
        let blob = create_fdt(&p).unwrap();
        let dt = fdt::Fdt::new(&blob).unwrap();
        let chosen = dt.find_node("/chosen").unwrap();
        assert!(chosen.property("linux,initrd-start").is_none());
        assert!(chosen.property("stdout-path").is_none());
        assert!(dt.find_node("/aliases").is_none());
        assert!(dt.find_compatible(&["ns16550a"]).is_none());
    }

    #[test]
    fn gicv2_gets_its_compatible_and_ppi_cpu_masks() {
        let blob = create_fdt(&params(2, 1, GicVersion::V2)).unwrap();
        let dt = fdt::Fdt::new(&blob).unwrap();
        let gic = dt.find_node("/intc@8000000").unwrap();
        assert_eq!(gic.compatible().unwrap().first(), "arm,cortex-a15-gic");
        let timer = cells(prop(&dt, "/timer", "interrupts"));
        assert_eq!(&timer[..3], &[1, 13, 0x308]);
        assert!(create_fdt(&params(9, 0, GicVersion::V2)).is_err());
    }

    #[test]
    fn bad_input_is_refused() {
        let mut p = params(1, 0, GicVersion::V3);
        p.cmdline = "x".repeat(CMDLINE_MAX + 1);
        assert!(matches!(create_fdt(&p), Err(FdtError::Invalid(_))));
        p.cmdline = "a\0b".into();
        assert!(matches!(create_fdt(&p), Err(FdtError::Writer(_))));
        let mut p = params(1, 0, GicVersion::V3);
        p.vcpu_mpidrs.clear();
        assert!(create_fdt(&p).is_err());
        let mut p = params(1, 0, GicVersion::V3);
        p.gic.regions.pop();
        assert!(create_fdt(&p).is_err());
    }

    #[test]
    fn more_than_16_vcpus_use_aff1_in_reg_and_name() {
        let blob = create_fdt(&params(17, 0, GicVersion::V3)).unwrap();
        let dt = fdt::Fdt::new(&blob).unwrap();
        let cpu = dt.find_node("/cpus/cpu@100").unwrap();
        assert_eq!(be64(cpu.property("reg").unwrap().value), 0x100);
    }

    /// dtc (device-tree-compiler) checks what the parser above does not:
    /// unit addresses against `reg`, phandle references, node names.
    #[test]
    fn dtc_accepts_it_without_warnings() {
        use std::process::Command;
        if Command::new("dtc").arg("--version").output().is_err() {
            eprintln!("dtc not installed (apt-get install device-tree-compiler): skipped");
            return;
        }
        for gic in [GicVersion::V3, GicVersion::V2] {
            let blob = create_fdt(&params(8, VIRTIO_MMIO_MAX, gic)).unwrap();
            let path = std::env::temp_dir().join(format!("spore-fdt-test-{gic:?}.dtb"));
            std::fs::write(&path, &blob).unwrap();
            let out = Command::new("dtc")
                .args(["-I", "dtb", "-O", "dts", "-o", "/dev/null"])
                .arg(&path)
                .output()
                .unwrap();
            let _ = std::fs::remove_file(&path);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "dtc failed: {stderr}");
            assert!(stderr.trim().is_empty(), "dtc warnings ({gic:?}): {stderr}");
        }
    }
}
