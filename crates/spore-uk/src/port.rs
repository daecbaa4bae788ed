//! x86 port I/O. The VMM starts the unikernel with IOPL 3, so these are
//! allowed at CPL 3; each one is a VM exit handled by the VMM.

use core::arch::asm;

/// Writes one byte to `port`.
#[inline]
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects on the guest; IOPL 3 allows it.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Writes a 32-bit value to `port`.
#[inline]
pub fn outl(port: u16, value: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a 32-bit value from `port`.
#[inline]
pub fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: as for `outb`.
    unsafe {
        asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags))
    }
    value
}
