//! The host's cgroup hierarchies as this process sees them, v1 or v2:
//! where each controller is mounted, which cgroup this process is in, and
//! the few writes every user of a hierarchy needs (controllers passed down
//! in v2, a new v1 cpuset given its parent's CPUs and memory nodes, a
//! process moved in). `spore jailer` (Firecracker's `--cgroup` semantics)
//! and `spore serve` (a cgroup per instance VMM) both build on it, so the
//! two agree on every host: v2 only, v1 only (these machines mount their
//! controllers as v1), or a hybrid of both.
//!
//! Hand-written: the cgroup crates on crates.io (`cgroups-rs`,
//! `controlgroup`) model each controller's files and pull in their own
//! process handling; spore writes a handful of files and needs their paths
//! resolved exactly as the kernel and Firecracker's jailer resolve them.

use std::io;
use std::path::{Path, PathBuf};

/// One cgroup filesystem mounted: where, v1 or v2, and its mount options
/// (a v1 hierarchy's controllers are among them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub path: PathBuf,
    pub v2: bool,
    pub options: Vec<String>,
}

impl CgroupMount {
    /// Whether this v1 hierarchy holds `controller`.
    pub fn holds(&self, controller: &str) -> bool {
        !self.v2 && self.options.iter().any(|o| o == controller)
    }
}

/// The cgroup (v1 and v2) mounts in a /proc/mounts text, in its order.
pub fn cgroup_mounts(mounts: &str) -> Vec<CgroupMount> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_src, target, fstype, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                path: PathBuf::from(unescape(target)),
                v2,
                options: opts.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The mount of `controller`'s v1 hierarchy in a /proc/mounts text.
pub fn find_v1_mount(mounts: &str, controller: &str) -> Option<PathBuf> {
    cgroup_mounts(mounts)
        .into_iter()
        .find(|m| m.holds(controller))
        .map(|m| m.path)
}

/// The cgroup v2 (unified) mount in a /proc/mounts text.
pub fn find_v2_mount(mounts: &str) -> Option<PathBuf> {
    cgroup_mounts(mounts)
        .into_iter()
        .find(|m| m.v2)
        .map(|m| m.path)
}

/// The controllers a v2 cgroup offers its children (its
/// `cgroup.controllers`; empty when unreadable).
pub fn v2_controllers(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The v1 controllers this kernel has: the first column of /proc/cgroups.
/// A v1 mount's options hold its controllers among plain options (`rw`,
/// `relatime`, `name=`...): only a name listed here counts as one.
pub fn kernel_controllers(proc_cgroups: &str) -> Vec<&str> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// A cgroup file's controller: its name up to the first `.`.
pub fn controller_of(file: &str) -> &str {
    file.split('.').next().unwrap_or(file)
}

/// This process's cgroup in one hierarchy, from a /proc/self/cgroup text:
/// the v2 line (`0::/path`) for `None`, else the v1 line whose controller
/// list holds the controller. The path is relative to the hierarchy's root.
pub fn own_cgroup<'a>(proc_cgroup: &'a str, controller: Option<&str>) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_id, list, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            None => list.is_empty(),
            Some(c) => list.split(',').any(|x| x == c),
        };
        hit.then(|| path.trim_start_matches('/'))
    })
}

/// Where a set of controllers is: one hierarchy and the controllers of the
/// set it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub mount: PathBuf,
    pub v2: bool,
    pub controllers: Vec<&'static str>,
}

