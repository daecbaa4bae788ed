//! Devices: the I/O bus, legacy port-I/O devices and virtio devices.

pub mod bus;
pub mod legacy;
pub mod tmem;
pub mod virtio;
pub mod wake;
