//! A clone process's command line: what a source VMM tells each `spore vmm
//! --clone-handoff FD` it starts ([`super::spawn`]). [`ClonedProcessArgs`] is
//! the one definition of it, written by `spawn` ([`ClonedProcessArgs::to_args`])
//! and read back by the binary ([`ClonedProcessArgs::from_flags`]); what the
//! process then does is `crate::vmm::clone_process`.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;

use crate::seccomp::SeccompSetting;

/// Everything a clone process is told on its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClonedProcessArgs {
    /// Where the clone serves its API.
    pub api_sock: PathBuf,
    /// Its instance id (`GET /`).
    pub id: String,
    /// The inherited end of the handoff socket pair.
    pub handoff_fd: RawFd,
    /// (guest memory bytes, vCPUs) to make KVM objects for while waiting;
    /// on the command line in whole MiB.
    pub prepare: Option<(u64, u8)>,
    /// Where its signal-port marks go when it stops.
    pub marks_file: Option<PathBuf>,
    /// The source's seccomp choice, which its clones keep.
    pub seccomp: SeccompSetting,
}

/// Clone-process flags that do not fit together.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadCloneArgs(pub String);

impl ClonedProcessArgs {
    /// The `spore` arguments (after the program name) that start this
    /// process: `vmm --api-sock S --id N --clone-handoff FD [--clone-prepare
    /// MIB,VCPUS] [--marks-file F] [--no-seccomp | --seccomp-filter F]`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "vmm".into(),
            "--api-sock".into(),
            self.api_sock.clone().into(),
            "--id".into(),
            self.id.clone().into(),
            "--clone-handoff".into(),
            self.handoff_fd.to_string().into(),
        ];
        if let Some((bytes, vcpus)) = self.prepare {
            a.push("--clone-prepare".into());
            a.push(format!("{},{vcpus}", bytes >> 20).into());
        }
        if let Some(m) = &self.marks_file {
            a.push("--marks-file".into());
            a.push(m.clone().into());
        }
        a.extend(self.seccomp.to_args());
        a
    }

    /// The arguments from the `spore vmm` flags that carry them (the CLI's
    /// parser reads the flags; their meaning is decided here).
    pub fn from_flags(
        api_sock: Option<PathBuf>,
        id: String,
        handoff_fd: RawFd,
        prepare: Option<&str>,
        marks_file: Option<PathBuf>,
        seccomp: SeccompSetting,
    ) -> Result<Self, BadCloneArgs> {
        let api_sock =
            api_sock.ok_or_else(|| BadCloneArgs("--clone-handoff needs --api-sock".into()))?;
        let prepare = match prepare {
            None => None,
            Some(spec) => Some(parse_prepare(spec).ok_or_else(|| {
                BadCloneArgs(format!("--clone-prepare {spec:?}: expected MIB,VCPUS"))
            })?),
        };
        Ok(ClonedProcessArgs {
            api_sock,
            id,
            handoff_fd,
            prepare,
            marks_file,
            seccomp,
        })
    }
}

/// `MIB,VCPUS` → (bytes, vCPUs).
fn parse_prepare(spec: &str) -> Option<(u64, u8)> {
    let (mib, vcpus) = spec.split_once(',')?;
    let mib: u64 = mib.trim().parse().ok()?;
    Some((mib.checked_mul(1 << 20)?, vcpus.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ClonedProcessArgs {
        ClonedProcessArgs {
            api_sock: "/run/c1.sock".into(),
            id: "c1".into(),
            handoff_fd: 7,
            prepare: Some((256 << 20, 2)),
            marks_file: Some("/run/c1.marks.json".into()),
            seccomp: SeccompSetting::File("/etc/f.json".into()),
        }
    }

    /// What `spawn` writes is what the binary reads back.
    #[test]
    fn the_command_line_round_trips() {
        let a = args();
        let line: Vec<String> = a
            .to_args()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            line,
            [
                "vmm",
                "--api-sock",
                "/run/c1.sock",
                "--id",
                "c1",
                "--clone-handoff",
                "7",
                "--clone-prepare",
                "256,2",
                "--marks-file",
                "/run/c1.marks.json",
                "--seccomp-filter",
                "/etc/f.json"
            ]
        );
        let flag = |name: &str| {
            line.iter()
                .position(|s| s == name)
                .map(|i| line[i + 1].clone())
        };
        let back = ClonedProcessArgs::from_flags(
            flag("--api-sock").map(PathBuf::from),
            flag("--id").unwrap_or_default(),
            flag("--clone-handoff")
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1),
            flag("--clone-prepare").as_deref(),
            flag("--marks-file").map(PathBuf::from),
            match flag("--seccomp-filter") {
                Some(f) => SeccompSetting::File(f.into()),
                None => SeccompSetting::Default,
            },
        )
        .unwrap();
        assert_eq!(back, a);
        let bare = ClonedProcessArgs {
            prepare: None,
            marks_file: None,
            seccomp: SeccompSetting::Default,
            ..a.clone()
        };
        assert_eq!(bare.to_args().len(), 7);
        let off = ClonedProcessArgs {
            seccomp: SeccompSetting::Off,
            ..bare
        };
        assert_eq!(
            off.to_args()
                .last()
                .map(|s| s.to_string_lossy().into_owned()),
            Some("--no-seccomp".into())
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        let from = |sock: Option<&str>, prepare: Option<&str>| {
            ClonedProcessArgs::from_flags(
                sock.map(PathBuf::from),
                "c".into(),
                3,
                prepare,
                None,
                SeccompSetting::Default,
            )
        };
        assert!(from(None, None)
            .unwrap_err()
            .to_string()
            .contains("--api-sock"));
        for spec in [
            "",
            "256",
            "256,",
            "x,1",
            "256,300",
            "-1,1",
            "18446744073709551615,1",
        ] {
            assert!(from(Some("s"), Some(spec)).is_err(), "{spec:?}");
        }
        assert_eq!(
            from(Some("s"), Some(" 64 , 4 ")).unwrap().prepare,
            Some((64 << 20, 4))
        );
    }
}
