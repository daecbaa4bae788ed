//! The guest's side of virtio-net, parsed and checked in one place: the
//! `virtio_net_hdr_v1` that starts every frame (12 bytes: VERSION_1 always
//! has `num_buffers`), and the descriptor chains carrying frames.
//!
//! Everything the worker takes from a chain comes through [`parse_tx`] or
//! [`parse_rx`]: descriptor direction, lengths, total length, the number of
//! descriptors and every buffer's place in guest memory are checked here,
//! so a bad chain is dropped (and counted) by the worker, never a panic and
//! never a host allocation sized by the guest. virtio-queue's chain
//! iterator already stops after as many descriptors as the queue holds
//! (a loop in the `next` links ends there).

use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use super::QUEUE_SIZE;
use crate::devices::virtio::GuestMemoryMmap;

/// `struct virtio_net_hdr_v1`, as the tap and the guest exchange it.
pub const VNET_HDR_LEN: usize = 12;
/// Largest frame either way: 64 KiB of TSO/UFO payload and its headers
/// (Linux's and Firecracker's 65562).
pub const MAX_FRAME_LEN: usize = 65562;
/// A frame with its virtio-net header: the host buffers' size.
pub const MAX_FRAME_WITH_HEADER: usize = MAX_FRAME_LEN + VNET_HDR_LEN;
/// Most descriptors one chain may have (one per queue entry).
pub const MAX_SEGMENTS: usize = QUEUE_SIZE as usize;
/// Where `num_buffers` sits in the header.
const NUM_BUFFERS_OFFSET: usize = 10;

/// `virtio_net_hdr_v1`'s fields (little-endian on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHeader {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
}

