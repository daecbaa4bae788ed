//! The start paths, fastest first: an idle **warm** instance; a **clone** of
//! the version's zygote; a **restore** of the version's snapshot; a **cold**
//! boot. A cold boot makes the VM it started the zygote (unless zygotes are
//! off, or demoted under the memory budget), the invocation then running on
//! the zygote's first clone, and the zygote writes the version's snapshot
//! afterwards (once per version). A restore serves its invocation itself
//! while a boot remakes the zygote in the background.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::{AcquireError, Instance, Instances, Pool, Zygote, STANDBY_CLONES};
use crate::catalog::Function;
use crate::instance_conn::{InstanceConn, InvokeError};
use crate::metrics::StartPath;
use crate::network::InstanceNet;
use crate::snapshots::{FunctionSnapshot, Origin};
use crate::vmm::VmmProcess;
use crate::{code, runtime};

/// Whether making an instance's network failed (the pool is exhausted,
/// `ip` or `nft` failed).
fn is_network_error(e: &anyhow::Error) -> bool {
    e.downcast_ref::<crate::network::NetError>().is_some()
}

fn start_err(e: anyhow::Error) -> AcquireError {
    // The function's init failed: the invocation's answer, not a failure of
    // the platform.
    if let Some(InvokeError::Init(r)) = e.downcast_ref::<InvokeError>() {
        return AcquireError::Init(r.clone());
    }
    AcquireError::Start(format!("{e:#}"))
}

impl Instances {
    /// Connects to an instance of `f` and waits for `Ready` (at most
    /// `ready_limit`), configuring a Linux guest that is still in `Standby`
    /// (a fresh boot).
    pub(super) async fn connect(
        &self,
        f: &Function,
        uds: &std::path::Path,
    ) -> Result<InstanceConn, InvokeError> {
        let config = runtime::find(&f.runtime).and_then(|rt| rt.configure_message(f));
        InstanceConn::connect(uds, self.cfg.ready_limit, config.as_deref()).await
    }

