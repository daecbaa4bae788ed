//! The virtio-vsock packet header: the wire format is `spore_abi::vsock`
//! (shared with the VMM's device); the op codes as plain `u16`s for the
//! driver's matches.

pub use spore_abi::vsock::{
    Header, EVENT_TRANSPORT_RESET, HDR_SIZE, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_RCV, SHUTDOWN_SEND,
    TYPE_STREAM,
};

/// `VIRTIO_VSOCK_OP_*`.
pub mod op {
    use spore_abi::vsock::Op;

    pub const REQUEST: u16 = Op::Request as u16;
    pub const RESPONSE: u16 = Op::Response as u16;
    pub const RST: u16 = Op::Rst as u16;
    pub const SHUTDOWN: u16 = Op::Shutdown as u16;
    pub const RW: u16 = Op::Rw as u16;
    pub const CREDIT_UPDATE: u16 = Op::CreditUpdate as u16;
    pub const CREDIT_REQUEST: u16 = Op::CreditRequest as u16;
}
