//! The virtio-blk wire format: one descriptor chain in, one validated
//! [`Request`] out.
//!
//! This is the only place that interprets guest-provided descriptors for the
//! block device. Everything it returns has been checked: every segment lies in
//! guest memory with the right direction, data lengths are whole sectors and
//! the sector range is inside the disk. Code after it trusts those values.
//!
//! Framing follows what drivers (Linux, the spore unikernel) send: a 16-byte
//! device-readable header descriptor, data descriptors, and a device-writable
//! status descriptor last, the status being its final byte.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use super::SECTOR_SIZE;
use crate::devices::virtio::GuestMemoryMmap;

/// The status bytes a request ends with (virtio_bindings spells them as u32).
#[allow(
    clippy::cast_possible_truncation,
    reason = "virtio-blk statuses are 0, 1 and 2"
)]
pub const STATUS_OK: u8 = VIRTIO_BLK_S_OK as u8;
#[allow(
    clippy::cast_possible_truncation,
    reason = "virtio-blk statuses are 0, 1 and 2"
)]
pub const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
#[allow(
    clippy::cast_possible_truncation,
    reason = "virtio-blk statuses are 0, 1 and 2"
)]
pub const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// Size of `struct virtio_blk_outhdr`: type (le32), ioprio (le32), sector (le64).
const HEADER_LEN: u32 = 16;

/// Longest chain accepted. Without VIRTIO_RING_F_INDIRECT_DESC a chain cannot
/// exceed the queue size; a longer one came through an indirect table the
/// driver was never offered.
pub const MAX_CHAIN_DESCRIPTORS: usize = super::QUEUE_SIZE as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Read sectors into guest memory.
    In,
    /// Write sectors from guest memory.
    Out,
    Flush,
    /// Read the drive's 20-byte serial.
    GetId,
}

/// A guest buffer that lies entirely inside guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A validated request.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub kind: RequestKind,
    /// First sector (In/Out); the range `sector..sector + data_len / 512` is on the disk.
    pub sector: u64,
    /// Data buffers in order: device-writable for In/GetId, readable for Out.
    pub data: Vec<Segment>,
    /// Sum of the data segment lengths; a multiple of 512 for In/Out.
    pub data_len: u64,
    /// Where the status byte goes.
    pub status_addr: GuestAddress,
}

/// Why a chain is not a valid request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("empty descriptor chain")]
    Empty,
    #[error("descriptor chain longer than {MAX_CHAIN_DESCRIPTORS} descriptors")]
    TooLong,
    #[error("descriptor chain is cut short (loop, bad next index, or over 4 GiB)")]
    Truncated,
    #[error("last descriptor cannot hold a status byte (read-only, empty or outside memory)")]
    BadStatusDescriptor,
    #[error("request has no header descriptor")]
    MissingHeader,
    #[error("header descriptor is device-writable, shorter than 16 bytes or outside memory")]
    BadHeader,
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("data descriptor has the wrong direction for the request")]
    WrongDirection,
    #[error("data descriptor {addr:#x}+{len:#x} lies outside guest memory")]
    OutOfMemory { addr: u64, len: u32 },
    #[error("data length {0} is not a multiple of 512")]
    PartialSector(u64),
    #[error("sectors {sector}+{count} are beyond the disk's {capacity} sectors")]
    BeyondCapacity {
        sector: u64,
        count: u64,
        capacity: u64,
    },
    #[error("write to a read-only drive")]
    ReadOnly,
}

/// A chain that is not a valid request, and where to report that.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The status byte, when the chain has a usable one; otherwise the chain
    /// is returned to the driver with nothing written.
    pub status_addr: Option<GuestAddress>,
    pub error: RequestError,
}

impl RequestError {
    /// The virtio-blk status the driver sees for this error.
    pub fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported(_) => STATUS_UNSUPP,
            _ => STATUS_IOERR,
        }
    }
}

/// What parsing needs to know about the disk.
#[derive(Debug, Clone, Copy)]
pub struct DiskLimits {
    pub capacity_sectors: u64,
    pub read_only: bool,
}

/// Whether `addr..addr + len` lies in guest memory, without overflow.
fn in_memory(mem: &GuestMemoryMmap, addr: GuestAddress, len: u32, access: Permissions) -> bool {
    addr.checked_add(u64::from(len)).is_some() && mem.check_range(addr, len as usize, access)
}

