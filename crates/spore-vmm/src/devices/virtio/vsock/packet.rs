//! The virtio-vsock wire format (virtio 1.2 §5.10.6): the 44-byte packet
//! header, the parsing of a guest tx descriptor chain into a validated
//! [`TxPacket`], and the writing of host packets into guest rx buffers.
//!
//! This is the only place that reads vsock packets out of guest memory. Every
//! field the guest controls is checked here, so the connection and muxer code
//! after it can trust a [`TxPacket`]. Guest memory is only touched through
//! virtio-queue's `Reader`/`Writer`, which bounds-check every descriptor
//! against the guest memory map; nothing here holds a raw pointer into it.

use std::io::{Read, Write};
use std::ops::Deref;

pub use spore_abi::vsock::{
    Header, Op, HDR_SIZE, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
use virtio_queue::{DescriptorChain, Writer};

use crate::devices::virtio::GuestMemoryMmap;

/// Largest payload accepted in one guest packet (Linux sends at most 64 KiB).
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// A packet the guest sent, fully validated: addressed from the guest to the
/// host, stream type, known op, and a payload exactly `len` bytes long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxPacket {
    /// The guest's port.
    pub src_port: u32,
    /// The host port the guest addresses.
    pub dst_port: u32,
    pub op: Op,
    pub flags: u32,
    /// The guest's receive buffer size for this connection.
    pub buf_alloc: u32,
    /// Bytes the guest has consumed from its receive buffer.
    pub fwd_cnt: u32,
    /// Empty for every op but `Rw`.
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    #[error("descriptor chain does not lie in guest memory: {0}")]
    Chain(virtio_queue::Error),
    #[error("cannot access the packet in guest memory: {0}")]
    Access(std::io::Error),
    #[error("descriptor chain holds {0} readable bytes, less than the {HDR_SIZE}-byte header")]
    ShortHeader(usize),
    #[error("src_cid {got} is not the guest's cid {expected}")]
    SrcCid { got: u64, expected: u64 },
    #[error("dst_cid {0} is not the host cid {HOST_CID}")]
    DstCid(u64),
    #[error("len {} exceeds the {MAX_PAYLOAD}-byte maximum", .0.len)]
    TooLong(Header),
    #[error("len {} but the chain carries {avail} payload bytes", .hdr.len)]
    LenMismatch { hdr: Header, avail: usize },
    #[error("op {} carries a payload of {} bytes; only OP_RW may", .0.op, .0.len)]
    UnexpectedPayload(Header),
    #[error("socket type {} is not stream ({TYPE_STREAM})", .0.type_)]
    Type(Header),
    #[error("unknown op {}", .0.op)]
    UnknownOp(Header),
}

impl PacketError {
    /// For a well-addressed but malformed packet, the (host port, guest port)
    /// pair the device should answer with OP_RST. `None` when the packet
    /// cannot be attributed to a connection, or is itself an RST (an RST is
    /// never answered, or two peers could bounce RSTs forever).
    pub fn rst_ports(&self) -> Option<(u32, u32)> {
        let hdr = match self {
            PacketError::TooLong(h)
            | PacketError::UnexpectedPayload(h)
            | PacketError::Type(h)
            | PacketError::UnknownOp(h) => h,
            PacketError::LenMismatch { hdr, .. } => hdr,
            _ => return None,
        };
        (hdr.op != Op::Rst as u16).then_some((hdr.dst_port, hdr.src_port))
    }
}

