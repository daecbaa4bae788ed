//! The virtio devices a configuration asks for, in guest order (the root
//! drive first, so that it is /dev/vda; then the other drives, the network
//! interfaces, rng, vsock, balloon, virtio-mem), each made fresh or rebuilt from its saved state.
//!
//! virtio-mem is made before the others, before the irqchip: a restore
//! re-registers its plugged chunks' KVM memory slots, and slot changes are
//! cheap only while the VM has no irqchip.

use std::sync::Arc;

use kvm_ioctls::{Kvm, VmFd};

use super::mmds::MmdsRoute;
use super::mmio::MmioSlots;
use super::persist::{make_virtio, DeviceId, StateLookup, VirtioState};
use super::{DeviceError, VirtioHandles};
use crate::arch::layout;
use crate::config::{MemoryHotplugConfig, VmConfig};
use crate::devices::virtio::balloon::{Balloon, BalloonSettings};
use crate::devices::virtio::blk::Block;
use crate::devices::virtio::mem::{map_snapshot_region, VirtioMem};
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::Vsock;
use crate::memory::hotplug::HotplugMemory;
use crate::memory::{GuestRam, GuestRegionMmap};
use crate::mmds::stack::MmdsStack;

/// The virtio-mem device, made ahead of the other devices, and its region.
pub struct MemDevice<'s> {
    device: VirtioMem,
    region: Arc<GuestRegionMmap>,
    saved: Option<&'s VirtioState>,
}

impl MemDevice<'_> {
    /// The hotplug region (devices and the unikernel's page tables must reach it).
    pub fn region(&self) -> &Arc<GuestRegionMmap> {
        &self.region
    }
}

/// The virtio-mem device `hotplug` describes, over a fresh region placed
/// above boot RAM, or (with `restore`) over the region mapped from the
/// snapshot memory file `ram` comes from, with its state applied. With
/// `dirty_log` (`track_dirty_pages`), its KVM slots log dirty pages.
pub fn make_mem_device<'s>(
    kvm: &Kvm,
    vm_fd: &VmFd,
    mem_bytes: u64,
    hotplug: &MemoryHotplugConfig,
    dirty_log: bool,
    restore: Option<(&GuestRam, &mut StateLookup<'s>)>,
) -> Result<MemDevice<'s>, DeviceError> {
    let id = DeviceId::mem();
    let (addr, size, slot_size, block_size) = (
        layout::hotplug_region_addr(mem_bytes),
        hotplug.total_size_mib << 20,
        hotplug.slot_size_mib << 20,
        hotplug.block_size_mib << 20,
    );
    let (mut backing, saved) = match restore {
        None => (HotplugMemory::anonymous(addr, size, slot_size)?, None),
        Some((ram, states)) => {
            let saved = states.virtio(&id)?;
            let backing = map_snapshot_region(ram, addr, size, slot_size).map_err(|e| {
                DeviceError::Restore {
                    id: id.clone(),
                    detail: e.to_string(),
                }
            })?;
            (backing, Some(saved))
        }
    };
    // The device adds and removes memory slots from its own thread; a
    // restore's slots are added below, already with the dirty log.
    backing.set_dirty_log(dirty_log);
    backing.attach_vm(duplicate_vm_fd(kvm, vm_fd)?);
    let region = backing.region();
    let device = make_virtio::<VirtioMem>(
        &id,
        saved,
        (backing, block_size, slot_size),
        |(backing, block, slot)| Ok(VirtioMem::new(backing, block, slot).0),
    )?;
    Ok(MemDevice {
        device,
        region,
        saved,
    })
}

