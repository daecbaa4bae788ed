//! The function SDK: a unikernel that serves invocations of a `spore serve`
//! function.
//!
//! ```ignore
//! fn main(info: &BootInfo) -> i32 {
//!     // init: whatever the function needs before its first invocation
//!     spore_uk::function::serve(info, |event, ctx| Ok(event.to_vec()))
//! }
//! ```
//!
//! [`serve`] speaks [`spore_abi::function`] over vsock: it listens on
//! [`INVOKE_VSOCK_PORT`], says `Ready` on every connection the host makes, and
//! answers each `Invoke` with the handler's result and the invocation's log
//! ([`flog!`](crate::flog); a handler that sleeps or runs long sends it in
//! `Log` frames before its result, see `send_pending_log`). A connection
//! that drops (the host closed it, or a clone's transport reset) sends it
//! back to accepting. A frame that breaks the protocol closes the
//! connection; the guest never trusts the host's lengths beyond the limits
//! of the protocol. Idle, it sleeps in the signal port's
//! `WAIT`, so an idle instance costs the host no CPU.
//!
//! The function's environment comes from the command line (`env.KEY=VALUE`,
//! VALUE percent-encoded): [`env`].

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use spore_abi::function::{
    FrameHeader, Kind, HEADER_SIZE, INVOKE_VSOCK_PORT, MAX_LOG, MAX_PAYLOAD,
};

use crate::virtio::vsock::{ConnId, Vsock, VsockConfig, VsockError};
use crate::{clock, BootInfo};

/// What a handler knows about the invocation it serves.
pub struct Context<'a> {
    /// The host's id of this invocation.
    pub request_id: &'a str,
    /// When the invocation times out, in Unix ms (0: not given).
    pub deadline_unix_ms: u64,
    /// Invocations this instance has served before this one.
    pub served: u64,
}

/// A handled function error, reported as Lambda's error JSON.
pub struct FunctionError {
    pub error_type: String,
    pub message: String,
}

impl FunctionError {
    pub fn new(error_type: &str, message: &str) -> Self {
        FunctionError {
            error_type: error_type.into(),
            message: message.into(),
        }
    }

    fn to_json(&self) -> Vec<u8> {
        let mut out = String::from("{\"errorMessage\":");
        push_json_string(&mut out, &self.message);
        out.push_str(",\"errorType\":");
        push_json_string(&mut out, &self.error_type);
        out.push('}');
        out.into_bytes()
    }
}

/// What a handler returns: the response body, or a function error.
pub type Response = Result<Vec<u8>, FunctionError>;

/// The invocation log not yet sent: what the function printed with
/// [`flog!`](crate::flog) during the current invocation since its last
/// `Log` frame, its last [`MAX_LOG`] bytes.
static LOG: spin::Mutex<Vec<u8>> = spin::Mutex::new(Vec::new());
/// Whether [`LOG`] may hold bytes: what every sleep checks, one load.
static LOG_PENDING: AtomicBool = AtomicBool::new(false);
/// The TSC when the current handler started or last sent a `Log` frame.
static LOG_SENT_TSC: AtomicU64 = AtomicU64::new(0);
/// A handler that runs without sleeping sends what it logged at most this
/// often (ms).
const LOG_STREAM_EVERY_MS: u64 = 1;

#[doc(hidden)]
pub fn log_fmt(args: fmt::Arguments) {
    let mut line = String::new();
    if fmt::write(&mut line, args).is_err() {
        return;
    }
    line.push('\n');
    append_tail(&mut LOG.lock(), line.as_bytes(), MAX_LOG as usize);
    LOG_PENDING.store(true, Ordering::Relaxed);
    let since = clock::rdtsc().wrapping_sub(LOG_SENT_TSC.load(Ordering::Relaxed));
    if clock::tsc_khz().is_some_and(|khz| since >= khz.saturating_mul(LOG_STREAM_EVERY_MS)) {
        send_pending_log();
    }
}

