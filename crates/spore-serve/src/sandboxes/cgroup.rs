//! Each sandbox VMM in a cgroup of its own, as function instances are
//! (`crate::cgroups`): its memory (the sandbox's plus the VMM's overhead),
//! its processes and its CPU share bounded, under the group
//! `sbx-<template>.<account>`. A zygote, and a resumed sandbox, start in
//! theirs; a clone (a new sandbox, a fork) is started by its source's VMM
//! and moved into its own at once.

use super::{Record, SandboxError, Sandboxes};
use crate::cgroups::Leaf;
use crate::vmm::VmmProcess;

impl Sandboxes {
    /// A new cgroup `instance` for a VMM of `account`'s sandboxes of
    /// `template` with `memory_mib` (`None` without cgroups: `--no-cgroups`,
    /// or a host without a memory controller the daemon may use).
    pub(super) async fn cgroup_for(
        &self,
        account: &str,
        template: &str,
        memory_mib: u32,
        instance: &str,
    ) -> Result<Option<Leaf>, SandboxError> {
        let Some(cgroups) = self.cgroups.clone() else {
            return Ok(None);
        };
        let limits = cgroups.limits(memory_mib);
        let group = format!("sbx-{template}.{account}");
        let instance = instance.to_string();
        let leaf = tokio::task::spawn_blocking(move || cgroups.leaf(&group, &instance, limits))
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))?
            .map_err(|e| SandboxError::Internal(format!("making the sandbox's cgroup: {e}")))?;
        Ok(Some(leaf))
    }

    /// Moves a clone, sandbox `rec`'s VMM, into a cgroup of its own; on
    /// failure the clone is ended.
    pub(super) async fn confine_clone(
        &self,
        vmm: &mut VmmProcess,
        rec: &Record,
    ) -> Result<(), SandboxError> {
        let moved = async {
            let leaf = self.cgroup_for(&rec.account, &rec.template, rec.memory_mib, &rec.id);
            let Some(leaf) = leaf.await? else {
                return Ok(None);
            };
            let (files, pid) = (leaf.procs_files(), vmm.pid);
            let added = tokio::task::spawn_blocking(move || crate::cgroups::add_pid(&files, pid))
                .await
                .map_err(|e| SandboxError::Internal(e.to_string()))?;
            match added {
                Ok(()) => Ok(Some(leaf)),
                Err(e) => {
                    leaf.remove().await;
                    Err(SandboxError::Internal(format!(
                        "moving the sandbox's VMM into its cgroup: {e}"
                    )))
                }
            }
        }
        .await;
        match moved {
            Ok(leaf) => {
                vmm.cgroup = leaf;
                Ok(())
            }
            Err(e) => {
                vmm.kill().await;
                Err(e)
            }
        }
    }
}