/// Parses the descriptors of one chain (as yielded by virtio-queue's
/// `DescriptorChain`, which already bounds the walk by the queue size and
/// stops at a descriptor table outside memory).
pub fn parse(
    descriptors: impl Iterator<Item = Descriptor>,
    mem: &GuestMemoryMmap,
    limits: DiskLimits,
) -> Result<Request, Rejected> {
    let drop = |error| Rejected {
        status_addr: None,
        error,
    };
    let mut descs = Vec::new();
    for d in descriptors {
        if descs.len() == MAX_CHAIN_DESCRIPTORS {
            return Err(drop(RequestError::TooLong));
        }
        descs.push(d);
    }
    let (status_desc, rest) = descs.split_last().ok_or(drop(RequestError::Empty))?;
    // virtio-queue ends a walk early without telling us (loops, an index past
    // the table, a table outside memory, over 4 GiB in total): the last
    // descriptor then still points onwards, and its "status" is not the real one.
    if status_desc.has_next() {
        return Err(drop(RequestError::Truncated));
    }
    let status_addr =
        status_byte(status_desc, mem).ok_or(drop(RequestError::BadStatusDescriptor))?;
    let reject = |error| Rejected {
        status_addr: Some(status_addr),
        error,
    };

    let (header, data_descs) = rest
        .split_first()
        .ok_or(reject(RequestError::MissingHeader))?;
    if header.is_write_only()
        || header.len() < HEADER_LEN
        || !in_memory(mem, header.addr(), HEADER_LEN, Permissions::Read)
    {
        return Err(reject(RequestError::BadHeader));
    }
    let read_header = || -> Option<(u32, u64)> {
        let ty = mem.read_obj::<u32>(header.addr()).ok()?;
        let sector = mem.read_obj::<u64>(header.addr().checked_add(8)?).ok()?;
        Some((u32::from_le(ty), u64::from_le(sector)))
    };
    let (ty, sector) = read_header().ok_or(reject(RequestError::BadHeader))?;
    let kind = match ty {
        VIRTIO_BLK_T_IN => RequestKind::In,
        VIRTIO_BLK_T_OUT => RequestKind::Out,
        VIRTIO_BLK_T_FLUSH => RequestKind::Flush,
        VIRTIO_BLK_T_GET_ID => RequestKind::GetId,
        other => return Err(reject(RequestError::Unsupported(other))),
    };
    if kind == RequestKind::Out && limits.read_only {
        return Err(reject(RequestError::ReadOnly));
    }

    let mut data = Vec::new();
    let mut data_len: u64 = 0;
    // A flush carries no data; any buffers a driver attached are not touched.
    if kind != RequestKind::Flush {
        let device_writes = kind != RequestKind::Out;
        let access = if device_writes {
            Permissions::Write
        } else {
            Permissions::Read
        };
        for d in data_descs {
            if d.is_write_only() != device_writes {
                return Err(reject(RequestError::WrongDirection));
            }
            if !in_memory(mem, d.addr(), d.len(), access) {
                return Err(reject(RequestError::OutOfMemory {
                    addr: d.addr().raw_value(),
                    len: d.len(),
                }));
            }
            if d.len() == 0 {
                continue;
            }
            // Cannot overflow: at most MAX_CHAIN_DESCRIPTORS terms below 2^32.
            data_len += u64::from(d.len());
            data.push(Segment {
                addr: d.addr(),
                len: d.len(),
            });
        }
    }

    if matches!(kind, RequestKind::In | RequestKind::Out) {
        if !data_len.is_multiple_of(SECTOR_SIZE) {
            return Err(reject(RequestError::PartialSector(data_len)));
        }
        let count = data_len / SECTOR_SIZE;
        let beyond = RequestError::BeyondCapacity {
            sector,
            count,
            capacity: limits.capacity_sectors,
        };
        match sector.checked_add(count) {
            Some(end) if end <= limits.capacity_sectors => {}
            _ => return Err(reject(beyond)),
        }
    }

    Ok(Request {
        kind,
        sector,
        data,
        data_len,
        status_addr,
    })
}

/// The address of the status byte: the last byte of a device-writable
/// descriptor that lies in guest memory.
fn status_byte(d: &Descriptor, mem: &GuestMemoryMmap) -> Option<GuestAddress> {
    if !d.is_write_only() || d.len() == 0 || !in_memory(mem, d.addr(), d.len(), Permissions::Write)
    {
        return None;
    }
    d.addr().checked_add(u64::from(d.len()) - 1)
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
