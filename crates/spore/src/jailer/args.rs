//! The jailer's command line (Firecracker's `jailer` flags) and its checks:
//! everything a user typed is validated here, before anything is created,
//! so that a bad flag leaves nothing behind.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;

/// Firecracker's jailer command line.
#[derive(Parser, Debug)]
#[command(
    name = "jailer",
    disable_version_flag = true,
    about = "spore's jailer: run a VMM binary chrooted, in its own mount namespace and \
             cgroup, as an unprivileged user (Firecracker's jailer command line)"
)]
pub struct JailerArgs {
    /// The microVM's unique id (letters, digits and '-', at most 64).
    #[arg(long)]
    pub id: String,
    /// The VMM binary to copy into the jail and exec (static, like
    /// Firecracker's: nothing from the host's /lib is visible inside).
    #[arg(long)]
    pub exec_file: PathBuf,
    /// The user id the VMM runs as.
    #[arg(long)]
    pub uid: String,
    /// The group id the VMM runs as.
    #[arg(long)]
    pub gid: String,
    /// Where jails are made: <base>/<exec file name>/<id>/root.
    #[arg(long, default_value = "/srv/jailer")]
    pub chroot_base_dir: PathBuf,
    /// A network namespace to join (e.g. /var/run/netns/NAME).
    #[arg(long)]
    pub netns: Option<PathBuf>,
    /// Detach: a new session, stdin/stdout/stderr on /dev/null.
    #[arg(long)]
    pub daemonize: bool,
    /// Run the VMM as pid 1 of a new PID namespace.
    #[arg(long)]
    pub new_pid_ns: bool,
    /// The cgroup hierarchy the --cgroup values go to: 1 (each controller's
    /// own v1 hierarchy) or 2 (the unified one).
    #[arg(long, default_value = "1")]
    pub cgroup_version: String,
    /// A cgroup file to write, <file>=<value> (e.g. cpu.max=50000), repeatable.
    #[arg(long, value_name = "FILE=VALUE")]
    pub cgroup: Vec<String>,
    /// The cgroup the microVM's leaf <id> is made under (default: the exec
    /// file's name), relative to the cgroup mount.
    #[arg(long)]
    pub parent_cgroup: Option<PathBuf>,
    /// A resource limit, fsize=<bytes> or no-file=<count>, repeatable.
    #[arg(long, value_name = "RESOURCE=VALUE")]
    pub resource_limit: Vec<String>,
    /// The exec file's own arguments (after `--`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub exec_args: Vec<OsString>,
}

/// One resource limit to set with setrlimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    FileSize(u64),
    OpenFiles(u64),
}

/// What the jailer was asked to do, checked.
#[derive(Debug)]
pub struct Plan {
    pub id: String,
    /// The exec file, canonical.
    pub exec_file: PathBuf,
    /// Its file name: the jail's directory and the binary's name inside.
    pub exec_name: String,
    /// <base>/<exec name>/<id>/root.
    pub chroot_dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub netns: Option<PathBuf>,
    pub daemonize: bool,
    pub new_pid_ns: bool,
    pub cgroup_version: u8,
    /// (file, value) pairs.
    pub cgroups: Vec<(String, String)>,
    pub parent_cgroup: PathBuf,
    pub limits: Vec<Limit>,
    pub exec_args: Vec<OsString>,
}

/// Firecracker's id rule: letters, digits and '-', 1 to 64 characters.
pub fn check_id(id: &str) -> anyhow::Result<()> {
    if id.is_empty() || id.len() > 64 {
        bail!("invalid id {id:?}: {} characters (1 to 64)", id.len());
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        bail!("invalid id {id:?}: {c:?} (only letters, digits and '-')");
    }
    Ok(())
}

/// A relative path with no `.`, `..` or root: what stays under a base.
fn is_plain_relative(p: &Path) -> bool {
    p.components().all(|c| matches!(c, Component::Normal(_))) && !p.as_os_str().is_empty()
}

