//! How many clones may exist: one budget per clone tree, and an optional
//! limit on the clone processes of the whole host.
//!
//! **The tree's budget.** A VM that is no clone (the root) may count
//! `max_clones` clones in its whole tree: its clones, their clones, and so
//! on, whoever asked for them (the guest's `FORK` or `PUT /clone`). Clone
//! processes are separate, so the budget is split rather than shared: each
//! clone a source makes costs the source 1, plus the **share** of the
//! budget it hands that clone ([`shares`]); a clone may count at most its
//! share in its own subtree (its cap, whatever its `max_clones` says). By
//! induction over the tree, a VM's subtree never holds more clones than
//! the budget it held, so the tree never exceeds the root's `max_clones`.
//! The share is `clone_budget` when set (capped by what is left), else
//! half of what is left when clones may fork, else 0: a zygote serving
//! many clones that do not fork spends exactly one per clone.
//!
//! **The host's limit** (`host_max_clones`, or `SPORE_MAX_CLONES_HOST` in
//! the environment, the lower wins) bounds the clone processes running on
//! the host (spawned `spore vmm --clone-handoff`, or forked by a clone
//! factory), counted in `/proc` when a clone is asked for (only when a
//! limit is set).

use std::path::Path;

use super::factory::{CLONE_COMM, FACTORY_FLAG};

/// The environment variable with a host-wide clone process limit.
pub const HOST_LIMIT_ENV: &str = "SPORE_MAX_CLONES_HOST";

/// The share of the budget each of `count` new clones gets, when `left`
/// is what the source may still spend; `None` when `count` clones do not
/// fit. `budget` is `clone_budget`, `may_fork` is `clones_may_fork`.
pub fn shares(left: u64, count: u32, budget: Option<u64>, may_fork: bool) -> Option<Vec<u64>> {
    let mut pool = left.checked_sub(u64::from(count))?;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let share = match budget {
            Some(b) => b.min(pool),
            None if may_fork => pool / 2,
            None => 0,
        };
        pool -= share;
        out.push(share);
    }
    Some(out)
}

/// The host's clone process limit, and where it comes from: the lower of
/// the configured one and [`HOST_LIMIT_ENV`] (an unreadable value there is
/// ignored, with a warning).
pub fn host_limit(configured: Option<u64>) -> Option<(u64, &'static str)> {
    let env = std::env::var(HOST_LIMIT_ENV)
        .ok()
        .and_then(|v| match v.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                tracing::warn!("{HOST_LIMIT_ENV}={v:?} is not a number; ignored");
                None
            }
        });
    match (configured, env) {
        (Some(c), Some(e)) if e < c => Some((e, HOST_LIMIT_ENV)),
        (Some(c), _) => Some((c, "host_max_clones")),
        (None, Some(e)) => Some((e, HOST_LIMIT_ENV)),
        (None, None) => None,
    }
}

/// Whether a process is a spore clone process, from its NUL-separated
/// command line and its name (`comm`): a spawned one runs `<exe> vmm ...
/// --clone-handoff FD ...`; a forked one shows its factory's `<exe> vmm
/// --clone-factory FD ...` and is named [`CLONE_COMM`] (the factory is not).
fn is_clone_process(cmdline: &[u8], comm: &[u8]) -> bool {
    let mut args = cmdline.split(|&b| b == 0);
    let _exe = args.next();
    if args.next() != Some(b"vmm") {
        return false;
    }
    let spawned = args.any(|a| a == b"--clone-handoff");
    let forked = comm.trim_ascii_end() == CLONE_COMM.as_bytes()
        && cmdline
            .split(|&b| b == 0)
            .any(|a| a == FACTORY_FLAG.as_bytes());
    spawned || forked
}

