//! Parsing of well-formed and hostile virtio-blk descriptor chains.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;

use super::*;
use crate::host_usize;

const W: u16 = VRING_DESC_F_WRITE as u16;
const R: u16 = 0;
const HDR: u64 = 0x1000;
const DATA: u64 = 0x2000;
const STATUS: u64 = 0x5000;
const MEM_SIZE: u64 = 0x10_0000;
const LIMITS: DiskLimits = DiskLimits {
    capacity_sectors: 16,
    read_only: false,
};

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), host_usize::from_u64(MEM_SIZE))]).unwrap()
}

fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

fn header(mem: &GuestMemoryMmap, ty: u32, sector: u64) -> RawDescriptor {
    mem.write_obj(ty.to_le(), GuestAddress(HDR)).unwrap();
    mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
    mem.write_obj(sector.to_le(), GuestAddress(HDR + 8))
        .unwrap();
    desc(HDR, 16, R)
}

fn status() -> RawDescriptor {
    desc(STATUS, 1, W)
}

/// Parses `descs` as one chain, linked in order.
fn parse_chain(
    mem: &GuestMemoryMmap,
    descs: &[RawDescriptor],
    limits: DiskLimits,
) -> Result<Request, Rejected> {
    let vq = MockSplitQueue::new(mem, 16);
    let chain = vq.build_desc_chain(descs).unwrap();
    parse(chain, mem, limits)
}

/// Parses raw descriptors exactly as given (their own flags and next fields).
fn parse_raw(mem: &GuestMemoryMmap, descs: &[RawDescriptor]) -> Result<Request, Rejected> {
    let vq = MockSplitQueue::new(mem, 16);
    let chain = vq.build_multiple_desc_chains(descs).unwrap();
    parse(chain, mem, LIMITS)
}

fn rejected_with_status(error: RequestError) -> Result<Request, Rejected> {
    Err(Rejected {
        status_addr: Some(GuestAddress(STATUS)),
        error,
    })
}

fn dropped(error: RequestError) -> Result<Request, Rejected> {
    Err(Rejected {
        status_addr: None,
        error,
    })
}

#[test]
fn well_formed_requests() {
    let mem = memory();
    let h = header(&mem, VIRTIO_BLK_T_IN, 2);
    let req = parse_chain(
        &mem,
        &[
            h,
            desc(DATA, 512, W),
            desc(DATA + 0x1000, 1024, W),
            status(),
        ],
        LIMITS,
    )
    .unwrap();
    assert_eq!(req.kind, RequestKind::In);
    assert_eq!(req.sector, 2);
    assert_eq!(req.data_len, 1536);
    assert_eq!(
        req.data,
        vec![
            Segment {
                addr: GuestAddress(DATA),
                len: 512
            },
            Segment {
                addr: GuestAddress(DATA + 0x1000),
                len: 1024
            }
        ]
    );
    assert_eq!(req.status_addr, GuestAddress(STATUS));

    let h = header(&mem, VIRTIO_BLK_T_OUT, 15);
    let req = parse_chain(&mem, &[h, desc(DATA, 512, R), status()], LIMITS).unwrap();
    assert_eq!(
        (req.kind, req.sector, req.data_len),
        (RequestKind::Out, 15, 512)
    );

    let h = header(&mem, VIRTIO_BLK_T_FLUSH, 0);
    let req = parse_chain(&mem, &[h, status()], LIMITS).unwrap();
    assert_eq!((req.kind, req.data_len), (RequestKind::Flush, 0));

    let h = header(&mem, VIRTIO_BLK_T_GET_ID, 0);
    let req = parse_chain(&mem, &[h, desc(DATA, 20, W), status()], LIMITS).unwrap();
    assert_eq!((req.kind, req.data_len), (RequestKind::GetId, 20));

    // A longer status descriptor: the status is its last byte.
    let h = header(&mem, VIRTIO_BLK_T_FLUSH, 0);
    let req = parse_chain(&mem, &[h, desc(STATUS, 4, W)], LIMITS).unwrap();
    assert_eq!(req.status_addr, GuestAddress(STATUS + 3));

    // Zero-length data descriptors are skipped; a zero-sector read is valid.
    let h = header(&mem, VIRTIO_BLK_T_IN, 16);
    let req = parse_chain(&mem, &[h, desc(DATA, 0, W), status()], LIMITS).unwrap();
    assert!(req.data.is_empty());
}

#[test]
fn data_outside_guest_memory() {
    let mem = memory();
    for (addr, len) in [
        (MEM_SIZE, 512),
        (MEM_SIZE - 256, 512),
        (u64::MAX - 10, 512),
        (u64::MAX, 1),
        (0x1_0000_0000, 512),
    ] {
        let h = header(&mem, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            parse_chain(&mem, &[h, desc(addr, len, W), status()], LIMITS),
            rejected_with_status(RequestError::OutOfMemory { addr, len }),
            "{addr:#x}+{len:#x}"
        );
    }
}

#[test]
fn chain_longer_than_4gib_is_dropped() {
    let mem = memory();
    // 16 + u32::MAX overflows the chain's byte count: virtio-queue ends the walk.
    let h = header(&mem, VIRTIO_BLK_T_IN, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, u32::MAX, W), status()], LIMITS),
        dropped(RequestError::Truncated)
    );
}