/// A `--cgroup` argument, `<controller>.<property>=<value>`. The file name
/// is joined to a cgroup path and the value written into it: the name is
/// one plain file name (letters, digits, `_`, `-`, `.`; no `..`, no `/`),
/// its controller lowercase letters, digits and `_`; the value one line.
/// Whether the controller is mounted is checked at setup (`cgroup`).
fn parse_cgroup(arg: &str) -> anyhow::Result<(String, String)> {
    let Some((file, value)) = arg.split_once('=') else {
        bail!("invalid --cgroup {arg:?}: expected <file>=<value>");
    };
    if value.is_empty() || value.contains('=') {
        bail!("invalid --cgroup {arg:?}: expected <file>=<value>");
    }
    if value.chars().any(char::is_control) {
        bail!("invalid --cgroup {arg:?}: the value holds a control character");
    }
    let name_ok = file
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !file.contains("..");
    match file.split_once('.') {
        Some((c, p))
            if name_ok
                && !c.is_empty()
                && !p.is_empty()
                && !p.ends_with('.')
                && c.chars()
                    .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || x == '_') =>
        {
            Ok((file.to_string(), value.to_string()))
        }
        _ => bail!("invalid --cgroup file {file:?}: expected <controller>.<property>"),
    }
}

fn parse_limit(arg: &str) -> anyhow::Result<Limit> {
    let (name, value) = arg.split_once('=').with_context(|| {
        format!("invalid --resource-limit {arg:?}: expected <resource>=<value>")
    })?;
    let n: u64 = value.parse().map_err(|_| {
        anyhow::anyhow!("invalid --resource-limit {arg:?}: {value:?} is not a number")
    })?;
    match name {
        "fsize" => Ok(Limit::FileSize(n)),
        "no-file" => Ok(Limit::OpenFiles(n)),
        _ => bail!("invalid --resource-limit {arg:?}: the resources are fsize and no-file"),
    }
}

fn parse_id_number(what: &str, s: &str) -> anyhow::Result<u32> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("invalid --{what} {s:?}: not a number"))
}

