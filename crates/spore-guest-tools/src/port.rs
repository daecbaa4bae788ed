//! Raw access to the signal register (`spore_abi::signal`) from Linux user
//! space. One API for both architectures; what differs is how the 32-bit
//! register is reached, each in its own small module below:
//!
//! - **x86_64**: I/O port [`SIGNAL_PORT`]. `ioperm(SIGNAL_PORT, 4, 1)` lets a
//!   root process execute 32-bit `in`/`out` on that one register directly
//!   (narrower than `iopl(3)`, which would open all 65536 ports); a write to
//!   the port then exits to the VMM like any port I/O. The guest kernel needs
//!   `CONFIG_X86_IOPL_IOPERM`. Refused on bare metal (no hypervisor bit in
//!   CPUID), where port 0x510 could belong to real hardware.
//! - **aarch64**: guest-physical [`SIGNAL_MMIO_ADDR`], alone in its page.
//!   The process maps exactly that one page of `/dev/mem` (`O_SYNC`: device
//!   memory, uncached) and does 32-bit volatile loads and stores; each one
//!   traps to the VMM as an MMIO exit. Needs root (`CAP_SYS_RAWIO`) and a
//!   kernel with `CONFIG_DEVMEM` (`STRICT_DEVMEM` allows it: the page is not
//!   RAM). Refused unless the device tree's root `compatible` names spore
//!   (`spore,microvm`): on another machine that address can be a real device
//!   (QEMU's `virt` has its fw_cfg there). The device tree is read from
//!   `/sys/firmware/devicetree` or `/proc/device-tree`, so sysfs or procfs
//!   must be mounted.
//!
//! This module never touches anything but the signal register.

#[cfg(target_arch = "aarch64")]
use spore_abi::signal::SIGNAL_MMIO_ADDR;
#[cfg(target_arch = "x86_64")]
use spore_abi::signal::SIGNAL_PORT;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PortError {
    #[cfg(target_arch = "x86_64")]
    #[error("ioperm({port:#x}) failed: {source} (port I/O needs root, i.e. CAP_SYS_RAWIO, and a kernel with CONFIG_X86_IOPL_IOPERM)")]
    Ioperm { port: u16, source: std::io::Error },
    #[cfg(target_arch = "x86_64")]
    #[error("no hypervisor detected (CPUID.1:ECX bit 31 clear); refusing to write port {port:#x} on bare metal")]
    NotVirtualized { port: u16 },
    #[cfg(target_arch = "aarch64")]
    #[error("cannot open /dev/mem: {0} (the signal register needs root, i.e. CAP_SYS_RAWIO, and a kernel with CONFIG_DEVMEM)")]
    DevMemOpen(std::io::Error),
    #[cfg(target_arch = "aarch64")]
    #[error("cannot map the signal register's page {addr:#x} from /dev/mem: {source} (a kernel with IO_STRICT_DEVMEM, or a driver holding that range, refuses it)")]
    DevMemMap { addr: u64, source: std::io::Error },
    #[cfg(target_arch = "aarch64")]
    #[error("cannot read the device tree's root compatible ({0}; is sysfs or procfs mounted?); refusing to touch {SIGNAL_MMIO_ADDR:#x} without knowing the machine")]
    NoDeviceTree(std::io::Error),
    #[cfg(target_arch = "aarch64")]
    #[error("not a spore VM (device tree root compatible: {compatible}); refusing to touch {SIGNAL_MMIO_ADDR:#x}, which may be real hardware here")]
    NotSpore { compatible: String },
    #[error("cannot pin to one CPU: {0}")]
    Pin(std::io::Error),
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    #[error("the signal register is only supported on x86_64 and aarch64")]
    UnsupportedArch,
}

/// The signal register, made accessible to this process.
pub struct SignalPort(arch::Register);

impl SignalPort {
    pub fn open() -> Result<Self, PortError> {
        arch::Register::open().map(Self)
    }

