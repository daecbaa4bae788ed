//! A minimal virtio-blk driver (device id 2, virtio 1.2 §5.2): read, write
//! and flush whole 512-byte sectors, one request at a time, polled.
//!
//! A request is a chain: a 16-byte header (type, sector; read by the
//! device), the data (read by the device for writes, written by it for
//! reads) and a one-byte status (written by the device).

use alloc::boxed::Box;

use super::mmio::{Transport, F_VERSION_1};
use super::queue::VirtQueue;
use super::{device_id, VirtioError};
use crate::BootInfo;

pub const SECTOR: usize = 512;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const S_OK: u8 = 0;
/// VIRTIO_BLK_F_RO.
const F_RO: u64 = 1 << 5;
/// VIRTIO_BLK_F_FLUSH.
const F_FLUSH: u64 = 1 << 9;
const REQUEST_TIMEOUT_US: u64 = 10_000_000;
const MAX_POLLS: u32 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlkError {
    /// The buffer is not a whole number of sectors, or past the disk's end.
    BadRange {
        sector: u64,
        len: usize,
    },
    /// The disk is read-only.
    ReadOnly,
    /// The device answered with this status (1 = IOERR, 2 = UNSUPP).
    Status(u8),
    Timeout,
    QueueFull,
}

pub struct VirtioBlk {
    transport: Transport,
    queue: VirtQueue,
    header: Box<[u8; 16]>,
    status: Box<[u8; 1]>,
    capacity: u64,
    read_only: bool,
    failed: bool,
}

impl VirtioBlk {
    /// Brings up the `n`th virtio-blk device of the boot info (0 = first).
    pub fn new(info: &BootInfo, n: usize) -> Result<VirtioBlk, VirtioError> {
        let dev = info
            .mmio_devices()
            .iter()
            .filter(|d| d.device_id == device_id::BLOCK)
            .nth(n)
            .copied()
            .ok_or(VirtioError::NoDevice(device_id::BLOCK))?;
        // SAFETY: the boot info lists this window as a virtio-mmio device,
        // identity-mapped by the boot protocol; only this driver uses it.
        let (transport, features) = unsafe { Transport::init(&dev, F_VERSION_1, F_RO | F_FLUSH)? };
        let queue = transport.setup_queue(0, 8)?;
        let header = boxed()?;
        let status = boxed()?;
        transport.driver_ok();
        let capacity = transport.config_u32(0) as u64 | (transport.config_u32(4) as u64) << 32;
        Ok(VirtioBlk {
            transport,
            queue,
            header,
            status,
            capacity,
            read_only: features & F_RO != 0,
            failed: false,
        })
    }

    /// Size of the disk in sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Reads sectors from `sector` into `buf` (a multiple of 512 bytes).
    pub fn read(&mut self, sector: u64, buf: &mut [u8]) -> Result<(), BlkError> {
        self.check(sector, buf.len())?;
        self.request(T_IN, sector, buf.as_mut_ptr(), buf.len(), true)
    }

    /// Writes `buf` (a multiple of 512 bytes) to sectors from `sector`.
    pub fn write(&mut self, sector: u64, buf: &[u8]) -> Result<(), BlkError> {
        self.check(sector, buf.len())?;
        if self.read_only {
            return Err(BlkError::ReadOnly);
        }
        self.request(T_OUT, sector, buf.as_ptr() as *mut u8, buf.len(), false)
    }

    pub fn flush(&mut self) -> Result<(), BlkError> {
        self.request(T_FLUSH, 0, core::ptr::null_mut(), 0, false)
    }

    fn check(&self, sector: u64, len: usize) -> Result<(), BlkError> {
        let sectors = (len / SECTOR) as u64;
        if len == 0
            || !len.is_multiple_of(SECTOR)
            || sector
                .checked_add(sectors)
                .is_none_or(|end| end > self.capacity)
        {
            return Err(BlkError::BadRange { sector, len });
        }
        Ok(())
    }

    fn request(
        &mut self,
        kind: u32,
        sector: u64,
        data: *mut u8,
        len: usize,
        device_writes: bool,
    ) -> Result<(), BlkError> {
        if self.failed {
            return Err(BlkError::Timeout);
        }
        self.header[0..4].copy_from_slice(&kind.to_le_bytes());
        self.header[4..8].fill(0);
        self.header[8..16].copy_from_slice(&sector.to_le_bytes());
        self.status[0] = 0xff;
        let h = (self.header.as_ptr(), 16, false);
        let s = (self.status.as_ptr(), 1, true);
        let d = (data as *const u8, len as u32, device_writes);
        // SAFETY: header, status and data outlive the request: this call
        // waits until the device returns the chain (or fails the device).
        let head = unsafe {
            if len == 0 {
                self.queue.add_chain(&[h, s])
            } else {
                self.queue.add_chain(&[h, d, s])
            }
        }
        .ok_or(BlkError::QueueFull)?;
        self.transport.notify(0);
        let start = crate::clock::Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(used) = self.queue.pop_used() {
                if used.id != head {
                    continue;
                }
                // SAFETY: the device is done with the status byte.
                let st = unsafe { core::ptr::read_volatile(&self.status[0]) };
                return if st == S_OK {
                    Ok(())
                } else {
                    Err(BlkError::Status(st))
                };
            }
            polls += 1;
            let timed_out = match start.elapsed_us() {
                Some(us) => us > REQUEST_TIMEOUT_US,
                None => polls > MAX_POLLS,
            };
            if timed_out {
                self.transport.fail();
                self.failed = true;
                return Err(BlkError::Timeout);
            }
            crate::signal::wait(10_000);
            self.transport.ack_interrupt();
        }
    }
}

fn boxed<const N: usize>() -> Result<Box<[u8; N]>, VirtioError> {
    let mut v = alloc::vec::Vec::new();
    v.try_reserve_exact(N)
        .map_err(|_| VirtioError::OutOfMemory)?;
    v.resize(N, 0u8);
    v.into_boxed_slice()
        .try_into()
        .map_err(|_| VirtioError::OutOfMemory)
}
