//! virtio-net: a guest network interface on a host tap device (virtio 1.2, §5.1).
//!
//! - [`header`]: the guest's wire format (`virtio_net_hdr_v1`) and every
//!   check on the guest's descriptor chains, in one place.
//! - [`tap`]: the host side, a tap opened by name ([`tap::Tap`]), behind the
//!   small [`tap::NetBackend`] trait so tests can use a socketpair.
//! - [`device`]: the [`Net`] device model (features, config space,
//!   activation) and the [`NetHandle`] the VMM keeps (limits, a clone's MAC).
//! - [`worker`]: the worker thread moving frames between the queues and
//!   the tap, under the rx/tx rate limiters.
//! - [`persist`]: the snapshot state; a restore reopens the tap by name.
//!
//! Two queues (rx 0, tx 1) of [`QUEUE_SIZE`]. Frames pass through two host
//! buffers of fixed size ([`header::MAX_FRAME_WITH_HEADER`]), never through
//! an allocation sized by the guest.

pub mod device;
pub mod header;
pub mod persist;
pub mod tap;
pub mod worker;

pub use device::{Net, NetHandle};
pub use persist::NetState;

/// Entries in each of the two queues.
pub const QUEUE_SIZE: u16 = 256;
/// rx then tx, as virtio-net numbers them.
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network interface {iface_id}: {source}")]
    Tap {
        iface_id: String,
        #[source]
        source: tap::TapError,
    },
    #[error("network interface {iface_id}: cannot create its rate limiter timers: {source}")]
    Timer {
        iface_id: String,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
