//! How a process ended, in the words of E2B's envd: its `EndEvent` carries
//! Go's `os.ProcessState` (`exit_code` -1 when a signal killed it, `status`
//! as `ProcessState.String()` prints it), and its `error` is the error Go's
//! `Cmd.Wait` returns, which is that same status for any unsuccessful end.
//! The SDK hands `error` to its users (`CommandExitException.error`), so it
//! is kept as E2B sends it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::proto::process::process_event::EndEvent;

/// The end of a process that exited or was killed.
pub fn end_event(status: ExitStatus) -> EndEvent {
    let text = status_text(status);
    match status.code() {
        Some(code) => EndEvent {
            exit_code: code,
            exited: true,
            error: (code != 0).then(|| text.clone()),
            status: text,
        },
        None => EndEvent {
            exit_code: -1,
            exited: false,
            error: Some(text.clone()),
            status: text,
        },
    }
}

/// The end of a process envd lost track of (waiting for it failed).
pub fn failed(error: &std::io::Error) -> EndEvent {
    EndEvent {
        exit_code: -1,
        exited: false,
        status: String::new(),
        error: Some(format!("waiting for the process: {error}")),
    }
}

/// `exit status 3`, `signal: killed`, `signal: segmentation fault (core dumped)`.
fn status_text(status: ExitStatus) -> String {
    let mut text = if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(signal) = status.signal() {
        format!("signal: {}", signal_name(signal))
    } else if let Some(signal) = status.stopped_signal() {
        format!("stop signal: {}", signal_name(signal))
    } else if status.continued() {
        "continued".to_owned()
    } else {
        format!("unknown wait status {}", status.into_raw())
    };
    if status.core_dumped() {
        text.push_str(" (core dumped)");
    }
    text
}

/// Linux's signals as Go names them.
fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "hangup",
        "interrupt",
        "quit",
        "illegal instruction",
        "trace/breakpoint trap",
        "aborted",
        "bus error",
        "floating point exception",
        "killed",
        "user defined signal 1",
        "segmentation fault",
        "user defined signal 2",
        "broken pipe",
        "alarm clock",
        "terminated",
        "stack fault",
        "child exited",
        "continued",
        "stopped (signal)",
        "stopped",
        "stopped (tty input)",
        "stopped (tty output)",
        "urgent I/O condition",
        "CPU time limit exceeded",
        "file size limit exceeded",
        "virtual timer expired",
        "profiling timer expired",
        "window changed",
        "I/O possible",
        "power failure",
        "bad system call",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("signal {signal}"), |name| (*name).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn signaled(signal: i32, core: bool) -> ExitStatus {
        ExitStatus::from_raw(signal | if core { 0x80 } else { 0 })
    }

    #[test]
    fn exits_read_as_gos_process_state() {
        let ok = end_event(exited(0));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let three = end_event(exited(3));
        assert_eq!(three.exit_code, 3);
        assert!(three.exited);
        assert_eq!(three.status, "exit status 3");
        assert_eq!(three.error.as_deref(), Some("exit status 3"));
    }

    #[test]
    fn signals_read_as_gos_process_state() {
        let killed = end_event(signaled(libc::SIGKILL, false));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        assert_eq!(killed.error.as_deref(), Some("signal: killed"));
        assert_eq!(
            end_event(signaled(libc::SIGTERM, false)).status,
            "signal: terminated"
        );
        assert_eq!(
            end_event(signaled(libc::SIGSEGV, true)).status,
            "signal: segmentation fault (core dumped)"
        );
        assert_eq!(
            end_event(signaled(libc::SIGHUP, false)).status,
            "signal: hangup"
        );
        assert_eq!(
            end_event(signaled(libc::SIGSYS, false)).status,
            "signal: bad system call"
        );
        assert_eq!(end_event(signaled(40, false)).status, "signal: signal 40");
    }
}