/// Sends what the running handler logged and has not sent yet to the host
/// in a `Log` frame, so that it outlives the instance: the host keeps the
/// parts it got when the instance dies before answering (its VMM killed,
/// the guest crashed or timed out).
///
/// Called when the handler logs a line a millisecond or more after its
/// start or its last `Log` frame, and whenever the guest is about to sleep
/// ([`crate::wait`]) or exit (the signal port's hook, set by [`serve`]).
/// Why not at every line: a frame costs a notification of the vsock device
/// (a VM exit) and a wake-up of the daemon, which a warm invocation (about
/// 0.17 ms on the host) that logs a line or two cannot afford: its log goes
/// with its result, as it always did. A handler that sleeps or runs long
/// can: its sleep is a VM exit anyway. What an instance killed
/// mid-invocation can still lose: the lines a handler that does not sleep
/// logged less than a millisecond after its start or its last `Log` frame,
/// if it logs nothing more.
fn send_pending_log() {
    if !LOG_PENDING.load(Ordering::Relaxed) {
        return;
    }
    // Held while sending: a wait inside the send (for the host's credit)
    // comes back here and finds it taken, and the panic handler does not
    // use the Vsock at the same time.
    let Some(serving) = SERVING.try_lock() else {
        return;
    };
    let Some((vsock_addr, conn)) = *serving else {
        return;
    };
    let part = core::mem::take(&mut *LOG.lock());
    LOG_PENDING.store(false, Ordering::Relaxed);
    LOG_SENT_TSC.store(clock::rdtsc(), Ordering::Relaxed);
    if part.is_empty() {
        return;
    }
    let header = FrameHeader {
        kind: Kind::Log,
        len_a: 0,
        // `append_tail` keeps LOG within MAX_LOG.
        len_b: part.len().min(MAX_LOG as usize) as u32,
        arg: 0,
    };
    // One write, so one packet (and one notification) for a short part.
    let mut frame = Vec::new();
    if frame.try_reserve_exact(HEADER_SIZE + part.len()).is_err() {
        // It goes with the result instead.
        append_tail(&mut LOG.lock(), &part, MAX_LOG as usize);
        LOG_PENDING.store(true, Ordering::Relaxed);
        return;
    }
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(&part[..header.len_b as usize]);
    drop(part);
    // SAFETY: `serve_one` stores the address of its `Vsock` in SERVING only
    // while the handler runs on this, the only, thread, with `serve_one`'s
    // frame (and the Vsock in it) alive below it and not touching the Vsock
    // until the handler returns; the lock held above keeps this the only
    // use of it meanwhile (the handler has no access to that Vsock).
    let vsock = unsafe { &mut *(vsock_addr as *mut Vsock) };
    // A connection that broke takes the log with it, and the result too.
    let _ = vsock.write_all(conn, &frame);
}

/// Adds a line to the invocation's log, which `spore serve` keeps (`spore fn
/// logs`, `LogType: Tail`). It is sent with the result, or during the
/// invocation when the handler sleeps, or logs a millisecond or more after
/// its start or the last send, so that the host keeps it even if the
/// instance dies before answering. Not printed on the serial console: every
/// byte there is a VM exit, which a warm invocation cannot afford.
#[macro_export]
macro_rules! flog {
    ($($arg:tt)*) => { $crate::function::log_fmt(format_args!($($arg)*)) };
}

/// Appends `data` to `log`, keeping only the last `cap` bytes.
fn append_tail(log: &mut Vec<u8>, data: &[u8], cap: usize) {
    let data = &data[data.len().saturating_sub(cap)..];
    let overflow = (log.len() + data.len()).saturating_sub(cap);
    if overflow > 0 {
        log.drain(..overflow.min(log.len()));
    }
    if log.try_reserve(data.len()).is_ok() {
        log.extend_from_slice(data);
    }
}

/// The value of environment variable `key`, from `env.KEY=VALUE` on the
/// command line, percent-decoded. `None` if unset or not valid UTF-8.
pub fn env(key: &str) -> Option<String> {
    find_env(crate::cmdline(), key)
}

fn find_env(cmdline: &str, key: &str) -> Option<String> {
    let raw = cmdline.split_ascii_whitespace().find_map(|word| {
        let rest = word.strip_prefix("env.")?;
        let (k, v) = rest.split_once('=')?;
        (k == key).then_some(v)
    })?;
    percent_decode(raw)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = core::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Appends `s` as a JSON string (quoted, escaped): for functions' results.
pub fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = fmt::write(out, format_args!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The text after `"key":` in a flat JSON event (a function's payload),
/// with spaces skipped: what the example functions read their knobs with.
pub fn json_field<'a>(event: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let pat = alloc::format!("\"{key}\"");
    let at = event.windows(pat.len()).position(|w| w == pat.as_bytes())?;
    let rest = &event[at + pat.len()..];
    let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..];
    let rest = rest.strip_prefix(b":")?;
    Some(&rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..])
}

