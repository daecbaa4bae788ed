//! The layered start of a Linux function (SnapFaaS): a VM restored from its
//! runtime's base snapshot ([`crate::bases`]) instead of a cold boot. The
//! base is built on the first need (one per runtime and memory size, kept
//! across restarts); the function's first start then writes its snapshot as
//! a Diff on top of the base, so it holds only the function's own pages.
//!
//! Order matters: the code drive is swapped (`PATCH /drives/code`, which
//! raises the drive's config-change interrupt) while the restored VM is
//! still paused, so the guest's first look at `/dev/vdb` after the resume is
//! at the function's code disk; the agent (unconfigured in the base) answers
//! the connection with `Standby`, and mounts the device fresh at `Configure`
//! after dropping its cached blocks (`BLKFLSBUF`).

use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;

use super::Instances;
use crate::bases::{base_name, Base, BaseRecord};
use crate::catalog::Function;
use crate::instance_conn::InstanceConn;
use crate::metrics::DiffStat;
use crate::runtime::{self, Runtime};
use crate::snapshots::LinuxSnapshots;
use crate::vmm::VmmProcess;

/// What a Linux VM boots from.
pub(super) struct LinuxBoot<'a> {
    pub kernel: &'a Path,
    pub root_image: &'a Path,
    /// The function's code disk.
    pub code: &'a Path,
}

impl Instances {
    /// A VM of `f` started from its runtime's base: restored, given `f`'s
    /// code disk, configured and `Ready`. If `f`'s version has no snapshot
    /// yet, its Diff is written first (then the VM is resumed and
    /// reconnected).
    pub(super) async fn boot_layered(
        &self,
        f: &Function,
        rt: &dyn Runtime,
        files: &LinuxBoot<'_>,
    ) -> anyhow::Result<(VmmProcess, InstanceConn)> {
        let base = self.ensure_base(f, rt, files).await?;
        let started = Instant::now();
        let vmm = self.spawn_vmm(f).await?;
        self.record(&vmm);
        let setup = async {
            // Lazy: the base's pages come in as the guest touches them.
            // Tracking dirty pages: the function's Diff needs it.
            let load = serde_json::json!({
                "snapshot_path": base.state_path(),
                "mem_backend": { "backend_type": "File", "backend_path": base.mem_path() },
                "restore_mode": "lazy",
                "resume_vm": false,
                "track_dirty_pages": true,
                "vsock_override": { "uds_path": vmm.vsock_uds },
                "clone_generation": self.snapshots.next_generation(),
            });
            vmm.api("PUT", "/snapshot/load", Some(load.to_string()))
                .await
                .context("loading the runtime base")?;
            let drive = serde_json::json!({ "drive_id": "code", "path_on_host": files.code });
            vmm.api("PATCH", "/drives/code", Some(drive.to_string()))
                .await
                .context("giving the restored base the function's code disk")?;
            resume(&vmm).await?;
            // Standby → Configure → Ready (or the function's InitError).
            let conn = self.connect(f, &vmm.vsock_uds).await?;
            if self.cfg.no_snapshots || self.snapshots.find(f).is_some() {
                return anyhow::Ok(conn);
            }
            // The guest goes back to accepting when this connection closes.
            drop(conn);
            let t = Instant::now();
            match self.snapshots.create_diff(f, &vmm, &base, files.kernel).await {
                Ok(snap) => {
                    let bytes = snap.layer.as_ref().map_or(0, |l| l.diff_disk_bytes);
                    tracing::info!(function = %f.name, version = f.version,
                        "snapshot {}: a diff of {bytes} bytes on disk on base {} (id {}, {} bytes), written in {:.1} ms",
                        snap.dir.display(), base.name(), base.record.id,
                        base.record.mem_disk_bytes, t.elapsed().as_secs_f64() * 1e3);
                    self.metrics.diff_written(
                        &f.name,
                        DiffStat {
                            base: base.name(),
                            base_id: base.record.id.clone(),
                            disk_bytes: bytes,
                        },
                    );
                }
                Err(e) => tracing::warn!(function = %f.name, "no diff snapshot: {e:#}"),
            }
            if self.cfg.linux_snapshots == LinuxSnapshots::Merged {
                self.merge_diff(f).await;
            }
            resume(&vmm).await?;
            anyhow::Ok(self.connect(f, &vmm.vsock_uds).await?)
        }
        .await;
        let started_vm = self.started_or_ended(vmm, setup).await?;
        tracing::info!(function = %f.name, "started from base {} in {:.1} ms",
            base.name(), started.elapsed().as_secs_f64() * 1e3);
        Ok(started_vm)
    }

