//! A cgroup of its own for every clone, entered off the clone path.
//!
//! A clone process starts in its zygote's cgroup and must be in its own
//! before it serves. Moving a process between cgroups takes the kernel's
//! `cgroup_threadgroup_rwsem` for writing, which waits for an RCU grace
//! period when nobody took it for a while: measured here, 0.01 ms when
//! clones come back to back but 7.5 ms at the median when they come 100 ms
//! apart. So the zygote's standby processes (clone processes it starts
//! ahead; a clone request hands one out) are each moved into a leaf of
//! their own as soon as a clone report lists them, in the background
//! ([`Instances::place_standby`]); a later clone request that hands one out
//! finds it already placed ([`CloneLeaf::Placed`]). A clone that was no
//! standby process placed before (the zygote's first, or one that came
//! while its pool was refilled) is moved while its guest answers
//! ([`CloneLeaf::Join`]), as every clone was before.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use tokio::task::JoinHandle;

use super::{Instances, Zygote};
use crate::catalog::Function;
use crate::cgroups::{Cgroups, Leaf, Limits};
use crate::mutex::lock;

/// A leaf being made for a process (and the process moved into it).
type Placing = JoinHandle<anyhow::Result<Leaf>>;

/// The leaves a zygote's standby processes were moved into, by process
/// name (names are never reused by one zygote; pids may be).
#[derive(Default)]
pub(super) struct StandbyLeaves {
    inner: Mutex<Placed>,
}

#[derive(Default)]
struct Placed {
    by_name: HashMap<String, (i32, Placing)>,
    /// The zygote ended: nothing more is placed.
    closed: bool,
}

/// Where a new clone's cgroup comes from.
pub(super) enum CloneLeaf {
    /// No cgroups on this host.
    None,
    /// It was a standby process already moved (or being moved) into its leaf.
    Placed(Placing),
    /// A leaf made while the zygote cloned, to move it into now.
    Join(JoinHandle<std::io::Result<Leaf>>),
}

impl StandbyLeaves {
    /// Whether some standby process has a leaf (then a clone request very
    /// likely hands out one of them).
    pub(super) fn any(&self) -> bool {
        !lock(&self.inner).by_name.is_empty()
    }

    /// The leaf placed for clone `name`, if it is the process `pid` that
    /// was moved there.
    pub(super) fn take(&self, name: &str, pid: i32) -> Option<Placing> {
        let (placed_pid, job) = lock(&self.inner).by_name.remove(name)?;
        if placed_pid == pid {
            return Some(job);
        }
        tokio::spawn(release(job));
        None
    }

    /// The zygote ended (its standby processes with it): their leaves go
    /// back for reuse.
    pub(super) async fn close(&self) {
        let jobs: Vec<Placing> = {
            let mut placed = lock(&self.inner);
            placed.closed = true;
            placed.by_name.drain().map(|(_, (_, job))| job).collect()
        };
        for job in jobs {
            release(job).await;
        }
    }
}

impl CloneLeaf {
    /// The clone `pid` in its own leaf (`None` without cgroups).
    pub(super) async fn enter(self, pid: i32) -> anyhow::Result<Option<Leaf>> {
        match self {
            CloneLeaf::None => Ok(None),
            CloneLeaf::Placed(job) => Ok(Some(job.await??)),
            CloneLeaf::Join(job) => {
                let leaf = job.await??;
                Ok(Some(move_into(leaf, pid).await?))
            }
        }
    }

    /// The clone did not come: a leaf made for it is removed.
    pub(super) async fn discard(self) {
        match self {
            CloneLeaf::None => {}
            CloneLeaf::Placed(job) => release(job).await,
            CloneLeaf::Join(job) => {
                if let Ok(Ok(leaf)) = job.await {
                    leaf.remove().await;
                }
            }
        }
    }
}

/// Moves `pid` into `leaf` on a blocking thread (cgroupfs writes block on
/// the kernel's lock); the leaf is removed if that fails.
async fn move_into(leaf: Leaf, pid: i32) -> anyhow::Result<Leaf> {
    let files = leaf.procs_files();
    let moved = tokio::task::spawn_blocking(move || crate::cgroups::add_pid(&files, pid))
        .await
        .map_err(anyhow::Error::from)
        .and_then(|r| r.map_err(anyhow::Error::from));
    match moved {
        Ok(()) => Ok(leaf),
        Err(e) => {
            leaf.remove().await;
            Err(e.context("moving the clone into its cgroup"))
        }
    }
}

