//! The VMM's cgroups, as Firecracker's jailer makes them: for each
//! `--cgroup <file>=<value>` the cgroup `<parent>/<id>` in the hierarchy
//! that holds the file's controller (its name up to the first `.`), the
//! value written into it, and this process moved in (its children, the VMM
//! and its clones, follow). `--cgroup-version 1` looks for each controller's
//! own v1 hierarchy (`v1`), `2` for the one unified hierarchy (`v2`).
//!
//! Both look the hierarchies up in /proc/mounts, check every controller
//! before creating anything, and record what they made and where this
//! process was ([`Joined`]) so that a later failure can undo it.

mod v1;
mod v2;

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Makes and joins the cgroups of `version` (1 or 2) for `id` under
/// `parent`, with the `(file, value)` pairs written into them.
pub fn setup(
    version: u8,
    id: &str,
    parent: &Path,
    values: &[(String, String)],
    joined: &mut Joined,
) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("read /proc/mounts")?;
    match version {
        1 => v1::setup(&mounts, id, parent, values, joined),
        _ => v2::setup(&mounts, id, parent, values, joined),
    }
}

/// One cgroup filesystem mounted: where, v1 or v2, and (v1) the
/// controllers its hierarchy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub path: PathBuf,
    pub v2: bool,
    /// The mount options: a v1 hierarchy's controllers are among them.
    pub options: Vec<String>,
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

/// A `--cgroup` file's controller: its name up to the first `.` (the
/// file was checked to have one).
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

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    // Cgroup files take one write; no temp file or rename is possible.
    std::fs::write(path, value).with_context(|| format!("write {value:?} to {}", path.display()))
}

/// Moves this process into the cgroup `dir` (the whole process: v1's
/// `tasks` would move one thread; the jailer has one anyway).
fn join(dir: &Path) -> anyhow::Result<()> {
    write(&dir.join("cgroup.procs"), &std::process::id().to_string())
}

/// The cgroups this jailer made (or joined), undone on a later failure.
#[derive(Default)]
pub struct Joined {
    /// The directories it created, deepest last.
    created: Vec<PathBuf>,
    /// The cgroups this process was in before (one per hierarchy joined),
    /// to move back to before removing.
    previous: Vec<PathBuf>,
}

impl Joined {
    pub fn undo(&mut self) {
        for prev in self.previous.drain(..) {
            let _ = join(&prev);
        }
        for d in self.created.drain(..).rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Creates each missing cgroup from below `root` down to `leaf` (each
/// recorded for undo) and returns every level below `root`, top first.
fn create_levels(root: &Path, leaf: &Path, joined: &mut Joined) -> anyhow::Result<Vec<PathBuf>> {
    let mut levels: Vec<PathBuf> = leaf
        .ancestors()
        .take_while(|d| *d != root)
        .map(Path::to_path_buf)
        .collect();
    levels.reverse();
    for d in &levels {
        if d.exists() {
            continue;
        }
        std::fs::create_dir(d).with_context(|| format!("create cgroup {}", d.display()))?;
        joined.created.push(d.clone());
    }
    Ok(levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_mounts_lists_v1_and_v2_hierarchies() {
        let m = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                 cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n\
                 cgroup2 /sys/fs/cgroup/unified\\040x cgroup2 rw 0 0\n";
        let got = cgroup_mounts(m);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].path, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(!got[0].v2);
        assert!(got[0].options.iter().any(|o| o == "cpuacct"));
        assert_eq!(got[1].path, PathBuf::from("/sys/fs/cgroup/unified x"));
        assert!(got[1].v2);
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
}
