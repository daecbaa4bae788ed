//! Legacy port-I/O devices: 8250 serial, i8042 (reset), the spore signal port.
