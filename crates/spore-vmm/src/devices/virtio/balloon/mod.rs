//! virtio-balloon (device id 5, virtio 1.2 §5.5): the host asks the guest to
//! give memory back, and gets it back for real.
//!
//! Queues, in the order Linux numbers them: inflate, deflate, then
//! statistics (if `VIRTIO_BALLOON_F_STATS_VQ`, offered when a polling
//! interval is configured) and free page reporting (if
//! `VIRTIO_BALLOON_F_REPORTING`). `VIRTIO_BALLOON_F_DEFLATE_ON_OOM` is offered
//! when asked for. Config space: `num_pages` (the target, set through the
//! API; changing it raises a config-change interrupt) and `actual` (written
//! by the driver).
//!
//! Inflated pages and reported free ranges are released on the host with
//! `madvise(MADV_REMOVE)` on the shared memfd mapping (a hole punched in the
//! memfd at the right offset, whatever side of the MMIO hole the page is
//! on), after every PFN and range has been checked against guest RAM.
//!
//! Files: `request.rs` (parsing and validation of everything the guest
//! sends), `device.rs` (device model, API handle), `worker.rs` (queues, host
//! release), `persist.rs` (snapshot state).

pub mod device;
pub mod persist;
pub mod request;
mod worker;

#[cfg(test)]
mod tests;

pub use device::{
    Balloon, BalloonError, BalloonHandle, BalloonSettings, BalloonStatistics, BalloonStatus,
    ReleaseCounters,
};
pub use persist::{BalloonState, BalloonStateError};
