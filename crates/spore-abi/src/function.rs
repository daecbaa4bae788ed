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
//!    (`{"errorMessage": ..., "errorType": ...}`). Before its result the guest
//!    may send any number of [`Kind::Log`] frames (`len_a` = 0, `len_b` = log
//!    length, `arg` = 0; then the log bytes): parts of the invocation's log
//!    sent while the handler still runs, so that the host keeps them if the
//!    instance dies before answering. The invocation's log is then those
//!    parts, in order, followed by the result's log. A guest that sends none
//!    (the Linux agent; unikernels built before `Log` existed) sends its whole
//!    log with the result, as before;
//! 4. steps 2–3 repeat on the same connection (a warm instance). If the
//!    connection drops (host closed it, or a clone's transport reset), the guest
//!    goes back to accepting and sends `Ready` again on the next connection.
//!    A guest whose function process died or timed out during an invocation
//!    answers it with `ResultError` (`Runtime.ExitError`, `Sandbox.Timedout`)
//!    and closes the connection; it restarts the function before its next
//!    `Ready`.
//!
//! ## Standby and Configure (Linux guests: `spore-agent`)
//!
//! A Linux function guest boots a generic language runtime first and learns
//! which function it runs later, so that the host can snapshot one
//! initialised runtime (its *base snapshot*) and start every function of that
//! runtime from it. Its agent adds three kinds before step 1:
//!
//! - guest → host [`Kind::Standby`] (no body, `arg` = µs since the agent
//!   started): the runtime is initialised and no function is attached; the
//!   host may take the base snapshot now. Sent on each connection while the
//!   agent is not configured.
//! - host → guest [`Kind::Configure`] (`len_a` = JSON length, at most
//!   [`MAX_CONFIG`]; `len_b` = 0): which function to run, as JSON:
//!
//!   ```json
//!   {"function_name": "hello", "function_version": "$LATEST",
//!    "handler": "app.handler", "memory_mib": 128, "timeout_s": 3,
//!    "region": "us-east-1", "env": {"KEY": "value"},
//!    "code_device": "/dev/vdb", "code_dir": "/var/task"}
//!   ```
//!
//!   `code_device` (or `null`) is an ext4 image the guest mounts read-only at
//!   `code_dir`; `function_version`, `env`, `code_device` and `code_dir` may be
//!   left out (`$LATEST`, `{}`, `null`, `/var/task`). The guest then
//!   initialises the function and answers `Ready` (step 1), or
//!   [`Kind::InitError`].
//! - guest → host [`Kind::InitError`] (`len_a` = Lambda's error JSON length,
//!   `len_b` = log length, `arg` = init time in ns; then the body, then the
//!   log): the function's init failed (`errorType` e.g.
//!   `Runtime.ImportModuleError`, `Runtime.ExitError`). The guest closes the
//!   connection after it and sends it again on every later connection. A
//!   `Configure` the guest cannot use at all (bad JSON, a code device that
//!   does not mount) is also answered with `InitError` (`errorType`
//!   `Spore.InvalidConfigure`, `Spore.CodeDeviceError`), but the guest stays
//!   unconfigured: the next connection gets `Standby` again.
//!
//! So a fresh guest's connection goes `Standby` → `Configure` → `Ready` (or
//! `InitError`) → `Invoke`/result..., and a configured guest's (a clone, or a
//! guest restored from a snapshot taken after Configure) goes straight to
//! `Ready`. A `Configure` sent to a configured guest updates its metadata
//! (version, environment) and is answered by `Ready`. A host that expects
//! `Ready` and gets anything else treats it as a protocol error.
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
/// Largest [`Kind::Configure`] JSON.
pub const MAX_CONFIG: u32 = 64 * 1024;

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
    /// Guest → host: runtime initialised, no function attached (base-snapshot point).
    Standby = 5,
    /// Host → guest: the function to run (JSON).
    Configure = 6,
    /// Guest → host: the function's init failed; the body is Lambda's error JSON.
    InitError = 7,
    /// Guest → host, during an invocation: a part of its log, sent before the result.
    Log = 8,
}