/// Reads and validates one packet from a guest tx chain.
pub fn parse_tx<M>(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
    guest_cid: u64,
) -> Result<TxPacket, PacketError>
where
    M: Deref<Target = GuestMemoryMmap>,
{
    // Reader::new checks every readable descriptor against the memory map.
    let mut reader = chain.reader(mem).map_err(PacketError::Chain)?;
    let total = reader.available_bytes();
    if total < HDR_SIZE {
        return Err(PacketError::ShortHeader(total));
    }
    let mut raw = [0u8; HDR_SIZE];
    reader.read_exact(&mut raw).map_err(PacketError::Access)?;
    let hdr = Header::from_bytes(&raw);

    // Misaddressed packets are dropped without an answer: replying would
    // mean sending to an address the guest does not own.
    if hdr.src_cid != guest_cid {
        return Err(PacketError::SrcCid {
            got: hdr.src_cid,
            expected: guest_cid,
        });
    }
    if hdr.dst_cid != HOST_CID {
        return Err(PacketError::DstCid(hdr.dst_cid));
    }
    let len = hdr.len as usize;
    if len > MAX_PAYLOAD {
        return Err(PacketError::TooLong(hdr));
    }
    let avail = total - HDR_SIZE;
    if len != avail {
        return Err(PacketError::LenMismatch { hdr, avail });
    }
    if hdr.type_ != TYPE_STREAM {
        return Err(PacketError::Type(hdr));
    }
    let op = Op::from_raw(hdr.op).ok_or(PacketError::UnknownOp(hdr))?;
    if op != Op::Rw && len != 0 {
        return Err(PacketError::UnexpectedPayload(hdr));
    }
    let mut payload = vec![0u8; len];
    reader
        .read_exact(&mut payload)
        .map_err(PacketError::Access)?;
    Ok(TxPacket {
        src_port: hdr.src_port,
        dst_port: hdr.dst_port,
        op,
        flags: hdr.flags,
        buf_alloc: hdr.buf_alloc,
        fwd_cnt: hdr.fwd_cnt,
        payload,
    })
}

/// A guest rx buffer, ready to receive one host packet.
pub struct RxBuffer<'a> {
    writer: Writer<'a, vm_memory::bitmap::BS<'a, crate::devices::virtio::DirtyBitmap>>,
}

impl<'a> RxBuffer<'a> {
    /// Wraps the writable part of `chain`. `Ok(None)` when it cannot even
    /// hold a header.
    pub fn new<M>(
        mem: &'a GuestMemoryMmap,
        chain: DescriptorChain<M>,
    ) -> Result<Option<Self>, PacketError>
    where
        M: Deref<Target = GuestMemoryMmap>,
    {
        // Writer::new checks every writable descriptor against the memory map.
        let writer = chain.writer(mem).map_err(PacketError::Chain)?;
        if writer.available_bytes() < HDR_SIZE {
            return Ok(None);
        }
        Ok(Some(RxBuffer { writer }))
    }

    /// How many payload bytes fit after the header.
    pub fn payload_room(&self) -> usize {
        self.writer.available_bytes().saturating_sub(HDR_SIZE)
    }

