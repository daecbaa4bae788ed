//! Per-function invocation logs: `<state>/logs/<function>.log`, each
//! invocation framed by Lambda-style START / END / REPORT lines around what
//! the function logged. A log over 1 MiB is rotated to `.log.1` (one
//! generation kept), so logs never grow without bound.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::catalog::Function;
use crate::metrics::StartPath;

const ROTATE_BYTES: u64 = 1024 * 1024;

pub fn path(state: &Path, function: &str) -> PathBuf {
    state.join("logs").join(format!("{function}.log"))
}

/// The log text of one invocation.
pub fn invocation_log(
    f: &Function,
    request_id: &str,
    path: StartPath,
    seconds: f64,
    outcome: &str,
    function_log: &[u8],
) -> Vec<u8> {
    let mut out =
        format!("START RequestId: {request_id} Version: {}\n", f.qualifier()).into_bytes();
    out.extend_from_slice(function_log);
    if !function_log.is_empty() && !function_log.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(
        format!(
            "END RequestId: {request_id}\nREPORT RequestId: {request_id}\tDuration: {:.2} ms\tMemory Size: {} MB\tStart Path: {}\tOutcome: {outcome}\n",
            seconds * 1e3,
            f.memory_mib,
            path.as_str()
        )
        .as_bytes(),
    );
    out
}

/// The log of an invocation whose instance died: what the function logged
/// until then (what a spore-uk guest streamed before its result), then
/// [`console_tail`] (a Linux function's output is there).
pub fn died_log(function_log: Vec<u8>, console: &str) -> Vec<u8> {
    let mut out = function_log;
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(&console_tail(console));
    out
}

/// What a guest's console said last (`" | "`-joined lines, as
/// `VmmProcess::log_lines` gives them), as log lines marked as the
/// console's: kept in the invocation's log when its instance died.
pub fn console_tail(joined: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in joined.split(" | ").filter(|l| !l.trim().is_empty()) {
        out.extend_from_slice(b"[instance console] ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out
}

/// Appends to a function's log off the request path.
pub fn append(state: &Path, function: &str, text: Vec<u8>) {
    let file = path(state, function);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = append_now(&file, &text) {
            tracing::warn!("writing {}: {e}", file.display());
        }
    });
}

fn append_now(file: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = file.parent() {
        crate::fs::create_private_dir(dir)?;
    }
    if std::fs::metadata(file).map(|m| m.len()).unwrap_or(0) > ROTATE_BYTES {
        std::fs::rename(file, file.with_extension("log.1"))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)?;
    f.write_all(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_died_log_has_the_functions_lines_then_the_consoles() {
        assert_eq!(
            died_log(b"one\ntwo".to_vec(), "boot | panic"),
            b"one\ntwo\n[instance console] boot\n[instance console] panic\n"
        );
        assert_eq!(died_log(Vec::new(), ""), b"");
        assert_eq!(died_log(b"one\n".to_vec(), " "), b"one\n");
    }
}
