//! What a virtio-blk device reads and writes: a raw image, or a read-only
//! base with a copy-on-write overlay ([`super::overlay`]).
//!
//! The device's worker holds the [`Disk`] behind a mutex that
//! [`BlockHandle`] shares, so a paused VM can switch a raw drive to
//! base + overlay in place ([`BlockHandle::freeze`]) when it is cloned while
//! it keeps running: from then on it never writes the base its clones share.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::backend::{DiskImage, DiskIoError};
use super::overlay::{sanitize, CowDisk, CowIoError, OverlayError};
use super::request::Segment;
use super::SECTOR_SIZE;
use crate::config::{CowOverlayConfig, RateLimiterConfig};
use crate::devices::virtio::{GuestMemoryMmap, VirtioInterrupt};
use crate::host::lock;
use crate::rate_limiter::RateLimiter;

/// Bytes moved between guest memory and a copy-on-write disk per step (the
/// overlay cannot hand guest memory to the kernel in one read: a request may
/// span blocks that live in different files).
const BOUNCE_LEN: usize = 64 << 10;

#[derive(Debug)]
pub enum Disk {
    Raw(DiskImage),
    Cow { disk: CowDisk, bounce: Vec<u8> },
}

impl Disk {
    pub fn cow(disk: CowDisk) -> Self {
        Disk::Cow {
            disk,
            bounce: vec![0; BOUNCE_LEN],
        }
    }

    pub fn capacity_sectors(&self) -> u64 {
        match self {
            Disk::Raw(d) => d.capacity_sectors(),
            Disk::Cow { disk, .. } => disk.size() / SECTOR_SIZE,
        }
    }

    /// Read-only to the guest (a copy-on-write disk is writable: its base is not written).
    pub fn read_only(&self) -> bool {
        match self {
            Disk::Raw(d) => d.read_only(),
            Disk::Cow { .. } => false,
        }
    }

    /// The image file (the base of a copy-on-write disk).
    pub fn path(&self) -> &Path {
        match self {
            Disk::Raw(d) => d.path(),
            Disk::Cow { disk, .. } => disk.base_path(),
        }
    }

    /// The raw image's fd and whether a flush must sync it (the Async
    /// engine's target); `None` for a copy-on-write disk.
    pub fn async_target(&self) -> Option<(std::os::fd::RawFd, bool)> {
        match self {
            Disk::Raw(d) => Some((d.raw_fd(), d.durable_flush())),
            Disk::Cow { .. } => None,
        }
    }

    pub fn overlay(&self) -> Option<&CowDisk> {
        match self {
            Disk::Raw(_) => None,
            Disk::Cow { disk, .. } => Some(disk),
        }
    }

    pub fn read_into(
        &mut self,
        mem: &GuestMemoryMmap,
        sector: u64,
        segments: &[Segment],
    ) -> Result<(), DiskIoError> {
        match self {
            Disk::Raw(d) => d.read_into(mem, sector, segments),
            Disk::Cow { disk, bounce } => {
                let mut offset = byte_offset(sector)?;
                for_each_piece(segments, bounce.len(), |addr, len| {
                    let buf = &mut bounce[..len];
                    disk.read_at(offset, buf)?;
                    mem.write_slice(buf, addr)?;
                    offset += len as u64;
                    Ok(())
                })
            }
        }
    }

    pub fn write_from(
        &mut self,
        mem: &GuestMemoryMmap,
        sector: u64,
        segments: &[Segment],
    ) -> Result<(), DiskIoError> {
        match self {
            Disk::Raw(d) => d.write_from(mem, sector, segments),
            Disk::Cow { disk, bounce } => {
                let mut offset = byte_offset(sector)?;
                for_each_piece(segments, bounce.len(), |addr, len| {
                    let buf = &mut bounce[..len];
                    mem.read_slice(buf, addr)?;
                    disk.write_at(offset, buf)?;
                    offset += len as u64;
                    Ok(())
                })
            }
        }
    }

    pub fn flush(&self) -> Result<(), DiskIoError> {
        match self {
            Disk::Raw(d) => d.flush(),
            Disk::Cow { disk, .. } => Ok(disk.flush()?),
        }
    }
}

fn byte_offset(sector: u64) -> Result<u64, DiskIoError> {
    sector
        .checked_mul(SECTOR_SIZE)
        .ok_or(DiskIoError::Offset(sector))
}

/// Calls `f(addr, len)` for consecutive pieces of `segments` of at most `max` bytes.
fn for_each_piece(
    segments: &[Segment],
    max: usize,
    mut f: impl FnMut(GuestAddress, usize) -> Result<(), DiskIoError>,
) -> Result<(), DiskIoError> {
    for seg in segments {
        let mut done = 0usize;
        let len = seg.len as usize;
        while done < len {
            let n = (len - done).min(max);
            let addr = seg
                .addr
                .checked_add(done as u64)
                .ok_or(DiskIoError::Memory(
                    vm_memory::GuestMemoryError::InvalidGuestAddress(seg.addr),
                ))?;
            f(addr, n)?;
            done += n;
        }
    }
    Ok(())
}

impl From<CowIoError> for DiskIoError {
    fn from(e: CowIoError) -> Self {
        DiskIoError::Cow(e)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("drive {drive}: {source}")]
    Overlay {
        drive: String,
        #[source]
        source: OverlayError,
    },
}

