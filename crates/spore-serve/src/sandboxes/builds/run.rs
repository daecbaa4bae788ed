//! A build's run: its parent's image copied, a VM booted from the copy
//! (jailed as the template's user, on the parent's network), the steps run
//! in it ([`super::steps`]), the image kept and served as the template's.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::layers::{self, Cached, StepState};
use super::steps::{shown_args, StepRunner};
use super::{Build, BuildStart, Built, Step, STEP_LIMIT};
use crate::mutex::lock;
use crate::network::egress::Egress;
use crate::sandboxes::events::Level;
use crate::sandboxes::{envd, template, Sandboxes, Template, TemplateSpec};

impl Sandboxes {
    /// Runs a build: the parent's image copied, a VM booted from the copy,
    /// the steps run in it, the image kept as the template's. An error is
    /// its message and the step it names.
    pub(super) async fn run_build(
        &self,
        build_id: &str,
        parent: &Template,
        start: &BuildStart,
    ) -> Result<(), (String, Option<String>)> {
        let b = lock(&self.builds.table)
            .get(build_id)
            .cloned()
            .ok_or_else(|| ("the build is gone".to_string(), None))?;
        let base = |e: String| (e, Some("base".to_string()));
        let dir = self.builds.template_dir(&b.account, &b.name);
        let steps = &start.steps;
        let keys = layers::keys(&parent.spec, steps)
            .map_err(|e| base(format!("{}: {e}", parent.spec.rootfs.display())))?;
        let cached = self
            .builds
            .layers(&b.account)
            .longest_cached(&keys, steps, start.force);
        let done = cached.as_ref().map_or(0, |c| c.steps);
        for (i, step) in steps.iter().enumerate().take(done) {
            let n = (i + 1).to_string();
            let msg = format!(
                "[{n}/{}] {} {} (cached)",
                steps.len(),
                step.kind,
                shown_args(step)
            );
            self.builds.log(build_id, Level::Info, &msg, Some(&n));
        }
        if self.jail.is_some() {
            // Jailed VMMs of the account's templates pass through the
            // account's directory to their images (and cannot list it).
            pass_through(&self.builds.root.join(&b.account)).map_err(|e| base(e.to_string()))?;
        }
        let image = dir.join(format!("rootfs-{build_id}.ext4"));
        let spec = TemplateSpec {
            name: b.name.clone(),
            kernel: parent.spec.kernel.clone(),
            rootfs: image.clone(),
            vcpus: b.cpu_count.unwrap_or(parent.spec.vcpus),
            memory_mib: b.memory_mib.unwrap_or(parent.spec.memory_mib),
            user: parent.spec.user.clone(),
            start_cmd: start.start_cmd.clone(),
            ready_cmd: start.ready_cmd.clone(),
            network: parent.spec.network,
            dns: parent.spec.dns.clone(),
        };
        let fin = |e: String| (e, Some("finalize".to_string()));
        let state = match cached {
            // Every step cached: the layer is the image, no VM boots.
            Some(c) if c.steps == steps.len() => {
                let (from, to) = (c.image.clone(), image.clone());
                tokio::task::spawn_blocking(move || link_or_copy(&from, &to))
                    .await
                    .map_err(|e| fin(e.to_string()))?
                    .map_err(|e| fin(format!("keeping the image: {e}")))?;
                self.builds.log(
                    build_id,
                    Level::Info,
                    "every step was cached: no build VM",
                    Some("finalize"),
                );
                c.state
            }
            cached => {
                let state = self
                    .build_in_vm(build_id, &b, parent, &spec, steps, (&keys, cached))
                    .await?;
                // The final image is the last step's layer (a link).
                if let Some(key) = keys.last() {
                    let (layers, key, at, st) = (
                        self.builds.layers(&b.account),
                        key.clone(),
                        image.clone(),
                        state.clone(),
                    );
                    let kept =
                        tokio::task::spawn_blocking(move || layers.keep(&key, &at, &st, true))
                            .await
                            .map_err(std::io::Error::other)
                            .and_then(|r| r);
                    if let Err(e) = kept {
                        let msg = format!("the build cache could not keep the image: {e}");
                        self.builds
                            .log(build_id, Level::Warn, &msg, Some("finalize"));
                    }
                }
                state
            }
        };
        if let Some(mib) = b.min_free_disk_mib {
            self.keep_free_space(build_id, &image, mib).await;
        }
        let spec = TemplateSpec {
            user: state.template_user,
            ..spec
        };
        self.share_built_image(&b, &spec).map_err(fin)?;
        let built = Built {
            template_id: b.template_id.clone(),
            account: b.account.clone(),
            build_id: build_id.to_string(),
            spec,
        };
        let json = serde_json::to_vec_pretty(&built).map_err(|e| fin(e.to_string()))?;
        crate::fs::write_private(&dir.join(format!("built-{build_id}.json")), &json)
            .map_err(|e| fin(format!("built-{build_id}.json: {e}")))?;
        let tags = b.tags.clone();
        self.tag_build(built, &tags).await.map_err(fin)?;
        let msg = format!("tagged {}", tags.join(", "));
        self.builds
            .log(build_id, Level::Info, &msg, Some("finalize"));
        Ok(())
    }