    pub(super) async fn acquire(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
    ) -> Result<(Instance, StartPath), AcquireError> {
        // Provisioned: a fresh clone started ahead (throughput mode).
        loop {
            let Some(mut inst) = super::lock(&pool.fresh).pop() else {
                break;
            };
            if inst.vmm.is_alive() {
                return Ok((inst, StartPath::Provisioned));
            }
            self.end(inst.vmm).await;
        }
        // Warm: the most recently used idle instance (its pages are hottest).
        loop {
            let Some(mut inst) = super::lock(&pool.idle).pop() else {
                break;
            };
            if inst.vmm.is_alive() {
                return Ok((inst, StartPath::Warm));
            }
            self.end(inst.vmm).await;
        }
        let f = &pool.function;
        let zygotes = !self.cfg.no_clones && !pool.demoted();
        if !zygotes {
            // Every start is its own VM: restored if the version has a
            // snapshot, else booted (which makes the snapshot).
            if let Some(snap) = self.usable_snapshot(f).await {
                match self.restore(f, &snap).await {
                    Ok((vmm, conn)) => return Ok((instance(vmm, conn), StartPath::Restore)),
                    Err(e) => self.snapshot_failed(f, e),
                }
            }
            let (vmm, conn) = self.boot(f).await.map_err(start_err)?;
            let (vmm, conn) = self.snapshot_booted(f, vmm, conn).await?;
            return Ok((instance(vmm, conn), StartPath::Cold));
        }
        let mut zygote = pool.zygote.lock().await;
        if let Some(z) = zygote.as_mut() {
            match self.clone_of(f, z).await {
                Ok(inst) => return Ok((inst, StartPath::Clone)),
                // The clone's network could not be made: not the zygote's
                // fault, and every other start path needs one too.
                Err(e) if is_network_error(&e) => return Err(start_err(e)),
                Err(e) => {
                    // A zygote that cannot clone (its cap reached, its VMM
                    // gone) is replaced by a restore or a cold start.
                    tracing::warn!(function = %f.name, "zygote retired: {e:#}");
                    if let Some(z) = zygote.take() {
                        self.end_zygote(z).await;
                    }
                }
            }
        }
        if let Some(snap) = self.usable_snapshot(f).await {
            let started = Instant::now();
            match self.restore(f, &snap).await {
                Ok((vmm, conn)) => {
                    tracing::info!(function = %f.name, version = f.version,
                        "restored in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
                    // The restored VM serves this invocation; the zygote is
                    // made again by a boot in the background (a VM restored
                    // from a file is not made a template).
                    drop(zygote);
                    let (me, pool) = (self.clone(), pool.clone());
                    tokio::spawn(async move { me.remake_zygote(&pool).await });
                    return Ok((instance(vmm, conn), StartPath::Restore));
                }
                Err(e) => self.snapshot_failed(f, e),
            }
        }
        let started = Instant::now();
        let (vmm, conn) = self.boot(f).await.map_err(start_err)?;
        tracing::info!(function = %f.name, version = f.version, init_us = conn.init_us,
            "booted in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        let inst = self.become_zygote(f, vmm, conn, &mut zygote).await?;
        drop(zygote);
        // The snapshot is written from the zygote (paused, a template) after
        // this invocation has its instance: off the cold start's path.
        let (me, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move { me.snapshot_zygote(&pool).await });
        Ok((inst, StartPath::Cold))
    }

    /// One instance for the provisioned pool: a clone of the zygote, which
    /// is made first (restored or booted) if there is none.
    pub(super) async fn provision_one(&self, pool: &Arc<Pool>) -> Result<Instance, AcquireError> {
        let f = &pool.function;
        let mut zygote = pool.zygote.lock().await;
        if let Some(z) = zygote.as_mut() {
            match self.clone_of(f, z).await {
                Ok(inst) => return Ok(inst),
                Err(e) if is_network_error(&e) => return Err(start_err(e)),
                Err(e) => {
                    tracing::warn!(function = %f.name, "zygote retired: {e:#}");
                    if let Some(z) = zygote.take() {
                        self.end_zygote(z).await;
                    }
                }
            }
        }
        let (vmm, conn) = match self.usable_snapshot(f).await {
            Some(snap) => self.restore(f, &snap).await.map_err(start_err)?,
            None => {
                let (vmm, conn) = self.boot(f).await.map_err(start_err)?;
                self.snapshot_booted(f, vmm, conn).await?
            }
        };
        self.become_zygote(f, vmm, conn, &mut zygote).await
    }

    /// Boots the pool's function again to make its zygote, if it still has
    /// none and is still the function's current pool.
    async fn remake_zygote(&self, pool: &Arc<Pool>) {
        let mut zygote = pool.zygote.lock().await;
        let current = self.is_current(pool);
        if zygote.is_some() || !current || pool.demoted() {
            return;
        }
        let f = &pool.function;
        let made = async {
            let (vmm, conn) = self.boot(f).await.map_err(start_err)?;
            self.become_zygote(f, vmm, conn, &mut zygote).await
        }
        .await;
        match made {
            // Its first clone waits as a warm instance.
            Ok(inst) => self.release(pool, inst),
            Err(e) => tracing::warn!(function = %f.name, "zygote not made again: {e}"),
        }
    }

    /// The version's snapshot, when snapshots are on and one was made here,
    /// or (in a cluster) fetched from a node that made it.
    async fn usable_snapshot(&self, f: &Function) -> Option<FunctionSnapshot> {
        if self.cfg.no_snapshots {
            return None;
        }
        if let Some(snap) = self.snapshots.find(f) {
            return Some(snap);
        }
        self.snapshot_from_peers(f).await
    }

    /// A unikernel function's snapshot from another node (Linux functions
    /// start from this node's runtime base: diffs are not shipped), if one
    /// was made on a CPU and kernel like this node's; `None` boots cold.
    pub(super) async fn snapshot_from_peers(&self, f: &Function) -> Option<FunctionSnapshot> {
        let node = self.cluster.get()?;
        if runtime::find(&f.runtime).is_none_or(|rt| rt.linux()) {
            return None;
        }
        // The kernel to compare with is the function's image: its code.
        if let Err(e) = self.ensure_code(f).await {
            tracing::info!(function = %f.name, "no snapshot from the cluster: {e:#}");
            return None;
        }
        let kernel = self.guest_kernel(f);
        let here = match tokio::task::spawn_blocking(move || Origin::of_this_host(&kernel)).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                tracing::warn!(function = %f.name, "no snapshot from the cluster: {e}");
                return None;
            }
            Err(e) => {
                tracing::warn!(function = %f.name, "no snapshot from the cluster: {e}");
                return None;
            }
        };
        let user = match self.jailed(f) {
            Ok(j) => j.map(|j| j.user),
            Err(e) => {
                tracing::warn!(function = %f.name, "no snapshot from the cluster: {e:#}");
                return None;
            }
        };
        match crate::cluster::fetch_snapshot(node, &self.snapshots, f, &here, user.as_ref()).await {
            Ok(got) => {
                tracing::info!(function = %f.name, version = f.version, from = %got.from,
                    "snapshot fetched ({} bytes sent) in {:.1} ms", got.bytes,
                    got.elapsed.as_secs_f64() * 1e3);
                self.metrics.snapshot_fetched(&f.name);
                Some(got.snapshot)
            }
            Err(e) => {
                tracing::info!(function = %f.name, version = f.version,
                    "no snapshot from the cluster: {e}");
                None
            }
        }
    }

