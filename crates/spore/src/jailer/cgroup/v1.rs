//! cgroup v1: each controller has a hierarchy of its own (or shares one
//! with a few others, e.g. `cpu,cpuacct`), mounted where /proc/mounts says.
//! For each hierarchy a `--cgroup` value names, the cgroup
//! `<mount>/<parent>/<id>` is made, the values written and this process
//! moved in. A new v1 cpuset has empty `cpuset.cpus`/`cpuset.mems` and
//! refuses tasks: each cpuset level made (or found empty) takes its
//! parent's first.
//!
//! As Firecracker's jailer: with no `--cgroup` values nothing is made or
//! joined.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use spore_cgroup::{controller_of, find_v1_mount, inherit_cpuset, kernel_controllers, own_cgroup};

use super::{create_levels, join, write, Joined};

/// One `--cgroup` value and the v1 hierarchy its controller is in.
#[derive(Debug, PartialEq, Eq)]
pub struct Placed<'a> {
    pub mount: PathBuf,
    pub controller: &'a str,
    pub file: &'a str,
    pub value: &'a str,
}

/// Finds the v1 hierarchy of each value's controller; fails, naming the
/// controller, on the first one this kernel lacks or has no v1 mount for
/// (`v2_has`: whether the v2 hierarchy offers it instead, for the hint).
pub fn resolve<'a>(
    mounts: &str,
    proc_cgroups: &str,
    values: &'a [(String, String)],
    v2_has: impl Fn(&str) -> Option<PathBuf>,
) -> anyhow::Result<Vec<Placed<'a>>> {
    let known = kernel_controllers(proc_cgroups);
    let mut placed = Vec::with_capacity(values.len());
    for (file, value) in values {
        let controller = controller_of(file);
        if !known.contains(&controller) {
            bail!(
                "--cgroup {file}: {controller:?} is not a cgroup controller of this kernel \
                 (/proc/cgroups lists: {})",
                known.join(" ")
            );
        }
        let Some(mount) = find_v1_mount(mounts, controller) else {
            let hint = match v2_has(controller) {
                Some(v2) => format!(
                    "; it is in the cgroup v2 hierarchy at {}: use --cgroup-version 2",
                    v2.display()
                ),
                None => String::new(),
            };
            bail!(
                "--cgroup {file}: controller {controller:?} has no cgroup v1 hierarchy \
                 (no cgroup mount in /proc/mounts holds it){hint}"
            );
        };
        placed.push(Placed {
            mount,
            controller,
            file,
            value,
        });
    }
    Ok(placed)
}

/// The v2 hierarchy's mount if its root offers `controller`.
fn in_v2(mounts: &str, controller: &str) -> Option<PathBuf> {
    let m = spore_cgroup::find_v2_mount(mounts)?;
    spore_cgroup::v2_controllers(&m)
        .iter()
        .any(|c| c == controller)
        .then_some(m)
}

/// Sets up the v1 cgroups for `id` under `parent` and moves this process
/// into each.
pub fn setup(
    mounts: &str,
    id: &str,
    parent: &Path,
    values: &[(String, String)],
    joined: &mut Joined,
) -> anyhow::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    let proc_cgroups = std::fs::read_to_string("/proc/cgroups").context("read /proc/cgroups")?;
    let placed = resolve(mounts, &proc_cgroups, values, |c| in_v2(mounts, c))?;
    // Each hierarchy once (co-mounted controllers share one), in order.
    let mut hierarchies: Vec<(&Path, &str)> = Vec::new();
    for p in &placed {
        if !hierarchies.iter().any(|(m, _)| *m == p.mount) {
            hierarchies.push((&p.mount, p.controller));
        }
    }
    for (mount, _) in &hierarchies {
        let leaf = mount.join(parent).join(id);
        let levels = create_levels(mount, &leaf, joined)?;
        if mount.join("cpuset.cpus").exists() {
            for l in &levels {
                inherit_cpuset(l, "cpuset.cpus")?;
                inherit_cpuset(l, "cpuset.mems")?;
            }
        }
    }
    for p in &placed {
        write(&p.mount.join(parent).join(id).join(p.file), p.value)?;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").context("read /proc/self/cgroup")?;
    for (mount, controller) in hierarchies {
        if let Some(rel) = own_cgroup(&own, Some(controller)) {
            joined.previous.push(mount.join(rel));
        }
        join(&mount.join(parent).join(id))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n\
        cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n\
        cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,relatime,cpuset 0 0\n\
        cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n\
        cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
    const CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
        cpuset\t3\t1\t1\ncpu\t1\t1\t1\ncpuacct\t2\t1\t1\nmemory\t4\t9\t1\nhugetlb\t0\t1\t1\n";

    fn values(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(f, x)| (f.to_string(), x.to_string()))
            .collect()
    }

    #[test]
    fn cgroup_v1_each_controller_resolves_to_its_own_mount() {
        let v = values(&[
            ("cpuset.mems", "0"),
            ("cpuset.cpus", "0-1"),
            ("cpuacct.x", "1"),
        ]);
        let got = resolve(MOUNTS, CGROUPS, &v, |_| None).unwrap();
        let mounts: Vec<_> = got.iter().map(|p| p.mount.display().to_string()).collect();
        assert_eq!(
            mounts,
            [
                "/sys/fs/cgroup/cpuset",
                "/sys/fs/cgroup/cpuset",
                "/sys/fs/cgroup/cpu,cpuacct"
            ]
        );
        assert_eq!(got[1].controller, "cpuset");
        assert_eq!((got[1].file, got[1].value), ("cpuset.cpus", "0-1"));
        // Co-mounted controllers share the hierarchy.
        assert_eq!(
            find_v1_mount(MOUNTS, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
    }

    #[test]
    fn cgroup_v1_plain_mount_options_are_no_controllers() {
        // `rw` and `relatime` are in every cgroup mount's options, `name=`
        // marks a named hierarchy: none is a controller.
        for file in [
            "rw.x",
            "relatime.y",
            "name=systemd.z",
            "cgroup.procs",
            "tasks.x",
        ] {
            let v = values(&[(file, "1")]);
            let e = resolve(MOUNTS, CGROUPS, &v, |_| None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("not a cgroup controller of this kernel"),
                "{file}: {e}"
            );
        }
    }

    #[test]
    fn cgroup_v1_unmounted_controller_fails_naming_it_and_the_v2_hierarchy() {
        let v = values(&[("memory.limit_in_bytes", "1")]);
        let e = resolve(MOUNTS, CGROUPS, &v, |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"memory\" has no cgroup v1 hierarchy"), "{e}");
        assert!(!e.contains("version 2"), "{e}");
        let v = values(&[("hugetlb.2MB.limit_in_bytes", "1")]);
        let e = resolve(MOUNTS, CGROUPS, &v, |c| {
            (c == "hugetlb").then(|| PathBuf::from("/sys/fs/cgroup/unified"))
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "in the cgroup v2 hierarchy at /sys/fs/cgroup/unified: use --cgroup-version 2"
            ),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
