//! The build cache: the image after a step is kept as a layer, named by a
//! hash of everything that made it (the parent's image, then each step's
//! type, arguments and uploaded files), so that a build whose first steps
//! are those of an earlier build starts from the image after them, and an
//! identical build boots no VM at all. As E2B's builds, a step marked
//! `force` (the SDK's `skip_cache()`) and every step after it run again,
//! and a build marked `force` runs every step.
//!
//! Layers are per account (`<state>/sbx-templates/<account>/.layers/`):
//! one tenant's build never starts from another's image. Each is
//! `<key>.ext4` with `<key>.json` (what the steps so far set: user,
//! environment, working directory). The image after every `RUN` and `COPY`
//! is kept (a sparse copy while the build VM waits; `ENV`, `WORKDIR` and
//! `USER` are cheap to run again), and a build's final image is linked,
//! not copied. At most [`LAYERS_KEPT`] layers are kept per account, the
//! least recently used removed first.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::{hex, Builds, Step};
use crate::sandboxes::TemplateSpec;

/// Layers kept per account.
const LAYERS_KEPT: usize = 8;

/// What the steps so far set, for the steps after them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct StepState {
    pub(super) user: String,
    pub(super) template_user: String,
    pub(super) env: Vec<(String, String)>,
    pub(super) workdir: Option<String>,
}

/// A cached layer a build starts from.
#[derive(Debug)]
pub(super) struct Cached {
    /// How many of the build's steps it holds.
    pub(super) steps: usize,
    pub(super) image: PathBuf,
    pub(super) state: StepState,
}

/// An account's layers.
pub(super) struct Layers {
    dir: PathBuf,
}

impl Builds {
    pub(super) fn layers(&self, account: &str) -> Layers {
        Layers {
            dir: self.root.join(account).join(".layers"),
        }
    }
}

/// The key of the image after each step: a hash chained from the parent's
/// image (its path, size and modification time: a daemon template's image
/// replaced in place is another image) through each step.
pub(super) fn keys(parent: &TemplateSpec, steps: &[Step]) -> std::io::Result<Vec<String>> {
    let meta = std::fs::metadata(&parent.rootfs)?;
    let mtime = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = sha2::Sha256::new();
    h.update(b"spore-build-layer-v1\0");
    h.update(parent.rootfs.as_os_str().as_encoded_bytes());
    h.update(format!("\0{}\0{mtime}\0{}\0", meta.len(), parent.user));
    let mut key = hex(&h.finalize());
    let mut keys = Vec::with_capacity(steps.len());
    for step in steps {
        let mut h = sha2::Sha256::new();
        h.update(key.as_bytes());
        // JSON: each argument delimited, so that `a b` + `c` and `a` +
        // `b c` differ.
        let described = serde_json::json!([step.kind, step.args, step.files_hash]);
        h.update(described.to_string().as_bytes());
        key = hex(&h.finalize());
        keys.push(key.clone());
    }
    Ok(keys)
}

/// Whether the image after `step` is kept as a layer (the last step's
/// always is, by a link).
pub(super) fn worth_keeping(step: &Step) -> bool {
    matches!(step.kind.as_str(), "RUN" | "COPY")
}

impl Layers {
    /// The layer holding the most of the build's first steps, stopping at
    /// the first step marked `force`; none when the build is.
    pub(super) fn longest_cached(
        &self,
        keys: &[String],
        steps: &[Step],
        force: bool,
    ) -> Option<Cached> {
        if force {
            return None;
        }
        let usable = steps
            .iter()
            .take_while(|s| !s.force)
            .count()
            .min(keys.len());
        (1..=usable).rev().find_map(|n| {
            let image = self.dir.join(format!("{}.ext4", keys[n - 1]));
            let state_file = self.dir.join(format!("{}.json", keys[n - 1]));
            let state: StepState =
                serde_json::from_slice(&std::fs::read(&state_file).ok()?).ok()?;
            if !image.is_file() {
                return None;
            }
            // Used now: the last to be removed.
            let _ = std::fs::File::options()
                .write(true)
                .open(&state_file)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            Some(Cached {
                steps: n,
                image,
                state,
            })
        })
    }

