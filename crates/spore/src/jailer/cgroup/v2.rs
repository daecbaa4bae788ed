//! cgroup v2: the leaf `<mount>/<parent>/<id>` in the one unified
//! hierarchy, each value's controller enabled in the
//! `cgroup.subtree_control` of every ancestor (as v2 requires), the values
//! written and this process moved in.
//!
//! As Firecracker's jailer: with no `--cgroup` values no leaf is made, and
//! the process joins `<mount>/<parent>` only if that cgroup exists already.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use spore_cgroup::{cgroup_mounts, controller_of, find_v2_mount, own_cgroup};

use super::{create_levels, join, write, Joined};

/// Why `controller` cannot be used on v2: the root's controller list, and
/// where the controller is instead (a v1 hierarchy holds it).
fn missing(file: &str, controller: &str, mount: &Path, available: &str, mounts: &str) -> String {
    let mut why = format!(
        "--cgroup {file}: controller {controller:?} is not in the cgroup v2 hierarchy at {} \
         (its cgroup.controllers: {:?})",
        mount.display(),
        available.trim()
    );
    let v1 = cgroup_mounts(mounts)
        .into_iter()
        .find(|m| m.holds(controller));
    if let Some(m) = v1 {
        why += &format!(
            "; it is mounted as cgroup v1 at {}: use --cgroup-version 1",
            m.path.display()
        );
    }
    why
}

/// This process's v2 cgroup, under the mount.
fn current(mount: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    Some(mount.join(own_cgroup(&text, None)?))
}

/// Sets up the cgroup for `id` under `parent` and moves this process in.
pub fn setup(
    mounts: &str,
    id: &str,
    parent: &Path,
    values: &[(String, String)],
    joined: &mut Joined,
) -> anyhow::Result<()> {
    let Some(mount) = find_v2_mount(mounts) else {
        bail!("no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/mounts)");
    };
    let parent_dir = mount.join(parent);
    if values.is_empty() {
        if parent_dir.is_dir() {
            joined.previous.extend(current(&mount));
            join(&parent_dir)?;
        }
        return Ok(());
    }
    let available = std::fs::read_to_string(mount.join("cgroup.controllers"))
        .with_context(|| format!("read {}/cgroup.controllers", mount.display()))?;
    for (file, _) in values {
        let controller = controller_of(file);
        if !available.split_whitespace().any(|c| c == controller) {
            bail!("{}", missing(file, controller, &mount, &available, mounts));
        }
    }
    let leaf = parent_dir.join(id);
    create_levels(&mount, &leaf, joined)?;
    for (file, value) in values {
        spore_cgroup::enable_down(&mount, &parent_dir, controller_of(file))?;
        write(&leaf.join(file), value)?;
    }
    joined.previous.extend(current(&mount));
    join(&leaf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                          cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n\
                          cgroup2 /sys/fs/cgroup/unified\\040x cgroup2 rw 0 0\n";

    #[test]
    fn cgroup_v2_missing_controller_names_the_hierarchy_and_the_v1_mount() {
        let root = Path::new("/sys/fs/cgroup/unified");
        let why = missing("cpuset.mems", "cpuset", root, "hugetlb\n", MOUNTS);
        assert!(why.contains("\"cpuset\""), "{why}");
        assert!(
            why.contains("cgroup v2 hierarchy at /sys/fs/cgroup/unified"),
            "{why}"
        );
        assert!(
            why.contains("v1 at /sys/fs/cgroup/cpuset: use --cgroup-version 1"),
            "{why}"
        );
        assert!(!why.contains('\n'), "{why}");
        let why = missing("pids.max", "pids", root, "hugetlb", MOUNTS);
        assert!(!why.contains("version 1"), "{why}");
    }
}