impl NetHeader {
    pub fn from_bytes(b: &[u8; VNET_HDR_LEN]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHeader {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
            num_buffers: u16_at(10),
        }
    }

    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        for (i, v) in [
            (2, self.hdr_len),
            (4, self.gso_size),
            (6, self.csum_start),
            (8, self.csum_offset),
            (10, self.num_buffers),
        ] {
            b[i..i + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// Sets `num_buffers` in a frame read from the tap (the kernel leaves
/// those two bytes alone).
pub fn set_num_buffers(frame: &mut [u8], n: u16) {
    if let Some(b) = frame.get_mut(NUM_BUFFERS_OFFSET..NUM_BUFFERS_OFFSET + 2) {
        b.copy_from_slice(&n.to_le_bytes());
    }
}

/// One checked guest buffer: inside guest memory, non-empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// Why a chain was dropped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    #[error("a tx chain has a device-writable descriptor")]
    WritableInTx,
    #[error("an rx chain has a device-readable descriptor")]
    ReadableInRx,
    #[error("a tx chain carries more than {MAX_FRAME_WITH_HEADER} bytes")]
    TooLong,
    #[error("a chain has more than {MAX_SEGMENTS} descriptors")]
    TooManyDescriptors,
    #[error("a chain is shorter than the {VNET_HDR_LEN}-byte virtio-net header")]
    TooShort,
    #[error("a buffer at {addr:#x} of {len} bytes is outside guest memory")]
    OutOfMemory { addr: u64, len: u32 },
}

/// Checks one descriptor's buffer and appends it to `out`.
fn push_segment(
    mem: &GuestMemoryMmap,
    out: &mut Vec<Segment>,
    addr: GuestAddress,
    len: u32,
) -> Result<(), ChainError> {
    if len == 0 {
        return Ok(());
    }
    if out.len() >= MAX_SEGMENTS {
        return Err(ChainError::TooManyDescriptors);
    }
    if !mem.check_range(addr, len as usize, vm_memory::Permissions::ReadWrite) {
        return Err(ChainError::OutOfMemory {
            addr: addr.raw_value(),
            len,
        });
    }
    out.push(Segment { addr, len });
    Ok(())
}

/// A tx chain: readable buffers only, holding a header and at most
/// [`MAX_FRAME_LEN`] bytes of frame. Fills `out` (cleared first) and
/// returns the total length, header included.
pub fn parse_tx(
    descriptors: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
    mem: &GuestMemoryMmap,
    out: &mut Vec<Segment>,
) -> Result<usize, ChainError> {
    out.clear();
    let mut total: usize = 0;
    for d in descriptors {
        if d.is_write_only() {
            return Err(ChainError::WritableInTx);
        }
        total = total.saturating_add(d.len() as usize);
        if total > MAX_FRAME_WITH_HEADER {
            return Err(ChainError::TooLong);
        }
        push_segment(mem, out, d.addr(), d.len())?;
    }
    if total < VNET_HDR_LEN {
        return Err(ChainError::TooShort);
    }
    Ok(total)
}

/// An rx chain: writable buffers only, room for at least the header.
/// Fills `out` (cleared first) and returns the room, capped at
/// [`MAX_FRAME_WITH_HEADER`] (more is never used).
pub fn parse_rx(
    descriptors: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
    mem: &GuestMemoryMmap,
    out: &mut Vec<Segment>,
) -> Result<usize, ChainError> {
    out.clear();
    let mut room: usize = 0;
    for d in descriptors {
        if !d.is_write_only() {
            return Err(ChainError::ReadableInRx);
        }
        if room >= MAX_FRAME_WITH_HEADER {
            // Room enough already: the rest is never written, but still
            // counts against the descriptor bound.
            if out.len() >= MAX_SEGMENTS {
                return Err(ChainError::TooManyDescriptors);
            }
            continue;
        }
        push_segment(mem, out, d.addr(), d.len())?;
        room = room.saturating_add(d.len() as usize);
    }
    if room < VNET_HDR_LEN {
        return Err(ChainError::TooShort);
    }
    Ok(room.min(MAX_FRAME_WITH_HEADER))
}

/// Copies the buffers `segs` (checked by [`parse_tx`]) into `buf`; returns
/// the bytes copied (all of them unless `buf` is shorter).
pub fn gather(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    buf: &mut [u8],
) -> Result<usize, vm_memory::GuestMemoryError> {
    let mut at = 0;
    for s in segs {
        let Some(dst) = buf.get_mut(at..at + s.len as usize) else {
            break;
        };
        mem.read_slice(dst, s.addr)?;
        at += s.len as usize;
    }
    Ok(at)
}

/// Copies `data` into the buffers `segs` (checked by [`parse_rx`]), in
/// order, as much as fits; returns the bytes written.
pub fn scatter(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    data: &[u8],
) -> Result<usize, vm_memory::GuestMemoryError> {
    let mut at = 0;
    for s in segs {
        if at >= data.len() {
            break;
        }
        let n = (s.len as usize).min(data.len() - at);
        mem.write_slice(&data[at..at + n], s.addr)?;
        at += n;
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::split::Descriptor;

    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    fn desc(addr: u64, len: u32, write: bool) -> Descriptor {
        let flags = if write {
            u16::try_from(VRING_DESC_F_WRITE).unwrap()
        } else {
            0
        };
        Descriptor::new(addr, len, flags, 0)
    }

    #[test]
    fn header_round_trips() {
        let h = NetHeader {
            flags: 1,
            gso_type: 4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 3,
        };
        assert_eq!(NetHeader::from_bytes(&h.to_bytes()), h);
        let mut b = h.to_bytes();
        set_num_buffers(&mut b, 7);
        assert_eq!(NetHeader::from_bytes(&b).num_buffers, 7);
    }

    #[test]
    fn tx_chains_are_checked() {
        let m = mem();
        let mut segs = Vec::new();
        let ok = [desc(0x1000, 12, false), desc(0x2000, 100, false)];
        assert_eq!(parse_tx(ok.into_iter(), &m, &mut segs), Ok(112));
        assert_eq!(segs.len(), 2);
        assert_eq!(
            parse_tx([desc(0x1000, 12, true)].into_iter(), &m, &mut segs),
            Err(ChainError::WritableInTx)
        );
        assert_eq!(
            parse_tx([desc(0x1000, 11, false)].into_iter(), &m, &mut segs),
            Err(ChainError::TooShort)
        );
        assert_eq!(
            parse_tx([desc(0x1000, 0, false)].into_iter(), &m, &mut segs),
            Err(ChainError::TooShort)
        );
        // Just the largest frame, then one byte more.
        let max = u32::try_from(MAX_FRAME_WITH_HEADER).unwrap();
        assert!(parse_tx([desc(0x1000, max, false)].into_iter(), &m, &mut segs).is_ok());
        assert_eq!(
            parse_tx(
                [desc(0x1000, max, false), desc(0, 1, false)].into_iter(),
                &m,
                &mut segs
            ),
            Err(ChainError::TooLong)
        );
        // Lengths that would overflow a u32 sum.
        assert_eq!(
            parse_tx(
                [desc(0, u32::MAX, false), desc(0, u32::MAX, false)].into_iter(),
                &m,
                &mut segs
            ),
            Err(ChainError::TooLong)
        );
        assert!(matches!(
            parse_tx([desc(0x3f_fff0, 100, false)].into_iter(), &m, &mut segs),
            Err(ChainError::OutOfMemory { .. })
        ));
        assert!(matches!(
            parse_tx([desc(u64::MAX - 4, 100, false)].into_iter(), &m, &mut segs),
            Err(ChainError::OutOfMemory { .. })
        ));
        let many = (0..=MAX_SEGMENTS as u64).map(|i| desc(0x1000 + i * 16, 16, false));
        assert_eq!(
            parse_tx(many, &m, &mut segs),
            Err(ChainError::TooManyDescriptors)
        );
    }

    #[test]
    fn rx_chains_are_checked() {
        let m = mem();
        let mut segs = Vec::new();
        assert_eq!(
            parse_rx([desc(0x1000, 1526, true)].into_iter(), &m, &mut segs),
            Ok(1526)
        );
        assert_eq!(
            parse_rx([desc(0x1000, 1526, false)].into_iter(), &m, &mut segs),
            Err(ChainError::ReadableInRx)
        );
        assert_eq!(
            parse_rx([desc(0x1000, 4, true)].into_iter(), &m, &mut segs),
            Err(ChainError::TooShort)
        );
        assert!(matches!(
            parse_rx([desc(0x40_0000, 16, true)].into_iter(), &m, &mut segs),
            Err(ChainError::OutOfMemory { .. })
        ));
        // Room is capped: a huge chain is fine, its tail is never used.
        let big = [desc(0, 0x10_0000, true), desc(0x10_0000, 0x10_0000, true)];
        assert_eq!(
            parse_rx(big.into_iter(), &m, &mut segs),
            Ok(MAX_FRAME_WITH_HEADER)
        );
        assert_eq!(segs.len(), 1);
    }

    #[test]
    fn gather_and_scatter_follow_the_segments() {
        let m = mem();
        let segs = [
            Segment {
                addr: GuestAddress(0x1000),
                len: 3,
            },
            Segment {
                addr: GuestAddress(0x2000),
                len: 5,
            },
        ];
        assert_eq!(scatter(&m, &segs, b"abcdefghij").unwrap(), 8);
        let mut buf = [0u8; 16];
        assert_eq!(gather(&m, &segs, &mut buf).unwrap(), 8);
        assert_eq!(&buf[..8], b"abcdefgh");
        let mut short = [0u8; 4];
        assert_eq!(gather(&m, &segs, &mut short).unwrap(), 3);
    }
}
