//! Legacy port-I/O devices: 8250 serial, i8042 (reset, Ctrl+Alt+Del), the
//! spore signal port.

pub mod i8042;
pub mod serial;
pub mod serial_limit;
pub mod signal;
