//! Templates' zygotes: one per account and template, booted when first
//! needed (again after it failed or died), cloned for each new sandbox; the
//! template bases they write, kept while a sandbox's chain or a zygote needs
//! them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{lifecycle, template, SandboxError, Sandboxes, Template};
use crate::network::egress::Egress;
use crate::vmm::VmmProcess;

impl Sandboxes {
    /// A clone of `account`'s zygote of the template with its files in
    /// `dir`; the zygote is booted first if it is not running (first use, a
    /// boot that failed, a zygote that died). Creates of one account's
    /// template take turns.
    /// Returns the clone and the template base its memory is a diff on.
    /// A networked template's clone runs in a namespace of its own, its
    /// outbound traffic as `egress` says.
    pub(super) async fn clone_zygote(
        &self,
        t: &Template,
        account: &str,
        dir: &Path,
        egress: &Egress,
    ) -> Result<(VmmProcess, Option<PathBuf>), SandboxError> {
        let slot = t.zygote_of(account);
        let mut slot = slot.lock().await;
        self.ensure_zygote(t, account, &mut slot).await?;
        let Some(z) = slot.as_mut() else {
            return Err(SandboxError::Internal("no zygote".into()));
        };
        z.last_used = std::time::Instant::now();
        let user = self.user_of(account, &t.spec.name)?;
        if let (Some(j), Some(u)) = (&self.jail, &user) {
            j.give_sandbox_dir(dir, u)
                .map_err(|e| SandboxError::Internal(e.to_string()))?;
        }
        let nets = if t.spec.network {
            let owner = template_net_owner(&t.key, account);
            let jailed = user.as_ref().map(|u| (u, dir));
            Some(
                self.network
                    .for_clones(&z.vmm, &owner, &z.net_stem, 1, egress, jailed)
                    .await
                    .map_err(SandboxError::internal)?,
            )
        } else {
            None
        };
        let clone = lifecycle::clones_of(&z.vmm, dir, "zygote", 1, nets)
            .await
            .map_err(SandboxError::internal)?
            .pop()
            .ok_or_else(|| SandboxError::Internal("PUT /clone answered no clone".into()))?;
        Ok((clone, z.base.clone()))
    }

    pub(super) async fn ensure_zygote(
        &self,
        t: &Template,
        account: &str,
        slot: &mut Option<template::Zygote>,
    ) -> Result<(), SandboxError> {
        if let Some(z) = slot.as_mut() {
            if z.vmm.is_alive() {
                return Ok(());
            }
            tracing::warn!(template = %t.spec.name, "sandbox template: its zygote ended; booting it again");
            z.vmm.kill().await;
            *slot = None;
        }
        let run_dir = self
            .state_dir
            .join("run")
            .join(format!("sbx-{}.{account}", t.key));
        // The bases no sandbox's chain and no other zygote needs go before
        // a new one is made.
        if let Some(needed) = self.bases_needed(t, account) {
            remove_bases_but(&self.bases, &needed);
        }
        self.boot_zygote(t, account, slot, &run_dir).await
    }

    /// The template bases sandboxes and the zygotes other than `except`'s
    /// zygote for `account` use; `None` when one is busy (it may need any).
    fn bases_needed(&self, except: &Template, account: &str) -> Option<HashSet<PathBuf>> {
        let mut needed = HashSet::new();
        for e in crate::mutex::lock(&self.table).values() {
            needed.extend(e.try_lock().ok()?.rec.base.clone());
        }
        for t in self.all_templates() {
            for (owner, slot) in t.zygote_slots() {
                if t.key == except.key && owner == account {
                    continue;
                }
                let z = slot.try_lock().ok()?;
                needed.extend(z.as_ref().and_then(|z| z.base.clone()));
            }
        }
        Some(needed)
    }

