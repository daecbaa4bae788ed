//! A cgroup of its own for every instance VMM: its memory bounded
//! (`MemorySize` plus the VMM's own overhead), its processes and threads
//! bounded, and its CPU share and cap proportional to its memory as Lambda
//! gives CPU (1,769 MB = one vCPU). The cap comes with the end of an
//! instance's first invocation, or 100 ms into it ([`Leaf::cap_cpu`]): its
//! start is on its invoker's path and runs unthrottled, and a zygote (which
//! clones on every invoker's path) is never capped. A guest or VMM that goes past its
//! memory is ended by the kernel in its own cgroup only, and the invoker is
//! told `Runtime.OutOfMemory`.
//!
//! The tree is made under the daemon's own cgroup (so whatever bounds the
//! daemon also bounds its instances): `<own>/<prefix>/<account>.<function>/
//! <instance>`, in the cgroup v2 hierarchy when it offers the `memory` and
//! `pids` controllers, else in the v1 hierarchies of `memory`, `pids` and
//! `cpu` (each where /proc/mounts has it). A VMM the daemon starts is moved
//! into its cgroup while it starts, before it is configured (a `pre_exec`
//! join would make std fork the daemon instead of `posix_spawn`); a clone
//! is moved into its own ahead, as a standby process of its zygote, or
//! while its guest answers (`instances::clone_leaves`). A leaf whose VMM
//! ended is kept for the next instance of the same function and size
//! (making and removing cgroups
//! takes the kernel's cgroup lock, and a memory cgroup's removal can take
//! milliseconds: measured, that alone cost the clone path ~1 ms at the
//! median and ~10 ms at p99); the tree goes when the daemon stops, and a
//! restarted daemon removes the empty ones its predecessor left.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Threads and processes one instance's cgroup may hold (a VMM has about
/// five threads; a zygote also holds its clone factory and the clones it
/// starts ahead until each is moved out).
const PIDS_MAX: u32 = 512;

/// Memory a VMM needs besides its guest's: its own heap, page tables,
/// device buffers and the binary's pages it touches. Measured: a booted
/// unikernel VMM holds ~12 MiB besides guest memory, a Linux one ~25 MiB.
pub const DEFAULT_OVERHEAD: u64 = 64 << 20;

/// Lambda's rule: a function gets one vCPU's worth of CPU at 1,769 MB.
const MB_PER_VCPU: u64 = 1769;

/// The CPU cap's period (v1 `cpu.cfs_period_us`, v2 `cpu.max`'s second
/// field). A capped instance that used its share waits for the next period:
/// measured with the kernel's default of 100 ms, that wait was the p99 of
/// every start path (75–95 ms); 10 ms bounds it at ~9 ms.
const CPU_PERIOD_US: u64 = 10_000;

/// The smallest quota the kernel takes (1 ms a period).
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// One hierarchy the instance cgroups are made in.
#[derive(Debug, Clone)]
struct Hierarchy {
    /// `<mount>/<the daemon's own cgroup>/<prefix>`.
    base: PathBuf,
    v2: bool,
    /// The controllers of ours it holds (`memory`, `pids`, `cpu`).
    controllers: Vec<&'static str>,
}

/// Leaves kept for reuse at most, over all functions (more are removed).
const SPARE_LEAVES: usize = 256;

/// Where instance cgroups are made, and how big they are.
#[derive(Debug, Clone)]
pub struct Cgroups {
    hierarchies: Vec<Hierarchy>,
    overhead: u64,
    /// Whether instances are capped at their CPU share (else the share is
    /// only their weight when CPUs are contended).
    cap_cpu: bool,
    /// Leaves whose VMM ended, by group and limits, for reuse.
    spare: Arc<Mutex<Spare>>,
}

/// A leaf's directory in each hierarchy, and whether that one is v2.
type LeafDirs = Vec<(PathBuf, bool)>;

#[derive(Debug, Default)]
struct Spare {
    by_kind: HashMap<(String, Limits), Vec<SpareLeaf>>,
    count: usize,
}

/// A leaf kept for reuse: its limits are its kind's; only a CPU cap its
/// last instance got is undone when it is reused.
#[derive(Debug)]
struct SpareLeaf {
    dirs: LeafDirs,
    capped: bool,
}

