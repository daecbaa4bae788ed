//! Legacy devices: the 8250 serial console (port I/O on x86_64, MMIO on
//! aarch64), the i8042 (x86_64: reset, Ctrl+Alt+Del), the PL031 RTC
//! (aarch64), the spore signal port.

pub mod i8042;
pub mod rtc;
pub mod serial;
pub mod serial_limit;
pub mod signal;