    /// Keeps `image` (a build VM's, idle and synced) as layer `key`: a
    /// sparse copy, or a hard link when `link` (a final image, never
    /// written again). Written under a temporary name and renamed, its
    /// state last: a layer without its state is not one.
    pub(super) fn keep(
        &self,
        key: &str,
        image: &Path,
        state: &StepState,
        link: bool,
    ) -> std::io::Result<()> {
        crate::fs::create_private_dir(&self.dir)?;
        let to = self.dir.join(format!("{key}.ext4"));
        let tmp = self.dir.join(format!(".tmp-{key}.ext4"));
        let _ = std::fs::remove_file(&tmp);
        let kept = if link {
            std::fs::hard_link(image, &tmp).or_else(|_| crate::fs::copy_sparse(image, &tmp))
        } else {
            crate::fs::copy_sparse(image, &tmp)
        };
        if let Err(e) = kept.and_then(|()| std::fs::rename(&tmp, &to)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let json = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        crate::fs::write_private(&self.dir.join(format!("{key}.json")), &json)?;
        self.evict();
        Ok(())
    }

    /// Removes the least recently used layers past [`LAYERS_KEPT`], and
    /// images whose state is missing.
    fn evict(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut layers = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(key) = name.strip_suffix(".json") {
                let used = entry.metadata().and_then(|m| m.modified()).ok();
                layers.push((used, key.to_string()));
            } else if let Some(key) = name.strip_suffix(".ext4") {
                if !name.starts_with(".tmp-") && !self.dir.join(format!("{key}.json")).exists() {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        if layers.len() <= LAYERS_KEPT {
            return;
        }
        layers.sort();
        for (_, key) in &layers[..layers.len() - LAYERS_KEPT] {
            // The state first: a half-removed layer is not found.
            let _ = std::fs::remove_file(self.dir.join(format!("{key}.json")));
            let _ = std::fs::remove_file(self.dir.join(format!("{key}.ext4")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, arg: &str, force: bool) -> Step {
        Step {
            kind: kind.into(),
            args: vec![arg.into()],
            files_hash: None,
            force,
        }
    }

    #[test]
    fn layers_are_found_by_their_steps_and_skipped_when_forced() {
        let dir = std::env::temp_dir().join(format!("spore-layers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rootfs = dir.join("parent.ext4");
        std::fs::write(&rootfs, b"parent image").unwrap();
        let parent = TemplateSpec {
            name: "base".into(),
            kernel: dir.join("vmlinux"),
            rootfs: rootfs.clone(),
            vcpus: 1,
            memory_mib: 512,
            user: "user".into(),
            start_cmd: None,
            ready_cmd: None,
            network: false,
            dns: Vec::new(),
        };
        let steps = vec![
            step("RUN", "a", false),
            step("ENV", "b", false),
            step("RUN", "c", false),
        ];
        let k = keys(&parent, &steps).unwrap();
        assert_eq!(k.len(), 3);
        // A prefix of the steps has the same keys; another step does not.
        let other = keys(&parent, &[step("RUN", "a", false), step("RUN", "x", false)]).unwrap();
        assert_eq!(other[0], k[0]);
        assert_ne!(other[1], k[1]);
        // Arguments are delimited.
        let split = |args: &[&str]| Step {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..step("RUN", "", false)
        };
        assert_ne!(
            keys(&parent, &[split(&["a b", "c"])]).unwrap(),
            keys(&parent, &[split(&["a", "b c"])]).unwrap()
        );

        let layers = Layers {
            dir: dir.join("layers"),
        };
        assert!(layers.longest_cached(&k, &steps, false).is_none());
        let after_one = dir.join("one.ext4");
        std::fs::write(&after_one, b"after step 1").unwrap();
        let state = StepState {
            user: "root".into(),
            template_user: "user".into(),
            env: vec![("A".into(), "1".into())],
            workdir: Some("/app".into()),
        };
        layers.keep(&k[0], &after_one, &state, false).unwrap();
        let hit = layers.longest_cached(&k, &steps, false).unwrap();
        assert_eq!(hit.steps, 1);
        assert_eq!(hit.state, state);
        assert_eq!(std::fs::read(&hit.image).unwrap(), b"after step 1");
        layers.keep(&k[2], &after_one, &state, true).unwrap();
        assert_eq!(layers.longest_cached(&k, &steps, false).unwrap().steps, 3);
        // `force` on the build, or from a step on.
        assert!(layers.longest_cached(&k, &steps, true).is_none());
        let mut forced = steps.clone();
        forced[1].force = true;
        assert_eq!(layers.longest_cached(&k, &forced, false).unwrap().steps, 1);
        forced[0].force = true;
        assert!(layers.longest_cached(&k, &forced, false).is_none());
        // Another parent image (replaced in place: another size) has other keys.
        std::fs::write(&rootfs, b"a new parent image").unwrap();
        assert_ne!(keys(&parent, &steps).unwrap()[0], k[0]);

        // Past LAYERS_KEPT the least recently used go, state and image.
        for i in 0..LAYERS_KEPT + 2 {
            layers
                .keep(&format!("{i:064x}"), &after_one, &state, false)
                .unwrap();
        }
        let kept = std::fs::read_dir(&layers.dir).unwrap().count();
        assert_eq!(kept, 2 * LAYERS_KEPT);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