/// The limits of one instance's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u32,
    /// v1 `cpu.shares` (v2 `cpu.weight` is derived from it).
    pub cpu_shares: u64,
    /// CPU time a [`CPU_PERIOD_US`] period once capped ([`Leaf::cap_cpu`]).
    pub cpu_quota_us: u64,
}

impl Cgroups {
    /// Finds the hierarchies and makes `<prefix>` in each; `None` (logged)
    /// when this host offers no memory controller the daemon may use.
    pub fn set_up(prefix: &str, overhead: u64, cap_cpu: bool) -> Option<Cgroups> {
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let hierarchies = match find(&mounts, &own, prefix) {
            Ok(h) => h,
            Err(why) => {
                tracing::warn!("instances get no cgroup of their own: {why}");
                return None;
            }
        };
        for h in &hierarchies {
            if let Err(e) = make_base(h) {
                tracing::warn!(
                    "instances get no cgroup of their own: making {}: {e}",
                    h.base.display()
                );
                return None;
            }
        }
        Some(Cgroups {
            hierarchies,
            overhead,
            cap_cpu,
            spare: Arc::default(),
        })
    }

    /// What an instance of `memory_mib` gets.
    pub fn limits(&self, memory_mib: u32) -> Limits {
        let mib = u64::from(memory_mib);
        Limits {
            // In whole pages, as the kernel keeps it.
            memory_bytes: (mib << 20).saturating_add(self.overhead) & !4095,
            pids: PIDS_MAX,
            cpu_shares: (1024 * mib / MB_PER_VCPU).max(2),
            cpu_quota_us: (CPU_PERIOD_US * mib / MB_PER_VCPU).max(MIN_CPU_QUOTA_US),
        }
    }

    /// Makes the cgroup `<group>/<instance>` with `limits`. `group` and
    /// `instance` are the daemon's own names (a function key with its `:`
    /// made a `.`, an instance's run directory name).
    pub fn leaf(&self, group: &str, instance: &str, limits: Limits) -> std::io::Result<Leaf> {
        let group = group.replace(':', ".");
        let kind = (group.clone(), limits);
        let reused = {
            let mut spare = crate::mutex::lock(&self.spare);
            let dirs = spare.by_kind.get_mut(&kind).and_then(Vec::pop);
            if dirs.is_some() {
                spare.count -= 1;
            }
            dirs
        };
        if let Some(SpareLeaf { dirs, capped }) = reused {
            // Uncapped until its instance is ready. Its other limits are
            // its kind's already: a reuse writes nothing else (each write
            // is CPU on some invocation's way on a busy host).
            if capped {
                if let Some((file, v2)) = self.cpu_cap_file(&dirs) {
                    let value = if v2 {
                        format!("max {CPU_PERIOD_US}")
                    } else {
                        "-1".to_string()
                    };
                    std::fs::write(file, value)?;
                }
            }
            let mut leaf = Leaf {
                cpu_cap: self.cpu_cap_file(&dirs),
                dirs,
                kind,
                spare: Some(self.spare.clone()),
                oom_base: 0,
                capped: false,
            };
            // The kernel's count is the cgroup's whole life's.
            leaf.oom_base = leaf.oom_count();
            return Ok(leaf);
        }
        let mut leaf = Leaf {
            dirs: Vec::new(),
            kind,
            spare: Some(self.spare.clone()),
            oom_base: 0,
            cpu_cap: None,
            capped: false,
        };
        for h in &self.hierarchies {
            // Made again if gone: a dead daemon's guardian removes the tree
            // (under the state directory's lock, which this daemon took after
            // set_up made it).
            if !h.base.exists() {
                make_base(h)?;
            }
            let parent = h.base.join(&group);
            if !parent.exists() {
                std::fs::create_dir(&parent).or_else(exists_is_fine)?;
                if h.v2 {
                    enable_controllers(&parent, &h.controllers)?;
                }
            }
            let dir = parent.join(instance);
            std::fs::create_dir(&dir).or_else(exists_is_fine)?;
            leaf.dirs.push((dir.clone(), h.v2));
            write_limits(&dir, h, limits)?;
        }
        leaf.cpu_cap = self.cpu_cap_file(&leaf.dirs);
        Ok(leaf)
    }

