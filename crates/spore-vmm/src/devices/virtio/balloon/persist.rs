//! Snapshot state of the balloon: the config space (target, actual), the
//! statistics setup and last report, the host's release counters, and the
//! statistics buffer the device holds (without it, the driver would never
//! send statistics again after a restore: it keeps one buffer in flight).
//!
//! Free page hinting keeps its commands (the host's, the driver's, the
//! last run id and whether to acknowledge the end of a run), so a restored
//! guest in the middle of a run sees the same config space and its hints
//! are still matched against the right run.
//!
//! Inflated pages need no state of their own: they are holes in the
//! snapshot's memory file (released pages read as zeros and zero pages are
//! not written), and the driver's own list of them lives in guest memory.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::device::{Balloon, BalloonHandle, BalloonSettings};
use super::request::GuestStats;
use super::{HintState, ReleaseCounters};
use crate::host::lock;
use crate::persist::Persist;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    pub target_pages: u32,
    pub actual_pages: u32,
    pub stats_polling_interval_s: u16,
    pub deflate_on_oom: bool,
    pub free_page_reporting: bool,
    pub free_page_hinting: bool,
    pub hint: HintState,
    /// The guest's last statistics, as JSON: their serde shape skips unset
    /// fields, which a binary format cannot carry.
    pub stats_json: Option<String>,
    pub counters: ReleaseCounters,
    /// Head index of the statistics buffer the device held.
    pub held_stats: Option<u16>,
}

#[derive(Debug, thiserror::Error)]
pub enum BalloonStateError {
    #[error("the snapshot's balloon has {field} {saved}, this VM's configuration {actual}")]
    Mismatch {
        field: &'static str,
        saved: String,
        actual: String,
    },
    #[error("virtio-balloon: {0}")]
    Device(#[from] std::io::Error),
}

impl BalloonHandle {
    /// The device's state; take it after the device was quiesced.
    pub fn save(&self) -> BalloonState {
        let shared = self.shared_block();
        let st = lock(&shared.state);
        BalloonState {
            target_pages: st.target_pages,
            actual_pages: st.actual_pages,
            stats_polling_interval_s: st.stats_interval_s,
            deflate_on_oom: shared.deflate_on_oom,
            free_page_reporting: shared.free_page_reporting,
            free_page_hinting: shared.free_page_hinting,
            hint: st.hint,
            stats_json: st
                .stats
                .as_ref()
                .and_then(|(s, _)| serde_json::to_string(s).ok()),
            counters: st.counters,
            held_stats: st.restored_held_stats,
        }
    }
}

impl Balloon {
    /// The balloon the VM's configuration describes, with `state` applied.
    /// The features must match (they fix the queues the driver set up).
    pub fn restore(
        settings: BalloonSettings,
        state: &BalloonState,
    ) -> Result<Self, BalloonStateError> {
        let mismatch = |field, saved: String, actual: String| {
            Err(BalloonStateError::Mismatch {
                field,
                saved,
                actual,
            })
        };
        if state.deflate_on_oom != settings.deflate_on_oom {
            return mismatch(
                "deflate_on_oom",
                state.deflate_on_oom.to_string(),
                settings.deflate_on_oom.to_string(),
            );
        }
        if state.free_page_reporting != settings.free_page_reporting {
            return mismatch(
                "free_page_reporting",
                state.free_page_reporting.to_string(),
                settings.free_page_reporting.to_string(),
            );
        }
        if state.free_page_hinting != settings.free_page_hinting {
            return mismatch(
                "free_page_hinting",
                state.free_page_hinting.to_string(),
                settings.free_page_hinting.to_string(),
            );
        }
        // Statistics on or off decides whether the stats queue exists.
        if (state.stats_polling_interval_s == 0) != (settings.stats_polling_interval_s == 0) {
            return mismatch(
                "stats_polling_interval_s",
                state.stats_polling_interval_s.to_string(),
                settings.stats_polling_interval_s.to_string(),
            );
        }
        let target_mib = u64::from(state.target_pages) >> (20 - super::request::PAGE_SHIFT);
        if target_mib > settings.mem_mib {
            return mismatch(
                "a target in MiB",
                target_mib.to_string(),
                format!("memory of {} MiB", settings.mem_mib),
            );
        }
        let balloon = Balloon::new(settings)?;
        {
            let shared = balloon.handle();
            let shared = shared.shared_block();
            let mut st = lock(&shared.state);
            st.target_pages = state.target_pages;
            st.actual_pages = state.actual_pages;
            st.stats_interval_s = state.stats_polling_interval_s;
            st.stats = state
                .stats_json
                .as_deref()
                .and_then(|j| serde_json::from_str::<GuestStats>(j).ok())
                .map(|s| (s, SystemTime::now()));
            st.counters = state.counters;
            st.restored_held_stats = state.held_stats;
            st.hint = state.hint;
        }
        Ok(balloon)
    }
}

impl Persist for Balloon {
    type State = BalloonState;
    /// The balloon the VM's configuration describes.
    type Args = BalloonSettings;
    type Error = BalloonStateError;

    /// See [`BalloonHandle::save`]: quiesce the device first.
    fn save(&self) -> BalloonState {
        self.handle().save()
    }

    fn restore(settings: BalloonSettings, state: &BalloonState) -> Result<Self, Self::Error> {
        Balloon::restore(settings, state)
    }
}
