//! Sandbox templates: what a sandbox is made from (a guest kernel, a root
//! image with spore-agent and spore-envd, memory and vCPUs), given to `spore
//! serve --sandbox-template FILE` as TOML:
//!
//! ```toml
//! name = "base"                       # what Sandbox.create("base") names
//! kernel = "/var/lib/spore/vmlinux"
//! rootfs = "/var/lib/spore/sandbox-base.ext4"
//! vcpus = 1                           # default 1
//! memory_mib = 512                    # default 512
//! user = "user"                       # commands' default user, default "user"
//! start_cmd = "python3 -m http.server 8000"   # optional: started in the zygote
//! ready_cmd = "curl -sf localhost:8000"       # optional: until it exits 0
//! network = true                      # default true: eth0, see `super::net`
//! dns = ["1.1.1.1"]                   # default: the host's name servers
//! ```
//!
//! Each template has a **zygote** per account: one VM booted from it until
//! its envd answers, then frozen as the template of the account's sandboxes,
//! each a clone of it (its memory shared copy-on-write, the image read-only
//! under a private overlay). It boots on the account's first create, which
//! waits for it (a local daemon's, when the daemon starts). A template's start command runs in
//! the zygote (E2B's: a server its sandboxes start with, already running),
//! and its ready command is run until it succeeds, before the zygote is
//! snapshotted as the template base and cloned.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use super::envd;
use crate::network::InstanceNet;
use crate::vmm::VmmProcess;

/// How long a template's zygote may take to boot until its envd answers (a
/// Linux guest under emulation takes tens of seconds).
const BOOT_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    pub name: String,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u32,
    #[serde(default = "default_user")]
    pub user: String,
    /// Started in the background in the zygote once its envd answers (as
    /// `user`, `bash -l -c`; its output in `/tmp/spore-start.log`).
    #[serde(default)]
    pub start_cmd: Option<String>,
    /// Run (as `user`) until it exits 0, every second for up to
    /// [`READY_LIMIT`], before the zygote becomes the template.
    #[serde(default)]
    pub ready_cmd: Option<String>,
    /// Its VMs get a network interface (`eth0`, each in a namespace of its
    /// own with the host's NAT: [`super::net`]); without, they have only
    /// vsock and `allow_internet_access` changes nothing.
    #[serde(default = "default_network")]
    pub network: bool,
    /// The guest's name servers (`/etc/resolv.conf`); empty: the host's.
    #[serde(default)]
    pub dns: Vec<std::net::Ipv4Addr>,
}

/// How long a template's ready command may take to succeed.
pub const READY_LIMIT: Duration = Duration::from_secs(300);

fn default_vcpus() -> u8 {
    1
}
fn default_memory_mib() -> u32 {
    512
}
fn default_user() -> String {
    "user".into()
}
fn default_network() -> bool {
    true
}

impl TemplateSpec {
    /// Reads and checks a template file.
    pub fn load(path: &Path) -> anyhow::Result<TemplateSpec> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the sandbox template {}", path.display()))?;
        let spec: TemplateSpec =
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        spec.check()
            .with_context(|| format!("sandbox template {}", path.display()))?;
        Ok(spec)
    }

    fn check(&self) -> anyhow::Result<()> {
        if !valid_name(&self.name) {
            bail!(
                "name {:?}: 1 to 24 lower-case letters, digits, '-' or '_'",
                self.name
            );
        }
        for (what, p) in [("kernel", &self.kernel), ("rootfs", &self.rootfs)] {
            if !p.is_file() {
                bail!("{what} {} is not a file", p.display());
            }
        }
        if !(1..=32).contains(&self.vcpus) {
            bail!("vcpus = {}: 1 to 32", self.vcpus);
        }
        if !(128..=65_536).contains(&self.memory_mib) {
            bail!("memory_mib = {}: 128 to 65536", self.memory_mib);
        }
        for (what, c) in [
            ("start_cmd", &self.start_cmd),
            ("ready_cmd", &self.ready_cmd),
        ] {
            if c.as_ref()
                .is_some_and(|c| c.trim().is_empty() || c.len() > 4096)
            {
                bail!("{what}: a command of 1 to 4096 bytes");
            }
        }
        if self.user.is_empty()
            || !self
                .user
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            bail!("user {:?} is not a user name", self.user);
        }
        if self.dns.len() > 3 {
            bail!("dns: at most 3 name servers (what a guest's resolv.conf uses)");
        }
        Ok(())
    }

    /// The image's size in MiB (what E2B reports as the disk size).
    pub fn disk_mib(&self) -> u64 {
        std::fs::metadata(&self.rootfs).map_or(0, |m| m.len() >> 20)
    }
}