/// Attaches the configuration's virtio devices; with `saved`, each from its state.
pub(super) fn attach_virtio(
    slots: &mut MmioSlots<'_>,
    config: &VmConfig,
    mem_device: Option<MemDevice<'_>>,
    mut saved: Option<&mut StateLookup<'_>>,
    mmds: Option<&MmdsRoute>,
) -> Result<VirtioHandles, DeviceError> {
    let mut handles = VirtioHandles::default();
    let mut drives: Vec<_> = config.drives.iter().collect();
    drives.sort_by_key(|d| !d.is_root_device);
    for d in drives {
        let id = DeviceId::drive(&d.drive_id);
        let state = take(&mut saved, &id)?;
        let block = make_virtio::<Block>(&id, state, d.clone(), |d| {
            Block::open(&d).map_err(|source| DeviceError::Drive {
                id: d.drive_id.clone(),
                source,
            })
        })?;
        handles.drives.push(block.handle());
        slots.attach(id, Box::new(block), state)?;
    }

    // Each reopens its tap by the configured name (a restore's
    // configuration carries the snapshot's names or their overrides).
    for n in &config.network_interfaces {
        let id = DeviceId::net(&n.iface_id);
        let state = take(&mut saved, &id)?;
        let mut net = make_virtio::<Net>(&id, state, n.clone(), |n| Ok(Net::open(&n)?))?;
        if let Some(route) = mmds.filter(|r| r.serves(&n.iface_id)) {
            net.set_mmds(MmdsStack::new(route.ipv4, route.store.clone()));
        }
        handles.nets.push(net.handle());
        slots.attach(id, Box::new(net), state)?;
    }

    let id = DeviceId::rng();
    let state = take(&mut saved, &id)?;
    let limits = config
        .entropy
        .as_ref()
        .and_then(|e| e.rate_limiter.as_ref());
    let rng = make_virtio::<Rng>(&id, state, (), |()| {
        Rng::new(limits).map_err(|e| DeviceError::Restore {
            id: id.clone(),
            detail: format!("cannot make the entropy rate limiter: {e}"),
        })
    })?;
    slots.attach(id, Box::new(rng), state)?;

    if let Some(v) = &config.vsock {
        let id = DeviceId::vsock();
        let state = take(&mut saved, &id)?;
        let args = (v.guest_cid as u64, v.uds_path.clone().into());
        let vsock =
            make_virtio::<Vsock>(&id, state, args, |(cid, path)| Ok(Vsock::new(cid, path)?))?;
        handles.vsock = Some(vsock.handle()?);
        slots.attach(id, Box::new(vsock), state)?;
    }

    if let Some(b) = &config.balloon {
        let id = DeviceId::balloon();
        let state = take(&mut saved, &id)?;
        let settings = BalloonSettings {
            amount_mib: b.amount_mib,
            deflate_on_oom: b.deflate_on_oom,
            stats_polling_interval_s: b.stats_polling_interval_s,
            free_page_reporting: b.free_page_reporting,
            free_page_hinting: b.free_page_hinting,
            mem_mib: config.machine.mem_size_mib,
        };
        let balloon = make_virtio::<Balloon>(&id, state, settings, |s| {
            Balloon::new(s).map_err(|e| DeviceError::Restore {
                id: DeviceId::balloon(),
                detail: e.to_string(),
            })
        })?;
        handles.balloon = Some(balloon.handle());
        slots.attach(id, Box::new(balloon), state)?;
    }

    if let Some(m) = mem_device {
        handles.mem = Some(m.device.handle());
        slots.attach(DeviceId::mem(), Box::new(m.device), m.saved)?;
    }
    Ok(handles)
}

/// The state of virtio device `id` when restoring.
fn take<'s>(
    saved: &mut Option<&mut StateLookup<'s>>,
    id: &DeviceId,
) -> Result<Option<&'s VirtioState>, DeviceError> {
    saved.as_deref_mut().map(|s| s.virtio(id)).transpose()
}

/// A second handle on the VM (a duplicate fd), owned by the virtio-mem region.
fn duplicate_vm_fd(kvm: &Kvm, vm_fd: &VmFd) -> Result<VmFd, DeviceError> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on an fd we own; the result is checked.
    let fd = unsafe { libc::fcntl(vm_fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(DeviceError::Io {
            what: "duplicating the VM fd",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh duplicate of a KVM VM fd, owned by nobody else.
    unsafe { kvm.create_vmfd_from_rawfd(fd) }.map_err(|source| DeviceError::Kvm {
        what: "a VM fd copy",
        source,
    })
}
