//! The virtio-net device model: what the guest sees (features, config
//! space) and its activation, which starts the worker thread with the tap
//! opened when the device was made.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_UFO, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_HOST_UFO,
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS,
    VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::tap::{NetBackend, Tap};
use super::worker::{NetCounters, NetWorker, WorkerState};
use super::{NetError, QUEUE_SIZE, RX_QUEUE, TX_QUEUE};
use crate::config::{MacAddr, NetworkInterfaceConfig, RateLimiterConfig};
use crate::devices::virtio::blk::device::read_config_bytes;
use crate::devices::virtio::worker::Worker;
use crate::devices::virtio::{
    device_type, ActivateContext, ActivateError, VirtioDevice, VirtioInterrupt,
};
use crate::host::lock;
use crate::mmds::stack::MmdsStack;
use crate::rate_limiter::RateLimiter;

/// `struct virtio_net_config` up to `mtu`: mac[6], status, max_virtqueue_pairs, mtu.
pub const CONFIG_LEN: usize = 12;

/// The config space, shared with the [`NetHandle`] (a clone's new MAC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfigSpace {
    pub mac: [u8; 6],
    pub mtu: u16,
}

impl NetConfigSpace {
    fn bytes(&self) -> [u8; CONFIG_LEN] {
        let mut b = [0u8; CONFIG_LEN];
        b[0..6].copy_from_slice(&self.mac);
        #[allow(clippy::cast_possible_truncation, reason = "VIRTIO_NET_S_LINK_UP is 1")]
        let link_up = VIRTIO_NET_S_LINK_UP as u16;
        b[6..8].copy_from_slice(&link_up.to_le_bytes());
        // One rx/tx pair (meaningful only with VIRTIO_NET_F_MQ, never offered).
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
        b[10..12].copy_from_slice(&self.mtu.to_le_bytes());
        b
    }
}

/// An activated device's interrupt and queue kicks, for the handle.
struct LiveNet {
    interrupt: Arc<VirtioInterrupt>,
    kicks: Vec<EventFd>,
}

/// The parts of the device the VMM reaches while it runs.
#[derive(Clone)]
struct Shared {
    config: Arc<Mutex<NetConfigSpace>>,
    rx_limiter: Arc<Mutex<RateLimiter>>,
    tx_limiter: Arc<Mutex<RateLimiter>>,
    live: Arc<Mutex<Option<LiveNet>>>,
    counters: Arc<NetCounters>,
}

/// A virtio-net device on a host tap.
pub struct Net {
    iface_id: String,
    tap_name: String,
    avail_features: u64,
    shared: Shared,
    /// The tap, lent to the worker while the device is active.
    backend: Option<Box<dyn NetBackend>>,
    worker: Option<Worker<WorkerState>>,
    /// Where the guest's MMDS requests go, if this interface routes them.
    mmds: Option<Arc<Mutex<MmdsStack>>>,
}

/// The features every interface offers; MAC and MTU are added when configured.
fn base_features() -> u64 {
    [
        VIRTIO_F_VERSION_1,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_GUEST_UFO,
        VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
        VIRTIO_NET_F_HOST_UFO,
        VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_NET_F_STATUS,
    ]
    .iter()
    .fold(0u64, |f, &bit| f | 1 << bit)
}

impl Net {
    /// Opens the tap `cfg.host_dev_name` and makes the device `cfg` describes.
    pub fn open(cfg: &NetworkInterfaceConfig) -> Result<Net, NetError> {
        let tap = Tap::open(&cfg.host_dev_name).map_err(|source| NetError::Tap {
            iface_id: cfg.iface_id.clone(),
            source,
        })?;
        Self::with_backend(cfg, Box::new(tap))
    }

