//! How an instance's VMM ended, told apart for the invoker: the guest ended
//! its VM (the function's runtime exited or crashed: `Runtime.ExitError`, the
//! function's fault) or the VMM itself was killed or failed (a host fault:
//! `ServiceException`, never blamed on the function).
//!
//! A VMM started with [`EXIT_RECORD_ENV`] set (the daemon sets it; forked
//! clones inherit it) writes an [`ExitRecord`] beside its API socket
//! ([`record_path`]) when its VM stops in an orderly way. A VMM killed by a
//! signal (`SIGKILL`, a seccomp kill, a crash) writes nothing: a missing
//! record after the process is gone is a host fault too.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Set (to any value) in a VMM's environment: write the exit record.
pub const EXIT_RECORD_ENV: &str = "SPORE_EXIT_RECORD";

/// Why a VMM's VM stopped, as the VMM wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stop", rename_all = "snake_case")]
pub enum ExitRecord {
    /// The guest asked to exit with this status.
    GuestExit { code: u8 },
    /// The guest reset or powered off the machine (a Linux guest's panic
    /// reboot, a triple fault).
    GuestReset,
    /// The host stopped it (an API request, SIGTERM).
    Requested,
    /// A vCPU failed in the VMM.
    Error { message: String },
}

/// `<api-sock>.exit`: where the VMM serving `api_sock` writes its record.
pub fn record_path(api_sock: &Path) -> PathBuf {
    let mut p = api_sock.as_os_str().to_owned();
    p.push(".exit");
    PathBuf::from(p)
}

/// The record a VMM left, if it left a readable one.
pub fn read_record(api_sock: &Path) -> Option<ExitRecord> {
    let bytes = std::fs::read(record_path(api_sock)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// How an instance ended, for the invocation it was serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest ended its VM: the function's fault.
    Guest(String),
    /// The VMM was killed, crashed or was stopped by the host: not the
    /// function's fault.
    Host(String),
}

/// Classifies a VMM that is gone from its record and, for the daemon's own
/// children, the wait status's signal (`None` for clones, or an exit).
pub fn classify(record: Option<ExitRecord>, signal: Option<i32>) -> Ending {
    match (record, signal) {
        (Some(ExitRecord::GuestExit { code }), _) => {
            Ending::Guest(format!("Runtime exited with error: exit status {code}"))
        }
        (Some(ExitRecord::GuestReset), _) => Ending::Guest(
            "Runtime exited with error: the guest reset its VM (a crash or a reboot)".into(),
        ),
        (Some(ExitRecord::Requested), _) => {
            Ending::Host("the instance's VMM was stopped by the host".into())
        }
        (Some(ExitRecord::Error { message }), _) => {
            Ending::Host(format!("the instance's VMM failed: {message}"))
        }
        (None, Some(sig)) => Ending::Host(format!(
            "the instance's VMM was killed by signal {sig} ({})",
            signal_name(sig)
        )),
        (None, None) => {
            Ending::Host("the instance's VMM ended without a record (killed or crashed)".into())
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGSYS => "SIGSYS, a seccomp kill",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_as_one_json_line() {
        for r in [
            ExitRecord::GuestExit { code: 7 },
            ExitRecord::GuestReset,
            ExitRecord::Requested,
            ExitRecord::Error {
                message: "KVM_RUN: EFAULT".into(),
            },
        ] {
            let text = serde_json::to_string(&r).expect("serializes");
            assert!(!text.contains('\n'));
            assert_eq!(serde_json::from_str::<ExitRecord>(&text).ok(), Some(r));
        }
        assert_eq!(
            serde_json::to_string(&ExitRecord::GuestExit { code: 3 })
                .ok()
                .as_deref(),
            Some(r#"{"stop":"guest_exit","code":3}"#)
        );
    }

    #[test]
    fn only_the_guest_ending_its_vm_is_the_functions_fault() {
        assert!(matches!(
            classify(Some(ExitRecord::GuestExit { code: 7 }), None),
            Ending::Guest(m) if m.ends_with("exit status 7")
        ));
        assert!(matches!(
            classify(Some(ExitRecord::GuestReset), Some(9)),
            Ending::Guest(_)
        ));
        assert!(matches!(
            classify(None, Some(libc::SIGKILL)),
            Ending::Host(m) if m.contains("SIGKILL")
        ));
        assert!(matches!(classify(None, None), Ending::Host(_)));
        assert!(matches!(
            classify(Some(ExitRecord::Requested), None),
            Ending::Host(_)
        ));
        assert!(matches!(
            classify(
                Some(ExitRecord::Error {
                    message: "x".into()
                }),
                None
            ),
            Ending::Host(_)
        ));
    }

    #[test]
    fn the_record_sits_beside_the_api_socket() {
        assert_eq!(
            record_path(Path::new("/s/run/f-1/clone-3.sock")),
            Path::new("/s/run/f-1/clone-3.sock.exit")
        );
        assert_eq!(read_record(Path::new("/nonexistent/api.sock")), None);
    }
}
