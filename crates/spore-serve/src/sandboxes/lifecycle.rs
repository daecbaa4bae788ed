//! A sandbox's life on spore's mechanisms: created as a clone of its
//! template's zygote, forked as clones of itself while it runs (`PUT /clone`
//! in continue mode), paused as a full snapshot in its directory (then the
//! VMM ends and its memory is the host's again), resumed by restoring that
//! snapshot in a new VMM, killed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::events::{self, Level};
use super::{envd, new_id, new_token, Record, SandboxError, Sandboxes, State};
use crate::network::egress::Egress;
use crate::network::InstanceNet;
use crate::vmm::VmmProcess;

/// How long a new clone's or a restored sandbox's envd may take to answer
/// (a Linux guest under emulation is slow to get its vCPUs going).
const READY_LIMIT: Duration = Duration::from_secs(120);

/// What a create asks for.
pub struct NewSandbox {
    pub template: String,
    pub timeout_s: u64,
    pub auto_pause: bool,
    /// Resume on a request through the proxy while paused (needs auto_pause).
    pub auto_resume: bool,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// E2B's `allow_internet_access` and `network.allowOut`/`denyOut`:
    /// what a networked template's sandbox may reach beyond its namespace.
    pub egress: Egress,
}

impl Sandboxes {
    /// A new sandbox of `account`: a clone of the template's zygote, its
    /// envd given a fresh access token, the environment, and the time.
    pub async fn create(&self, account: &str, new: NewSandbox) -> Result<Record, SandboxError> {
        let template = self.template_for(account, &new.template)?;
        let _room = self.admit(account, template.spec.memory_mib, 1).await?;
        let started = Instant::now();
        let id = new_id()?;
        let dir = self.dir.join(&id);
        crate::fs::create_private_dir(&dir).map_err(|e| SandboxError::Internal(e.to_string()))?;
        let (vmm, base) = match self
            .clone_zygote(&template, account, &dir, &new.egress)
            .await
        {
            Ok(cloned) => cloned,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let token = new_token()?;
        let now = crate::clock::unix_ms();
        let rec = Record {
            id: id.clone(),
            account: account.to_string(),
            template: template.spec.name.clone(),
            build: template.build_id.clone(),
            metadata: new.metadata,
            access_token: token.clone(),
            started_at_ms: now,
            end_at_ms: now + new.timeout_s * 1000,
            auto_pause: new.auto_pause,
            state: State::Running,
            cpu_count: u32::from(template.spec.vcpus),
            memory_mib: template.spec.memory_mib,
            disk_mib: template.spec.disk_mib(),
            pause_generation: 0,
            vm_dir: None,
            diff_ready: base.is_some(),
            base,
            layers: Vec::new(),
            auto_resume: new.auto_resume,
            timeout_s: new.timeout_s,
            networked: template.spec.network,
            internet: new.egress.internet(),
            egress: Some(new.egress),
        };
        let settings = serde_json::json!({
            "accessToken": token,
            "envVars": new.env_vars,
            "defaultUser": template.spec.user,
            "timestamp": crate::clock::iso_ms(crate::clock::unix_ms()),
        });
        self.start_serving(rec, vmm, None, &settings, &dir).await?;
        let ms = started.elapsed().as_millis().to_string();
        events::record(
            &dir,
            Level::Info,
            &format!(
                "sandbox created from template {} in {ms} ms",
                template.spec.name
            ),
            &[("template", &template.spec.name), ("duration_ms", &ms)],
        );
        tracing::info!(
            sandbox = %id,
            template = %template.spec.name,
            "sandbox created in {ms} ms"
        );
        self.get(account, &id).await
    }

    /// Waits for a new VMM's envd, gives it `settings`, saves the record
    /// and enters the sandbox in the table; on failure the VMM ends and the
    /// directory goes.
    async fn start_serving(
        &self,
        rec: Record,
        mut vmm: VmmProcess,
        current_token: Option<&str>,
        settings: &serde_json::Value,
        dir: &Path,
    ) -> Result<(), SandboxError> {
        let ready = async {
            envd::wait_healthy(&vmm.vsock_uds, READY_LIMIT).await?;
            envd::init(&vmm.vsock_uds, current_token, settings).await?;
            rec.save(dir)?;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = ready {
            let tail = vmm.log_lines(5);
            vmm.kill().await;
            let _ = std::fs::remove_dir_all(dir);
            return Err(SandboxError::Internal(format!(
                "sandbox {}: {e:#} (VMM log: {tail})",
                rec.id
            )));
        }
        self.insert(rec, vmm);
        Ok(())
    }

    /// `count` forks of a running sandbox, each a clone of it with its own
    /// id, access token, disk overlay and vsock; one result per fork. One
    /// `PUT /clone` makes them all (one template of the source), their VMM
    /// files in one directory they share (`Record::vm_dir`).
    pub async fn fork(
        &self,
        account: &str,
        id: &str,
        count: u32,
        timeout_s: Option<u64>,
    ) -> Result<Vec<Result<Record, SandboxError>>, SandboxError> {
        let source = self.entry(account, id).await?;
        let Some(vmm) = &source.vmm else {
            return Err(SandboxError::Conflict(format!(
                "sandbox \"{id}\" is paused: resume it before forking it"
            )));
        };
        let _room = self.admit(account, source.rec.memory_mib, count).await?;
        let user = self.user_of(account, &source.rec.template)?;
        let group = format!("f-{}", new_id()?);
        let vm_dir = self.dir.join(&group);
        crate::fs::create_private_dir(&vm_dir)
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        let made = async {
            if let Some(u) = &user {
                crate::jail::own_tree(&vm_dir, u)?;
            }
            let nets = if source.rec.networked {
                let egress = source.rec.egress();
                let jailed = user.as_ref().map(|u| (u, vm_dir.as_path()));
                Some(
                    self.network
                        .for_clones(
                            vmm,
                            super::SANDBOX_NET_OWNER,
                            &group,
                            count,
                            &egress,
                            jailed,
                        )
                        .await?,
                )
            } else {
                None
            };
            fork_settings(vmm, count).await?;
            clones_of(vmm, &vm_dir, "continue", count, nets).await
        };
        let clones = match made.await {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&vm_dir);
                return Err(SandboxError::internal(e));
            }
        };
        // Each fork's envd is waited for and given its settings at the same
        // time as the others': one after another, every fork waited for
        // the round trips of those before it.
        let starts = clones.into_iter().map(|clone| {
            let (source, user, group) = (&source, &user, &group);
            async move {
                let fork_id = new_id()?;
                let dir = self.dir.join(&fork_id);
                crate::fs::create_private_dir(&dir)
                    .map_err(|e| SandboxError::Internal(e.to_string()))?;
                if let Some(u) = user {
                    crate::jail::share_dir_with(&dir, u)
                        .map_err(|e| SandboxError::Internal(e.to_string()))?;
                }
                let now = crate::clock::unix_ms();
                let token = new_token()?;
                let rec = Record {
                    id: fork_id.clone(),
                    access_token: token.clone(),
                    started_at_ms: now,
                    end_at_ms: timeout_s.map_or(source.rec.end_at_ms, |t| now + t * 1000),
                    state: State::Running,
                    pause_generation: 0,
                    vm_dir: Some(group.clone()),
                    // Its memory continues the source's chain: a diff on
                    // the template base while the source never paused,
                    // else on the source's own layers (not the fork's).
                    base: source
                        .rec
                        .base
                        .clone()
                        .filter(|_| source.rec.layers.is_empty()),
                    layers: Vec::new(),
                    diff_ready: source.rec.diff_ready && source.rec.layers.is_empty(),
                    ..source.rec.clone()
                };
                let settings = serde_json::json!({
                    "accessToken": token,
                    "timestamp": crate::clock::iso_ms(now),
                });
                self.start_serving(rec, clone, Some(&source.rec.access_token), &settings, &dir)
                    .await?;
                events::record(
                    &dir,
                    Level::Info,
                    &format!("sandbox forked from {}", source.rec.id),
                    &[("source", &source.rec.id)],
                );
                Ok(fork_id)
            }
        });
        let results: Vec<Result<String, SandboxError>> = join_all(starts).await;
        let made: Vec<&str> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().map(String::as_str))
            .collect();
        events::record(
            &self.dir.join(&source.rec.id),
            if made.len() == results.len() {
                Level::Info
            } else {
                Level::Warn
            },
            &format!(
                "forked: {} of {} asked made ({})",
                made.len(),
                results.len(),
                made.join(", ")
            ),
            &[("forks", &made.join(","))],
        );
        drop(source);
        if results.iter().all(Result::is_err) {
            let _ = std::fs::remove_dir_all(&vm_dir);
        }
        let mut out = Vec::new();
        for r in results {
            out.push(match r {
                Ok(fork_id) => self.get(account, &fork_id).await,
                Err(e) => Err(e),
            });
        }
        Ok(out)
    }

    /// Pauses a running sandbox: a snapshot in its directory, then its VMM
    /// ends. The snapshot is a diff on its chain (the template base and
    /// its own pauses since: only the pages it changed) where it has one,
    /// else full. A paused sandbox holds no memory and survives a daemon
    /// restart.
    pub async fn pause(&self, account: &str, id: &str) -> Result<(), SandboxError> {
        let mut entry = self.entry(account, id).await?;
        let Some(mut vmm) = entry.vmm.take() else {
            return Err(SandboxError::Conflict(format!(
                "sandbox \"{id}\" is already paused"
            )));
        };
        let dir = self.dir.join(id);
        let generation = entry.rec.pause_generation + 1;
        let (state, mem) = Record::snapshot_files(&dir, generation);
        let started = Instant::now();
        let mut diff = entry.rec.pause_is_diff();
        let mut written = snapshot(&vmm, diff, &state, &mem).await;
        if diff && written.is_err() {
            // A chain that cannot be continued (its base gone, say): full.
            let why = written
                .as_ref()
                .err()
                .map_or_else(String::new, |e| format!("{e:#}"));
            tracing::warn!(sandbox = %id, "a diff pause failed, pausing with a full snapshot: {why}");
            events::record(
                &dir,
                Level::Warn,
                &format!("a diff pause failed, pausing with a full snapshot: {why}"),
                &[],
            );
            diff = false;
            written = snapshot(&vmm, false, &state, &mem).await;
        }
        if let Err(e) = written {
            // It runs on as it was: resumed if the pause got that far.
            let _ = vmm
                .api("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#.into()))
                .await;
            entry.vmm = Some(vmm);
            let _ = std::fs::remove_file(&state);
            let _ = std::fs::remove_file(&mem);
            events::record(
                &dir,
                Level::Error,
                &format!("pause failed, running on: {e:#}"),
                &[],
            );
            return Err(SandboxError::Internal(format!(
                "pausing sandbox {id}: {e:#}"
            )));
        }
        vmm.kill().await;
        self.stopped_running(id);
        entry.rec.state = State::Paused;
        entry.rec.pause_generation = generation;
        entry.rec.diff_ready = true;
        if diff {
            entry.rec.layers.push(generation);
        } else {
            entry.rec.base = None;
            entry.rec.layers = vec![generation];
        }
        if let Err(e) = entry.rec.save(&dir) {
            return Err(SandboxError::Internal(format!(
                "sandbox {id}: its record: {e}"
            )));
        }
        if !diff {
            remove_pauses_before(&dir, generation);
        }
        let what = format!(
            "sandbox paused in {} ms ({} snapshot, {} KiB of memory on disk)",
            started.elapsed().as_millis(),
            if diff { "a diff" } else { "a full" },
            crate::fs::disk_bytes(&mem) >> 10
        );
        events::record(&dir, Level::Info, &what, &[]);
        tracing::info!(sandbox = %id, "{what}");
        Ok(())
    }

    /// Resumes a paused sandbox (its snapshot restored in a new VMM, envd's
    /// clock set); `Ok(false)` when it was running already. Either way its
    /// timeout starts again from now.
    pub async fn resume(
        &self,
        account: &str,
        id: &str,
        timeout_s: u64,
        auto_pause: Option<bool>,
    ) -> Result<bool, SandboxError> {
        let mut entry = self.entry(account, id).await?;
        let dir = self.dir.join(id);
        entry.rec.end_at_ms = crate::clock::unix_ms() + timeout_s * 1000;
        if let Some(a) = auto_pause {
            entry.rec.auto_pause = a;
        }
        if entry.vmm.is_some() {
            entry
                .rec
                .save(&dir)
                .map_err(|e| SandboxError::Internal(e.to_string()))?;
            return Ok(false);
        }
        let _room = self.admit(account, entry.rec.memory_mib, 1).await?;
        let started = Instant::now();
        let generation = entry.rec.pause_generation;
        let (state, mem) = Record::snapshot_files(&dir, generation);
        // Its sockets and log: under `run/`, which a later daemon clears.
        let run_dir = self
            .state_dir
            .join("run")
            .join(format!("sbx-{id}-r{generation}"));
        let user = self.user_of(account, &entry.rec.template)?;
        let jailed =
            match (&self.jail, &user) {
                (Some(j), Some(u)) => {
                    let spec = &self.template_of_record(account, &entry.rec)?.spec;
                    let jailed = j.resumed(spec, u, &entry.rec, &dir);
                    Some(jailed.map_err(|e| {
                        SandboxError::Internal(format!("resuming sandbox {id}: {e:#}"))
                    })?)
                }
                _ => None,
            };
        // A networked sandbox's snapshot reopens `tap0` by name, in a new
        // namespace.
        let net = if entry.rec.networked {
            let instance = format!("{id}r{generation}");
            let made = self
                .network
                .make(
                    super::SANDBOX_NET_OWNER,
                    &instance,
                    &entry.rec.egress(),
                    user.as_ref(),
                )
                .await;
            Some(made.map_err(SandboxError::internal)?)
        } else {
            None
        };
        let mut vmm = VmmProcess::spawn(&self.spore_bin, &run_dir, net, None, jailed)
            .await
            .map_err(SandboxError::internal)?;
        let load = serde_json::json!({
            "snapshot_path": state,
            "mem_file_path": mem,
            "resume_vm": true,
            "vsock_override": { "uds_path": vmm.vsock_uds },
        });
        let restored = async {
            vmm.api("PUT", "/snapshot/load", Some(load.to_string()))
                .await?;
            envd::wait_healthy(&vmm.vsock_uds, READY_LIMIT).await?;
            // The guest's clock stood still while it was paused.
            let clock =
                serde_json::json!({ "timestamp": crate::clock::iso_ms(crate::clock::unix_ms()) });
            envd::init(&vmm.vsock_uds, Some(&entry.rec.access_token), &clock).await?;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = restored {
            let tail = vmm.log_tail();
            events::record(
                &self.dir.join(id),
                Level::Error,
                &format!(
                    "resume failed: {e:#}; its VMM's log ends: {}",
                    vmm.log_lines(20)
                ),
                &[],
            );
            vmm.kill().await;
            return Err(SandboxError::Internal(format!(
                "resuming sandbox {id}: {e:#} (VMM log: {tail})"
            )));
        }
        entry.rec.state = State::Running;
        entry.vmm = Some(vmm);
        let bytes = u64::from(entry.rec.memory_mib) << 20;
        let sandboxes = &self.instances.sandbox_memory;
        sandboxes.running(id, account, bytes);
        entry
            .rec
            .save(&dir)
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        let what = format!("sandbox resumed in {} ms", started.elapsed().as_millis());
        events::record(&dir, Level::Info, &what, &[]);
        tracing::info!(sandbox = %id, "{what}");
        Ok(true)
    }

    /// Kills a sandbox, running or paused: its VMM ends, its directory goes.
    pub async fn kill(&self, account: &str, id: &str) -> Result<(), SandboxError> {
        let mut entry = self.entry(account, id).await?;
        entry.gone = true;
        crate::mutex::lock(&self.table).remove(id);
        self.stopped_running(id);
        if let Some(mut vmm) = entry.vmm.take() {
            // One whose VMM had ended on its own says why, before its log
            // goes with its directory.
            if let Some(ending) = vmm.ending() {
                tracing::warn!(
                    sandbox = %id,
                    "sandbox removed: its VMM (pid {}) had ended ({ending:?}); its log ends: {}",
                    vmm.pid,
                    vmm.log_lines(30)
                );
            }
            vmm.kill().await;
        }
        let _ = std::fs::remove_dir_all(self.dir.join(id));
        if let Some(group) = &entry.rec.vm_dir {
            self.release_group(group);
        }
        Ok(())
    }

    /// E2B's `update_network`: what it may reach beyond its namespace,
    /// put in force in its namespace now if it runs, and kept for its
    /// resumes (its forks take it from it). 409 for a sandbox without a
    /// network.
    pub async fn set_egress(
        &self,
        account: &str,
        id: &str,
        egress: Egress,
    ) -> Result<(), SandboxError> {
        let mut entry = self.entry(account, id).await?;
        if !entry.rec.networked {
            return Err(SandboxError::Conflict(format!(
                "sandbox \"{id}\" has no network: its template {} has network = false",
                entry.rec.template
            )));
        }
        if let Some(net) = entry.vmm.as_ref().and_then(|v| v.net.as_ref()) {
            let (name, rules) = (net.name.clone(), egress.clone());
            tokio::task::spawn_blocking(move || {
                rules
                    .apply_in(&name)
                    .map_err(|e| format!("its namespace {name}: {e}"))
            })
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))?
            .map_err(|e| SandboxError::Internal(format!("sandbox {id}: {e}")))?;
        }
        let list = |nets: &[ipnet::Ipv4Net]| {
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let (allow, deny) = (list(&egress.allow), list(&egress.deny));
        entry.rec.set_egress(egress);
        entry
            .rec
            .save(&self.dir.join(id))
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        events::record(
            &self.dir.join(id),
            Level::Info,
            &format!("network updated: allow_out [{allow}], deny_out [{deny}]"),
            &[("allow_out", &allow), ("deny_out", &deny)],
        );
        Ok(())
    }

    /// Its timeout, from now.
    pub async fn set_timeout(
        &self,
        account: &str,
        id: &str,
        timeout_s: u64,
    ) -> Result<(), SandboxError> {
        let mut entry = self.entry(account, id).await?;
        entry.rec.end_at_ms = crate::clock::unix_ms() + timeout_s * 1000;
        entry
            .rec
            .save(&self.dir.join(id))
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        events::record(
            &self.dir.join(id),
            Level::Info,
            &format!(
                "timeout set: {timeout_s} s from now (ends at {})",
                crate::clock::iso_ms(entry.rec.end_at_ms)
            ),
            &[],
        );
        Ok(())
    }
}