/// What an activated device lends its handle: the interrupt (a config
/// change after a new image) and its queue's kick (the worker re-checks a
/// rate limiter that was changed).
pub struct LiveDevice {
    pub interrupt: Arc<VirtioInterrupt>,
    pub kick: Option<EventFd>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error("drive {drive} has a copy-on-write overlay over {base}; its image cannot be replaced while it runs")]
    Overlay { drive: String, base: PathBuf },
    #[error(transparent)]
    Open(#[from] super::BlockError),
}

/// A drive's disk as the VM sees it from outside the device: for switching
/// to copy-on-write, reading what backs it, and `PATCH /drives/{id}`.
#[derive(Clone)]
pub struct BlockHandle {
    id: String,
    disk: Arc<Mutex<Disk>>,
    durable_flush: bool,
    limiter: Arc<Mutex<RateLimiter>>,
    live: Arc<Mutex<Option<LiveDevice>>>,
}

impl BlockHandle {
    pub(super) fn new(
        id: String,
        disk: Arc<Mutex<Disk>>,
        durable_flush: bool,
        limiter: Arc<Mutex<RateLimiter>>,
        live: Arc<Mutex<Option<LiveDevice>>>,
    ) -> Self {
        Self {
            id,
            disk,
            durable_flush,
            limiter,
            live,
        }
    }

    /// Serves `path` from now on (Firecracker's `PATCH /drives/{id}`
    /// `path_on_host`): the new image is opened first (a bad path changes
    /// nothing), swapped in between two requests, and the guest is told
    /// through a configuration change interrupt (its capacity may differ).
    /// The read-only setting stays what the guest negotiated. Returns the
    /// new capacity in sectors.
    pub fn replace_image(&self, path: &Path) -> Result<u64, UpdateError> {
        let read_only = {
            let disk = lock(&self.disk);
            if let Some(cow) = disk.overlay() {
                return Err(UpdateError::Overlay {
                    drive: self.id.clone(),
                    base: cow.base_path().to_path_buf(),
                });
            }
            disk.read_only()
        };
        let image = DiskImage::open(path, read_only, self.durable_flush)?;
        let capacity = image.capacity_sectors();
        *lock(&self.disk) = Disk::Raw(image);
        if let Some(live) = lock(&self.live).as_ref() {
            live.interrupt.signal_config_change();
        }
        Ok(capacity)
    }

    /// Applies a `PATCH` to the drive's rate limiter and wakes its worker
    /// so that requests held back under the old limits are looked at again.
    pub fn update_rate_limiter(&self, cfg: &RateLimiterConfig) {
        lock(&self.limiter).update(cfg);
        if let Some(kick) = lock(&self.live).as_ref().and_then(|l| l.kick.as_ref()) {
            if let Err(e) = kick.write(1) {
                tracing::warn!("drive {}: cannot wake the worker: {e}", self.id);
            }
        }
    }

    /// The drive's current limits (`None`: unlimited).
    pub fn rate_limiter(&self) -> Option<RateLimiterConfig> {
        lock(&self.limiter).config()
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The drive's overlay configuration, `None` for a raw drive.
    pub fn overlay_config(&self) -> Option<CowOverlayConfig> {
        lock(&self.disk).overlay().map(CowDisk::overlay_config)
    }

    /// Stops this drive from ever writing its base again, so that clones can
    /// share the base: a raw read-write drive gets a new overlay
    /// `<dir>/<prefix>.<id>.cow` over its image; an in-memory overlay moves to
    /// that file. Read-only drives and file overlays stay as they are.
    /// Returns the drive's new overlay configuration if it changed. Call it
    /// on a paused VM: a request in flight finishes first (the disk's lock).
    pub fn freeze(
        &self,
        dir: &Path,
        prefix: &str,
    ) -> Result<Option<CowOverlayConfig>, FreezeError> {
        let path: PathBuf = dir.join(format!("{prefix}.{}.cow", sanitize(&self.id)));
        let err = |source| FreezeError::Overlay {
            drive: self.id.clone(),
            source,
        };
        let mut disk = lock(&self.disk);
        match &mut *disk {
            Disk::Raw(raw) if raw.read_only() => Ok(None),
            Disk::Raw(raw) => {
                // Completed writes are already in the file (no cache of
                // ours). The base is the open file itself, not its path,
                // which may have been removed or replaced meanwhile.
                let base = raw.try_clone_file().map_err(|source| {
                    err(OverlayError::Base {
                        path: raw.path().to_path_buf(),
                        op: "duplicate the open image",
                        source,
                    })
                })?;
                let size = raw.capacity_sectors() * super::SECTOR_SIZE;
                let cow =
                    CowDisk::create_over_file(base, raw.path(), size, &path, self.durable_flush)
                        .map_err(err)?;
                *disk = Disk::cow(cow);
                Ok(disk.overlay().map(CowDisk::overlay_config))
            }
            Disk::Cow { disk: cow, .. } if cow.overlay_path().is_none() => {
                cow.spill(&path).map(Some).map_err(err)
            }
            Disk::Cow { .. } => Ok(None),
        }
    }
}