    /// The device over any backend (tests use a socketpair).
    pub fn with_backend(
        cfg: &NetworkInterfaceConfig,
        backend: Box<dyn NetBackend>,
    ) -> Result<Net, NetError> {
        let timer = |source| NetError::Timer {
            iface_id: cfg.iface_id.clone(),
            source,
        };
        let rx = RateLimiter::new(cfg.rx_rate_limiter.as_ref()).map_err(timer)?;
        let tx = RateLimiter::new(cfg.tx_rate_limiter.as_ref()).map_err(timer)?;
        let mut avail_features = base_features();
        if cfg.guest_mac.is_some() {
            avail_features |= 1 << VIRTIO_NET_F_MAC;
        }
        if cfg.mtu.is_some() {
            avail_features |= 1 << VIRTIO_NET_F_MTU;
        }
        Ok(Net {
            iface_id: cfg.iface_id.clone(),
            tap_name: cfg.host_dev_name.clone(),
            avail_features,
            shared: Shared {
                config: Arc::new(Mutex::new(NetConfigSpace {
                    mac: cfg.guest_mac.unwrap_or_default().0,
                    mtu: cfg.mtu.unwrap_or(0),
                })),
                rx_limiter: Arc::new(Mutex::new(rx)),
                tx_limiter: Arc::new(Mutex::new(tx)),
                live: Arc::new(Mutex::new(None)),
                counters: Arc::new(NetCounters::default()),
            },
            backend: Some(backend),
            worker: None,
            mmds: None,
        })
    }

    /// Routes the guest's MMDS requests on this interface to `stack`.
    pub fn set_mmds(&mut self, stack: MmdsStack) {
        self.mmds = Some(Arc::new(Mutex::new(stack)));
    }

    pub fn iface_id(&self) -> &str {
        &self.iface_id
    }

    pub fn tap_name(&self) -> &str {
        &self.tap_name
    }

    pub fn config_space(&self) -> NetConfigSpace {
        *lock(&self.shared.config)
    }

    pub(super) fn set_config_space(&mut self, c: NetConfigSpace) {
        *lock(&self.shared.config) = c;
    }

    pub(super) fn limiters(&self) -> (&Arc<Mutex<RateLimiter>>, &Arc<Mutex<RateLimiter>>) {
        (&self.shared.rx_limiter, &self.shared.tx_limiter)
    }

    pub(super) fn set_limiters(&mut self, rx: RateLimiter, tx: RateLimiter) {
        *lock(&self.shared.rx_limiter) = rx;
        *lock(&self.shared.tx_limiter) = tx;
    }

    /// A handle for the VMM: PATCH's limits, a clone's MAC, counters.
    pub fn handle(&self) -> NetHandle {
        NetHandle {
            iface_id: self.iface_id.clone(),
            has_mac: self.avail_features & (1 << VIRTIO_NET_F_MAC) != 0,
            shared: self.shared.clone(),
        }
    }