    /// `--linux-snapshots merged`: the Diff just written for `f` becomes
    /// one Full snapshot (base and diff merged). If that fails the Diff
    /// stays, and the function is restored layered (logged).
    async fn merge_diff(&self, f: &Function) {
        let Some(diff) = self.snapshots.find(f).filter(|s| s.layer.is_some()) else {
            return;
        };
        let t = Instant::now();
        match self
            .snapshots
            .merge_with_base(f, &diff, &self.cfg.spore_bin)
            .await
        {
            Ok((snap, rec)) => tracing::info!(function = %f.name, version = f.version,
                "snapshot {}: the diff ({} bytes) merged with base {} (id {}) into one full snapshot of {} bytes on disk in {:.1} ms",
                snap.dir.display(), rec.diff_disk_bytes, rec.base, rec.base_id,
                rec.full_disk_bytes, t.elapsed().as_secs_f64() * 1e3),
            Err(e) => tracing::warn!(function = %f.name,
                "the diff was not merged with its base (restored layered instead): {e:#}"),
        }
    }

    /// The base of `f`'s runtime and memory size: the one on disk if it was
    /// made from the same kernel and root image, else a new one.
    async fn ensure_base(
        &self,
        f: &Function,
        rt: &dyn Runtime,
        files: &LinuxBoot<'_>,
    ) -> anyhow::Result<Base> {
        let lock = self.bases.lock_for(&base_runtime(f, rt), f.memory_mib);
        let _building = lock.lock().await;
        let kernel = files.kernel.display().to_string();
        let root_image = files.root_image.display().to_string();
        if let Some(b) = self.bases.find(&base_runtime(f, rt), f.memory_mib) {
            if b.record.kernel == kernel
                && b.record.root_image == root_image
                && b.record.devices == runtime::LINUX_DEVICES
            {
                tracing::info!(function = %f.name,
                    "reusing base snapshot {} (id {}, {} bytes on disk)",
                    b.name(), b.record.id, b.record.mem_disk_bytes);
                self.metrics
                    .base_used(&b.name(), &b.record.id, b.record.mem_disk_bytes, false);
                return Ok(b);
            }
            tracing::info!(
                "base snapshot {} was made from another kernel, runtime image or set of devices; making it again",
                b.name()
            );
        }
        if let Some(ago) = self
            .bases
            .failed_recently(&base_runtime(f, rt), f.memory_mib)
        {
            anyhow::bail!(
                "building the base snapshot failed {:.0} s ago; tried again after {} s",
                ago.as_secs_f64(),
                crate::bases::BASE_RETRY_AFTER.as_secs()
            );
        }
        let started = Instant::now();
        let built = self.build_base(f, rt, files, kernel, root_image).await;
        self.bases
            .build_done(&base_runtime(f, rt), f.memory_mib, built.is_ok());
        let b = built?;
        tracing::info!(function = %f.name,
            "base snapshot {} (id {}, {} bytes on disk) made in {:.1} ms",
            b.name(), b.record.id, b.record.mem_disk_bytes,
            started.elapsed().as_secs_f64() * 1e3);
        self.metrics
            .base_used(&b.name(), &b.record.id, b.record.mem_disk_bytes, true);
        Ok(b)
    }

