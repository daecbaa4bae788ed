//! The VMM's cgroups, as Firecracker's jailer makes them: for each
//! `--cgroup <file>=<value>` the cgroup `<parent>/<id>` in the hierarchy
//! that holds the file's controller (its name up to the first `.`), the
//! value written into it, and this process moved in (its children, the VMM
//! and its clones, follow). `--cgroup-version 1` looks for each controller's
//! own v1 hierarchy (`v1`), `2` for the one unified hierarchy (`v2`).
//!
//! Both look the hierarchies up in /proc/mounts (with `spore_cgroup`, as
//! `spore serve` does for its instances), check every controller
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

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    Ok(spore_cgroup::write(path, value)?)
}

/// Moves this process into the cgroup `dir`.
fn join(dir: &Path) -> anyhow::Result<()> {
    Ok(spore_cgroup::join(dir, std::process::id())?)
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