/// Gives back the leaf of a standby process that was never handed out.
async fn release(job: Placing) {
    if let Ok(Ok(leaf)) = job.await {
        leaf.release().await;
    }
}

/// Makes the leaf `<group>/<instance>` and moves `pid` into it.
async fn place(
    cgroups: Cgroups,
    group: String,
    instance: String,
    limits: Limits,
    pid: i32,
) -> anyhow::Result<Leaf> {
    let leaf =
        tokio::task::spawn_blocking(move || cgroups.leaf(&group, &instance, limits)).await??;
    move_into(leaf, pid).await
}

/// One standby process as a clone report lists it.
#[derive(serde::Deserialize)]
pub(super) struct StandbyProcess {
    name: String,
    pid: i32,
}

impl Instances {
    /// Starts making a leaf for a clone of `f` (`None` without cgroups),
    /// named `c<n>`.
    fn cgroup_ahead(&self, f: &Function) -> Option<JoinHandle<std::io::Result<Leaf>>> {
        let cgroups = self.cfg.cgroups.clone()?;
        let limits = cgroups.limits(f.memory_mib);
        let group = f.name.clone();
        let instance = format!("c{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        Some(tokio::task::spawn_blocking(move || {
            cgroups.leaf(&group, &instance, limits)
        }))
    }

    /// Where the clone a request is about to ask `z` for gets its cgroup,
    /// decided before the request: a leaf starts being made now unless a
    /// standby process (which the request will likely hand out) has one.
    pub(super) fn clone_leaf_ahead(&self, f: &Function, z: &Zygote) -> CloneLeaf {
        if self.cfg.cgroups.is_none() || z.standby_leaves.any() {
            return CloneLeaf::None;
        }
        self.cgroup_ahead(f)
            .map_or(CloneLeaf::None, CloneLeaf::Join)
    }

    /// The clone `name` (process `pid`) came: its leaf is the one placed
    /// for it as a standby process, else `ahead`, else one made now.
    pub(super) async fn clone_leaf(
        &self,
        f: &Function,
        z: &Zygote,
        ahead: CloneLeaf,
        name: &str,
        pid: i32,
    ) -> CloneLeaf {
        if let Some(job) = z.standby_leaves.take(name, pid) {
            ahead.discard().await;
            return CloneLeaf::Placed(job);
        }
        match ahead {
            CloneLeaf::None => self
                .cgroup_ahead(f)
                .map_or(CloneLeaf::None, CloneLeaf::Join),
            ahead => ahead,
        }
    }

    /// Moves each standby process of `z` in `listed` (what its last clone
    /// report left in its pool) without a leaf into one of its own, in the
    /// background: a later clone request hands it out already placed.
    pub(super) fn place_standby(&self, f: &Function, z: &Zygote, listed: Vec<StandbyProcess>) {
        let Some(cgroups) = self.cfg.cgroups.as_ref() else {
            return;
        };
        let limits = cgroups.limits(f.memory_mib);
        let zygote = z.name();
        let mut placed = lock(&z.standby_leaves.inner);
        if placed.closed {
            return;
        }
        // Leaves of standby processes that died unused go back.
        let gone: Vec<String> = placed
            .by_name
            .iter()
            .filter(|(name, (pid, _))| {
                !listed.iter().any(|p| &p.name == *name)
                    && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some((_, job)) = placed.by_name.remove(&name) {
                tokio::spawn(release(job));
            }
        }
        for p in listed {
            if p.pid <= 0 || placed.by_name.contains_key(&p.name) {
                continue;
            }
            let instance = format!("{zygote}.{}", p.name.replace('/', "_"));
            let job = tokio::spawn(place(
                cgroups.clone(),
                f.name.clone(),
                instance,
                limits,
                p.pid,
            ));
            placed.by_name.insert(p.name, (p.pid, job));
        }
    }
}