    /// Pins this process to the CPU it runs on. The result a read returns
    /// belongs to the vCPU that sent the last signal, so a request/response
    /// pair (WAIT) must not migrate between the write and the read.
    pub fn pin_to_current_cpu(&self) -> Result<(), PortError> {
        // SAFETY: plain syscalls on this process with a local, zeroed cpu_set_t.
        unsafe {
            let cpu = libc::sched_getcpu();
            if cpu < 0 {
                return Err(PortError::Pin(std::io::Error::last_os_error()));
            }
            let mut set: libc::cpu_set_t = core::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            if libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(PortError::Pin(std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Writes one 32-bit value to the signal register.
    pub fn write(&self, value: u32) {
        self.0.write(value);
    }

    /// Reads the 32-bit result of the last signal on this vCPU.
    pub fn read(&self) -> u32 {
        self.0.read()
    }
}

/// Whether a device tree `compatible` property (NUL-separated strings) has
/// an entry of vendor `spore` (`spore,microvm`).
#[cfg(any(target_arch = "aarch64", test))]
fn names_spore(compatible: &[u8]) -> bool {
    compatible
        .split(|&b| b == 0)
        .any(|entry| entry == b"spore" || entry.starts_with(b"spore,"))
}

#[cfg(target_arch = "x86_64")]
mod arch {
    use super::{PortError, SIGNAL_PORT};

    /// Port I/O on [`SIGNAL_PORT`], granted by `ioperm`.
    pub(super) struct Register(());

    impl Register {
        pub(super) fn open() -> Result<Self, PortError> {
            // Leaf 1 exists on every x86_64 CPU; bit 31 of ECX is the hypervisor bit.
            let leaf1 = core::arch::x86_64::__cpuid(1);
            if leaf1.ecx & (1 << 31) == 0 {
                return Err(PortError::NotVirtualized { port: SIGNAL_PORT });
            }
            // The register is 32 bits wide: `out dx, eax` touches ports
            // SIGNAL_PORT..SIGNAL_PORT+4, and the CPU checks all four bitmap bits.
            // SAFETY: ioperm only changes this process's I/O permission bitmap.
            if unsafe { libc::ioperm(libc::c_ulong::from(SIGNAL_PORT), 4, 1) } != 0 {
                return Err(PortError::Ioperm {
                    port: SIGNAL_PORT,
                    source: std::io::Error::last_os_error(),
                });
            }
            Ok(Self(()))
        }

        pub(super) fn write(&self, value: u32) {
            // SAFETY: `open` granted access to this port; the port is spore's signal port,
            // which has no memory effects visible to this process.
            unsafe {
                core::arch::asm!("out dx, eax", in("dx") SIGNAL_PORT, in("eax") value,
                    options(nomem, nostack, preserves_flags));
            }
        }

        pub(super) fn read(&self) -> u32 {
            let value: u32;
            // SAFETY: as for `write`.
            unsafe {
                core::arch::asm!("in eax, dx", in("dx") SIGNAL_PORT, out("eax") value,
                    options(nomem, nostack, preserves_flags));
            }
            value
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::ptr::NonNull;

    use spore_abi::signal::SIGNAL_MMIO_SIZE;

    use super::{names_spore, PortError, SIGNAL_MMIO_ADDR};

    // The register is the first word of its own page: mapping that page maps
    // nothing else, and the register sits at offset 0 of the mapping.
    const _: () = assert!(SIGNAL_MMIO_ADDR.is_multiple_of(SIGNAL_MMIO_SIZE));
    /// The mapping's length: the register's page.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "SIGNAL_MMIO_SIZE is one page (asserted below), far below usize::MAX"
    )]
    const MAP_LEN: usize = SIGNAL_MMIO_SIZE as usize;
    const _: () = assert!(MAP_LEN as u64 == SIGNAL_MMIO_SIZE && MAP_LEN <= 65536);

    /// Where the device tree's root `compatible` is found, newest first.
    const COMPATIBLE: [&str; 2] = [
        "/sys/firmware/devicetree/base/compatible",
        "/proc/device-tree/compatible",
    ];

    /// The page of `/dev/mem` at [`SIGNAL_MMIO_ADDR`], mapped shared.
    pub(super) struct Register {
        page: NonNull<u32>,
    }

    // SAFETY: the mapping belongs to the process, not to a thread; the only
    // accesses are single volatile 32-bit loads and stores, which any thread
    // may do at any time (the VMM serializes them per vCPU).
    unsafe impl Send for Register {}
    // SAFETY: as for Send: `read` and `write` take `&self` and touch the
    // device register only, never memory shared with Rust code.
    unsafe impl Sync for Register {}

    impl Register {
        pub(super) fn open() -> Result<Self, PortError> {
            check_spore_machine()?;
            // O_SYNC: the kernel maps the page uncached (device memory), so
            // every load and store reaches the VMM, in program order.
            let mem = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_SYNC)
                .open("/dev/mem")
                .map_err(PortError::DevMemOpen)?;
            let map_err = |source| PortError::DevMemMap {
                addr: SIGNAL_MMIO_ADDR,
                source,
            };
            let offset = libc::off_t::try_from(SIGNAL_MMIO_ADDR)
                .map_err(|_| map_err(std::io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
            // SAFETY: a new shared mapping of one page of /dev/mem; the
            // result is checked for MAP_FAILED. The fd may be closed after.
            let ptr = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    MAP_LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    mem.as_raw_fd(),
                    offset,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(map_err(std::io::Error::last_os_error()));
            }
            let page = NonNull::new(ptr.cast::<u32>())
                .ok_or_else(|| map_err(std::io::Error::from_raw_os_error(libc::EFAULT)))?;
            Ok(Self { page })
        }

        pub(super) fn write(&self, value: u32) {
            // Whatever this process stored before the signal (a SNAPSHOT or
            // FORK point) is visible before the VMM sees the store, as the
            // kernel's writel() orders it.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            // SAFETY: `page` is the live, aligned mapping of the register's
            // page; one 32-bit store to the register, which the VMM handles.
            unsafe { core::ptr::write_volatile(self.page.as_ptr(), value) }
        }

        pub(super) fn read(&self) -> u32 {
            // SAFETY: as for `write`; one 32-bit load of the register.
            unsafe { core::ptr::read_volatile(self.page.as_ptr()) }
        }
    }

    impl Drop for Register {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the page `open` mapped; nothing else
            // refers to it once the Register is gone.
            unsafe { libc::munmap(self.page.as_ptr().cast(), MAP_LEN) };
        }
    }

    /// Refuses unless the device tree's root `compatible` names spore.
    fn check_spore_machine() -> Result<(), PortError> {
        let mut first_err = None;
        for path in COMPATIBLE {
            match std::fs::read(path) {
                Ok(compatible) if names_spore(&compatible) => return Ok(()),
                Ok(compatible) => {
                    let shown: Vec<String> = compatible
                        .split(|&b| b == 0)
                        .filter(|s| !s.is_empty())
                        .map(|s| String::from_utf8_lossy(s).into_owned())
                        .collect();
                    return Err(PortError::NotSpore {
                        compatible: shown.join(", "),
                    });
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(PortError::NoDeviceTree(first_err.unwrap_or_else(|| {
            std::io::Error::from(std::io::ErrorKind::NotFound)
        })))
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    use super::PortError;

    pub(super) struct Register(());

    impl Register {
        pub(super) fn open() -> Result<Self, PortError> {
            Err(PortError::UnsupportedArch)
        }
        pub(super) fn write(&self, _value: u32) {}
        pub(super) fn read(&self) -> u32 {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names_spore;

    #[test]
    fn spore_compatible_is_recognized() {
        assert!(names_spore(b"spore,microvm\0"));
        assert!(names_spore(b"spore,microvm"));
        assert!(names_spore(b"vendor,board\0spore,microvm\0"));
        assert!(names_spore(b"spore\0"));
        assert!(!names_spore(b"linux,dummy-virt\0"));
        assert!(!names_spore(b"raspberrypi,4-model-b\0brcm,bcm2711\0"));
        assert!(!names_spore(b"notspore,x\0"));
        assert!(!names_spore(b""));
    }
}
