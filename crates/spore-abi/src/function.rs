//! The function invoke protocol of `spore serve`: framed messages on one vsock
//! stream between the daemon (host side) and a function instance (guest side).
//!
//! The guest listens on [`INVOKE_VSOCK_PORT`]. For each accepted connection:
//!
//! 1. the guest sends [`Kind::Ready`] once its function is initialised
//!    (`arg` = how long its init took, in µs);
//! 2. the host sends [`Kind::Invoke`] (`len_a` = request-id length, `len_b` =
//!    payload length, `arg` = deadline in Unix ms; then the request id, then the
//!    payload);
//! 3. the guest answers [`Kind::ResultOk`] or [`Kind::ResultError`] (`len_a` =
//!    body length, `len_b` = log length, `arg` = handler time in ns; then the
//!    body, then the invocation's log). An error body is Lambda's error JSON
//!    (`{"errorMessage": ..., "errorType": ...}`);
//! 4. steps 2–3 repeat on the same connection (a warm instance). If the
//!    connection drops (host closed it, or a clone's transport reset), the guest
//!    goes back to accepting and sends `Ready` again on the next connection.
//!
//! Every frame starts with the fixed [`FrameHeader`] ([`HEADER_SIZE`] bytes,
//! little-endian). Both sides treat the other as untrusted: lengths are checked
//! against the limits here before anything is allocated or read.

/// The guest vsock port a function instance listens on ("SF").
pub const INVOKE_VSOCK_PORT: u32 = 0x5346;
/// `"SPFN"`, little-endian, at the start of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPFN");
/// Protocol version carried in every frame.
pub const VERSION: u8 = 1;
/// Size of [`FrameHeader`] on the wire.
pub const HEADER_SIZE: usize = 24;
/// Largest invoke payload and response body: Lambda's synchronous limit (6 MB).
pub const MAX_PAYLOAD: u32 = 6 * 1024 * 1024;
/// Largest invocation log a guest may return with a result.
pub const MAX_LOG: u32 = 64 * 1024;
/// Longest request id.
pub const MAX_REQUEST_ID: u32 = 64;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Guest → host: initialised and ready for an invocation.
    Ready = 1,
    /// Host → guest: run the handler on this payload.
    Invoke = 2,
    /// Guest → host: the handler returned a response.
    ResultOk = 3,
    /// Guest → host: the handler failed; the body is Lambda's error JSON.
    ResultError = 4,
}

impl Kind {
    /// The kind a raw byte names, if any.
    pub const fn from_raw(raw: u8) -> Option<Self> {
        Some(match raw {
            1 => Kind::Ready,
            2 => Kind::Invoke,
            3 => Kind::ResultOk,
            4 => Kind::ResultError,
            _ => return None,
        })
    }
}

/// Why a frame header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    BadMagic,
    BadVersion(u8),
    UnknownKind(u8),
    /// A length over its limit (or a non-zero length where none is allowed).
    BadLength {
        kind: Kind,
        len_a: u32,
        len_b: u32,
    },
}

/// The fixed header of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    /// Invoke: request-id length; results: body length; Ready: 0.
    pub len_a: u32,
    /// Invoke: payload length; results: log length; Ready: 0.
    pub len_b: u32,
    /// Ready: init time (µs); Invoke: deadline (Unix ms); results: handler time (ns).
    pub arg: u64,
}

impl FrameHeader {
    /// The header's wire form.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = VERSION;
        out[5] = self.kind as u8;
        // out[6..8] reserved, zero.
        out[8..12].copy_from_slice(&self.len_a.to_le_bytes());
        out[12..16].copy_from_slice(&self.len_b.to_le_bytes());
        out[16..24].copy_from_slice(&self.arg.to_le_bytes());
        out
    }

    /// Parses and checks a header: magic, version, kind and lengths within limits.
    pub fn decode(raw: &[u8; HEADER_SIZE]) -> Result<Self, FrameError> {
        let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        if word(0) != MAGIC {
            return Err(FrameError::BadMagic);
        }
        if raw[4] != VERSION {
            return Err(FrameError::BadVersion(raw[4]));
        }
        let kind = Kind::from_raw(raw[5]).ok_or(FrameError::UnknownKind(raw[5]))?;
        let mut arg_bytes = [0u8; 8];
        arg_bytes.copy_from_slice(&raw[16..24]);
        let header = FrameHeader {
            kind,
            len_a: word(8),
            len_b: word(12),
            arg: u64::from_le_bytes(arg_bytes),
        };
        let (max_a, max_b) = match kind {
            Kind::Ready => (0, 0),
            Kind::Invoke => (MAX_REQUEST_ID, MAX_PAYLOAD),
            Kind::ResultOk | Kind::ResultError => (MAX_PAYLOAD, MAX_LOG),
        };
        if header.len_a > max_a || header.len_b > max_b {
            return Err(FrameError::BadLength {
                kind,
                len_a: header.len_a,
                len_b: header.len_b,
            });
        }
        Ok(header)
    }

    /// Bytes that follow the header.
    pub fn body_len(&self) -> usize {
        self.len_a as usize + self.len_b as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = FrameHeader {
            kind: Kind::Invoke,
            len_a: 36,
            len_b: 1000,
            arg: 1_700_000_000_000,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn refuses_bad_headers() {
        let ok = FrameHeader {
            kind: Kind::ResultOk,
            len_a: 10,
            len_b: 10,
            arg: 0,
        }
        .encode();
        let mut bad = ok;
        bad[0] ^= 1;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameError::BadMagic));
        let mut bad = ok;
        bad[4] = 9;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameError::BadVersion(9)));
        let mut bad = ok;
        bad[5] = 0;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameError::UnknownKind(0)));
        let big = FrameHeader {
            kind: Kind::Invoke,
            len_a: 1,
            len_b: MAX_PAYLOAD + 1,
            arg: 0,
        };
        assert!(matches!(
            FrameHeader::decode(&big.encode()),
            Err(FrameError::BadLength { .. })
        ));
        let ready = FrameHeader {
            kind: Kind::Ready,
            len_a: 1,
            len_b: 0,
            arg: 0,
        };
        assert!(matches!(
            FrameHeader::decode(&ready.encode()),
            Err(FrameError::BadLength { .. })
        ));
    }
}