/// `count` clones of `source` (`mode`: "zygote" freezes it as the
/// template, "continue" lets it run on), their sockets and disk overlays in
/// `dir`; with `nets` (a networked source's: [`super::net::SandboxNetwork::
/// for_clones`]), each in its namespace, which it then holds. A clone that
/// is not all there is ended, never half-adopted.
pub(super) async fn clones_of(
    source: &VmmProcess,
    dir: &Path,
    mode: &str,
    count: u32,
    nets: Option<(HashMap<u64, InstanceNet>, serde_json::Value)>,
) -> anyhow::Result<Vec<VmmProcess>> {
    let mut body = serde_json::json!({ "count": count, "mode": mode, "socket_dir": dir });
    let mut nets = match nets {
        Some((nets, network)) => {
            body["network"] = network;
            Some(nets)
        }
        None => None,
    };
    let resp = source.api("PUT", "/clone", Some(body.to_string())).await?;
    let report: serde_json::Value = serde_json::from_str(&resp)?;
    let listed = report
        .get("clones")
        .and_then(|c| c.as_array())
        .ok_or_else(|| anyhow::anyhow!("PUT /clone answered no clones: {resp}"))?;
    let mut clones = Vec::new();
    let mut incomplete = None;
    for clone in listed {
        let (Some(sock), Some(name), Some(pid)) = (
            clone.get("socket").and_then(|v| v.as_str()),
            clone.get("name").and_then(|v| v.as_str()),
            clone
                .get("pid")
                .and_then(|v| v.as_i64())
                .and_then(|p| i32::try_from(p).ok())
                .filter(|&p| p > 0),
        ) else {
            incomplete = Some(clone.to_string());
            continue;
        };
        let vsock: PathBuf = dir.join(format!("{name}.vsock"));
        let mut vmm = VmmProcess::adopt(pid, sock.into(), vsock, dir.to_path_buf());
        if let Some(nets) = nets.as_mut() {
            let index = clone.get("index").and_then(serde_json::Value::as_u64);
            vmm.net = index.and_then(|i| nets.remove(&i));
            if vmm.net.is_none() {
                // Adopted all the same, so that it is ended below.
                incomplete = Some(clone.to_string());
            }
        }
        clones.push(vmm);
    }
    if incomplete.is_some() || clones.len() != count as usize {
        for mut c in clones {
            c.kill().await;
        }
        anyhow::bail!(
            "PUT /clone answered {} clones of {count}{}",
            listed.len(),
            incomplete.map_or(String::new(), |c| format!(", one incomplete: {c}"))
        );
    }
    Ok(clones)
}