    /// Boots the runtime with the placeholder code disk and dirty-page
    /// tracking, waits for `Standby`, and writes the Full base snapshot
    /// (the VM is ended afterwards).
    async fn build_base(
        &self,
        f: &Function,
        rt: &dyn Runtime,
        files: &LinuxBoot<'_>,
        kernel: String,
        root_image: String,
    ) -> anyhow::Result<Base> {
        let bases = self.bases.clone();
        // mkfs.ext4 runs once per state directory: off the async threads.
        let placeholder = tokio::task::spawn_blocking(move || bases.placeholder()).await??;
        let tmp = self.bases.temp_dir(&base_runtime(f, rt), f.memory_mib)?;
        let run_dir = self.run_dir();
        let instance = run_dir
            .file_name()
            .map(|n| format!("base-{}", n.to_string_lossy()))
            .unwrap_or_default();
        let cgroup = self.cgroup_for(f, &instance).await?;
        let vmm = VmmProcess::spawn(
            &self.cfg.spore_bin,
            &run_dir,
            None,
            cgroup,
            self.base_jailed(),
        )
        .await?;
        self.record(&vmm);
        let made = async {
            // Jailed: written by the base VMM's user (the shared id), read
            // by every function's restores through the shared group.
            if let Some(user) = &vmm.user {
                crate::jail::share_file(&placeholder, user.gid)?;
                crate::jail::own_tree(&tmp, user)?;
            }
            let boot = runtime::BootFiles {
                code: &placeholder,
                vsock_uds: &vmm.vsock_uds,
                linux: Some(runtime::LinuxFiles {
                    kernel: files.kernel,
                    root_image: files.root_image,
                }),
            };
            for call in rt.configure(f, &boot)? {
                let body = if call.path == "/machine-config" {
                    let mut m: serde_json::Value = serde_json::from_str(&call.body)?;
                    m["track_dirty_pages"] = true.into();
                    m.to_string()
                } else {
                    call.body
                };
                vmm.api(call.method, call.path, Some(body)).await?;
            }
            vmm.api(
                "PUT",
                "/actions",
                Some(r#"{"action_type":"InstanceStart"}"#.into()),
            )
            .await?;
            // Held open while the VM is paused and written: the guest waits
            // for Configure, which only the function's own VM will send.
            let standby = InstanceConn::standby(&vmm.vsock_uds, self.cfg.ready_limit).await?;
            tracing::debug!(
                "base {}: Standby {} µs after the agent started",
                base_name(&base_runtime(f, rt), f.memory_mib),
                standby.since_start_us
            );
            vmm.api("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
                .await?;
            let body = serde_json::json!({
                "snapshot_type": "Full",
                "snapshot_path": tmp.join("vm.state"),
                "mem_file_path": tmp.join("vm.mem"),
            });
            vmm.api("PUT", "/snapshot/create", Some(body.to_string()))
                .await?;
            let manifest: serde_json::Value =
                serde_json::from_str(&vmm.api("GET", "/snapshot/last", None).await?)?;
            let id = manifest["layer"]["id"]
                .as_str()
                .filter(|id| !id.is_empty())
                .ok_or_else(|| anyhow::anyhow!("GET /snapshot/last named no layer id"))?
                .to_string();
            drop(standby);
            let record = BaseRecord {
                id,
                runtime: base_runtime(f, rt),
                memory_mib: f.memory_mib,
                kernel,
                root_image,
                devices: runtime::LINUX_DEVICES.to_string(),
                mem_disk_bytes: crate::fs::disk_bytes(&tmp.join("vm.mem")),
                created_unix_ms: crate::clock::unix_ms(),
            };
            let base = self.bases.commit(&tmp, &record)?;
            if let Some(user) = &vmm.user {
                crate::jail::share_tree(&base.dir, user.gid)?;
            }
            anyhow::Ok(base)
        }
        .await;
        let tail = vmm.log_tail();
        self.end(vmm).await;
        made.map_err(|e| {
            let _ = std::fs::remove_dir_all(&tmp);
            e.context(format!(
                "making the {} base snapshot (VMM log: {tail})",
                base_name(&base_runtime(f, rt), f.memory_mib)
            ))
        })
    }
}

/// What a base is made for: its runtime, and for any account but the
/// default one the account too (`111122223333-python3`): accounts never
/// share a snapshot.
pub(super) fn base_runtime(f: &Function, rt: &dyn Runtime) -> String {
    match crate::accounts::split_key(&f.name) {
        (crate::accounts::DEFAULT_ACCOUNT, _) => rt.name().to_string(),
        (account, _) => format!("{account}-{}", rt.name()),
    }
}

async fn resume(vmm: &VmmProcess) -> anyhow::Result<()> {
    vmm.api("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#.into()))
        .await?;
    Ok(())
}
