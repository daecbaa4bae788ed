//! The virtio-mem wire format (virtio 1.2, §5.15.6), parsed and validated in
//! one place.
//!
//! A request is 24 bytes the driver wrote (`le16 type; le16 pad[3]; le64 addr;
//! le16 nb_blocks; le16 pad[3]`; UNPLUG_ALL carries no payload but drivers
//! send the full struct), the response 10 bytes the device writes (`le16
//! type; le16 pad[3]; le16 state`). The chain comes from the guest: its
//! readable part may be split over several descriptors, and every length and
//! address is checked before use.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress};

use crate::devices::virtio::GuestMemoryMmap;

pub const REQ_PLUG: u16 = 0;
pub const REQ_UNPLUG: u16 = 1;
pub const REQ_UNPLUG_ALL: u16 = 2;
pub const REQ_STATE: u16 = 3;

pub const RESP_ACK: u16 = 0;
pub const RESP_NACK: u16 = 1;
pub const RESP_BUSY: u16 = 2;
pub const RESP_ERROR: u16 = 3;

pub const STATE_PLUGGED: u16 = 0;
pub const STATE_UNPLUGGED: u16 = 1;
pub const STATE_MIXED: u16 = 2;

/// Bytes of a request: header and the largest payload.
pub const REQUEST_LEN: usize = 24;
/// Bytes of a response.
pub const RESPONSE_LEN: usize = 10;
/// Bytes of a request the device needs: the header alone for UNPLUG_ALL.
const HEADER_LEN: usize = 8;

/// A request as the driver sent it; ranges are not yet checked against the
/// region (that needs the block map, see [`super::blocks::BlockMap::range`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Plug { addr: u64, nb_blocks: u64 },
    Unplug { addr: u64, nb_blocks: u64 },
    UnplugAll,
    State { addr: u64, nb_blocks: u64 },
}

/// Why a chain is not a request the device can answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request of {0} bytes is too short")]
    Short(usize),
    #[error("unknown request type {0}")]
    UnknownType(u16),
    #[error("the chain has no device-writable buffer of {RESPONSE_LEN} bytes for the response")]
    NoResponseBuffer,
    #[error("a request buffer lies outside guest memory")]
    BadBuffer,
}

/// A device answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub resp_type: u16,
    pub state: u16,
}

impl Response {
    pub const fn of(resp_type: u16) -> Self {
        Self {
            resp_type,
            state: 0,
        }
    }

    pub fn encode(self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..2].copy_from_slice(&self.resp_type.to_le_bytes());
        b[8..10].copy_from_slice(&self.state.to_le_bytes());
        b
    }
}

/// Decodes request bytes. Padding is ignored, as the spec says.
pub fn decode(bytes: &[u8]) -> Result<Request, RequestError> {
    if bytes.len() < HEADER_LEN {
        return Err(RequestError::Short(bytes.len()));
    }
    let le16 = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let kind = le16(0);
    if kind == REQ_UNPLUG_ALL {
        return Ok(Request::UnplugAll);
    }
    if !matches!(kind, REQ_PLUG | REQ_UNPLUG | REQ_STATE) {
        return Err(RequestError::UnknownType(kind));
    }
    if bytes.len() < REQUEST_LEN - 6 {
        return Err(RequestError::Short(bytes.len()));
    }
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&bytes[8..16]);
    let addr = u64::from_le_bytes(addr);
    let nb_blocks = u64::from(le16(16));
    Ok(match kind {
        REQ_PLUG => Request::Plug { addr, nb_blocks },
        REQ_UNPLUG => Request::Unplug { addr, nb_blocks },
        _ => Request::State { addr, nb_blocks },
    })
}

/// A chain split into the request it carries and where the response goes.
#[derive(Debug)]
pub struct ParsedChain {
    pub request: Result<Request, RequestError>,
    /// Guest address of a writable buffer of at least [`RESPONSE_LEN`] bytes.
    pub response_at: Option<GuestAddress>,
}

/// Reads the request from the chain's readable descriptors (up to
/// [`REQUEST_LEN`] bytes, in order) and finds the first writable descriptor
/// large enough for the response.
pub fn parse_chain(
    descriptors: impl Iterator<Item = Descriptor>,
    mem: &GuestMemoryMmap,
) -> ParsedChain {
    let mut buf = [0u8; REQUEST_LEN];
    let mut have = 0usize;
    let mut bad_buffer = false;
    let mut response_at = None;
    for d in descriptors {
        if d.is_write_only() {
            if response_at.is_none() && d.len() as usize >= RESPONSE_LEN {
                response_at = Some(d.addr());
            }
            continue;
        }
        if have >= REQUEST_LEN || bad_buffer {
            continue;
        }
        let n = (d.len() as usize).min(REQUEST_LEN - have);
        if n == 0 {
            continue;
        }
        if d.addr().checked_add(n as u64).is_none()
            || mem.read_slice(&mut buf[have..have + n], d.addr()).is_err()
        {
            bad_buffer = true;
            continue;
        }
        have += n;
    }
    let request = if bad_buffer {
        Err(RequestError::BadBuffer)
    } else if response_at.is_none() {
        Err(RequestError::NoResponseBuffer)
    } else {
        decode(&buf[..have])
    };
    ParsedChain {
        request,
        response_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: u16, addr: u64, nb: u16) -> [u8; REQUEST_LEN] {
        let mut b = [0xaau8; REQUEST_LEN];
        b[0..2].copy_from_slice(&kind.to_le_bytes());
        b[8..16].copy_from_slice(&addr.to_le_bytes());
        b[16..18].copy_from_slice(&nb.to_le_bytes());
        b
    }

    #[test]
    fn decodes_every_type() {
        assert_eq!(
            decode(&req(REQ_PLUG, 0x1_0000_0000, 64)),
            Ok(Request::Plug {
                addr: 0x1_0000_0000,
                nb_blocks: 64
            })
        );
        assert_eq!(
            decode(&req(REQ_UNPLUG, 0x20_0000, u16::MAX)),
            Ok(Request::Unplug {
                addr: 0x20_0000,
                nb_blocks: 65_535
            })
        );
        assert_eq!(
            decode(&req(REQ_STATE, 8, 1)),
            Ok(Request::State {
                addr: 8,
                nb_blocks: 1
            })
        );
        assert_eq!(decode(&req(REQ_UNPLUG_ALL, 0, 0)), Ok(Request::UnplugAll));
        assert_eq!(
            decode(&req(REQ_UNPLUG_ALL, 0, 0)[..8]),
            Ok(Request::UnplugAll)
        );
        assert_eq!(decode(&req(4, 0, 0)), Err(RequestError::UnknownType(4)));
        assert_eq!(
            decode(&req(0xffff, 0, 0)),
            Err(RequestError::UnknownType(0xffff))
        );
        assert_eq!(
            decode(&req(REQ_PLUG, 0, 1)[..17]),
            Err(RequestError::Short(17))
        );
        assert_eq!(decode(&[0u8; 3]), Err(RequestError::Short(3)));
        assert_eq!(decode(&[]), Err(RequestError::Short(0)));
    }

    #[test]
    fn response_layout() {
        let r = Response {
            resp_type: RESP_ERROR,
            state: STATE_MIXED,
        }
        .encode();
        assert_eq!(r, [3, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
        assert_eq!(Response::of(RESP_NACK).encode()[0], 1);
        assert_eq!(RESP_BUSY, 2);
    }
}
