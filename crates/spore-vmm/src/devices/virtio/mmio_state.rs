//! Snapshot state of a virtio-mmio transport: its registers, every queue's
//! configuration and ring positions, the interrupt status, and the device's
//! config space (which pins what the device is: a disk's capacity, a vsock
//! CID).
//!
//! A snapshot first [`MmioTransport::quiesce`]s the device (its worker stops
//! and hands back the live queues), saves, and [`MmioTransport::resume`]s it.
//! A restore builds the same device afresh and applies the state; once the
//! VM's irqchip and vCPUs are restored too, [`MmioTransport::finish_restore`]
//! re-activates a device the driver had running with the saved queues.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};

use super::{MmioTransport, DRIVER_OK, FAILED, NEEDS_RESET};
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};

/// Bytes of device config space kept to recognise the device on restore.
const CONFIG_BYTES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TransportStateError {
    #[error("snapshot has virtio device type {saved}, this VM has type {actual} there")]
    DeviceType { saved: u32, actual: u32 },
    #[error("virtio device type {device_type}: its config space differs from the snapshot's (a disk of another size, another vsock CID?)")]
    Config { device_type: u32 },
    #[error("virtio device type {device_type}: snapshot has {saved} queues, device has {actual}")]
    QueueCount {
        device_type: u32,
        saved: usize,
        actual: usize,
    },
    #[error("virtio device type {device_type}, queue {index}: {detail}")]
    Queue {
        device_type: u32,
        index: usize,
        detail: String,
    },
    #[error("virtio device type {device_type}: {detail}")]
    Device { device_type: u32, detail: String },
}

/// One virtqueue (mirrors virtio-queue's `QueueState`, which has no serde).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
}

impl From<QueueState> for QueueSnapshot {
    fn from(q: QueueState) -> Self {
        Self {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
        }
    }
}