    /// The file that caps a leaf's CPU, and whether it is v2's `cpu.max`
    /// (else v1's `cpu.cfs_quota_us`): in the hierarchy holding `cpu`.
    fn cpu_cap_file(&self, dirs: &LeafDirs) -> Option<(PathBuf, bool)> {
        if !self.cap_cpu {
            return None;
        }
        dirs.iter()
            .zip(&self.hierarchies)
            .find(|(_, h)| h.controllers.contains(&"cpu"))
            .map(|((dir, v2), _)| {
                let file = if *v2 { "cpu.max" } else { "cpu.cfs_quota_us" };
                (dir.join(file), *v2)
            })
    }

    /// Removes the empty cgroups a previous daemon left (its instances were
    /// ended by its guardian). Only under the state directory's lock: the
    /// leaves a running daemon keeps for reuse are empty too.
    pub fn remove_leftovers(&self) {
        remove_leaves(&self.hierarchies, std::time::Instant::now());
    }

    /// Removes the daemon's tree (shutdown, its VMMs just killed): each leaf
    /// as soon as its processes left it (at most 2 s in all), then the rest.
    pub fn remove_all(&self) {
        *crate::mutex::lock(&self.spare) = Spare::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        remove_leaves(&self.hierarchies, deadline);
    }
}

