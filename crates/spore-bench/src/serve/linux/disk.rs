//! Where a serve daemon keeps a function's snapshots, and the disk they
//! take: a runtime base shared by its functions, a diff (and working set)
//! per layered function, a whole memory file per merged one.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::strategy::Strategy;

/// `<state>/snapshots/<name>-v<N>` (the newest N).
pub(super) fn snapshot_dir(state: &Path, name: &str) -> Option<PathBuf> {
    let prefix = format!("{name}-v");
    std::fs::read_dir(state.join("snapshots"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n: u64 = e
                .file_name()
                .to_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .max()
        .map(|(_, p)| p)
}

/// Bytes the files at or under `p` take on disk.
pub(super) fn disk_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| disk_bytes(&e.path()))
            .sum()
    } else {
        meta.blocks() * 512
    }
}

/// Disk per runtime base and per function snapshot, per memory size.
pub(super) fn disk_report(
    state: &Path,
    sizes: &[u32],
    functions: &[String],
    strategies: &[Strategy],
) -> Value {
    let layered = strategies
        .iter()
        .any(|s| matches!(s, Strategy::Layered | Strategy::LayeredWs | Strategy::Clone));
    let merged = strategies.contains(&Strategy::Merged);
    let mut out = Vec::new();
    for &mib in sizes {
        let base_dir = state.join(format!("bases/python3-{mib}"));
        let base = base_dir
            .is_dir()
            .then(|| disk_bytes(&base_dir.join("vm.mem")) + disk_bytes(&base_dir.join("vm.state")));
        let mut per_fn = serde_json::Map::new();
        let (mut sum_layered, mut sum_merged, mut n) = (0u64, 0u64, 0u64);
        for f in functions {
            let mut entry = serde_json::Map::new();
            if layered {
                if let Some(d) = snapshot_dir(state, &Strategy::Layered.function_name(f, mib)) {
                    let ws = disk_bytes(&d.join("vm.state.ws"));
                    let diff = disk_bytes(&d) - ws;
                    entry.insert("layered_diff".into(), diff.into());
                    entry.insert("working_set".into(), ws.into());
                    sum_layered += diff + ws;
                    n += 1;
                }
            }
            if merged {
                if let Some(d) = snapshot_dir(state, &Strategy::Merged.function_name(f, mib)) {
                    let full = disk_bytes(&d);
                    entry.insert("merged_full".into(), full.into());
                    sum_merged += full;
                }
            }
            per_fn.insert(f.clone(), Value::Object(entry));
        }
        out.push(json!({
            "memory_mib": mib,
            "base_bytes": base,
            "functions": per_fn,
            // What N functions of this runtime and size take: the base once
            // plus each diff (and working set), against a full snapshot each.
            "layered_total_bytes": base.map(|b| b + sum_layered),
            "merged_total_bytes": merged.then_some(sum_merged),
            "layered_functions": n,
        }));
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_snapshot_directory_of_a_function() {
        let state = std::env::temp_dir().join(format!("spore-bsl-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        assert_eq!(snapshot_dir(&state, "lorem-256"), None);
        for d in [
            "lorem-256-v1",
            "lorem-256-v3",
            "lorem-256-merged-v9",
            ".tmp-lorem-256-v4-0",
        ] {
            std::fs::create_dir_all(state.join("snapshots").join(d)).unwrap();
        }
        assert_eq!(
            snapshot_dir(&state, "lorem-256"),
            Some(state.join("snapshots/lorem-256-v3"))
        );
        std::fs::write(state.join("snapshots/lorem-256-v3/vm.mem"), vec![1u8; 8192]).unwrap();
        assert!(disk_bytes(&state.join("snapshots")) >= 8192);
        let _ = std::fs::remove_dir_all(&state);
    }
}