impl From<QueueSnapshot> for QueueState {
    fn from(q: QueueSnapshot) -> Self {
        QueueState {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioTransportState {
    pub device_type: u32,
    pub config: Vec<u8>,
    pub status: u32,
    pub activated: bool,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub acked_features: u64,
    pub acked_unknown_features: bool,
    pub queue_sel: u32,
    pub shm_sel: u32,
    pub config_generation: u32,
    pub interrupt_status: u32,
    pub queues: Vec<QueueSnapshot>,
}

fn config_bytes(device: &dyn VirtioDevice) -> Vec<u8> {
    let mut config = vec![0u8; CONFIG_BYTES];
    device.read_config(0, &mut config);
    config
}

impl MmioTransport {
    /// Stops an activated device's worker and takes back its live queues,
    /// so that [`Self::save`] sees where the rings really are.
    pub fn quiesce(&mut self) -> Result<(), TransportStateError> {
        if !self.activated {
            return Ok(());
        }
        let device_type = self.device.device_type();
        let queues = self
            .device
            .quiesce()
            .map_err(|e| TransportStateError::Device {
                device_type,
                detail: e.to_string(),
            })?;
        if queues.len() != self.queues.len() {
            return Err(TransportStateError::QueueCount {
                device_type,
                saved: queues.len(),
                actual: self.queues.len(),
            });
        }
        self.queues = queues;
        // Until resumed, the device is stopped; a failed resume must not
        // leave `activated` claiming otherwise.
        self.activated = false;
        self.status |= DRIVER_OK;
        Ok(())
    }

    /// Restarts a device stopped by [`Self::quiesce`]. Returns false if the
    /// device should run but could not be re-activated.
    pub fn resume(&mut self) -> bool {
        if self.should_run() && !self.activated {
            self.activate();
        }
        self.activated || !self.should_run()
    }

    /// The transport's state. Call on a quiesced device (or one never
    /// activated): a running worker owns newer queue positions.
    pub fn save(&self) -> MmioTransportState {
        MmioTransportState {
            device_type: self.device.device_type(),
            config: config_bytes(self.device.as_ref()),
            status: self.status,
            activated: self.should_run(),
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            acked_unknown_features: self.acked_unknown_features,
            queue_sel: self.queue_sel,
            shm_sel: self.shm_sel,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.status(),
            queues: self.queues.iter().map(|q| q.state().into()).collect(),
        }
    }

    /// Builds the transport for a freshly built `device` and applies `state`.
    /// The device stays stopped until [`Self::finish_restore`].
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<VirtioInterrupt>,
        state: &MmioTransportState,
    ) -> Result<Self, TransportStateError> {
        let device_type = device.device_type();
        if device_type != state.device_type {
            return Err(TransportStateError::DeviceType {
                saved: state.device_type,
                actual: device_type,
            });
        }
        if config_bytes(device.as_ref()) != state.config {
            return Err(TransportStateError::Config { device_type });
        }
        let mut t = Self::new(device, mem, interrupt).map_err(|e| TransportStateError::Device {
            device_type,
            detail: e.to_string(),
        })?;
        if state.queues.len() != t.queues.len() {
            return Err(TransportStateError::QueueCount {
                device_type,
                saved: state.queues.len(),
                actual: t.queues.len(),
            });
        }
        for (index, (q, saved)) in t.queues.iter_mut().zip(&state.queues).enumerate() {
            if saved.max_size != q.max_size() {
                return Err(TransportStateError::Queue {
                    device_type,
                    index,
                    detail: format!(
                        "maximum size {} in the snapshot, {} here",
                        saved.max_size,
                        q.max_size()
                    ),
                });
            }
            *q = Queue::try_from(QueueState::from(*saved)).map_err(|e| {
                TransportStateError::Queue {
                    device_type,
                    index,
                    detail: e.to_string(),
                }
            })?;
        }
        t.status = state.status;
        t.device_features_sel = state.device_features_sel;
        t.driver_features_sel = state.driver_features_sel;
        t.acked_features = state.acked_features;
        t.acked_unknown_features = state.acked_unknown_features;
        t.queue_sel = state.queue_sel;
        t.shm_sel = state.shm_sel;
        t.config_generation = state.config_generation;
        t.interrupt.restore_status(state.interrupt_status);
        if state.activated != t.should_run() {
            return Err(TransportStateError::Device {
                device_type,
                detail: "the saved device status and activation state disagree".into(),
            });
        }
        Ok(t)
    }

    /// Whether the driver set the device running (DRIVER_OK, no failure).
    fn should_run(&self) -> bool {
        self.status & DRIVER_OK != 0 && self.status & (FAILED | NEEDS_RESET) == 0
    }

    /// Second half of a restore, called once the VM's interrupt controllers
    /// and vCPUs hold their restored state: re-activates a device the driver
    /// had running with the saved queues (its worker may raise an interrupt
    /// at once, which an irqchip still in its reset state would drop: a lost
    /// interrupt hangs a queue for good with EVENT_IDX), lets the device
    /// react to the restore (vsock resets its transport), and raises the
    /// interrupt again if one was pending at the snapshot.
    pub fn finish_restore(&mut self) -> Result<(), TransportStateError> {
        let device_type = self.device.device_type();
        if self.should_run() && !self.activated {
            self.activate();
            if !self.activated {
                return Err(TransportStateError::Device {
                    device_type,
                    detail: "cannot re-activate the device with the snapshot's queues".into(),
                });
            }
            self.device.restored();
        }
        self.interrupt.resend_pending();
        Ok(())
    }
}

impl crate::persist::Persist for MmioTransport {
    type State = MmioTransportState;
    type Args = (Box<dyn VirtioDevice>, GuestMemoryMmap, Arc<VirtioInterrupt>);
    type Error = TransportStateError;

    /// See [`MmioTransport::save`]: quiesce the device first.
    fn save(&self) -> MmioTransportState {
        MmioTransport::save(self)
    }

    fn restore(
        (device, mem, interrupt): Self::Args,
        state: &MmioTransportState,
    ) -> Result<Self, TransportStateError> {
        MmioTransport::restore(device, mem, interrupt, state)
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::*;
    use crate::devices::virtio::rng::Rng;
    use crate::devices::wake::GuestWake;

    fn transport(mem: &GuestMemoryMmap) -> MmioTransport {
        let wake = Arc::new(GuestWake::new().unwrap());
        let irq = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            wake,
        ));
        MmioTransport::new(Box::new(Rng::new(None).unwrap()), mem.clone(), irq).unwrap()
    }

    fn w(t: &mut MmioTransport, off: u64, v: u32) {
        crate::devices::bus::BusDevice::write(t, off, &v.to_le_bytes());
    }

    #[test]
    fn running_device_round_trips() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut t = transport(&mem);
        // Driver bring-up: ACK, DRIVER, features (VERSION_1), FEATURES_OK, queue 0, DRIVER_OK.
        w(&mut t, 0x70, 1);
        w(&mut t, 0x70, 3);
        w(&mut t, 0x24, 1);
        w(&mut t, 0x20, 1);
        w(&mut t, 0x70, 11);
        w(&mut t, 0x30, 0);
        w(&mut t, 0x38, 16);
        w(&mut t, 0x80, 0x1000);
        w(&mut t, 0x90, 0x2000);
        w(&mut t, 0xa0, 0x3000);
        w(&mut t, 0x44, 1);
        w(&mut t, 0x70, 15);
        assert!(t.is_activated());
        t.quiesce().unwrap();
        let saved = t.save();
        t.resume();
        assert!(t.is_activated());
        assert!(saved.activated);
        assert_eq!(saved.queues[0].size, 16);
        assert_eq!(saved.queues[0].desc_table, 0x1000);
        let bytes = bincode::serialize(&saved).unwrap();
        let back: MmioTransportState = bincode::deserialize(&bytes).unwrap();
        let wake = Arc::new(GuestWake::new().unwrap());
        let irq = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            wake,
        ));
        let mut r =
            MmioTransport::restore(Box::new(Rng::new(None).unwrap()), mem.clone(), irq, &back)
                .unwrap();
        // Activation waits for the second half, once the irqchip is restored.
        assert!(!r.is_activated());
        r.finish_restore().unwrap();
        assert!(r.is_activated());
        assert_eq!(r.save(), saved);
    }

    #[test]
    fn mismatched_device_is_refused() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let t = transport(&mem);
        let mut s = t.save();
        s.device_type = 2;
        let wake = Arc::new(GuestWake::new().unwrap());
        let irq = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            wake,
        ));
        assert!(MmioTransport::restore(
            Box::new(Rng::new(None).unwrap()),
            mem.clone(),
            irq.clone(),
            &s
        )
        .is_err());
        let mut s = t.save();
        s.queues.push(s.queues[0]);
        assert!(MmioTransport::restore(Box::new(Rng::new(None).unwrap()), mem, irq, &s).is_err());
    }
}