    /// The guest kernel `f` boots: its unikernel image, or the Linux
    /// kernel.
    pub(super) fn guest_kernel(&self, f: &Function) -> PathBuf {
        match runtime::find(&f.runtime).filter(|rt| rt.linux()) {
            Some(_) => self.cfg.linux_kernel.clone().unwrap_or_default(),
            None => code::image_path(&self.cfg.state_dir, &f.code_sha256, &f.handler),
        }
    }

    /// A snapshot that does not restore is deleted: the next cold boot
    /// writes a new one.
    fn snapshot_failed(&self, f: &Function, e: anyhow::Error) {
        tracing::warn!(function = %f.name, "restore failed, snapshot dropped: {e:#}");
        self.snapshots.drop_snapshot(&f.name, f.version);
    }

    /// Writes the version's snapshot from its zygote, if it has none yet
    /// (clones wait meanwhile; the zygote stays paused and keeps serving).
    async fn snapshot_zygote(&self, pool: &Arc<Pool>) {
        let f = &pool.function;
        if self.cfg.no_snapshots || self.snapshots.find(f).is_some() {
            return;
        }
        let zygote = pool.zygote.lock().await;
        let Some(z) = zygote.as_ref() else { return };
        let started = Instant::now();
        match self
            .snapshots
            .create(f, &z.vmm, &self.guest_kernel(f))
            .await
        {
            Ok(snap) => {
                self.metrics.snapshot_written(&f.name);
                tracing::info!(function = %f.name, version = f.version,
                    "snapshot {} written from the zygote in {:.1} ms", snap.dir.display(),
                    started.elapsed().as_secs_f64() * 1e3)
            }
            Err(e) => tracing::warn!(function = %f.name, "no snapshot: {e:#}"),
        }
    }