    fn stop_worker(&mut self) {
        *lock(&self.shared.live) = None;
        if let Some(worker) = self.worker.take() {
            match worker.stop() {
                Some(state) => self.backend = Some(state.backend),
                None => tracing::error!("virtio-net {}: worker thread panicked", self.iface_id),
            }
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        device_type::NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_space().bytes(), offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_worker();
        if ctx.queues.len() != 2 || ctx.queue_events.len() != 2 {
            return Err(ActivateError::QueueCount {
                expected: 2,
                got: ctx.queues.len().min(ctx.queue_events.len()),
            });
        }
        if let Some(i) = ctx.queues.iter().position(|q| !q.ready()) {
            return Err(ActivateError::Device(format!(
                "virtio-net {}: the driver did not enable queue {i}",
                self.iface_id
            )));
        }
        let backend = self.backend.take().ok_or_else(|| {
            ActivateError::Device(format!(
                "virtio-net {}: its tap was lost with a worker that panicked",
                self.iface_id
            ))
        })?;
        let kicks = ctx
            .queue_events
            .iter()
            .map(EventFd::try_clone)
            .collect::<Result<Vec<_>, _>>()
            .map_err(ActivateError::Worker)?;
        let live = LiveNet {
            interrupt: ctx.interrupt.clone(),
            kicks,
        };
        let worker = NetWorker {
            mem: ctx.mem,
            interrupt: ctx.interrupt,
            queues: ctx.queues,
            queue_events: ctx.queue_events,
            backend,
            rx_limiter: self.shared.rx_limiter.clone(),
            tx_limiter: self.shared.tx_limiter.clone(),
            counters: self.shared.counters.clone(),
            acked_features: ctx.acked_features,
            tag: format!("virtio-net {}", self.iface_id),
            mmds: self.mmds.clone(),
        };
        let mut name = format!("net-{}", self.iface_id);
        while name.len() > 15 {
            name.pop();
        }
        // The spawner starts it under the VMM filter: the tap's offload
        // ioctl runs there, never on the activating vCPU thread.
        let worker =
            Worker::spawn(&name, move |stop| worker.run(stop)).map_err(ActivateError::Worker)?;
        self.worker = Some(worker);
        *lock(&self.shared.live) = Some(live);
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_worker();
    }

    fn quiesce(&mut self) -> Result<Vec<Queue>, ActivateError> {
        *lock(&self.shared.live) = None;
        let worker = self.worker.take().ok_or_else(|| {
            ActivateError::Device(format!("virtio-net {} is not active", self.iface_id))
        })?;
        // A frame read from the tap but not yet in the guest is lost, as on
        // a wire; every chain the worker took is on a used ring or back on
        // the avail ring.
        let state = worker.stop().ok_or_else(|| {
            ActivateError::Device(format!("virtio-net {}: worker panicked", self.iface_id))
        })?;
        self.backend = Some(state.backend);
        Ok(state.queues)
    }
}

/// The VMM's handle on one interface.
#[derive(Clone)]
pub struct NetHandle {
    iface_id: String,
    has_mac: bool,
    shared: Shared,
}

impl NetHandle {
    pub fn iface_id(&self) -> &str {
        &self.iface_id
    }

    /// `PATCH /network-interfaces/{id}`: new limits (a limiter left out is
    /// kept); both queues are kicked so the worker re-checks them now.
    pub fn update_rate_limiters(
        &self,
        rx: Option<&RateLimiterConfig>,
        tx: Option<&RateLimiterConfig>,
    ) {
        if let Some(rx) = rx {
            lock(&self.shared.rx_limiter).update(rx);
        }
        if let Some(tx) = tx {
            lock(&self.shared.tx_limiter).update(tx);
        }
        if let Some(live) = lock(&self.shared.live).as_ref() {
            for k in &live.kicks {
                let _ = k.write(1);
            }
        }
    }

    /// The limits in force (for `GET /vm/config`).
    pub fn rate_limiters(&self) -> (Option<RateLimiterConfig>, Option<RateLimiterConfig>) {
        (
            lock(&self.shared.rx_limiter).config(),
            lock(&self.shared.tx_limiter).config(),
        )
    }

    /// A clone's new MAC: written into the config space, and the driver
    /// told through a config-change interrupt if the device is active.
    pub fn set_mac(&self, mac: MacAddr) {
        lock(&self.shared.config).mac = mac.0;
        if let Some(live) = lock(&self.shared.live).as_ref() {
            live.interrupt.signal_config_change();
        }
    }

    pub fn mac(&self) -> Option<MacAddr> {
        self.has_mac.then(|| MacAddr(lock(&self.shared.config).mac))
    }

    /// (rx frames, tx frames, rx dropped, tx dropped, bad chains).
    pub fn counters(&self) -> [u64; 5] {
        let c = &self.shared.counters;
        [
            &c.rx_frames,
            &c.tx_frames,
            &c.rx_dropped,
            &c.tx_dropped,
            &c.bad_chains,
        ]
        .map(|a| a.load(Ordering::Relaxed))
    }
}

// Kept in step with the queue indices the worker uses.
const _: () = assert!(RX_QUEUE == 0 && TX_QUEUE == 1);
