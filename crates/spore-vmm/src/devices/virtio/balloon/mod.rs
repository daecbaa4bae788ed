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
//! release), `persist.rs` (snapshot state). What the device and its worker
//! both use (feature bits, hinting command ids, the [`Shared`] block) is
//! here, so that neither imports the other's internals.

pub mod device;
pub mod persist;
pub mod request;
mod worker;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

pub use device::{
    Balloon, BalloonError, BalloonHandle, BalloonSettings, BalloonStatistics, BalloonStatus,
    HintingStatus,
};
pub use persist::{BalloonState, BalloonStateError};
use request::GuestStats;
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::virtio::VirtioInterrupt;

/// Feature bits (virtio 1.2, §5.5.3).
pub const F_MUST_TELL_HOST: u64 = 1 << 0;
pub const F_STATS_VQ: u64 = 1 << 1;
pub const F_DEFLATE_ON_OOM: u64 = 1 << 2;
pub const F_FREE_PAGE_HINT: u64 = 1 << 3;
pub const F_REPORTING: u64 = 1 << 5;

/// Free page hinting command ids (virtio 1.2, §5.5.6.6; Linux's
/// `VIRTIO_BALLOON_CMD_ID_*`). In `free_page_hint_cmd_id`, STOP asks the
/// driver to stop hinting and DONE lets it reuse the pages it hinted; any
/// other value (spore starts at 2) asks for a new run. On the hinting queue
/// the driver sends the run's id when it starts and STOP when it finished.
pub const CMD_ID_STOP: u32 = 0;
pub const CMD_ID_DONE: u32 = 1;

/// Host-side counters, for tests and the statistics endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReleaseCounters {
    /// Pages the guest inflated (each released on the host).
    pub inflated_pages: u64,
    /// Pages the guest deflated.
    pub deflated_pages: u64,
    /// Bytes of free page reports released on the host.
    pub reported_bytes: u64,
    /// Bytes the guest hinted during a hinting run, released on the host.
    pub hinted_bytes: u64,
    /// Hinted ranges ignored because no run was active or they belonged to
    /// an earlier run (not an error: the driver races the host's commands).
    pub hints_ignored: u64,
    /// PFNs and report ranges refused (outside guest RAM, misaligned).
    pub refused: u64,
    /// Ranges released (one syscall each) and the time spent releasing them.
    pub release_calls: u64,
    pub release_us: u64,
}

/// Where free page hinting stands (Firecracker's `HintingState`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HintState {
    /// What the host last asked: the `free_page_hint_cmd_id` config field
    /// (STOP until the first run).
    pub host_cmd: u32,
    /// The id the last run got; the next one gets the one after.
    pub last_run_id: u32,
    /// The last command id the driver sent on the hinting queue.
    pub guest_cmd: Option<u32>,
    /// When the driver says the run is over (STOP), answer DONE at once.
    pub ack_on_stop: bool,
}

/// The device's state, behind [`Shared`]'s lock.
struct State {
    target_pages: u32,
    actual_pages: u32,
    stats_interval_s: u16,
    stats: Option<(GuestStats, SystemTime)>,
    /// When the target was last set and when the driver last changed
    /// `actual`: the time a resize took, measured where it happens.
    target_set_at: Option<SystemTime>,
    actual_set_at: Option<SystemTime>,
    counters: ReleaseCounters,
    /// Present while the device is activated: config changes interrupt.
    interrupt: Option<Arc<VirtioInterrupt>>,
    /// The statistics buffer a quiesced worker was holding, for the
    /// snapshot and for the worker a restore starts.
    restored_held_stats: Option<u16>,
    hint: HintState,
}

/// What the device model, its API handle and the worker share.
struct Shared {
    state: Mutex<State>,
    deflate_on_oom: bool,
    free_page_reporting: bool,
    free_page_hinting: bool,
    mem_mib: u64,
    /// Tells a running worker the polling interval changed.
    settings_evt: EventFd,
}