    /// Writes the version's snapshot from a VM booted for it, if it has
    /// none yet; the VM is then resumed and reconnected. A snapshot that
    /// cannot be written is logged, not fatal: the instance still serves.
    async fn snapshot_booted(
        &self,
        f: &Function,
        vmm: VmmProcess,
        conn: InstanceConn,
    ) -> Result<(VmmProcess, InstanceConn), AcquireError> {
        if self.cfg.no_snapshots || self.snapshots.find(f).is_some() {
            return Ok((vmm, conn));
        }
        // The guest goes back to accepting when this connection closes; a
        // restore resets vsock connections anyway.
        drop(conn);
        let started = Instant::now();
        match self.snapshots.create(f, &vmm, &self.guest_kernel(f)).await {
            Ok(snap) => {
                self.metrics.snapshot_written(&f.name);
                tracing::info!(function = %f.name, version = f.version,
                    "snapshot {} written in {:.1} ms", snap.dir.display(),
                    started.elapsed().as_secs_f64() * 1e3)
            }
            Err(e) => tracing::warn!(function = %f.name, "no snapshot: {e:#}"),
        }
        let resumed = vmm
            .api("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#.into()))
            .await;
        let conn = match resumed {
            Ok(_) => self
                .connect(f, &vmm.vsock_uds)
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        match conn {
            Ok(conn) => Ok((vmm, conn)),
            Err(e) => {
                self.end(vmm).await;
                Err(start_err(e))
            }
        }
    }

    /// Makes a started VM of `f` (booted or restored, its guest `Ready`) the
    /// zygote and returns its first clone; if it cannot become a zygote,
    /// returns it as a plain instance.
    async fn become_zygote(
        &self,
        f: &Function,
        vmm: VmmProcess,
        conn: InstanceConn,
        zygote_slot: &mut Option<Zygote>,
    ) -> Result<Instance, AcquireError> {
        let started = Instant::now();
        // The guest goes back to accepting when this connection closes; the
        // zygote is paused there.
        drop(conn);
        let clone_dir = vmm.run_dir.join("clones");
        let mut z = Zygote {
            vmm,
            clone_dir,
            standby_leaves: Default::default(),
        };
        // The daemon ends every VMM it started itself (and recovery those of
        // a killed daemon), and a retired version's zygote must not take
        // its clones' invocations in flight with it: clones outlive it.
        // Its clones never fork (guest fork stays off).
        let config = serde_json::json!({
            "mode": "zygote", "standby": STANDBY_CLONES, "max_clones": 1000,
            "socket_dir": z.clone_dir, "clones_outlive_source": true,
        });
        let made = async {
            crate::fs::create_private_dir(&z.clone_dir)?;
            if let Some(user) = &z.vmm.user {
                crate::jail::own_tree(&z.clone_dir, user)?;
            }
            z.vmm
                .api("PUT", "/clone/config", Some(config.to_string()))
                .await?;
            self.clone_of(f, &mut z).await
        }
        .await;
        match made {
            Ok(inst) => {
                tracing::info!(function = %f.name, "zygote ready after {:.1} ms",
                    started.elapsed().as_secs_f64() * 1e3);
                *zygote_slot = Some(z);
                Ok(inst)
            }
            Err(e) => {
                tracing::warn!(function = %f.name, "no zygote ({e:#}); serving from the VM itself");
                let conn = self
                    .connect(f, &z.vmm.vsock_uds)
                    .await
                    .map_err(|e| start_err(e.into()))?;
                Ok(instance(z.vmm, conn))
            }
        }
    }

    /// `f`'s code stored on this node: in a cluster, code deployed through
    /// another node is fetched from a peer.
    async fn ensure_code(&self, f: &Function) -> anyhow::Result<()> {
        let rt = runtime::find(&f.runtime)
            .ok_or_else(|| anyhow::anyhow!("unknown runtime {}", f.runtime))?;
        let code = if rt.linux() {
            code::disk_path(&self.cfg.state_dir, &f.code_sha256)
        } else {
            code::image_path(&self.cfg.state_dir, &f.code_sha256, &f.handler)
        };
        if let Some(node) = self.cluster.get().filter(|_| !code.exists()) {
            crate::cluster::fetch_code(
                node,
                &self.cfg.state_dir,
                &f.code_sha256,
                &f.runtime,
                &f.handler,
            )
            .await
            .map_err(|e| anyhow::anyhow!("fetching {}'s code from the cluster: {e}", f.name))?;
        }
        Ok(())
    }

    /// A fresh VMM booted with the function, connected and ready. A Linux
    /// function (snapshots on) starts from its runtime's base instead, which
    /// also writes its version's snapshot as a diff on the base; if that
    /// fails for a reason other than the function's init, it is booted.
    async fn boot(&self, f: &Function) -> anyhow::Result<(VmmProcess, InstanceConn)> {
        let rt = runtime::find(&f.runtime)
            .ok_or_else(|| anyhow::anyhow!("unknown runtime {}", f.runtime))?;
        // Linux: the guest kernel and the runtime's image are looked up on
        // every boot, so a rebuilt image serves the next cold start; a
        // missing one fails before any VMM is started.
        let linux = if rt.linux() {
            let kernel = self.cfg.linux_kernel.clone().ok_or_else(|| {
                anyhow::anyhow!(
                    "no Linux guest kernel: build one with guest/build-kernel.sh or give spore serve --linux-kernel"
                )
            })?;
            let root = crate::images::newest(&self.cfg.image_cache, rt.name())?;
            Some((kernel, root))
        } else {
            None
        };
        let code = if rt.linux() {
            code::disk_path(&self.cfg.state_dir, &f.code_sha256)
        } else {
            code::image_path(&self.cfg.state_dir, &f.code_sha256, &f.handler)
        };
        self.ensure_code(f).await?;
        if let Some(jail) = &self.jail {
            jail.share(&code)
                .map_err(|e| anyhow::anyhow!("letting {}'s VMMs read its code: {e}", f.name))?;
        }
        if let (Some((kernel, root_image)), false) = (&linux, self.cfg.no_snapshots) {
            let files = super::layered::LinuxBoot {
                kernel,
                root_image,
                code: &code,
            };
            match self.boot_layered(f, rt, &files).await {
                Ok(started) => return Ok(started),
                // The function's own init failed: a cold boot would fail
                // the same way.
                Err(e)
                    if e.downcast_ref::<InvokeError>()
                        .is_some_and(|e| matches!(e, InvokeError::Init(_))) =>
                {
                    return Err(e)
                }
                Err(e) => tracing::warn!(function = %f.name,
                    "no start from the runtime base ({e:#}); booting the function instead"),
            }
        }
        let vmm = self.spawn_vmm(f).await?;
        self.record(&vmm);
        let files = runtime::BootFiles {
            code: &code,
            vsock_uds: &vmm.vsock_uds,
            linux: linux
                .as_ref()
                .map(|(kernel, root_image)| runtime::LinuxFiles { kernel, root_image }),
        };
        let setup = async {
            for call in rt.configure(f, &files)? {
                vmm.api(call.method, call.path, Some(call.body)).await?;
            }
            vmm.api(
                "PUT",
                "/actions",
                Some(r#"{"action_type":"InstanceStart"}"#.into()),
            )
            .await?;
            anyhow::Ok(self.connect(f, &vmm.vsock_uds).await?)
        }
        .await;
        self.started_or_ended(vmm, setup).await
    }

    /// A fresh VMM restored from the version's snapshot, connected and ready.
    async fn restore(
        &self,
        f: &Function,
        snap: &FunctionSnapshot,
    ) -> anyhow::Result<(VmmProcess, InstanceConn)> {
        // A networked function's snapshot reopens `tap0` by name: in the
        // fresh namespace the VMM runs in.
        let mut vmm = self.spawn_vmm(f).await?;
        self.record(&vmm);
        let setup = async {
            self.snapshots.restore(snap, &mut vmm).await?;
            anyhow::Ok(self.connect(f, &vmm.vsock_uds).await?)
        }
        .await;
        let started = self.started_or_ended(vmm, setup).await;
        if let Err(e) = &started {
            tracing::debug!(function = %f.name, "restore of {}: {e:#}", snap.dir.display());
        }
        started
    }

    /// A fresh VMM process for an instance of `f`, in a network namespace
    /// of its own if `f` asks for network.
    pub(super) async fn spawn_vmm(&self, f: &Function) -> anyhow::Result<VmmProcess> {
        let run_dir = self.run_dir();
        let instance = run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let jailed = self.jailed(f)?;
        let net = self
            .instance_net(f, &instance, jailed.as_ref().map(|j| &j.user), false)
            .await?;
        let cgroup = self.cgroup_for(f, &instance).await?;
        VmmProcess::spawn(&self.cfg.spore_bin, &run_dir, net, cgroup, jailed).await
    }

    /// For a networked zygote: the namespace of its next clone, whose
    /// number is the zygote's `served + 1` (asked under the pool's zygote
    /// lock, which every clone request holds, so numbers do not race), and
    /// `PUT /clone`'s `network` naming it by template.
    async fn clone_net(
        &self,
        f: &Function,
        z: &Zygote,
    ) -> anyhow::Result<Option<(InstanceNet, serde_json::Value)>> {
        if !f.network {
            return Ok(None);
        }
        let status: serde_json::Value =
            serde_json::from_str(&z.vmm.api("GET", "/clone", None).await?)?;
        let served = status
            .get("served")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| anyhow::anyhow!("GET /clone answered no served count: {status}"))?;
        let zygote = z.name();
        let user = z.vmm.user.as_ref();
        let mut net = self
            .instance_net(f, &format!("{zygote}c{}", served + 1), user, user.is_some())
            .await?
            .ok_or_else(|| anyhow::anyhow!("no network made"))?;
        let template = crate::network::Network::namespace_path(
            &self
                .network
                .namespace_name(&f.name, &format!("{zygote}c{{n}}")),
        );
        let mut network = serde_json::json!({ "netns_template": template });
        // A jailed clone may not enter its namespace: it is given its tap's
        // /dev/net/tun, opened there, over a socket it connects to.
        if let Some(user) = &z.vmm.user {
            let n = served + 1;
            let tun = net
                .take_handoff_tun()
                .ok_or_else(|| anyhow::anyhow!("no tun descriptor opened for the clone"))?;
            let sock = z.clone_dir.join(format!("tun-{n}.sock"));
            let limit = crate::network::handoff::TUN_HANDOFF_LIMIT;
            crate::network::handoff::give_tun(&sock, tun, user, limit)?;
            network["tun_socket_template"] =
                serde_json::json!(z.clone_dir.join("tun-{n}.sock").display().to_string());
        }
        Ok(Some((net, network)))
    }

    /// The started VMM and its connection, or the VMM ended and the error
    /// naming the end of its log.
    pub(super) async fn started_or_ended(
        &self,
        vmm: VmmProcess,
        setup: anyhow::Result<InstanceConn>,
    ) -> anyhow::Result<(VmmProcess, InstanceConn)> {
        match setup {
            Ok(conn) => Ok((vmm, conn)),
            Err(e) => {
                let tail = vmm.log_tail();
                self.end(vmm).await;
                Err(e.context(format!("VMM log: {tail}")))
            }
        }
    }

    /// One clone of the zygote, connected and ready.
    async fn clone_of(&self, f: &Function, z: &mut Zygote) -> anyhow::Result<Instance> {
        let mut body = serde_json::json!({ "count": 1, "socket_dir": z.clone_dir });
        let net = match self.clone_net(f, z).await? {
            Some((net, network)) => {
                body["network"] = network;
                Some(net)
            }
            None => None,
        };
        // The clone's cgroup: placed ahead, or made while the zygote clones.
        let leaf_ahead = self.clone_leaf_ahead(f, z);
        let asked = Instant::now();
        // On failure `net` drops here, removing the namespace.
        let answered = match z.vmm.api("PUT", "/clone", Some(body.to_string())).await {
            Ok(resp) => parse_clone(&resp),
            Err(e) => Err(e),
        };
        let Cloned {
            sock,
            name,
            pid,
            standby,
        } = match answered {
            Ok(clone) => clone,
            Err(e) => {
                leaf_ahead.discard().await;
                return Err(e);
            }
        };
        let cloned_us = asked.elapsed().as_micros();
        let leaf = self.clone_leaf(f, z, leaf_ahead, &name, pid).await;
        // The standby processes left get their cgroups now, while this
        // clone's guest answers: off the path of the clones that take them.
        self.place_standby(f, z, standby);
        let vsock = z.clone_dir.join(format!("{name}.vsock"));
        let mut vmm = VmmProcess::adopt(pid, sock, vsock, z.clone_dir.clone());
        vmm.net = net;
        self.record(&vmm);
        // In its own cgroup before it serves: moved there while its guest
        // answers unless it was a standby process placed ahead.
        let vsock = vmm.vsock_uds.clone();
        let (entered, connected) = tokio::join!(leaf.enter(vmm.pid), self.connect(f, &vsock));
        match entered {
            Ok(leaf) => vmm.cgroup = leaf,
            Err(e) => {
                self.end(vmm).await;
                anyhow::bail!("clone of {}: {e:#}", f.name);
            }
        }
        match connected {
            Ok(conn) => {
                tracing::debug!(
                    function = %f.name,
                    "clone: PUT /clone {cloned_us} µs, ready {} µs later",
                    asked.elapsed().as_micros() - cloned_us
                );
                Ok(instance(vmm, conn))
            }
            Err(e) => {
                self.end(vmm).await;
                Err(anyhow::anyhow!("clone of {}: {e}", f.name))
            }
        }
    }

    /// Ends a zygote and removes its clones' directory (running clones
    /// keep their mapped template; the kernel frees it with the last).
    pub(super) async fn end_zygote(&self, z: Zygote) {
        self.end(z.vmm).await;
        z.standby_leaves.close().await;
        let _ = std::fs::remove_dir_all(&z.clone_dir);
    }
}

/// What a `PUT /clone` answer says: the clone and the standby processes
/// left in the zygote's pool.
struct Cloned {
    sock: std::path::PathBuf,
    name: String,
    pid: i32,
    standby: Vec<super::clone_leaves::StandbyProcess>,
}

/// The clone a `PUT /clone` answer names: its socket, name and pid (one
/// that is not a single process's is refused, never truncated: it is
/// signalled later).
fn parse_clone(resp: &str) -> anyhow::Result<Cloned> {
    let report: serde_json::Value = serde_json::from_str(resp)?;
    let clone = report
        .get("clones")
        .and_then(|c| c.get(0))
        .ok_or_else(|| anyhow::anyhow!("PUT /clone answered no clone: {resp}"))?;
    let (Some(sock), Some(name), Some(pid)) = (
        clone.get("socket").and_then(|v| v.as_str()),
        clone.get("name").and_then(|v| v.as_str()),
        clone.get("pid").and_then(|v| v.as_i64()),
    ) else {
        anyhow::bail!("PUT /clone answered an incomplete clone: {clone}");
    };
    let Some(pid) = i32::try_from(pid).ok().filter(|&pid| pid > 0) else {
        anyhow::bail!("PUT /clone answered a pid that is no process's: {pid}");
    };
    // An older VMM lists none: its clones are moved on their path.
    let standby = report
        .get("standby_processes")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    Ok(Cloned {
        sock: sock.into(),
        name: name.to_string(),
        pid,
        standby,
    })
}

fn instance(vmm: VmmProcess, conn: InstanceConn) -> Instance {
    Instance {
        vmm,
        conn,
        last_used: Instant::now(),
    }
}