/// Places `required` and (where mounted) `optional` controllers: all in the
/// v2 hierarchy when its root offers every required one (`v2_offers` reads
/// a v2 root's `cgroup.controllers`), else each in its v1 hierarchy,
/// co-mounted controllers sharing one placement. Fails naming the first
/// required controller no hierarchy offers.
pub fn place(
    mounts: &str,
    required: &[&'static str],
    optional: &[&'static str],
    v2_offers: impl Fn(&Path) -> Vec<String>,
) -> Result<Vec<Placement>, String> {
    let all = cgroup_mounts(mounts);
    if let Some(v2) = all.iter().find(|m| m.v2) {
        let offered = v2_offers(&v2.path);
        let has = |c: &str| offered.iter().any(|x| x == c);
        if required.iter().all(|c| has(c)) {
            let mut controllers = required.to_vec();
            controllers.extend(optional.iter().filter(|c| has(c)));
            return Ok(vec![Placement {
                mount: v2.path.clone(),
                v2: true,
                controllers,
            }]);
        }
    }
    let mut out: Vec<Placement> = Vec::new();
    let wanted = required.iter().map(|c| (c, true));
    for (c, needed) in wanted.chain(optional.iter().map(|c| (c, false))) {
        let Some(m) = all.iter().find(|m| m.holds(c)) else {
            if needed {
                return Err(format!(
                    "neither the cgroup v2 hierarchy nor a v1 one offers the {c} controller"
                ));
            }
            continue;
        };
        match out.iter_mut().find(|p| p.mount == m.path) {
            Some(p) => p.controllers.push(c),
            None => out.push(Placement {
                mount: m.path.clone(),
                v2: false,
                controllers: vec![c],
            }),
        }
    }
    Ok(out)
}

/// Writes `value` into a cgroup file. Cgroup files take one write each: no
/// temp file and rename are possible. The error names the file.
pub fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {value:?} to {}: {e}", path.display()),
        )
    })
}

/// Moves process `pid` (all its threads: v1's `tasks` would move one) into
/// the cgroup `dir`; `0` is the calling process.
pub fn join(dir: &Path, pid: u32) -> io::Result<()> {
    write(&dir.join("cgroup.procs"), &pid.to_string())
}

/// Passes `controllers` down from the v2 cgroup `dir` to its children, in
/// one write.
pub fn enable_controllers(dir: &Path, controllers: &[&str]) -> io::Result<()> {
    let line: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
    write(&dir.join("cgroup.subtree_control"), &line.join(" "))
}

/// Passes `controller` down every v2 level from `mount` to `dir`, top first
/// (a level can pass down only what its parent passes to it), skipping the
/// levels that already do.
pub fn enable_down(mount: &Path, dir: &Path, controller: &str) -> io::Result<()> {
    let rel = dir.strip_prefix(mount).unwrap_or(Path::new(""));
    let mut level = mount.to_path_buf();
    let mut levels = vec![level.clone()];
    for c in rel.components() {
        level.push(c);
        levels.push(level.clone());
    }
    for l in levels {
        let on = std::fs::read_to_string(l.join("cgroup.subtree_control")).unwrap_or_default();
        if !on.split_whitespace().any(|c| c == controller) {
            enable_controllers(&l, &[controller])?;
        }
    }
    Ok(())
}

