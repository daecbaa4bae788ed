//! The balloon device model and the VMM's handle on it.
//!
//! [`Balloon`] is what the transport sees; [`BalloonHandle`] is what the VMM
//! keeps to change the target and read statistics while the VM runs. Both
//! share one [`Shared`](super::Shared) block: the config space (target, actual), the last
//! statistics, the polling interval and, once activated, the interrupt.
//!
//! The worker (`worker.rs`) serves every queue on one thread of its own.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::request::{GuestStats, PAGE_SHIFT};
use super::worker::{BalloonWorker, Stopped};
use super::{
    HintState, ReleaseCounters, Shared, State, CMD_ID_DONE, CMD_ID_STOP, F_DEFLATE_ON_OOM,
    F_FREE_PAGE_HINT, F_MUST_TELL_HOST, F_REPORTING, F_STATS_VQ,
};
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{device_type, ActivateContext, ActivateError, VirtioDevice};
use crate::host::lock;

/// Entries per queue.
pub const QUEUE_SIZE: u16 = 256;
/// Size of the config space: num_pages, actual, free_page_hint_cmd_id, poison_val.
const CONFIG_SIZE: usize = 16;
const CONFIG_ACTUAL: u64 = 4;

/// The first id a hinting run gets (0 and 1 are the commands above).
const CMD_ID_FIRST_RUN: u32 = 2;
/// Pages per MiB, at the balloon's 4 KiB page size.
const PAGES_PER_MIB_SHIFT: u32 = 20 - PAGE_SHIFT;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BalloonError {
    #[error("amount_mib {amount} exceeds the guest's memory ({mem} MiB)")]
    TooLarge { amount: u64, mem: u64 },
    #[error(
        "statistics were {0} when the balloon was configured; the polling interval can be \
         changed but not switched between 0 and non-zero"
    )]
    StatsStateChange(&'static str),
    #[error(
        "balloon statistics are disabled: configure the balloon with stats_polling_interval_s > 0"
    )]
    StatsDisabled,
    #[error(
        "balloon free page hinting is not enabled: configure the balloon with \
         free_page_hinting: true before InstanceStart"
    )]
    HintingNotEnabled,
    #[error("the balloon device is not activated yet (the guest's driver has not set it up)")]
    NotActivated,
}

/// What the device is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalloonSettings {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    pub stats_polling_interval_s: u16,
    pub free_page_reporting: bool,
    pub free_page_hinting: bool,
    /// Guest RAM, bounding the target.
    pub mem_mib: u64,
}

/// `GET /balloon/hinting/status`, Firecracker's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HintingStatus {
    pub host_cmd: u32,
    pub guest_cmd: Option<u32>,
}

/// The VMM's hold on a balloon: target, actual, statistics.
#[derive(Clone)]
pub struct BalloonHandle(Arc<Shared>);

/// `GET /balloon`: Firecracker's fields, plus spore's view of progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BalloonStatus {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    pub stats_polling_interval_s: u16,
    pub free_page_reporting: bool,
    pub free_page_hinting: bool,
    pub target_pages: u32,
    pub actual_pages: u32,
    pub target_mib: u32,
    pub actual_mib: u32,
    /// When the target was last changed (Unix ms), if it was at run time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_updated_ms: Option<u64>,
    /// When the driver last changed `actual` (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual_updated_ms: Option<u64>,
}

/// `GET /balloon/statistics`, Firecracker's shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BalloonStatistics {
    pub target_pages: u32,
    pub actual_pages: u32,
    pub target_mib: u32,
    pub actual_mib: u32,
    #[serde(flatten)]
    pub stats: GuestStats,
    /// spore extension: when the guest last reported, in ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_update_ms: Option<u64>,
    /// spore extension: what was released on the host.
    pub host: ReleaseCounters,
}

impl BalloonHandle {
    /// Changes the target and tells the driver (config-change interrupt).
    pub fn set_target_mib(&self, amount_mib: u32) -> Result<(), BalloonError> {
        let s = &self.0;
        if u64::from(amount_mib) > s.mem_mib {
            return Err(BalloonError::TooLarge {
                amount: amount_mib.into(),
                mem: s.mem_mib,
            });
        }
        let interrupt = {
            let mut st = lock(&s.state);
            st.target_pages = amount_mib << PAGES_PER_MIB_SHIFT;
            st.target_set_at = Some(SystemTime::now());
            st.interrupt.clone()
        };
        if let Some(i) = interrupt {
            i.signal_config_change();
        }
        Ok(())
    }