/// Template names (in socket paths: kept short).
pub fn valid_name(name: &str) -> bool {
    (1..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A template's zygote: booted, its envd answering; frozen as the clones'
/// template by the first clone asked of it.
pub struct Zygote {
    pub vmm: VmmProcess,
    /// What its clones' network namespaces are named after (`<stem>c<n>`),
    /// unique per boot; its VM has `eth0` when the template has a network.
    pub net_stem: String,
    /// The template base: a full snapshot of the zygote once its envd
    /// answered (its state file), which its clones' pauses are diffs on;
    /// `None` where it could not be written (their pauses are full).
    pub base: Option<PathBuf>,
    /// When it last made a sandbox (or booted): see
    /// [`super::SandboxConfig::zygote_idle`].
    pub last_used: Instant,
}

/// Boots the template's zygote in `run_dir` (under the daemon's `run/`, so
/// that a later daemon ends it as a leftover) and waits for its envd.
/// `net` is its network namespace (named after `net_stem`) when the
/// template has a network; `jailed`, how its VMM is jailed (its clones are
/// too: they are its children). Its base goes to `bases`.
pub async fn boot_zygote(
    spore_bin: &Path,
    spec: &TemplateSpec,
    run_dir: &Path,
    bases: &Path,
    net: Option<(InstanceNet, String)>,
    jailed: Option<crate::jail::Jailed>,
) -> anyhow::Result<Zygote> {
    let started = Instant::now();
    let _ = std::fs::remove_dir_all(run_dir);
    let (net, net_stem) = net.map_or((None, String::new()), |(n, s)| (Some(n), s));
    let mut vmm = VmmProcess::spawn(spore_bin, run_dir, net, None, jailed).await?;
    match configure(&vmm, spec, run_dir, Disk::Overlay).await {
        Ok(()) => {}
        Err(e) => {
            let tail = vmm.log_tail();
            vmm.kill().await;
            return Err(e.context(format!("VMM log: {tail}")));
        }
    }
    if let Err(e) = envd::wait_healthy(&vmm.vsock_uds, BOOT_LIMIT).await {
        let tail = vmm.log_lines(8);
        vmm.kill().await;
        return Err(e.context(format!("template {}: console: {tail}", spec.name)));
    }
    if let Err(e) = start(&vmm, spec).await {
        vmm.kill().await;
        return Err(e.context(format!("template {}", spec.name)));
    }
    tracing::info!(
        template = %spec.name,
        "sandbox template ready {} ms after its zygote's VMM started (booted, envd answering, its start and ready commands run)",
        started.elapsed().as_millis()
    );
    let base = match write_base(&vmm, bases, &spec.name).await {
        Ok(state) => {
            tracing::info!(
                template = %spec.name,
                "sandbox template base written: {} MiB of memory on disk",
                crate::fs::disk_bytes(&state.with_extension("mem")) >> 20
            );
            Some(state)
        }
        Err(e) => {
            tracing::warn!(template = %spec.name, "sandbox template: no base (its sandboxes' pauses will be full snapshots): {e:#}");
            None
        }
    };
    Ok(Zygote {
        vmm,
        net_stem,
        base,
        last_used: Instant::now(),
    })
}

/// Boots a template build's VM from `spec` (its image a copy the build
/// writes in place) in `run_dir` and waits for its envd.
pub async fn boot_builder(
    spore_bin: &Path,
    spec: &TemplateSpec,
    run_dir: &Path,
    net: Option<InstanceNet>,
    jailed: Option<crate::jail::Jailed>,
) -> anyhow::Result<VmmProcess> {
    let _ = std::fs::remove_dir_all(run_dir);
    let mut vmm = VmmProcess::spawn(spore_bin, run_dir, net, None, jailed).await?;
    let booted = async {
        configure(&vmm, spec, run_dir, Disk::InPlace).await?;
        envd::wait_healthy(&vmm.vsock_uds, BOOT_LIMIT).await
    }
    .await;
    if let Err(e) = booted {
        let tail = vmm.log_lines(8);
        vmm.kill().await;
        return Err(e.context(format!("the build VM: console: {tail}")));
    }
    Ok(vmm)
}

/// How long the start command's wrapper (which puts it in the background)
/// and other quick commands may take.
const WRAPPER_LIMIT: Duration = Duration::from_secs(60);

/// A command in the zygote that ran past its limit.
#[derive(Debug, thiserror::Error)]
#[error("it ran past {0:?}")]
struct Overran(Duration);

/// `run` (a command in the zygote), ended after `limit`.
async fn bounded(
    limit: Duration,
    run: impl std::future::Future<Output = anyhow::Result<envd::Ran>>,
) -> anyhow::Result<envd::Ran> {
    tokio::time::timeout(limit, run)
        .await
        .map_err(|_| anyhow::Error::new(Overran(limit)))?
}

/// The template's start command, in the background, then its ready
/// command until it succeeds.
async fn start(vmm: &VmmProcess, spec: &TemplateSpec) -> anyhow::Result<()> {
    if let Some(cmd) = &spec.start_cmd {
        // The command reaches bash through the environment (never quoted
        // into a string); in the background with its output in a file, so
        // that envd's stream ends when the wrapper does.
        let ran = bounded(
            WRAPPER_LIMIT,
            envd::run(
                &vmm.vsock_uds,
                &spec.user,
                "nohup /bin/bash -l -c \"$SPORE_START_CMD\" </dev/null >/tmp/spore-start.log 2>&1 &",
                &[("SPORE_START_CMD", cmd)],
            ),
        )
        .await
        .context("starting its start_cmd")?;
        if ran.exit_code != 0 {
            bail!("its start_cmd could not be started: {}", ran.output);
        }
    }
    let Some(ready) = &spec.ready_cmd else {
        return Ok(());
    };
    let started = Instant::now();
    loop {
        // A ready_cmd that never ends fails like one that exits non-zero.
        let left = READY_LIMIT
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        let ran = match bounded(left, envd::run(&vmm.vsock_uds, &spec.user, ready, &[])).await {
            Ok(ran) => ran,
            Err(e) if e.is::<Overran>() => envd::Ran {
                exit_code: -1,
                output: format!("still running after {left:?}"),
                ..Default::default()
            },
            Err(e) => return Err(e.context("running its ready_cmd")),
        };
        if ran.exit_code == 0 {
            tracing::info!(
                template = %spec.name,
                "sandbox template: its ready_cmd passed after {} ms",
                started.elapsed().as_millis()
            );
            return Ok(());
        }
        if started.elapsed() >= READY_LIMIT {
            let log = bounded(
                WRAPPER_LIMIT,
                envd::run(
                    &vmm.vsock_uds,
                    &spec.user,
                    "tail -n 5 /tmp/spore-start.log",
                    &[],
                ),
            )
            .await
            .map(|r| r.output)
            .unwrap_or_default();
            bail!(
                "its ready_cmd did not pass within {READY_LIMIT:?} (exit code {}: {}; the start_cmd's output ends: {log})",
                ran.exit_code,
                ran.output
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Writes the zygote's memory as a full snapshot in `bases`
/// (`<template>-<n>.state`, `.mem`, a new `n` per boot: paused sandboxes
/// of an earlier zygote keep theirs). The zygote stays paused until its
/// first clone freezes it: its memory is then exactly the base, and its
/// disk overlay (frozen by that clone as its clones' base) exactly what
/// the base's state expects, so that the base can be restored too.
async fn write_base(vmm: &VmmProcess, bases: &Path, name: &str) -> anyhow::Result<PathBuf> {
    crate::fs::create_private_dir(bases)?;
    let stamp = crate::clock::unix_ms();
    let state = bases.join(format!("{name}-{stamp}.state"));
    let mem = state.with_extension("mem");
    vmm.api("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
        .await?;
    let body = serde_json::json!({
        "snapshot_type": "Full",
        "snapshot_path": state,
        "mem_file_path": mem,
    });
    if let Err(e) = vmm
        .api("PUT", "/snapshot/create", Some(body.to_string()))
        .await
    {
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_file(&mem);
        vmm.api("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#.into()))
            .await?;
        return Err(e);
    }
    Ok(state)
}

/// How a VM writes its image.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Disk {
    /// Under a copy-on-write overlay in its run directory (a zygote: each
    /// clone copies the overlay; the image is never written).
    Overlay,
    /// In place (a template build's copy of its parent's image).
    InPlace,
}

/// A VM's configuration from its template: its image (`disk`), vsock for
/// envd, `eth0` if the template has a network.
async fn configure(
    vmm: &VmmProcess,
    spec: &TemplateSpec,
    run_dir: &Path,
    disk: Disk,
) -> anyhow::Result<()> {
    let mut boot_args = format!(
        "console=ttyS0 quiet reboot=k panic=1 pci=off root=/dev/vda rw rootfstype=ext4 \
         init=/sbin/spore-agent spore.mode=sandbox spore.user={}",
        spec.user
    );
    if spec.network {
        boot_args.push(' ');
        boot_args.push_str(&super::net::guest_args(&spec.dns));
        vmm.api(
            "PUT",
            "/network-interfaces/eth0",
            Some(super::net::interface().to_string()),
        )
        .await?;
    }
    let calls = [
        (
            "/boot-source",
            serde_json::json!({
                "kernel_image_path": spec.kernel,
                "boot_args": boot_args,
            }),
        ),
        (
            "/machine-config",
            serde_json::json!({
                "vcpu_count": spec.vcpus,
                "mem_size_mib": spec.memory_mib,
                // Its clones' pauses are diffs on the template base.
                "track_dirty_pages": disk == Disk::Overlay,
            }),
        ),
        ("/drives/rootfs", {
            let mut drive = serde_json::json!({
                "drive_id": "rootfs",
                "path_on_host": spec.rootfs,
                "is_root_device": true,
                "is_read_only": false,
            });
            if disk == Disk::Overlay {
                drive["cow_overlay"] =
                    serde_json::json!({ "path": run_dir.join("zygote.rootfs.cow") });
            }
            drive
        }),
        (
            "/vsock",
            serde_json::json!({ "guest_cid": 3, "uds_path": vmm.vsock_uds }),
        ),
        (
            "/actions",
            serde_json::json!({ "action_type": "InstanceStart" }),
        ),
    ];
    for (path, body) in calls {
        vmm.api("PUT", path, Some(body.to_string())).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        assert!(valid_name("base"));
        assert!(valid_name("py-3_12"));
        assert!(!valid_name(""));
        assert!(!valid_name("Base"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(25)));
    }

    #[tokio::test]
    async fn a_command_past_its_limit_is_ended() {
        let quick = async { Ok(envd::Ran::default()) };
        assert_eq!(
            bounded(Duration::from_secs(5), quick)
                .await
                .unwrap()
                .exit_code,
            0
        );
        let stuck = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(envd::Ran::default())
        };
        let e = bounded(Duration::from_millis(10), stuck).await.unwrap_err();
        assert!(e.is::<Overran>(), "{e:#}");
    }

    #[test]
    fn a_spec_is_checked() {
        let dir = std::env::temp_dir().join(format!("spore-tpl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (k, r) = (dir.join("vmlinux"), dir.join("rootfs.ext4"));
        std::fs::write(&k, b"k").unwrap();
        std::fs::write(&r, b"r").unwrap();
        let file = dir.join("base.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"base\"\nkernel = {:?}\nrootfs = {:?}\n",
                k.display().to_string(),
                r.display().to_string()
            ),
        )
        .unwrap();
        let spec = TemplateSpec::load(&file).unwrap();
        assert_eq!(
            (spec.vcpus, spec.memory_mib, spec.user.as_str()),
            (1, 512, "user")
        );
        std::fs::write(
            &file,
            "name = \"base\"\nkernel = \"/nonexistent\"\nrootfs = \"/x\"\n",
        )
        .unwrap();
        assert!(TemplateSpec::load(&file).is_err());
        std::fs::write(&file, "name = \"base\"\nunknown = 1\n").unwrap();
        assert!(TemplateSpec::load(&file).is_err());
        let with = |extra: &str| {
            std::fs::write(
                &file,
                format!(
                    "name = \"web\"\nkernel = {:?}\nrootfs = {:?}\n{extra}\n",
                    k.display().to_string(),
                    r.display().to_string()
                ),
            )
            .unwrap();
            TemplateSpec::load(&file)
        };
        let web = with("start_cmd = \"python3 -m http.server\"\nready_cmd = \"true\"").unwrap();
        assert_eq!(web.start_cmd.as_deref(), Some("python3 -m http.server"));
        assert!(with("start_cmd = \"  \"").is_err());
        assert!(with(&format!("ready_cmd = \"{}\"", "x".repeat(5000))).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
