//! Serial output on COM1 by port I/O: the console of a spore unikernel.
//!
//! Bytes go straight to the transmit register. The VMM's 8250 model always
//! reports the transmitter empty, so polling the line status register would
//! only double the number of VM exits per byte.

use core::fmt;

use crate::port::outb;

/// COM1 base port (the transmit holding register at offset 0).
pub const COM1: u16 = 0x3f8;

/// A `fmt::Write` sink for COM1.
pub struct Serial;

impl Serial {
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            outb(COM1, b);
        }
    }
}

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments) {
    // The unikernel has one vCPU and no interrupts, so no lock is needed:
    // nothing can interleave with a print except a panic inside it.
    let _ = fmt::Write::write_fmt(&mut Serial, args);
}

/// Prints to COM1.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::serial::_print(format_args!($($arg)*)) };
}

/// Prints a line to COM1.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => { $crate::serial::_print(format_args!("{}\n", format_args!($($arg)*))) };
}
