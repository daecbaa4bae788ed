//! The contract between spore guests and the spore VMM, defined once.
//!
//! Both sides compile this crate: the VMM (std) and the unikernel runtime and
//! Linux guest helper (no_std or static). Nothing here may depend on std.
//!
//! - [`signal`]: the signal port, one port-I/O register for guest → VMM events.
//! - [`boot`]: the boot-info block the VMM hands to a unikernel in RDI, and
//!   the ELF note that marks an image as a spore unikernel.
//! - [`tmem`]: transcendent memory calls (key/value objects in a VMM pool).
//! - [`vsock`]: the virtio-vsock packet header, spoken by the VMM's device
//!   and the unikernel's driver.
//! - [`net`]: a clone's new network identity (MAC, IPv4) for the unikernel.
//! - [`function`]: the invoke protocol between `spore serve` and a function
//!   instance, over vsock.
#![no_std]

pub mod boot;
pub mod function;
pub mod net;
pub mod signal;
pub mod tmem;
pub mod vsock;