impl Kind {
    /// The kind a raw byte names, if any.
    pub const fn from_raw(raw: u8) -> Option<Self> {
        Some(match raw {
            1 => Kind::Ready,
            2 => Kind::Invoke,
            3 => Kind::ResultOk,
            4 => Kind::ResultError,
            5 => Kind::Standby,
            6 => Kind::Configure,
            7 => Kind::InitError,
            8 => Kind::Log,
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
    /// Invoke: request-id length; results and InitError: body length;
    /// Configure: JSON length; Ready, Standby and Log: 0.
    pub len_a: u32,
    /// Invoke: payload length; results, InitError and Log: log length;
    /// others: 0.
    pub len_b: u32,
    /// Ready: init time (µs); Standby: time since the agent started (µs);
    /// Invoke: deadline (Unix ms); results: handler time (ns); InitError: init
    /// time (ns); Configure and Log: 0 (ignored).
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
            Kind::Ready | Kind::Standby => (0, 0),
            Kind::Invoke => (MAX_REQUEST_ID, MAX_PAYLOAD),
            Kind::ResultOk | Kind::ResultError | Kind::InitError => (MAX_PAYLOAD, MAX_LOG),
            Kind::Configure => (MAX_CONFIG, 0),
            Kind::Log => (0, MAX_LOG),
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

    #[test]
    fn every_kind_round_trips() {
        for raw in 1..=8u8 {
            let kind = Kind::from_raw(raw).unwrap();
            assert_eq!(kind as u8, raw);
            let h = FrameHeader {
                kind,
                len_a: 0,
                len_b: 0,
                arg: u64::MAX - u64::from(raw),
            };
            assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        }
        assert_eq!(Kind::from_raw(9), None);
    }

    #[test]
    fn standby_configure_init_error_and_log_limits() {
        let check = |kind, len_a, len_b| {
            FrameHeader::decode(
                &FrameHeader {
                    kind,
                    len_a,
                    len_b,
                    arg: 0,
                }
                .encode(),
            )
        };
        // Standby carries nothing.
        assert!(check(Kind::Standby, 0, 0).is_ok());
        assert!(check(Kind::Standby, 0, 1).is_err());
        assert!(check(Kind::Standby, 1, 0).is_err());
        // Configure: JSON up to MAX_CONFIG, nothing in len_b.
        assert!(check(Kind::Configure, MAX_CONFIG, 0).is_ok());
        assert_eq!(
            check(Kind::Configure, MAX_CONFIG + 1, 0),
            Err(FrameError::BadLength {
                kind: Kind::Configure,
                len_a: MAX_CONFIG + 1,
                len_b: 0
            })
        );
        assert!(check(Kind::Configure, 10, 1).is_err());
        // InitError: like a result.
        assert!(check(Kind::InitError, MAX_PAYLOAD, MAX_LOG).is_ok());
        assert!(check(Kind::InitError, MAX_PAYLOAD + 1, 0).is_err());
        assert!(check(Kind::InitError, 0, MAX_LOG + 1).is_err());
        // Log: log bytes only, up to MAX_LOG.
        assert!(check(Kind::Log, 0, MAX_LOG).is_ok());
        assert!(check(Kind::Log, 0, MAX_LOG + 1).is_err());
        assert!(check(Kind::Log, 1, 0).is_err());
        // A length that would overflow usize arithmetic on 32 bits is refused first.
        assert!(check(Kind::Configure, u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn kinds_keep_their_wire_numbers() {
        // Deployed unikernels speak 1..=4: the new kinds must not renumber them.
        assert_eq!(Kind::Ready as u8, 1);
        assert_eq!(Kind::Invoke as u8, 2);
        assert_eq!(Kind::ResultOk as u8, 3);
        assert_eq!(Kind::ResultError as u8, 4);
        assert_eq!(Kind::Standby as u8, 5);
        assert_eq!(Kind::Configure as u8, 6);
        assert_eq!(Kind::InitError as u8, 7);
        assert_eq!(Kind::Log as u8, 8);
        assert_eq!(VERSION, 1);
    }
}