/// Gives a v1 cpuset's file `name` (`cpuset.cpus` or `cpuset.mems`) its
/// parent's value when it is empty: a new v1 cpuset starts with none and
/// takes no task until it has one.
pub fn inherit_cpuset(dir: &Path, name: &str) -> io::Result<()> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", p.display())))
    };
    let own = dir.join(name);
    if !read(&own)?.trim().is_empty() {
        return Ok(());
    }
    let Some(up) = dir.parent() else {
        return Ok(());
    };
    let from_parent = read(&up.join(name))?;
    write(&own, from_parent.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
        cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n\
        cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
        cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n\
        cgroup2 /sys/fs/cgroup/unified\\040x cgroup2 rw 0 0\n";

    #[test]
    fn cgroup_mounts_lists_v1_and_v2_hierarchies() {
        let got = cgroup_mounts(HYBRID);
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].path, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(got[0].holds("cpuacct") && got[0].holds("cpu"));
        assert!(!got[0].holds("memory"));
        assert_eq!(got[3].path, PathBuf::from("/sys/fs/cgroup/unified x"));
        assert!(got[3].v2 && !got[3].holds("rw"));
        assert_eq!(
            find_v2_mount(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified x"))
        );
        assert_eq!(
            find_v1_mount(HYBRID, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(find_v2_mount("cgroup /a cgroup rw,cpu 0 0\n"), None);
    }

    #[test]
    fn own_cgroup_reads_the_v1_and_v2_lines() {
        let t = "9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/d/e\n";
        assert_eq!(own_cgroup(t, Some("memory")), Some("a/b"));
        assert_eq!(own_cgroup(t, Some("cpuacct")), Some("c"));
        assert_eq!(own_cgroup(t, None), Some("d/e"));
        assert_eq!(own_cgroup(t, Some("pids")), None);
        assert_eq!(controller_of("cpuset.mems"), "cpuset");
    }

    #[test]
    fn place_prefers_a_v2_hierarchy_offering_every_required_controller() {
        let full = |_: &Path| vec!["cpu".into(), "memory".into(), "pids".into()];
        let got = place(HYBRID, &["memory", "pids"], &["cpu", "io"], full).unwrap();
        assert_eq!(
            got,
            vec![Placement {
                mount: PathBuf::from("/sys/fs/cgroup/unified x"),
                v2: true,
                controllers: vec!["memory", "pids", "cpu"],
            }]
        );
    }

    #[test]
    fn place_falls_back_to_each_controllers_v1_hierarchy() {
        // These machines' v2 hierarchy offers only hugetlb.
        let hugetlb = |_: &Path| vec!["hugetlb".into()];
        let got = place(HYBRID, &["memory", "pids"], &["cpu", "cpuacct"], hugetlb).unwrap();
        let mounts: Vec<_> = got
            .iter()
            .map(|p| (p.mount.display().to_string(), p.controllers.clone()))
            .collect();
        assert_eq!(
            mounts,
            vec![
                ("/sys/fs/cgroup/memory".to_string(), vec!["memory"]),
                ("/sys/fs/cgroup/pids".to_string(), vec!["pids"]),
                // Co-mounted controllers share one placement.
                (
                    "/sys/fs/cgroup/cpu,cpuacct".to_string(),
                    vec!["cpu", "cpuacct"]
                ),
            ]
        );
        assert!(got.iter().all(|p| !p.v2));
        let e = place(HYBRID, &["memory", "rdma"], &[], hugetlb).unwrap_err();
        assert!(e.contains("rdma"), "{e}");
        // An optional controller nobody mounts is left out.
        let got = place(HYBRID, &["memory"], &["io"], hugetlb).unwrap();
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn kernel_controllers_are_proc_cgroups_first_column() {
        let t = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\nmemory\t4\t9\t1\n";
        assert_eq!(kernel_controllers(t), ["cpuset", "memory"]);
    }

    #[test]
    fn cpuset_levels_inherit_empty_cpus_and_mems() {
        let dir = std::env::temp_dir().join(format!("spore-cpuset-{}", std::process::id()));
        let leaf = dir.join("a");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(dir.join("cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(dir.join("cpuset.mems"), "0\n").unwrap();
        std::fs::write(leaf.join("cpuset.cpus"), "\n").unwrap();
        std::fs::write(leaf.join("cpuset.mems"), "1\n").unwrap();
        inherit_cpuset(&leaf, "cpuset.cpus").unwrap();
        inherit_cpuset(&leaf, "cpuset.mems").unwrap();
        let cpus = std::fs::read_to_string(leaf.join("cpuset.cpus")).unwrap();
        let mems = std::fs::read_to_string(leaf.join("cpuset.mems")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((cpus.as_str(), mems.as_str()), ("0-3", "1\n"));
    }

    #[test]
    fn enable_down_writes_each_level_that_lacks_the_controller() {
        let root = std::env::temp_dir().join(format!("spore-v2-{}", std::process::id()));
        let dir = root.join("a/b");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(root.join("cgroup.subtree_control"), "cpu memory\n").unwrap();
        std::fs::write(root.join("a/cgroup.subtree_control"), "\n").unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        enable_down(&root, &dir, "memory").unwrap();
        let read = |p: &Path| std::fs::read_to_string(p.join("cgroup.subtree_control")).unwrap();
        let got = (read(&root), read(&root.join("a")), read(&dir));
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            got,
            ("cpu memory\n".into(), "+memory".into(), "+memory".into())
        );
    }
}