/// The most clones a sandbox VMM's tree may count (the VMM's own limit
/// is 1,000 by default; a clone's tree is bounded by the budget its source
/// gave it whatever this says).
const MAX_CLONES: u64 = 1 << 62;
/// The clone budget of each sandbox a zygote makes: what its forks, and
/// theirs, may count in all (so that a zygote serves 2^32 sandboxes).
const SANDBOX_CLONE_BUDGET: u64 = 1 << 30;

/// A zygote's clone settings: its clones (sandboxes) outlive it and get
/// [`SANDBOX_CLONE_BUDGET`] each, so that they can be forked (a clone of
/// a VMM whose budget gives it none cannot be cloned).
pub(super) async fn zygote_settings(vmm: &VmmProcess) -> anyhow::Result<()> {
    clone_settings(vmm, Some(SANDBOX_CLONE_BUDGET)).await
}

/// A sandbox's clone settings before `count` forks of it: they outlive it
/// (a fork is a sandbox of its own, which its source's pause or kill must
/// not end) and each gets a share of what its tree may still count, half
/// of it kept for the sandbox's later forks.
async fn fork_settings(vmm: &VmmProcess, count: u32) -> anyhow::Result<()> {
    clone_settings(vmm, None).await?;
    let status: serde_json::Value = serde_json::from_str(&vmm.api("GET", "/clone", None).await?)?;
    let left = status
        .get("budget_left")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow::anyhow!("GET /clone answered no budget_left: {status}"))?;
    let count = u64::from(count);
    if left < count {
        anyhow::bail!("this sandbox has been forked as often as its clone budget allows");
    }
    clone_settings(vmm, Some((left - count) / (2 * count))).await
}

/// `PUT /clone/config`: clones outlive `vmm`, each with `budget`.
async fn clone_settings(vmm: &VmmProcess, budget: Option<u64>) -> anyhow::Result<()> {
    let mut config = serde_json::json!({ "clones_outlive_source": true, "max_clones": MAX_CLONES });
    if let Some(b) = budget {
        config["clone_budget"] = b.into();
    }
    vmm.api("PUT", "/clone/config", Some(config.to_string()))
        .await?;
    Ok(())
}

/// A snapshot of the running VM (a diff on its last, or full): paused,
/// then written.
async fn snapshot(vmm: &VmmProcess, diff: bool, state: &Path, mem: &Path) -> anyhow::Result<()> {
    vmm.api("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
        .await?;
    let body = serde_json::json!({
        "snapshot_type": if diff { "Diff" } else { "Full" },
        "snapshot_path": state,
        "mem_file_path": mem,
    });
    vmm.api("PUT", "/snapshot/create", Some(body.to_string()))
        .await?;
    Ok(())
}

/// Removes a sandbox's pause snapshots older than `generation` (a full
/// pause needs none of them).
fn remove_pauses_before(dir: &Path, generation: u32) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let older = name
            .strip_prefix("pause-")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n < generation);
        if older {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