/// Clone processes running on the host (zombies have no command line and
/// do not count), found in `proc_root` (`/proc`).
pub fn count_clone_processes(proc_root: &Path) -> u64 {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let comm = std::fs::read(e.path().join("comm")).unwrap_or_default();
                is_clone_process(&c, &comm)
            })
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sums a tree where every VM forks as much as its budget allows, one
    /// clone per request, each clone spending its share the same way.
    fn tree_size(budget: u64, per_clone: Option<u64>, may_fork: bool) -> u64 {
        let mut left = budget;
        let mut total = 0;
        while let Some(s) = shares(left, 1, per_clone, may_fork) {
            left -= 1 + s[0];
            total += 1 + tree_size(s[0], per_clone, may_fork);
        }
        total
    }

    #[test]
    fn shares_split_what_is_left() {
        // Halves by default when clones may fork; nothing when they may not.
        assert_eq!(shares(9, 1, None, true), Some(vec![4]));
        assert_eq!(shares(9, 2, None, true), Some(vec![3, 2]));
        assert_eq!(shares(9, 2, None, false), Some(vec![0, 0]));
        // A set budget, capped by what is left.
        assert_eq!(shares(9, 2, Some(5), false), Some(vec![5, 2]));
        assert_eq!(shares(2, 2, Some(5), true), Some(vec![0, 0]));
        // More clones than the budget: refused.
        assert_eq!(shares(2, 3, None, true), None);
        assert_eq!(shares(0, 1, Some(1), true), None);
        assert_eq!(shares(0, 0, None, true), Some(vec![]));
    }

    #[test]
    fn a_tree_never_exceeds_its_root_budget() {
        for budget in [0, 1, 2, 3, 7, 8, 100, 1000] {
            for (per_clone, may_fork) in [
                (None, true),
                (None, false),
                (Some(1), true),
                (Some(50), true),
            ] {
                let n = tree_size(budget, per_clone, may_fork);
                // Every unit is spent: on a clone, or given to one that
                // spends it.
                assert_eq!(n, budget, "budget {budget}, {per_clone:?}, {may_fork}");
            }
        }
    }

    #[test]
    fn host_limit_takes_the_lower() {
        // The environment is process-wide: one test reads and sets it.
        std::env::remove_var(HOST_LIMIT_ENV);
        assert_eq!(host_limit(None), None);
        assert_eq!(host_limit(Some(5)), Some((5, "host_max_clones")));
        std::env::set_var(HOST_LIMIT_ENV, "3");
        assert_eq!(host_limit(Some(5)), Some((3, HOST_LIMIT_ENV)));
        assert_eq!(host_limit(Some(2)), Some((2, "host_max_clones")));
        assert_eq!(host_limit(None), Some((3, HOST_LIMIT_ENV)));
        std::env::set_var(HOST_LIMIT_ENV, "many");
        assert_eq!(host_limit(None), None);
        std::env::remove_var(HOST_LIMIT_ENV);
    }

    #[test]
    fn clone_processes_are_counted_from_their_command_lines() {
        let root = std::env::temp_dir().join(format!("spore-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (pid, cmdline) in [
            (
                "10",
                &b"/usr/bin/spore\0vmm\0--api-sock\0/r/c1.sock\0--clone-handoff\x005\0"[..],
            ),
            ("11", b"spore\0vmm\0--clone-handoff\x004\0"),
            ("12", b"spore\0vmm\0--api-sock\0/r/src.sock\0"),
            ("13", b"grep\0--clone-handoff\0"),
            ("14", b""),
            ("self", b"spore\0vmm\0--clone-handoff\x004\0"),
            // A factory, and a clone it forked (named spore-clone).
            ("15", b"spore\0vmm\0--clone-factory\x003\0--clone-dir\0/r\0"),
            ("16", b"spore\0vmm\0--clone-factory\x003\0--clone-dir\0/r\0"),
        ] {
            std::fs::create_dir_all(root.join(pid)).unwrap();
            std::fs::write(root.join(pid).join("cmdline"), cmdline).unwrap();
        }
        std::fs::write(root.join("15").join("comm"), "spore\n").unwrap();
        std::fs::write(root.join("16").join("comm"), "spore-clone\n").unwrap();
        assert_eq!(count_clone_processes(&root), 3);
        assert_eq!(count_clone_processes(&root.join("missing")), 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
