//! Raw access to the signal port from Linux user space.
//!
//! `ioperm(SIGNAL_PORT, 4, 1)` lets a root process execute 32-bit `in`/`out`
//! on that one register directly (narrower than `iopl(3)`, which would open
//! all 65536 ports); a write to the port then exits to the VMM like any port
//! I/O. The guest kernel needs `CONFIG_X86_IOPL_IOPERM`. This module must
//! never touch a port other than [`SIGNAL_PORT`], and refuses to run on bare
//! metal, where port 0x510 could belong to real hardware.

use spore_abi::signal::SIGNAL_PORT;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PortError {
    #[error("ioperm({port:#x}) failed: {source} (port I/O needs root, i.e. CAP_SYS_RAWIO, and a kernel with CONFIG_X86_IOPL_IOPERM)")]
    Ioperm { port: u16, source: std::io::Error },
    #[error("no hypervisor detected (CPUID.1:ECX bit 31 clear); refusing to write port {port:#x} on bare metal")]
    NotVirtualized { port: u16 },
    #[error("cannot pin to one CPU: {0}")]
    Pin(std::io::Error),
    #[cfg(not(target_arch = "x86_64"))]
    #[error("port I/O is only supported on x86_64")]
    UnsupportedArch,
}

/// The signal port, after I/O privilege was granted to this process.
pub struct SignalPort(());

#[cfg(target_arch = "x86_64")]
impl SignalPort {
    pub fn open() -> Result<Self, PortError> {
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

    /// Pins this process to the CPU it runs on. The result an `in` returns
    /// belongs to the vCPU that sent the last signal, so a request/response
    /// pair (WAIT) must not migrate between the `out` and the `in`.
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

    /// Writes one 32-bit value to the signal port.
    pub fn write(&self, value: u32) {
        // SAFETY: `open` granted access to this port; the port is spore's signal port,
        // which has no memory effects visible to this process.
        unsafe {
            core::arch::asm!("out dx, eax", in("dx") SIGNAL_PORT, in("eax") value,
                options(nomem, nostack, preserves_flags));
        }
    }

    /// Reads the 32-bit result of the last signal on this vCPU.
    pub fn read(&self) -> u32 {
        let value: u32;
        // SAFETY: as for `write`.
        unsafe {
            core::arch::asm!("in eax, dx", in("dx") SIGNAL_PORT, out("eax") value,
                options(nomem, nostack, preserves_flags));
        }
        value
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl SignalPort {
    pub fn open() -> Result<Self, PortError> {
        Err(PortError::UnsupportedArch)
    }
    pub fn pin_to_current_cpu(&self) -> Result<(), PortError> {
        Ok(())
    }
    pub fn write(&self, _value: u32) {}
    pub fn read(&self) -> u32 {
        0
    }
}