impl JailerArgs {
    /// Checks every flag; nothing on the host is changed.
    pub fn plan(self) -> anyhow::Result<Plan> {
        check_id(&self.id)?;
        let uid = parse_id_number("uid", &self.uid)?;
        let gid = parse_id_number("gid", &self.gid)?;
        let exec_file = std::fs::canonicalize(&self.exec_file)
            .with_context(|| format!("exec file {}", self.exec_file.display()))?;
        let meta = std::fs::metadata(&exec_file)
            .with_context(|| format!("exec file {}", exec_file.display()))?;
        if !meta.is_file() {
            bail!("exec file {} is not a regular file", exec_file.display());
        }
        let exec_name = exec_file
            .file_name()
            .and_then(|n| n.to_str())
            .context("the exec file's name is not UTF-8")?
            .to_string();
        let base = std::fs::canonicalize(&self.chroot_base_dir)
            .with_context(|| format!("chroot base dir {}", self.chroot_base_dir.display()))?;
        if !base.is_dir() {
            bail!("chroot base dir {} is not a directory", base.display());
        }
        let chroot_dir = base.join(&exec_name).join(&self.id).join("root");
        if let Some(ns) = &self.netns {
            let m = std::fs::metadata(ns).with_context(|| format!("netns {}", ns.display()))?;
            if m.is_dir() {
                bail!(
                    "netns {} is a directory, not a namespace handle",
                    ns.display()
                );
            }
        }
        let cgroup_version = match self.cgroup_version.as_str() {
            "1" => 1,
            "2" => 2,
            v => bail!("invalid --cgroup-version {v:?}: 1 or 2"),
        };
        let cgroups = self
            .cgroup
            .iter()
            .map(|c| parse_cgroup(c))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let parent_cgroup = self
            .parent_cgroup
            .unwrap_or_else(|| PathBuf::from(&exec_name));
        if !is_plain_relative(&parent_cgroup) {
            bail!(
                "invalid --parent-cgroup {}: a relative path without '.' or '..'",
                parent_cgroup.display()
            );
        }
        let limits = self
            .resource_limit
            .iter()
            .map(|l| parse_limit(l))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Plan {
            id: self.id,
            exec_file,
            exec_name,
            chroot_dir,
            uid,
            gid,
            netns: self.netns,
            daemonize: self.daemonize,
            new_pid_ns: self.new_pid_ns,
            cgroup_version,
            cgroups,
            parent_cgroup,
            limits,
            exec_args: self.exec_args,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> anyhow::Result<Plan> {
        let exe = std::env::current_exe().unwrap();
        let mut argv = vec![
            "jailer".to_string(),
            "--id".into(),
            "vm-1".into(),
            "--exec-file".into(),
            exe.display().to_string(),
            "--uid".into(),
            "1000".into(),
            "--gid".into(),
            "1000".into(),
            "--chroot-base-dir".into(),
            "/tmp".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        JailerArgs::try_parse_from(argv)?.plan()
    }

    #[test]
    fn jailer_args_good_line_gives_the_chroot_path_and_exec_args() {
        let p = parse(&[
            "--cgroup-version",
            "2",
            "--cgroup",
            "cpu.max=50000",
            "--resource-limit",
            "no-file=100",
            "--resource-limit",
            "fsize=4096",
            "--",
            "--api-sock",
            "/run/api.sock",
        ])
        .unwrap();
        assert!(p.chroot_dir.starts_with("/tmp"));
        assert!(p.chroot_dir.ends_with(format!("{}/vm-1/root", p.exec_name)));
        assert_eq!(p.cgroups, vec![("cpu.max".into(), "50000".into())]);
        assert_eq!(p.limits, vec![Limit::OpenFiles(100), Limit::FileSize(4096)]);
        assert_eq!(p.exec_args, vec!["--api-sock", "/run/api.sock"]);
        assert_eq!(p.parent_cgroup, PathBuf::from(&p.exec_name));
    }

    #[test]
    fn jailer_args_cgroup_v1_is_the_default_and_takes_the_sdk_values() {
        // firecracker-go-sdk's JailerCfg passes these, with no version.
        let p = parse(&[
            "--cgroup",
            "cpuset.mems=0",
            "--cgroup",
            "cpuset.cpus=0-1",
            "--cgroup",
            "hugetlb.2MB.limit_in_bytes=2097152",
        ])
        .unwrap();
        assert_eq!(p.cgroup_version, 1);
        assert_eq!(
            p.cgroups,
            vec![
                ("cpuset.mems".into(), "0".into()),
                ("cpuset.cpus".into(), "0-1".into()),
                ("hugetlb.2MB.limit_in_bytes".into(), "2097152".into()),
            ]
        );
        let p = parse(&["--parent-cgroup", "uvms/external", "--cgroup", "pids.max=9"]).unwrap();
        assert_eq!(p.parent_cgroup, PathBuf::from("uvms/external"));
    }

    #[test]
    fn jailer_args_bad_values_are_refused() {
        for (extra, want) in [
            (
                &["--cgroup-version", "2", "--cgroup", "cpu.max"][..],
                "<file>=<value>",
            ),
            (
                &["--cgroup-version", "2", "--cgroup", "../x.y=1"],
                "<controller>",
            ),
            (
                &["--cgroup-version", "2", "--cgroup", "nodot=1"],
                "<controller>",
            ),
            (&["--cgroup", "cpuset.cpus=0\n1"], "control character"),
            (&["--cgroup", "cpuset/../x.y=1"], "<controller>"),
            (&["--cgroup", "cpuset..cpus=1"], "<controller>"),
            (&["--cgroup", "cpuset./x=1"], "<controller>"),
            (&["--cgroup", "cpuset.=1"], "<controller>"),
            (&["--cgroup", "cpuset.cpus.=1"], "<controller>"),
            (&["--cgroup", ".cpus=1"], "<controller>"),
            (&["--cgroup", "CPU.max=1"], "<controller>"),
            (&["--cgroup", "a.b=c=d"], "<file>=<value>"),
            (&["--cgroup", "cpuset.cpus="], "<file>=<value>"),
            (&["--cgroup-version", "3"], "1 or 2"),
            (&["--parent-cgroup", "../up"], "parent-cgroup"),
            (&["--parent-cgroup", "/abs"], "parent-cgroup"),
            (&["--resource-limit", "cpu=1"], "fsize and no-file"),
            (&["--resource-limit", "fsize=big"], "not a number"),
            (&["--netns", "/tmp"], "directory"),
        ] {
            let e = parse(extra).unwrap_err().to_string();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        for id in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_id(id).is_err(), "{id:?}");
        }
        check_id(&"x".repeat(64)).unwrap();
    }
}
