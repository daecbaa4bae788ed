//! TCP/IP over the virtio-net driver, with smoltcp.
//!
//! - [`config`]: IPv4 settings from the command line (`ip=A.B.C.D/P`,
//!   `gw=A.B.C.D`) and from a clone's identity block.
//! - [`device`]: smoltcp's `phy::Device` over [`crate::virtio::net`].
//! - [`stack`]: the interface and its sockets ([`NetStack`]): polling,
//!   sleeping in the signal port's `wait` until the device or a timer has
//!   work, and re-addressing after a clone.
//!
//! The interface answers ARP and ping by itself; apps add TCP sockets to
//! [`NetStack::sockets`].

pub mod config;
pub mod device;
pub mod stack;

pub use config::{DisplayIpv4, DisplayMac, Ipv4Config};
pub use stack::{NetError, NetStack, Readdressed};