    /// Ends the zygotes that made no sandbox for `--sandbox-zygote-idle`
    /// (running sandboxes outlive them), and the template bases no
    /// sandbox needs then. A zygote busy making one is left for later.
    pub(super) async fn end_idle_zygotes(&self) {
        let Some(idle) = self.zygote_idle else {
            return;
        };
        for t in self.all_templates() {
            for (account, slot) in t.zygote_slots() {
                let Ok(mut slot) = slot.try_lock() else {
                    continue;
                };
                let Some(z) = slot.as_mut().filter(|z| z.last_used.elapsed() >= idle) else {
                    continue;
                };
                z.vmm.kill().await;
                tracing::info!(
                    template = %t.spec.name,
                    account = %account,
                    "sandbox template: this account's zygote ended after {} s without a create; its next create boots it again",
                    idle.as_secs()
                );
                *slot = None;
                drop(slot);
                if let Some(needed) = self.bases_needed(&t, &account) {
                    remove_bases_but(&self.bases, &needed);
                }
            }
        }
    }

    async fn boot_zygote(
        &self,
        t: &Template,
        account: &str,
        slot: &mut Option<template::Zygote>,
        run_dir: &Path,
    ) -> Result<(), SandboxError> {
        let could_not = |e: anyhow::Error| {
            SandboxError::Internal(format!("template {} could not start: {e:#}", t.spec.name))
        };
        let bases = self.bases.join(format!("{}.{account}", t.key));
        let user = self.user_of(account, &t.spec.name)?;
        let jailed = match (&self.jail, &user) {
            (Some(j), Some(u)) => Some(j.zygote(&t.spec, u, &bases).map_err(could_not)?),
            _ => None,
        };
        let net = if t.spec.network {
            let stem = format!("z{}", crate::clock::unix_ms());
            let owner = template_net_owner(&t.key, account);
            let made = self
                .network
                .make(&owner, &stem, &Egress::default(), user.as_ref())
                .await;
            let made = made.map_err(|e| {
                SandboxError::Internal(format!(
                    "template {} could not start: its network namespace: {e:#}",
                    t.spec.name
                ))
            })?;
            Some((made, stem))
        } else {
            None
        };
        let z = template::boot_zygote(&self.spore_bin, &t.spec, run_dir, &bases, net, jailed)
            .await
            .map_err(could_not)?;
        // Its clones (sandboxes) and theirs (forks) outlive their sources,
        // and may be forked.
        if let Err(e) = lifecycle::zygote_settings(&z.vmm).await {
            let mut vmm = z.vmm;
            vmm.kill().await;
            return Err(could_not(e));
        }
        *slot = Some(z);
        Ok(())
    }
}

/// The owner part of the names of the namespaces of `account`'s zygote of
/// a template and its clones; forks and resumed sandboxes are
/// [`SANDBOX_NET_OWNER`]'s.
fn template_net_owner(template: &str, account: &str) -> String {
    format!("sbx-{template}.{account}")
}

/// Removes the template bases in `bases` (a directory per template; an
/// older daemon's directly in it) but those in `needed` (state files;
/// each goes with its memory file).
pub(super) fn remove_bases_but(bases: &Path, needed: &HashSet<PathBuf>) {
    for e in std::fs::read_dir(bases).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            remove_bases_but(&path, needed);
            continue;
        }
        let state = path.with_extension("state");
        if !needed.contains(&state) {
            tracing::debug!("removing template base file {}", path.display());
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_no_sandbox_needs_go_in_every_templates_directory() {
        let bases = std::env::temp_dir().join(format!("spore-sbx-bases-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&bases);
        std::fs::create_dir_all(bases.join("base")).unwrap();
        let files = [
            bases.join("old-1.state"),
            bases.join("old-1.mem"),
            bases.join("base/base-2.state"),
            bases.join("base/base-2.mem"),
            bases.join("base/base-3.state"),
            bases.join("base/base-3.mem"),
        ];
        for f in &files {
            std::fs::write(f, b"x").unwrap();
        }
        let needed: HashSet<PathBuf> = [files[0].clone(), files[4].clone()].into();
        remove_bases_but(&bases, &needed);
        let left: Vec<bool> = files.iter().map(|f| f.exists()).collect();
        assert_eq!(left, [true, true, false, false, true, true]);
        let _ = std::fs::remove_dir_all(bases);
    }
}