#[test]
fn bad_headers() {
    let mem = memory();
    header(&mem, VIRTIO_BLK_T_IN, 0);
    for h in [
        desc(HDR, 15, R),
        desc(HDR, 16, W),
        desc(MEM_SIZE - 8, 16, R),
        desc(u64::MAX - 7, 16, R),
    ] {
        assert_eq!(
            parse_chain(&mem, &[h, status()], LIMITS),
            rejected_with_status(RequestError::BadHeader)
        );
    }
    assert_eq!(
        parse_chain(&mem, &[status()], LIMITS),
        rejected_with_status(RequestError::MissingHeader)
    );
}

#[test]
fn partial_sectors_and_capacity() {
    let mem = memory();
    let h = header(&mem, VIRTIO_BLK_T_IN, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 513, W), status()], LIMITS),
        rejected_with_status(RequestError::PartialSector(513))
    );
    let h = header(&mem, VIRTIO_BLK_T_OUT, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 100, R), status()], LIMITS),
        rejected_with_status(RequestError::PartialSector(100))
    );
    for (sector, len) in [(15, 1024), (16, 512), (u64::MAX, 512), (u64::MAX, 0)] {
        let h = header(&mem, VIRTIO_BLK_T_IN, sector);
        assert_eq!(
            parse_chain(&mem, &[h, desc(DATA, len, W), status()], LIMITS),
            rejected_with_status(RequestError::BeyondCapacity {
                sector,
                count: u64::from(len) / 512,
                capacity: 16
            }),
            "sector {sector} len {len}"
        );
    }
}

#[test]
fn write_on_read_only_drive() {
    let mem = memory();
    let ro = DiskLimits {
        read_only: true,
        ..LIMITS
    };
    let h = header(&mem, VIRTIO_BLK_T_OUT, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 512, R), status()], ro),
        rejected_with_status(RequestError::ReadOnly)
    );
    let h = header(&mem, VIRTIO_BLK_T_IN, 0);
    assert!(parse_chain(&mem, &[h, desc(DATA, 512, W), status()], ro).is_ok());
}

#[test]
fn wrong_direction_and_unsupported() {
    let mem = memory();
    let h = header(&mem, VIRTIO_BLK_T_IN, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 512, R), status()], LIMITS),
        rejected_with_status(RequestError::WrongDirection)
    );
    let h = header(&mem, VIRTIO_BLK_T_OUT, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 512, W), status()], LIMITS),
        rejected_with_status(RequestError::WrongDirection)
    );
    let h = header(&mem, VIRTIO_BLK_T_GET_ID, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 20, R), status()], LIMITS),
        rejected_with_status(RequestError::WrongDirection)
    );
    for ty in [2, 11, 13, 0xffff_ffff] {
        let h = header(&mem, ty, 0);
        let r = parse_chain(&mem, &[h, status()], LIMITS);
        assert_eq!(r, rejected_with_status(RequestError::Unsupported(ty)));
        assert_eq!(r.unwrap_err().error.status(), VIRTIO_BLK_S_UNSUPP as u8);
    }
    assert_eq!(RequestError::ReadOnly.status(), VIRTIO_BLK_S_IOERR as u8);
}

#[test]
fn unusable_status_descriptor_drops_the_chain() {
    let mem = memory();
    for st in [
        desc(STATUS, 1, R),
        desc(STATUS, 0, W),
        desc(MEM_SIZE, 1, W),
        desc(u64::MAX, 1, W),
    ] {
        let h = header(&mem, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            parse_chain(&mem, &[h, desc(DATA, 512, W), st], LIMITS),
            dropped(RequestError::BadStatusDescriptor)
        );
    }
    // No status descriptor at all: the readable data is last.
    let h = header(&mem, VIRTIO_BLK_T_OUT, 0);
    assert_eq!(
        parse_chain(&mem, &[h, desc(DATA, 512, R)], LIMITS),
        dropped(RequestError::BadStatusDescriptor)
    );
    assert_eq!(
        parse(std::iter::empty(), &mem, LIMITS),
        dropped(RequestError::Empty)
    );
}

#[test]
fn looping_and_dangling_chains_are_dropped() {
    let mem = memory();
    let n = VRING_DESC_F_NEXT as u16;
    header(&mem, VIRTIO_BLK_T_IN, 0);
    let h_next = |next| RawDescriptor::from(SplitDescriptor::new(HDR, 16, n, next));
    // 0 -> 1 -> 0 -> ...: virtio-queue stops after queue-size descriptors.
    let looping = [
        h_next(1),
        RawDescriptor::from(SplitDescriptor::new(STATUS, 1, W | n, 0)),
    ];
    assert_eq!(parse_raw(&mem, &looping), dropped(RequestError::Truncated));
    // A next index past the descriptor table.
    assert_eq!(
        parse_raw(&mem, &[h_next(200)]),
        dropped(RequestError::Truncated)
    );
}

#[test]
fn chain_too_long_is_dropped() {
    let mem = memory();
    header(&mem, VIRTIO_BLK_T_IN, 0);
    // An indirect table (never offered to the driver) of 300 descriptors.
    let table = 0x1_0000u64;
    let count = 300u16;
    for i in 0..count {
        let d = if i == 0 {
            SplitDescriptor::new(HDR, 16, VRING_DESC_F_NEXT as u16, 1)
        } else if i == count - 1 {
            SplitDescriptor::new(STATUS, 1, W, 0)
        } else {
            SplitDescriptor::new(DATA, 512, W | VRING_DESC_F_NEXT as u16, i + 1)
        };
        mem.write_obj(
            RawDescriptor::from(d),
            GuestAddress(table + u64::from(i) * 16),
        )
        .unwrap();
    }
    let head = desc(table, u32::from(count) * 16, VRING_DESC_F_INDIRECT as u16);
    assert_eq!(parse_raw(&mem, &[head]), dropped(RequestError::TooLong));
}