/// A whole number at `"key":` in a flat JSON event.
pub fn json_number_field(event: &[u8], key: &str) -> Option<u64> {
    let v = json_field(event, key)?;
    let end = v
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(v.len());
    core::str::from_utf8(&v[..end]).ok()?.parse().ok()
}

/// The connection an invocation is being served on, for the panic handler:
/// a panic inside a handler is reported to the host as a function error
/// before the guest exits.
static SERVING: spin::Mutex<Option<(usize, ConnId)>> = spin::Mutex::new(None);

/// Called by the runtime's panic handler.
pub(crate) fn report_panic(info: &core::panic::PanicInfo) {
    let Some(mut serving) = SERVING.try_lock() else {
        return;
    };
    let Some((vsock_addr, conn)) = serving.take() else {
        return;
    };
    // SAFETY: `serve` stores the address of its `Vsock` only while a handler
    // runs on this, the only, thread; `serve`'s frame (and the Vsock in it) is
    // alive below the panicking handler, and nothing else touches the Vsock
    // until the guest exits right after this.
    let vsock = unsafe { &mut *(vsock_addr as *mut Vsock) };
    let mut message = String::new();
    let _ = fmt::write(&mut message, format_args!("{}", info.message()));
    let body = FunctionError::new("Runtime.Panic", &message).to_json();
    let log = core::mem::take(&mut *LOG.lock());
    LOG_PENDING.store(false, Ordering::Relaxed);
    let _ = send_result(vsock, conn, Kind::ResultError, &body, &log, 0);
    // The VM ends right after this: wait until the host has the result,
    // which it shows by closing the connection (or ending this VM, as it
    // does after a runtime error). Bounded, so a host that never closes
    // does not keep a broken guest alive: 100 waits of at most 10 ms.
    for _ in 0..100 {
        if vsock.at_eof(conn) {
            break;
        }
        vsock.wait_for_work(10_000);
    }
}

/// Serves invocations forever with `handler`. Exits the guest with 2 if
/// there is no vsock device (nothing could ever invoke it).
pub fn serve<F>(info: &BootInfo, mut handler: F) -> !
where
    F: FnMut(&[u8], &Context) -> Response,
{
    let init_us = clock::since_start_us();
    // A handler that sleeps sends what it logged first.
    crate::signal::set_before_sleep(send_pending_log);
    let config = VsockConfig {
        max_connections: 4,
        conn_buffer: 256 * 1024,
    };
    let mut vsock = match Vsock::new(info, config) {
        Ok(v) => v,
        Err(e) => {
            crate::println!("function: no vsock device: {e:?}");
            crate::exit(2)
        }
    };
    if let Err(e) = vsock.listen(INVOKE_VSOCK_PORT) {
        crate::println!("function: cannot listen: {e}");
        crate::exit(2)
    }
    let mut served = 0u64;
    loop {
        let conn = vsock.accept_wait();
        let ready = FrameHeader {
            kind: Kind::Ready,
            len_a: 0,
            len_b: 0,
            arg: init_us,
        };
        if vsock.write_all(conn, &ready.encode()).is_err() {
            vsock.close(conn);
            continue;
        }
        while let Ok(()) = serve_one(&mut vsock, conn, &mut handler, &mut served) {}
        vsock.close(conn);
    }
}

/// Why a connection ends.
enum ConnEnd {
    Closed,
    BadFrame,
    OutOfMemory,
}

impl From<VsockError> for ConnEnd {
    fn from(_: VsockError) -> Self {
        ConnEnd::Closed
    }
}

