//! virtio-balloon (device id 5, virtio 1.2 §5.5): the host asks the guest to
//! give memory back, and gets it back for real.
//!
//! Queues, in the order Linux numbers them: inflate, deflate, then
//! statistics (if `VIRTIO_BALLOON_F_STATS_VQ`, offered when a polling
//! interval is configured), free page hinting (if
//! `VIRTIO_BALLOON_F_FREE_PAGE_HINT`) and free page reporting (if
//! `VIRTIO_BALLOON_F_REPORTING`); absent queues take no index.
//! `VIRTIO_BALLOON_F_DEFLATE_ON_OOM` is offered when asked for. Config space:
//! `num_pages` (the target, set through the API; changing it raises a
//! config-change interrupt), `actual` (written by the driver) and
//! `free_page_hint_cmd_id` (the hinting command: a run id, STOP or DONE).
//!
//! Free page hinting (run on demand, `PATCH /balloon/hinting/start`): the
//! device puts a new command id in the config space; the driver takes free
//! pages from its allocator, sends the id and then the pages on the hinting
//! queue, and STOP when it has no more. The device releases the hinted pages
//! while that run is the host's command; DONE (on `stop`, or at once when
//! the run ends if `acknowledge_on_stop`) lets the guest reuse them.
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
    HintState, HintingStatus, ReleaseCounters, CMD_ID_DONE, CMD_ID_STOP,
};
pub use persist::{BalloonState, BalloonStateError};
