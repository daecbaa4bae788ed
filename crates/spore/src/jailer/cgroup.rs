//! The VMM's cgroup (v2): the leaf `<mount>/<parent>/<id>`, the `--cgroup`
//! values written into it (each value's controller enabled in the
//! `cgroup.subtree_control` of every ancestor, as v2 requires), and this
//! process moved in (its children, the VMM and its clones, follow).
//!
//! As Firecracker's jailer: with no `--cgroup` values no leaf is made, and
//! the process joins `<mount>/<parent>` only if that cgroup exists already.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Finds the cgroup v2 mount in a /proc/mounts text.
pub fn find_v2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(target)))
    })
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    // Cgroup files take one write; no temp file or rename is possible.
    std::fs::write(path, value).with_context(|| format!("write {value:?} to {}", path.display()))
}

/// The cgroup this jailer made (or joined), undone on a later failure.
#[derive(Default)]
pub struct Joined {
    /// The directories it created, deepest last.
    created: Vec<PathBuf>,
    /// Where this process was before (to move back before removing).
    previous: Option<PathBuf>,
}

impl Joined {
    pub fn undo(&mut self) {
        if let Some(prev) = self.previous.take() {
            let _ = write(&prev.join("cgroup.procs"), &std::process::id().to_string());
        }
        for d in self.created.drain(..).rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// This process's v2 cgroup path, under the mount.
fn current(mount: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// Sets up the cgroup for `id` under `parent` and moves this process in.
pub fn setup(
    id: &str,
    parent: &Path,
    values: &[(String, String)],
    joined: &mut Joined,
) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("read /proc/mounts")?;
    let Some(mount) = find_v2_mount(&mounts) else {
        bail!("no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/mounts)");
    };
    let parent_dir = mount.join(parent);
    if values.is_empty() {
        if parent_dir.is_dir() {
            joined.previous = current(&mount);
            write(
                &parent_dir.join("cgroup.procs"),
                &std::process::id().to_string(),
            )?;
        }
        return Ok(());
    }
    let available = std::fs::read_to_string(mount.join("cgroup.controllers"))
        .with_context(|| format!("read {}/cgroup.controllers", mount.display()))?;
    for (file, _) in values {
        let controller = file.split('.').next().unwrap_or_default();
        if !available.split_whitespace().any(|c| c == controller) {
            bail!(
                "--cgroup {file}: controller {controller:?} is not available in {} (it has: {})",
                mount.display(),
                available.trim()
            );
        }
    }
    let leaf = parent_dir.join(id);
    // Create each missing level, remembering it for undo.
    let mut missing: Vec<PathBuf> = leaf
        .ancestors()
        .take_while(|d| *d != mount && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    for d in missing {
        std::fs::create_dir(&d).with_context(|| format!("create cgroup {}", d.display()))?;
        joined.created.push(d);
    }
    for (file, value) in values {
        let controller = file.split('.').next().unwrap_or_default();
        enable_controller(&mount, &parent_dir, controller)?;
        write(&leaf.join(file), value)?;
    }
    joined.previous = current(&mount);
    write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
}

/// Enables `controller` in `cgroup.subtree_control` from the mount down to
/// `dir` (the leaf's parent), top first: a level can only enable what its
/// parent passes down.
fn enable_controller(mount: &Path, dir: &Path, controller: &str) -> anyhow::Result<()> {
    let rel = dir.strip_prefix(mount).unwrap_or(Path::new(""));
    let mut level = mount.to_path_buf();
    let mut levels = vec![level.clone()];
    for c in rel.components() {
        level.push(c);
        levels.push(level.clone());
    }
    for l in levels {
        let ctl = l.join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&ctl).unwrap_or_default();
        if on.split_whitespace().any(|c| c == controller) {
            continue;
        }
        write(&ctl, &format!("+{controller}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v2_mount_is_found_in_proc_mounts() {
        let m = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                 cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                 cgroup2 /sys/fs/cgroup/unified\\040x cgroup2 rw 0 0\n";
        assert_eq!(
            find_v2_mount(m),
            Some(PathBuf::from("/sys/fs/cgroup/unified x"))
        );
        assert_eq!(find_v2_mount("cgroup /a cgroup rw 0 0\n"), None);
    }
}
