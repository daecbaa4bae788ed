//! The virtio-vsock wire format (virtio 1.2 §5.10.6): the 44-byte packet
//! header, little-endian on the wire, and its constants. The VMM's device
//! and the unikernel's driver both speak it, so it is defined once here.

/// Size of `struct virtio_vsock_hdr`.
pub const HDR_SIZE: usize = 44;
/// The host's well-known CID.
pub const HOST_CID: u64 = 2;
/// `VIRTIO_VSOCK_TYPE_STREAM`, the only socket type offered.
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flag: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// Shutdown flag: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;
/// Both shutdown flags.
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;
/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`: the device dropped every connection.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Packet operations (`VIRTIO_VSOCK_OP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    Request = 1,
    Response = 2,
    Rst = 3,
    Shutdown = 4,
    Rw = 5,
    CreditUpdate = 6,
    CreditRequest = 7,
}

impl Op {
    /// The operation a header's `op` field names, if it is a known one.
    pub const fn from_raw(raw: u16) -> Option<Self> {
        Some(match raw {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// `struct virtio_vsock_hdr`, fields in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

fn u64_at(b: &[u8; HDR_SIZE], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8; HDR_SIZE], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8; HDR_SIZE], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

impl Header {
    pub fn from_bytes(b: &[u8; HDR_SIZE]) -> Self {
        Header {
            src_cid: u64_at(b, 0),
            dst_cid: u64_at(b, 8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            type_: u16_at(b, 28),
            op: u16_at(b, 30),
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        }
    }

    pub fn to_bytes(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_wire_order() {
        let h = Header {
            src_cid: 2,
            dst_cid: 3,
            src_port: 1024,
            dst_port: 6379,
            len: 5,
            type_: TYPE_STREAM,
            op: Op::Rw as u16,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 7,
        };
        let b = h.to_bytes();
        assert_eq!(&b[16..20], &1024u32.to_le_bytes());
        assert_eq!(&b[30..32], &5u16.to_le_bytes());
        assert_eq!(Header::from_bytes(&b), h);
    }

    #[test]
    fn only_known_ops_decode() {
        assert_eq!(Op::from_raw(1), Some(Op::Request));
        assert_eq!(Op::from_raw(7), Some(Op::CreditRequest));
        assert_eq!(Op::from_raw(0), None);
        assert_eq!(Op::from_raw(8), None);
    }
}
