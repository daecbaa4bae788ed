//! Static tools for spore's Linux guests (built for x86_64- and aarch64-unknown-linux-musl
//! and put in the guest initramfs):
//!
//! - `spore-signal`: signal-port events (exit, mark, wait) from user space;
//! - `spore-vsock`: a vsock pipe (listen or connect, stdin/stdout ↔ socket),
//!   the guest end of `spore vsock` on the host;
//! - `spore-tmem`: put/get/invalidate objects in the VMM's tmem pool;
//! - `spore-reseed`: reseeds the kernel random pool from /dev/hwrng when the
//!   VMM says the VM is a clone ([`reseed`]), and applies the new MAC and
//!   IPv4 address the notice may carry ([`netid`]);
//! - `spore-agent`: PID 1 of Linux function guests, relaying invocations
//!   from the host to a runtime speaking the Lambda Runtime API ([`agent`]).

pub mod agent;
pub mod console;
pub mod ioctl;
pub mod netid;
pub mod port;
pub mod reseed;
pub mod signal_cli;
pub mod tmem;
pub mod vsock;