    /// Changes the statistics polling interval; 0 ↔ non-zero is refused
    /// (the stats queue exists only if it was non-zero at configuration).
    pub fn set_stats_interval(&self, interval_s: u16) -> Result<(), BalloonError> {
        {
            let mut st = lock(&self.0.state);
            match (st.stats_interval_s == 0, interval_s == 0) {
                (true, false) => return Err(BalloonError::StatsStateChange("disabled")),
                (false, true) => return Err(BalloonError::StatsStateChange("enabled")),
                _ => st.stats_interval_s = interval_s,
            }
        }
        if let Err(e) = self.0.settings_evt.write(1) {
            tracing::warn!("virtio-balloon: cannot wake the worker: {e}");
        }
        Ok(())
    }

    pub fn status(&self) -> BalloonStatus {
        let st = lock(&self.0.state);
        BalloonStatus {
            amount_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            deflate_on_oom: self.0.deflate_on_oom,
            stats_polling_interval_s: st.stats_interval_s,
            free_page_reporting: self.0.free_page_reporting,
            free_page_hinting: self.0.free_page_hinting,
            target_pages: st.target_pages,
            actual_pages: st.actual_pages,
            target_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            actual_mib: st.actual_pages >> PAGES_PER_MIB_SHIFT,
            target_updated_ms: st.target_set_at.and_then(unix_ms),
            actual_updated_ms: st.actual_set_at.and_then(unix_ms),
        }
    }

    pub fn statistics(&self) -> Result<BalloonStatistics, BalloonError> {
        let st = lock(&self.0.state);
        if st.stats_interval_s == 0 {
            return Err(BalloonError::StatsDisabled);
        }
        let (stats, when) = st.stats.clone().unzip();
        Ok(BalloonStatistics {
            target_pages: st.target_pages,
            actual_pages: st.actual_pages,
            target_mib: st.target_pages >> PAGES_PER_MIB_SHIFT,
            actual_mib: st.actual_pages >> PAGES_PER_MIB_SHIFT,
            stats: stats.unwrap_or_default(),
            last_update_ms: when.and_then(unix_ms),
            host: st.counters,
        })
    }

    /// `PATCH /balloon/hinting/start`: asks the driver for a new hinting
    /// run (a new command id in the config space). With `ack_on_stop`, the
    /// device answers DONE as soon as the driver reports the run finished,
    /// so the guest gets its hinted pages back without a `stop`.
    pub fn start_hinting(&self, ack_on_stop: bool) -> Result<(), BalloonError> {
        if !self.0.free_page_hinting {
            return Err(BalloonError::HintingNotEnabled);
        }
        self.set_host_cmd(|hint| {
            let mut id = hint.last_run_id.wrapping_add(1);
            if id < CMD_ID_FIRST_RUN {
                id = CMD_ID_FIRST_RUN;
            }
            hint.last_run_id = id;
            hint.ack_on_stop = ack_on_stop;
            id
        })
    }

    /// `PATCH /balloon/hinting/stop`: ends the run and lets the guest reuse
    /// the pages it hinted (DONE, as Firecracker answers a stop). Hints that
    /// arrive afterwards are not released.
    pub fn stop_hinting(&self) -> Result<(), BalloonError> {
        if !self.0.free_page_hinting {
            return Err(BalloonError::HintingNotEnabled);
        }
        self.set_host_cmd(|_| CMD_ID_DONE)
    }

    /// `GET /balloon/hinting/status`: the host's and the driver's last command.
    pub fn hinting_status(&self) -> Result<HintingStatus, BalloonError> {
        if !self.0.free_page_hinting {
            return Err(BalloonError::HintingNotEnabled);
        }
        let hint = lock(&self.0.state).hint;
        Ok(HintingStatus {
            host_cmd: hint.host_cmd,
            guest_cmd: hint.guest_cmd,
        })
    }

    /// Sets the command the config space shows and tells the driver. The
    /// driver must be there (as in Firecracker): a command nobody reads would
    /// only go stale.
    fn set_host_cmd(&self, next: impl FnOnce(&mut HintState) -> u32) -> Result<(), BalloonError> {
        let interrupt = {
            let mut st = lock(&self.0.state);
            let interrupt = st.interrupt.clone().ok_or(BalloonError::NotActivated)?;
            let cmd = next(&mut st.hint);
            st.hint.host_cmd = cmd;
            interrupt
        };
        interrupt.signal_config_change();
        Ok(())
    }

    pub(super) fn shared_block(&self) -> &Arc<Shared> {
        &self.0
    }

    #[cfg(test)]
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.0
    }

    pub fn counters(&self) -> ReleaseCounters {
        lock(&self.0.state).counters
    }
}

fn unix_ms(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
}

/// A virtio balloon (device id 5).
pub struct Balloon {
    shared: Arc<Shared>,
    features: u64,
    queue_sizes: Vec<u16>,
    worker: Option<Worker<Stopped>>,
}

