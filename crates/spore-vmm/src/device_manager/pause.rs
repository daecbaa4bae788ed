//! [`PausedDevices`]: every virtio device stopped while a paused VM's
//! state is captured (a snapshot, a clone template), and started again
//! whatever happens.
//!
//! vCPUs being paused is not enough: device workers run on their own
//! threads and would keep moving queues and writing guest memory. Stopping
//! a worker hands its live queues back to the transport, so the saved ring
//! positions are the real ones.

use std::fs::File;
use std::sync::MutexGuard;

use super::persist::{save_virtio, DeviceId, DeviceState, DeviceStates};
use super::{DeviceError, VmDevices};
use crate::devices::virtio::mem::RegionDiff;
use crate::devices::virtio::mmio::MmioTransport;
use crate::host::lock;
use crate::memory::hotplug::RegionChanges;
use crate::persist::Persist;

/// What the virtio-mem device wrote into a snapshot's memory file.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemoryWritten {
    /// Bytes of data written (plugged, non-zero pages).
    pub data_bytes: u64,
    pub plugged_bytes: u64,
}

/// Every virtio transport quiesced, held locked; they are resumed when
/// this is dropped (unless [`Self::keep_stopped`]).
pub struct PausedDevices<'a> {
    devices: &'a VmDevices,
    /// In slot order, as `devices.virtio`, each with whether its worker
    /// ran before: only those are started again. A zygote's devices stay
    /// stopped for good ([`Self::keep_stopped`]); a later capture of it (a
    /// snapshot written from the zygote) must not restart them, or their
    /// workers would write guest memory the zygote's clones map from (a
    /// virtio-net worker taking frames into its rx ring broke every later
    /// clone's rx).
    transports: Vec<(MutexGuard<'a, MmioTransport>, bool)>,
}

impl<'a> PausedDevices<'a> {
    /// Quiesces every virtio device. If one refuses, those already stopped
    /// are resumed and the refusal is returned.
    pub fn new(devices: &'a VmDevices) -> Result<Self, DeviceError> {
        let mut paused = PausedDevices {
            devices,
            transports: Vec::with_capacity(devices.virtio.len()),
        };
        for v in &devices.virtio {
            let mut t = lock(&v.transport);
            let was_running = t.is_activated();
            let quiesced = t.quiesce();
            // Held even on failure: the drop resumes it with the others.
            paused.transports.push((t, was_running));
            quiesced.map_err(|e| DeviceError::Quiesce {
                id: v.id.clone(),
                detail: e.to_string(),
            })?;
        }
        Ok(paused)
    }

    /// Every device's state, keyed by its id.
    pub fn save_states(&self) -> Result<DeviceStates, DeviceError> {
        let d = self.devices;
        let mut states = DeviceStates::default();
        states.push(
            DeviceId::serial(),
            DeviceState::Serial(Persist::save(&*lock(&d.serial))),
        );
        if let Some(i8042) = &d.i8042 {
            states.push(
                DeviceId::i8042(),
                DeviceState::I8042(Persist::save(&*lock(i8042))),
            );
        }
        if let Some(rtc) = &d.rtc {
            states.push(
                DeviceId::rtc(),
                DeviceState::Rtc(Persist::save(&*lock(rtc))),
            );
        }
        states.push(
            DeviceId::tmem(),
            DeviceState::Tmem(Persist::save(d.tmem.as_ref())),
        );
        for (v, (t, _)) in d.virtio.iter().zip(&self.transports) {
            states.push(
                v.id.clone(),
                DeviceState::Virtio(save_virtio(&v.id, v.slot, t)?),
            );
        }
        let mmds = lock(&d.mmds);
        if d.mmds_configured || mmds.is_initialized() {
            states.push(DeviceId::mmds(), DeviceState::Mmds(mmds.save()));
        }
        Ok(states)
    }

    /// Writes the virtio-mem region's plugged blocks into a snapshot memory
    /// file at `file_offset` (right after boot RAM), if the VM has the device.
    pub fn write_device_memory(
        &self,
        out: &File,
        file_offset: u64,
    ) -> std::io::Result<Option<DeviceMemoryWritten>> {
        let Some(mem) = &self.devices.handles.mem else {
            return Ok(None);
        };
        Ok(Some(DeviceMemoryWritten {
            data_bytes: mem.write_memory(out, file_offset)?,
            plugged_bytes: mem.plugged_bytes(),
        }))
    }

    /// Reads and clears the virtio-mem region's written pages and released
    /// ranges (see [`crate::memory::hotplug::HotplugMemory::take_dirty`]),
    /// if the VM has the device.
    pub fn take_device_dirty(&self) -> Option<RegionChanges> {
        self.devices
            .handles
            .mem
            .as_ref()
            .map(|mem| mem.take_dirty())
    }

    /// A diff's share of the virtio-mem region: the pages of `dirty` in
    /// plugged blocks, written at `file_offset` (see
    /// [`crate::devices::virtio::mem::MemHandle::write_diff`]).
    pub fn write_device_diff(
        &self,
        out: &File,
        file_offset: u64,
        dirty: &[u64],
    ) -> std::io::Result<Option<(RegionDiff, u64)>> {
        let Some(mem) = &self.devices.handles.mem else {
            return Ok(None);
        };
        Ok(Some((
            mem.write_diff(out, file_offset, dirty)?,
            mem.plugged_bytes(),
        )))
    }

    /// Leaves the devices stopped (a zygote template never runs again;
    /// its caller resumes them itself if it changes its mind).
    pub fn keep_stopped(mut self) {
        self.transports.clear();
    }
}

impl Drop for PausedDevices<'_> {
    fn drop(&mut self) {
        for (v, (t, was_running)) in self.devices.virtio.iter().zip(self.transports.iter_mut()) {
            if *was_running && !t.resume() {
                tracing::error!(device = %v.id, "the device could not be restarted after the capture");
            }
        }
    }
}
