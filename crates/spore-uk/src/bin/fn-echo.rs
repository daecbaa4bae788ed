//! fn-echo: a `spore serve` function (see `function`). It answers
//! `{"echo":<payload>,"invocations":N}` (N counts this instance's invocations,
//! so a caller sees warm reuse), and acts on a few payloads used by tests:
//! `{"log":"LINE"}` adds LINE to the invocation's log (`flog!`) first,
//! `{"sleep_ms":M}` answers after M ms, `{"fail":"MSG"}` returns a handled
//! error, `{"panic":"MSG"}` panics, `{"exit":C}` exits the guest with C,
//! `{"env":"KEY"}` answers the variable's value, `{"hold_mib":M}` writes M
//! MiB of heap that the instance keeps (memory of its own, not its
//! template's, for the memory budget's tests). With the environment variable
//! `ECHO_SINK=1` it logs each payload's first KiB and echoes it, acting on
//! none of the above (a destination function, whose records carry other
//! events' payloads). With `ECHO_HTTP=1` it answers as a function behind a
//! function URL does: status 201, a header, a cookie, and the event as a
//! base64 body.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use spore_uk::clock::Instant;
use spore_uk::function::{self, json_field, json_number_field, Context, FunctionError, Response};
use spore_uk::{flog, BootInfo};

spore_uk::entry!(main);

fn main(info: &BootInfo) -> i32 {
    function::serve(info, handle)
}

fn handle(event: &[u8], ctx: &Context) -> Response {
    flog!(
        "fn-echo: request {} ({} bytes)",
        ctx.request_id,
        event.len()
    );
    if function::env("ECHO_SINK").as_deref() == Some("1") {
        flog!(
            "fn-echo: payload {}",
            String::from_utf8_lossy(&event[..event.len().min(1024)])
        );
        return echo(event, ctx);
    }
    if function::env("ECHO_HTTP").as_deref() == Some("1") {
        let mut out = String::from(
            "{\"statusCode\":201,\"headers\":{\"x-echo\":\"1\"},\"cookies\":[\"seen=1; Path=/\"],\"isBase64Encoded\":true,\"body\":\"",
        );
        base64_into(&mut out, event);
        out.push_str("\"}");
        return Ok(out.into_bytes());
    }
    if let Some(line) = string_field(event, "log") {
        flog!("{line}");
    }
    if let Some(mib) = json_number_field(event, "hold_mib") {
        let mut held: Vec<u8> = Vec::new();
        let bytes = usize::try_from(mib)
            .unwrap_or(usize::MAX)
            .saturating_mul(1 << 20);
        if held.try_reserve_exact(bytes).is_err() {
            return Err(FunctionError::new("OutOfMemory", "hold_mib: no such heap"));
        }
        held.resize(bytes, 0);
        for (i, page) in held.chunks_mut(4096).enumerate() {
            page[0] = i as u8 | 1;
        }
        // Kept for the instance's life.
        held.leak();
    }
    if let Some(ms) = json_number_field(event, "sleep_ms") {
        sleep_ms(ms);
    }
    if let Some(msg) = string_field(event, "fail") {
        return Err(FunctionError::new("HandledError", &msg));
    }
    if let Some(msg) = string_field(event, "panic") {
        panic!("{msg}");
    }
    if let Some(code) = json_number_field(event, "exit") {
        spore_uk::exit(code as u32);
    }
    if let Some(key) = string_field(event, "env") {
        let mut out = String::from("{\"env\":\"");
        out.push_str(&key);
        out.push_str("\",\"value\":");
        match function::env(&key) {
            Some(v) => {
                out.push('"');
                out.push_str(&v.replace('\\', "\\\\").replace('"', "\\\""));
                out.push('"');
            }
            None => out.push_str("null"),
        }
        out.push('}');
        return Ok(out.into_bytes());
    }
    echo(event, ctx)
}

/// `{"echo":<payload>,"invocations":N}`.
fn echo(event: &[u8], ctx: &Context) -> Response {
    let mut out = Vec::new();
    out.try_reserve(event.len() + 48)
        .map_err(|_| FunctionError::new("OutOfMemory", "response too large for the heap"))?;
    out.extend_from_slice(b"{\"echo\":");
    out.extend_from_slice(event);
    out.extend_from_slice(alloc::format!(",\"invocations\":{}}}", ctx.served + 1).as_bytes());
    Ok(out)
}

/// Waits `ms` milliseconds, sleeping in the signal port's WAIT.
fn sleep_ms(ms: u64) {
    let start = Instant::now();
    while start.elapsed_us().unwrap_or(u64::MAX) < ms.saturating_mul(1000) {
        spore_uk::wait(100_000);
    }
}

fn string_field(event: &[u8], key: &str) -> Option<String> {
    let v = json_field(event, key)?.strip_prefix(b"\"")?;
    let end = v.iter().position(|&b| b == b'"')?;
    Some(String::from_utf8_lossy(&v[..end]).into_owned())
}

/// Standard base64 of `bytes`, appended to `out`.
fn base64_into(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
}