    /// Copies the image the steps start from (the parent's, or the cached
    /// layer's) to a work directory, runs the steps after the cached ones in
    /// a VM booted from the copy, and keeps the copy as `spec.rootfs`;
    /// returns what the steps set.
    async fn build_in_vm(
        &self,
        build_id: &str,
        b: &Build,
        parent: &Template,
        spec: &TemplateSpec,
        steps: &[Step],
        (keys, cached): (&[String], Option<Cached>),
    ) -> Result<StepState, (String, Option<String>)> {
        let base = |e: String| (e, Some("base".to_string()));
        let dir = self.builds.template_dir(&b.account, &b.name);
        // The build VM writes only its work directory (its image copy).
        let work = dir.join(format!(".work-{build_id}"));
        crate::fs::create_private_dir(&work).map_err(|e| base(e.to_string()))?;
        let partial = work.join("rootfs.ext4");
        let (source, copied_from) = match &cached {
            Some(c) => (
                c.image.clone(),
                format!("the build cache (after step {})", c.steps),
            ),
            None => (
                parent.spec.rootfs.clone(),
                format!("template {}", parent.spec.name),
            ),
        };
        let (from, to) = (source.clone(), partial.clone());
        let copied = tokio::task::spawn_blocking(move || crate::fs::copy_sparse(&from, &to))
            .await
            .map_err(|e| base(e.to_string()))?;
        if let Err(e) = copied {
            let _ = std::fs::remove_dir_all(&work);
            return Err(base(format!("copying {}: {e}", source.display())));
        }
        self.builds.log(
            build_id,
            Level::Info,
            &format!("image copied from {copied_from}"),
            Some("base"),
        );
        let vm_spec = TemplateSpec {
            rootfs: partial.clone(),
            ..spec.clone()
        };
        let resume = Resume {
            from: cached.as_ref().map_or(0, |c| c.steps),
            state: cached.map(|c| c.state),
            keys,
        };
        let ran = self
            .run_steps(build_id, b, &vm_spec, &work, steps, resume)
            .await;
        let state = match ran {
            Ok(state) => state,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work);
                return Err(e);
            }
        };
        let fin = |e: String| (e, Some("finalize".to_string()));
        let (from, to) = (partial, spec.rootfs.clone());
        let kept = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&from)?.sync_all()?;
            std::fs::rename(&from, &to)?;
            crate::fs::sync_dir(to.parent().unwrap_or(Path::new(".")))
        })
        .await;
        let _ = std::fs::remove_dir_all(&work);
        kept.map_err(|e| fin(e.to_string()))?
            .map_err(|e| fin(format!("keeping the image: {e}")))?;
        Ok(state)
    }

    /// Boots the build VM from `spec`'s image (a copy, written in place)
    /// and runs the steps from `resume.from` in it; the image after each
    /// `RUN` and `COPY` but the last is kept in the build cache. Returns
    /// what the steps set (the template's user: its last `USER`, else its
    /// parent's).
    async fn run_steps(
        &self,
        build_id: &str,
        b: &Build,
        spec: &TemplateSpec,
        dir: &Path,
        steps: &[Step],
        resume: Resume<'_>,
    ) -> Result<StepState, (String, Option<String>)> {
        let base = |e: String| (e, Some("base".to_string()));
        let user = self
            .user_of(&b.account, &b.name)
            .map_err(|e| base(e.to_string()))?;
        let jailed = match (&self.jail, &user) {
            (Some(j), Some(u)) => Some(
                j.builder(spec, u, dir)
                    .map_err(|e| base(format!("{e:#}")))?,
            ),
            _ => None,
        };
        let net = if spec.network {
            let owner = format!("sbx-build.{}", b.account);
            let stem = format!("b{}", &build_id[..8.min(build_id.len())]);
            Some(
                self.network
                    .make(&owner, &stem, &Egress::default(), user.as_ref())
                    .await
                    .map_err(|e| base(format!("its network namespace: {e:#}")))?,
            )
        } else {
            None
        };
        // (Short: its API socket's path must fit a Unix socket address.)
        let run_dir = self
            .state_dir
            .join("run")
            .join(format!("build-{}", &build_id[..8.min(build_id.len())]));
        let booted = template::boot_builder(&self.spore_bin, spec, &run_dir, net, jailed).await;
        let mut vmm = match booted {
            Ok(vmm) => vmm,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run_dir);
                return Err(base(format!("{e:#}")));
            }
        };
        self.builds
            .log(build_id, Level::Info, "build VM booted", Some("base"));
        let state = resume.state.unwrap_or_else(|| StepState {
            user: spec.user.clone(),
            template_user: spec.user.clone(),
            ..StepState::default()
        });
        let mut runner = StepRunner {
            vsock: vmm.vsock_uds.clone(),
            state,
            files: self.builds.files_dir(&b.account),
        };
        let mut result = Ok(());
        for (i, step) in steps.iter().enumerate().skip(resume.from) {
            let n = (i + 1).to_string();
            self.builds.log(
                build_id,
                Level::Info,
                &format!("[{n}/{}] {} {}", steps.len(), step.kind, shown_args(step)),
                Some(&n),
            );
            match tokio::time::timeout(STEP_LIMIT, runner.run(i, step)).await {
                Ok(Ok(output)) => {
                    if !output.trim().is_empty() {
                        self.builds
                            .log(build_id, Level::Info, output.trim_end(), Some(&n));
                    }
                }
                Ok(Err(e)) => {
                    result = Err((format!("step {n} ({}): {e:#}", step.kind), Some(n)));
                    break;
                }
                Err(_) => {
                    result = Err((
                        format!("step {n} ({}): ran past {STEP_LIMIT:?}", step.kind),
                        Some(n),
                    ));
                    break;
                }
            }
            self.builds.update(build_id, |_| {});
            if i + 1 < steps.len() && layers::worth_keeping(step) {
                let n = (i + 1).to_string();
                self.keep_layer(build_id, b, &runner, &spec.rootfs, (&resume.keys[i], &n))
                    .await;
            }
        }
        if result.is_ok() {
            // What the steps wrote reaches the image before the VM ends.
            if let Err(e) = envd::run(&runner.vsock, "root", "sync", &[]).await {
                result = Err((format!("sync: {e:#}"), Some("finalize".into())));
            }
        }
        vmm.kill().await;
        let _ = std::fs::remove_dir_all(&run_dir);
        result.map(|()| runner.state)
    }

    /// Keeps the build VM's image as layer `key` between two steps: synced
    /// in the guest first, copied while the VM waits. A failure only costs
    /// the cache (logged as a warning).
    async fn keep_layer(
        &self,
        build_id: &str,
        b: &Build,
        runner: &StepRunner,
        image: &Path,
        (key, n): (&str, &str),
    ) {
        let kept = match envd::run(&runner.vsock, "root", "sync", &[]).await {
            Err(e) => Err(format!("sync: {e:#}")),
            Ok(_) => {
                let (layers, key, at, st) = (
                    self.builds.layers(&b.account),
                    key.to_string(),
                    image.to_path_buf(),
                    runner.state.clone(),
                );
                tokio::task::spawn_blocking(move || layers.keep(&key, &at, &st, false))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
        };
        if let Err(e) = kept {
            let msg = format!("the build cache could not keep this step's image: {e}");
            self.builds.log(build_id, Level::Warn, &msg, Some(n));
        }
    }

    /// `minFreeDiskMb`: the image grown to keep `mib` MiB free; best
    /// effort, as on E2B (a growth that fails is a warning in the log).
    async fn keep_free_space(&self, build_id: &str, image: &Path, mib: u32) {
        let at = image.to_path_buf();
        let grown =
            tokio::task::spawn_blocking(move || super::free_space::ensure_free(&at, mib)).await;
        let (level, msg) = match grown {
            Ok(Ok((before, after))) if before == after => (
                Level::Info,
                format!("{} MiB free in the image (asked: {mib})", after.free >> 20),
            ),
            Ok(Ok((_, after))) => (
                Level::Info,
                format!(
                    "image grown to {} MiB: {} MiB free (asked: {mib})",
                    after.size >> 20,
                    after.free >> 20
                ),
            ),
            Ok(Err(e)) => (Level::Warn, format!("the image was not grown: {e}")),
            Err(e) => (Level::Warn, format!("the image was not grown: {e}")),
        };
        self.builds.log(build_id, level, &msg, Some("finalize"));
    }

    /// The built image made readable (not writable) by the template's
    /// jailed VMMs.
    fn share_built_image(&self, b: &Build, spec: &TemplateSpec) -> Result<(), String> {
        let Some(user) = self
            .user_of(&b.account, &b.name)
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let dir = self.builds.template_dir(&b.account, &b.name);
        crate::jail::share_read_only(&dir, &spec.rootfs, &user).map_err(|e| e.to_string())
    }

    /// Serves a built template (replacing an earlier build of it: its
    /// zygotes end, the sandboxes made from them run on).
    pub(super) async fn serve_built(&self, built: Built) {
        let key = (built.account.clone(), built.spec.name.clone());
        let t = Arc::new(Template {
            key: built.spec.name.clone(),
            build_id: Some(built.build_id),
            spec: built.spec,
            zygotes: Mutex::default(),
        });
        let old = lock(&self.built).insert(key, t);
        if let Some(old) = old {
            end_zygotes(&old).await;
        }
    }

    /// `account`'s template `name` has no `default` build any more: its
    /// zygotes end, `template.json` goes (its builds stay, and their tags).
    pub(super) async fn stop_serving(&self, account: &str, name: &str) {
        let dir = self.builds.template_dir(account, name);
        if let Err(e) = std::fs::remove_file(dir.join("template.json")) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(template = %name, "removing template.json: {e}");
            }
        }
        let old = lock(&self.built).remove(&(account.to_string(), name.to_string()));
        if let Some(old) = old {
            end_zygotes(&old).await;
        }
    }
}

/// Ends a template's zygotes (the sandboxes made from them run on).
async fn end_zygotes(t: &Template) {
    for (_, slot) in t.zygote_slots() {
        if let Some(mut z) = slot.lock().await.take() {
            z.vmm.kill().await;
        }
    }
}

/// Where a build resumes: after its first `from` steps (cached), with what
/// they set; `keys` name the image after each step ([`layers::keys`]).
struct Resume<'a> {
    from: usize,
    state: Option<StepState>,
    keys: &'a [String],
}

/// `to` as another name of `from` (a final image, never written again),
/// or a sparse copy where a link cannot be made.
fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::hard_link(from, to).or_else(|_| crate::fs::copy_sparse(from, to))?;
    crate::fs::sync_dir(to.parent().unwrap_or(Path::new(".")))
}

/// `dir` mode 0711: others pass through, cannot list.
fn pass_through(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}