/// Removes every leaf, group and base of `hierarchies`, retrying a busy leaf
/// until `deadline`. A leaf's CPU cap is lifted first: a killed process
/// still runs its exit in its cgroup, and a throttled one would wait for
/// the next period to leave it.
fn remove_leaves(hierarchies: &[Hierarchy], deadline: std::time::Instant) -> usize {
    let mut removed = 0;
    for h in hierarchies {
        for group in subdirs(&h.base) {
            for leaf in subdirs(&group) {
                uncap_cpu(&leaf, h.v2);
                while std::fs::remove_dir(&leaf).is_err() {
                    if std::time::Instant::now() > deadline {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                removed += usize::from(!leaf.exists());
            }
            let _ = std::fs::remove_dir(&group);
        }
        let _ = std::fs::remove_dir(&h.base);
    }
    removed
}

/// Lifts a leaf's CPU cap (where its hierarchy has the `cpu` controller).
fn uncap_cpu(dir: &Path, v2: bool) {
    let _ = if v2 {
        std::fs::write(dir.join("cpu.max"), format!("max {CPU_PERIOD_US}"))
    } else {
        std::fs::write(dir.join("cpu.cfs_quota_us"), "-1")
    };
}

/// Removes the instance cgroups of the daemon of `prefix` (its guardian,
/// once the daemon died and its VMMs were killed): each leaf as soon as its
/// killed processes left it, then the groups and the daemon's tree.
pub fn remove_tree(prefix: &str) -> usize {
    let (Ok(mounts), Ok(own)) = (
        std::fs::read_to_string("/proc/mounts"),
        std::fs::read_to_string("/proc/self/cgroup"),
    ) else {
        return 0;
    };
    let Ok(hierarchies) = find(&mounts, &own, prefix) else {
        return 0;
    };
    // The guardian holds the state directory's lock meanwhile, which a new
    // daemon waits for: a leaf still busy after this is left to the next
    // daemon's start (Cgroups::remove_leftovers removes empty ones).
    remove_leaves(
        &hierarchies,
        std::time::Instant::now() + Duration::from_millis(300),
    )
}

/// One instance's cgroup, in every hierarchy used.
#[derive(Debug)]
pub struct Leaf {
    dirs: LeafDirs,
    /// Its group and limits: what it can be reused for.
    kind: (String, Limits),
    /// Where it goes back when its VMM ends (`None`: removed then).
    spare: Option<Arc<Mutex<Spare>>>,
    /// The memory cgroup's OOM kills before this use of it.
    oom_base: u64,
    /// Where its CPU cap is written ([`Cgroups::cpu_cap_file`]).
    cpu_cap: Option<(PathBuf, bool)>,
    /// Its CPU cap was asked for ([`Leaf::cpu_cap_write`]).
    capped: bool,
}

impl Leaf {
    /// Its `cgroup.procs` files, one per hierarchy.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(d, _)| d.join("cgroup.procs"))
            .collect()
    }

    /// What caps its CPU at its memory's share (Lambda's rule), once its
    /// instance is ready: the file and the value to write (v1's
    /// `cpu.cfs_period_us` is set with the leaf's limits).
    pub fn cpu_cap_write(&mut self) -> Option<(PathBuf, String)> {
        let (file, v2) = self.cpu_cap.as_ref()?;
        self.capped = true;
        let quota = self.kind.1.cpu_quota_us;
        let value = if *v2 {
            format!("{quota} {CPU_PERIOD_US}")
        } else {
            quota.to_string()
        };
        Some((file.clone(), value))
    }

    /// Whether the kernel ended a process of this cgroup for its memory
    /// since this instance got it.
    pub fn oom_killed(&self) -> bool {
        self.oom_count() > self.oom_base
    }

    fn oom_count(&self) -> u64 {
        self.dirs
            .iter()
            .filter_map(|(d, v2)| {
                let file = if *v2 {
                    "memory.events"
                } else {
                    "memory.oom_control"
                };
                count_of(&std::fs::read_to_string(d.join(file)).ok()?, "oom_kill")
            })
            .sum()
    }

    /// The memory limit in force now (bytes; an operator may have changed
    /// it since it was made).
    pub fn memory_limit(&self) -> Option<u64> {
        self.dirs.iter().find_map(|(d, v2)| {
            let file = if *v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            std::fs::read_to_string(d.join(file))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
    }

    /// Its VMM ended: kept for the next instance of its kind (a killed
    /// process leaves it a moment later, harmlessly), or removed when
    /// enough are kept.
    pub async fn release(mut self) {
        // One whose memory limit someone changed (as for a test of the
        // kernel's OOM kill) is not kept: a reuse rewrites no limits.
        if self.memory_limit() != Some(self.kind.1.memory_bytes) {
            self.remove().await;
            return;
        }
        if let Some(spare) = self.spare.take() {
            let mut s = crate::mutex::lock(&spare);
            if s.count < SPARE_LEAVES {
                s.count += 1;
                let dirs = std::mem::take(&mut self.dirs);
                let capped = self.capped;
                let kept = SpareLeaf { dirs, capped };
                s.by_kind.entry(self.kind.clone()).or_default().push(kept);
                return;
            }
        }
        self.remove().await;
    }

    /// Removes it once its processes are gone (a killed process leaves its
    /// cgroup a moment after the signal), and its group if that is empty.
    pub async fn remove(self) {
        for (d, v2) in &self.dirs {
            uncap_cpu(d, *v2);
            for _ in 0..50 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            if let Some(group) = d.parent() {
                let _ = std::fs::remove_dir(group);
            }
        }
    }
}

/// Moves process `pid` into the cgroups of `files` (each a `cgroup.procs`).
pub fn add_pid(files: &[PathBuf], pid: i32) -> std::io::Result<()> {
    for f in files {
        std::fs::write(f, pid.to_string())?;
    }
    Ok(())
}

/// The hierarchies holding `memory`, `pids` and (if mounted) `cpu`: the
/// v2 one if it offers memory and pids, else the v1 ones (as
/// [`spore_cgroup::place`] finds them for the jailer too), each at the
/// daemon's own cgroup in it.
fn find(mounts: &str, own: &str, prefix: &str) -> Result<Vec<Hierarchy>, String> {
    let placed = spore_cgroup::place(
        mounts,
        &["memory", "pids"],
        &["cpu"],
        spore_cgroup::v2_controllers,
    )?;
    placed
        .into_iter()
        .map(|p| {
            let key = if p.v2 {
                None
            } else {
                p.controllers.first().copied()
            };
            let path = match spore_cgroup::own_cgroup(own, key) {
                Some(path) => path,
                None if p.v2 => return Err("no cgroup v2 line in /proc/self/cgroup".to_string()),
                None => "",
            };
            Ok(Hierarchy {
                base: p.mount.join(path).join(prefix),
                v2: p.v2,
                controllers: p.controllers,
            })
        })
        .collect()
}

fn make_base(h: &Hierarchy) -> std::io::Result<()> {
    if h.v2 {
        // The daemon's own cgroup must pass the controllers down, which v2
        // allows a cgroup holding processes only at the root: the daemon
        // first moves into a leaf beside its instances' tree (as under
        // systemd's `Delegate=yes`).
        if let (Some(own), Some(prefix)) = (h.base.parent(), h.base.file_name()) {
            if enable_controllers(own, &h.controllers).is_err() {
                let daemon = own.join(format!("{}-daemon", prefix.to_string_lossy()));
                std::fs::create_dir(&daemon).or_else(exists_is_fine)?;
                spore_cgroup::join(&daemon, 0)?;
                enable_controllers(own, &h.controllers)?;
            }
        }
        std::fs::create_dir_all(&h.base)?;
        enable_controllers(&h.base, &h.controllers)?;
    } else {
        std::fs::create_dir_all(&h.base)?;
    }
    Ok(())
}

fn enable_controllers(dir: &Path, controllers: &[&str]) -> std::io::Result<()> {
    spore_cgroup::enable_controllers(dir, controllers)
}

fn write_limits(dir: &Path, h: &Hierarchy, l: Limits) -> std::io::Result<()> {
    let put = |file: &str, value: String| std::fs::write(dir.join(file), value);
    for c in &h.controllers {
        match (*c, h.v2) {
            ("memory", false) => put("memory.limit_in_bytes", l.memory_bytes.to_string())?,
            ("memory", true) => {
                put("memory.max", l.memory_bytes.to_string())?;
                // Swapping a guest's memory out would only hide the limit.
                let _ = put("memory.swap.max", "0".into());
            }
            ("pids", _) => put("pids.max", l.pids.to_string())?,
            // Uncapped until the instance is ready.
            ("cpu", false) => {
                put("cpu.shares", l.cpu_shares.to_string())?;
                put("cpu.cfs_quota_us", "-1".into())?;
                put("cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
            }
            // v2's weight: 1–10000, 100 the default (v1's 1024).
            ("cpu", true) => {
                put(
                    "cpu.weight",
                    (l.cpu_shares * 100 / 1024).clamp(1, 10_000).to_string(),
                )?;
                put("cpu.max", format!("max {CPU_PERIOD_US}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn exists_is_fine(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::AlreadyExists {
        Ok(())
    } else {
        Err(e)
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// `key N` in a flat-keyed cgroup file.
fn count_of(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTS: &str = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
        cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
        cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n\
        cgroup2 /nonexistent-spore-test/unified cgroup2 rw 0 0\n";

    #[test]
    fn v1_hierarchies_are_under_the_daemons_own_cgroups() {
        let own = "8:pids:/\n4:memory:/sandbox/x\n1:cpu:/\n0::/\n";
        let h = find(V1_MOUNTS, own, "sp123456").unwrap();
        let bases: Vec<_> = h.iter().map(|h| h.base.clone()).collect();
        assert_eq!(
            bases,
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/sandbox/x/sp123456"),
                PathBuf::from("/sys/fs/cgroup/pids/sp123456"),
                PathBuf::from("/sys/fs/cgroup/cpu/sp123456"),
            ]
        );
        assert!(h.iter().all(|h| !h.v2));
    }

    #[test]
    fn without_a_memory_controller_there_are_no_instance_cgroups() {
        let mounts = "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n";
        let e = find(mounts, "0::/\n", "sp").unwrap_err();
        assert!(e.contains("memory"), "{e}");
    }

    #[test]
    fn limits_follow_lambdas_rules() {
        let c = Cgroups {
            hierarchies: Vec::new(),
            overhead: 64 << 20,
            cap_cpu: true,
            spare: Arc::default(),
        };
        let l = c.limits(128);
        assert_eq!(l.memory_bytes, (128 + 64) << 20);
        assert_eq!(l.cpu_shares, 74);
        // 723 µs a 10 ms period by the rule; the kernel takes 1 ms at least.
        assert_eq!(l.cpu_quota_us, 1_000);
        assert_eq!(c.limits(1769).cpu_shares, 1024);
        assert_eq!(c.limits(1769).cpu_quota_us, 10_000);
        assert_eq!(c.limits(10_240).cpu_quota_us, 57_885);
        assert_eq!(c.limits(1).cpu_shares, 2);
        assert_eq!(c.limits(1).cpu_quota_us, 1_000);
    }

    #[test]
    fn oom_counts_are_read_from_flat_keyed_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(count_of(v1, "oom_kill"), Some(3));
        let v2 = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(count_of(v2, "oom_kill"), Some(1));
        assert_eq!(count_of(v2, "nothing"), None);
    }
}