    /// Writes the header (with `len` set to the payload length) and payload;
    /// returns the number of bytes written, for the used ring.
    pub fn write(mut self, hdr: &Header, payload: &[u8]) -> Result<u32, PacketError> {
        let mut hdr = *hdr;
        // payload is at most MAX_PAYLOAD bytes (the muxer's scratch buffer).
        hdr.len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        self.writer
            .write_all(&hdr.to_bytes())
            .map_err(PacketError::Access)?;
        self.writer
            .write_all(payload)
            .map_err(PacketError::Access)?;
        Ok(u32::try_from(self.writer.bytes_written()).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::split::Descriptor as SplitDescriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    const CID: u64 = 3;
    const MEM_SIZE: usize = 0x10_0000;
    const HDR_ADDR: u64 = 0x8_0000;
    const DATA_ADDR: u64 = 0x9_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
    }

    fn hdr(op: Op, len: u32) -> Header {
        Header {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port: 1234,
            dst_port: 52,
            len,
            type_: TYPE_STREAM,
            op: op as u16,
            flags: 0,
            buf_alloc: 4096,
            fwd_cnt: 17,
        }
    }

    fn desc(addr: u64, len: u32, flags: u32) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(
            addr,
            len,
            u16::try_from(flags).unwrap(),
            0,
        ))
    }

    /// Writes `h` at HDR_ADDR and `payload` at DATA_ADDR, then parses the
    /// chain made of `descs`.
    fn parse(
        mem: &GuestMemoryMmap,
        h: &Header,
        payload: &[u8],
        descs: &[RawDescriptor],
    ) -> Result<TxPacket, PacketError> {
        mem.write_slice(&h.to_bytes(), GuestAddress(HDR_ADDR))
            .unwrap();
        mem.write_slice(payload, GuestAddress(DATA_ADDR)).unwrap();
        let q = MockSplitQueue::create(mem, GuestAddress(0x1000), 16);
        let chain = q.build_desc_chain(descs).unwrap();
        parse_tx(mem, chain, CID)
    }

    #[test]
    fn header_round_trips() {
        let h = hdr(Op::Rw, 5);
        assert_eq!(Header::from_bytes(&h.to_bytes()), h);
        // Field offsets as in the spec.
        assert_eq!(h.to_bytes()[30], Op::Rw as u8);
        assert_eq!(h.to_bytes()[40], 17);
    }

    #[test]
    fn parses_valid_packets() {
        let m = mem();
        let pkt = parse(
            &m,
            &hdr(Op::Rw, 5),
            b"hello",
            &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 5, 0)],
        )
        .unwrap();
        assert_eq!((pkt.op, pkt.src_port, pkt.dst_port), (Op::Rw, 1234, 52));
        assert_eq!((pkt.buf_alloc, pkt.fwd_cnt), (4096, 17));
        assert_eq!(pkt.payload, b"hello");

        // A header split over descriptors, and device-writable descriptors
        // (ignored for tx) are fine.
        let pkt = parse(
            &m,
            &hdr(Op::Request, 0),
            b"",
            &[
                desc(HDR_ADDR, 10, 0),
                desc(HDR_ADDR + 10, 34, 0),
                desc(DATA_ADDR, 64, VRING_DESC_F_WRITE),
            ],
        )
        .unwrap();
        assert_eq!(pkt.op, Op::Request);
        assert!(pkt.payload.is_empty());
    }

    #[test]
    fn rejects_short_headers() {
        let m = mem();
        let r = parse(&m, &hdr(Op::Request, 0), b"", &[desc(HDR_ADDR, 40, 0)]);
        assert!(matches!(r, Err(PacketError::ShortHeader(40))), "{r:?}");
        // Only writable descriptors: nothing to read.
        let r = parse(
            &m,
            &hdr(Op::Request, 0),
            b"",
            &[desc(HDR_ADDR, 44, VRING_DESC_F_WRITE)],
        );
        assert!(matches!(r, Err(PacketError::ShortHeader(0))), "{r:?}");
    }

    #[test]
    fn rejects_len_not_matching_the_chain() {
        let m = mem();
        let r = parse(
            &m,
            &hdr(Op::Rw, 100),
            &[0; 50],
            &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 50, 0)],
        );
        assert!(
            matches!(r, Err(PacketError::LenMismatch { avail: 50, .. })),
            "{r:?}"
        );
        // Such a packet is answered with a reset of its connection.
        assert_eq!(r.unwrap_err().rst_ports(), Some((52, 1234)));

        let r = parse(
            &m,
            &hdr(Op::Rw, 2),
            b"abc",
            &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 3, 0)],
        );
        assert!(
            matches!(r, Err(PacketError::LenMismatch { avail: 3, .. })),
            "{r:?}"
        );

        let big = u32::try_from(MAX_PAYLOAD).unwrap() + 1;
        let r = parse(
            &m,
            &hdr(Op::Rw, big),
            b"",
            &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, big, 0)],
        );
        assert!(matches!(r, Err(PacketError::TooLong(_))), "{r:?}");

        let r = parse(
            &m,
            &hdr(Op::Request, 3),
            b"abc",
            &[desc(HDR_ADDR, 44, 0), desc(DATA_ADDR, 3, 0)],
        );
        assert!(matches!(r, Err(PacketError::UnexpectedPayload(_))), "{r:?}");
    }

    #[test]
    fn rejects_descriptors_outside_guest_memory() {
        let m = mem();
        let end = MEM_SIZE as u64;
        for descs in [
            vec![desc(end + 0x1000, 44, 0)],
            // Straddles the end of memory.
            vec![desc(HDR_ADDR, 44, 0), desc(end - 2, 5, 0)],
            vec![desc(u64::MAX - 10, 44, 0)],
        ] {
            let r = parse(&m, &hdr(Op::Rw, 5), b"hello", &descs);
            assert!(matches!(r, Err(PacketError::Chain(_))), "{descs:?}: {r:?}");
        }
    }

    #[test]
    fn rejects_wrong_addresses_silently() {
        let m = mem();
        let d = [desc(HDR_ADDR, 44, 0)];
        let mut h = hdr(Op::Request, 0);
        h.src_cid = 4;
        let e = parse(&m, &h, b"", &d).unwrap_err();
        assert!(matches!(
            e,
            PacketError::SrcCid {
                got: 4,
                expected: 3
            }
        ));
        assert_eq!(e.rst_ports(), None);

        let mut h = hdr(Op::Request, 0);
        h.dst_cid = 7;
        let e = parse(&m, &h, b"", &d).unwrap_err();
        assert!(matches!(e, PacketError::DstCid(7)));
        assert_eq!(e.rst_ports(), None);
    }

    #[test]
    fn answers_unknown_ops_and_types_with_reset() {
        let m = mem();
        let d = [desc(HDR_ADDR, 44, 0)];
        let mut h = hdr(Op::Request, 0);
        h.op = 99;
        let e = parse(&m, &h, b"", &d).unwrap_err();
        assert!(matches!(e, PacketError::UnknownOp(_)));
        assert_eq!(e.rst_ports(), Some((52, 1234)));

        let mut h = hdr(Op::Request, 0);
        h.type_ = 2; // SEQPACKET, not offered
        let e = parse(&m, &h, b"", &d).unwrap_err();
        assert!(matches!(e, PacketError::Type(_)));
        assert_eq!(e.rst_ports(), Some((52, 1234)));

        // A malformed RST is never answered.
        let mut h = hdr(Op::Rst, 0);
        h.type_ = 2;
        assert_eq!(parse(&m, &h, b"", &d).unwrap_err().rst_ports(), None);
    }

    #[test]
    fn writes_rx_packets_within_the_buffer() {
        let m = mem();
        let q = MockSplitQueue::create(&m, GuestAddress(0x1000), 16);
        let chain = q
            .build_desc_chain(&[
                desc(HDR_ADDR, 20, VRING_DESC_F_WRITE),
                desc(DATA_ADDR, 100, VRING_DESC_F_WRITE),
            ])
            .unwrap();
        let buf = RxBuffer::new(&m, chain).unwrap().unwrap();
        assert_eq!(buf.payload_room(), 76);
        let n = buf.write(&hdr(Op::Rw, 0), b"payload").unwrap();
        assert_eq!(n, 51);
        let mut raw = [0u8; HDR_SIZE];
        m.read_slice(&mut raw[..20], GuestAddress(HDR_ADDR))
            .unwrap();
        m.read_slice(&mut raw[20..], GuestAddress(DATA_ADDR))
            .unwrap();
        assert_eq!(Header::from_bytes(&raw), hdr(Op::Rw, 7));
        let mut payload = [0u8; 7];
        m.read_slice(&mut payload, GuestAddress(DATA_ADDR + 24))
            .unwrap();
        assert_eq!(&payload, b"payload");

        let small = q
            .build_desc_chain(&[desc(HDR_ADDR, 43, VRING_DESC_F_WRITE)])
            .unwrap();
        assert!(RxBuffer::new(&m, small).unwrap().is_none());
        let oob = q
            .build_desc_chain(&[desc(MEM_SIZE as u64, 4096, VRING_DESC_F_WRITE)])
            .unwrap();
        assert!(RxBuffer::new(&m, oob).is_err());
    }
}