/// Reads one `Invoke`, runs the handler, answers.
fn serve_one<F>(
    vsock: &mut Vsock,
    conn: ConnId,
    handler: &mut F,
    served: &mut u64,
) -> Result<(), ConnEnd>
where
    F: FnMut(&[u8], &Context) -> Response,
{
    let mut raw = [0u8; HEADER_SIZE];
    read_exact(vsock, conn, &mut raw)?;
    let header = match FrameHeader::decode(&raw) {
        Ok(h) if h.kind == Kind::Invoke => h,
        Ok(h) => {
            crate::println!("function: unexpected {:?} frame from the host", h.kind);
            return Err(ConnEnd::BadFrame);
        }
        Err(e) => {
            crate::println!("function: bad frame from the host: {e:?}");
            return Err(ConnEnd::BadFrame);
        }
    };
    let mut id = [0u8; spore_abi::function::MAX_REQUEST_ID as usize];
    let id = &mut id[..header.len_a as usize];
    read_exact(vsock, conn, id)?;
    let request_id = core::str::from_utf8(id).map_err(|_| ConnEnd::BadFrame)?;
    let mut payload = Vec::new();
    payload
        .try_reserve_exact(header.len_b as usize)
        .map_err(|_| ConnEnd::OutOfMemory)?;
    payload.resize(header.len_b as usize, 0);
    read_exact(vsock, conn, &mut payload)?;

    LOG.lock().clear();
    LOG_PENDING.store(false, Ordering::Relaxed);
    let ctx = Context {
        request_id,
        deadline_unix_ms: header.arg,
        served: *served,
    };
    *SERVING.lock() = Some((vsock as *mut Vsock as usize, conn));
    let start = clock::rdtsc();
    LOG_SENT_TSC.store(start, Ordering::Relaxed);
    let result = handler(&payload, &ctx);
    let ticks = clock::rdtsc().wrapping_sub(start);
    *SERVING.lock() = None;
    drop(payload);
    *served += 1;
    let handler_ns = clock::tsc_khz().map_or(0, |khz| ticks.saturating_mul(1_000_000) / khz.max(1));
    // What was not sent in `Log` frames during the handler.
    let log = core::mem::take(&mut *LOG.lock());
    LOG_PENDING.store(false, Ordering::Relaxed);
    let sent = match result {
        Ok(body) if body.len() <= MAX_PAYLOAD as usize => {
            send_result(vsock, conn, Kind::ResultOk, &body, &log, handler_ns)
        }
        Ok(body) => {
            let e = FunctionError::new(
                "Function.ResponseSizeTooLarge",
                &alloc::format!(
                    "Response payload size ({} bytes) exceeded maximum allowed payload size ({} bytes).",
                    body.len(),
                    MAX_PAYLOAD
                ),
            );
            send_result(
                vsock,
                conn,
                Kind::ResultError,
                &e.to_json(),
                &log,
                handler_ns,
            )
        }
        Err(e) => send_result(
            vsock,
            conn,
            Kind::ResultError,
            &e.to_json(),
            &log,
            handler_ns,
        ),
    };
    sent.map_err(ConnEnd::from)
}

fn send_result(
    vsock: &mut Vsock,
    conn: ConnId,
    kind: Kind,
    body: &[u8],
    log: &[u8],
    handler_ns: u64,
) -> Result<(), VsockError> {
    let header = FrameHeader {
        kind,
        len_a: body.len() as u32,
        len_b: log.len().min(MAX_LOG as usize) as u32,
        arg: handler_ns,
    };
    vsock.write_all(conn, &header.encode())?;
    vsock.write_all(conn, body)?;
    vsock.write_all(conn, &log[..header.len_b as usize])
}

fn read_exact(vsock: &mut Vsock, conn: ConnId, mut buf: &mut [u8]) -> Result<(), ConnEnd> {
    while !buf.is_empty() {
        match vsock.recv_wait(conn, buf)? {
            0 => return Err(ConnEnd::Closed),
            n => buf = &mut buf[n..],
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_percent_decoded() {
        let cmdline = "a=b env.GREETING=hello%20world env.EMPTY= env.BAD=%zz env.X=1";
        assert_eq!(
            find_env(cmdline, "GREETING").as_deref(),
            Some("hello world")
        );
        assert_eq!(find_env(cmdline, "EMPTY").as_deref(), Some(""));
        assert_eq!(find_env(cmdline, "BAD"), None);
        assert_eq!(find_env(cmdline, "MISSING"), None);
        assert_eq!(find_env(cmdline, "X").as_deref(), Some("1"));
    }

    #[test]
    fn log_keeps_the_tail() {
        let mut log = Vec::new();
        append_tail(&mut log, b"0123456789", 8);
        assert_eq!(log, b"23456789");
        append_tail(&mut log, b"ab", 8);
        assert_eq!(log, b"456789ab");
    }

    #[test]
    fn error_json_is_escaped() {
        let e = FunctionError::new("HandledError", "say \"hi\"\n");
        assert_eq!(
            e.to_json(),
            br#"{"errorMessage":"say \"hi\"\n","errorType":"HandledError"}"#
        );
    }
}