impl Balloon {
    pub fn new(settings: BalloonSettings) -> Result<Self, std::io::Error> {
        if u64::from(settings.amount_mib) > settings.mem_mib {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                BalloonError::TooLarge {
                    amount: settings.amount_mib.into(),
                    mem: settings.mem_mib,
                },
            ));
        }
        let mut features =
            1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX | F_MUST_TELL_HOST;
        let mut queues = 2;
        if settings.stats_polling_interval_s > 0 {
            features |= F_STATS_VQ;
            queues += 1;
        }
        if settings.deflate_on_oom {
            features |= F_DEFLATE_ON_OOM;
        }
        if settings.free_page_hinting {
            features |= F_FREE_PAGE_HINT;
            queues += 1;
        }
        if settings.free_page_reporting {
            features |= F_REPORTING;
            queues += 1;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                target_pages: settings.amount_mib << PAGES_PER_MIB_SHIFT,
                actual_pages: 0,
                stats_interval_s: settings.stats_polling_interval_s,
                stats: None,
                target_set_at: None,
                actual_set_at: None,
                counters: ReleaseCounters::default(),
                interrupt: None,
                restored_held_stats: None,
                hint: HintState::default(),
            }),
            deflate_on_oom: settings.deflate_on_oom,
            free_page_reporting: settings.free_page_reporting,
            free_page_hinting: settings.free_page_hinting,
            mem_mib: settings.mem_mib,
            settings_evt: EventFd::new(EFD_NONBLOCK)?,
        });
        Ok(Self {
            shared,
            features,
            queue_sizes: vec![QUEUE_SIZE; queues],
            worker: None,
        })
    }

    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle(self.shared.clone())
    }

    fn stop_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            if w.stop().is_none() {
                tracing::error!("virtio-balloon: worker thread panicked");
            }
        }
        lock(&self.shared.state).interrupt = None;
    }

    fn config_bytes(&self) -> [u8; CONFIG_SIZE] {
        let st = lock(&self.shared.state);
        let mut c = [0u8; CONFIG_SIZE];
        c[..4].copy_from_slice(&st.target_pages.to_le_bytes());
        c[4..8].copy_from_slice(&st.actual_pages.to_le_bytes());
        c[8..12].copy_from_slice(&st.hint.host_cmd.to_le_bytes());
        c
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        device_type::BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn avail_features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.config_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// Only `actual` is writable: the driver reports how many pages it holds.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut st = lock(&self.shared.state);
        let mut actual = st.actual_pages.to_le_bytes();
        let mut touched = false;
        for (i, &b) in data.iter().enumerate() {
            let Some(o) = offset.checked_add(i as u64) else {
                break;
            };
            if let Some(slot) = o
                .checked_sub(CONFIG_ACTUAL)
                .and_then(|k| usize::try_from(k).ok())
                .and_then(|k| actual.get_mut(k))
            {
                *slot = b;
                touched = true;
            } else {
                tracing::debug!("virtio-balloon: write to read-only config byte {o} ignored");
            }
        }
        let actual = u32::from_le_bytes(actual);
        if touched && actual != st.actual_pages {
            st.actual_pages = actual;
            st.actual_set_at = Some(SystemTime::now());
        }
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        let worker = BalloonWorker::new(ctx, self.shared.clone())?;
        let epoll = worker.epoll().map_err(ActivateError::Worker)?;
        lock(&self.shared.state).interrupt = Some(worker.interrupt().clone());
        let w = Worker::spawn("virtio-balloon", move |stop| worker.run(epoll, stop));
        match w {
            Ok(w) => {
                self.worker = Some(w);
                Ok(())
            }
            Err(e) => {
                lock(&self.shared.state).interrupt = None;
                Err(ActivateError::Worker(e))
            }
        }
    }

    fn reset(&mut self) {
        self.stop_worker();
        let mut st = lock(&self.shared.state);
        st.restored_held_stats = None;
        // The driver is gone, and its hinted pages with it: no run is on.
        st.hint.host_cmd = CMD_ID_STOP;
        st.hint.guest_cmd = None;
    }

    /// Stops the worker for a snapshot, keeping the statistics buffer it
    /// holds (the driver sends no other until that one comes back).
    fn quiesce(&mut self) -> Result<Vec<virtio_queue::Queue>, ActivateError> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| ActivateError::Device("virtio-balloon is not active".into()))?;
        let stopped = worker
            .stop()
            .ok_or_else(|| ActivateError::Device("virtio-balloon worker panicked".into()))?;
        let mut st = lock(&self.shared.state);
        st.interrupt = None;
        st.restored_held_stats = stopped.held_stats;
        Ok(stopped.queues)
    }
}
