//! Runtime images of Linux functions in the build cache: read-only ext4
//! root file systems that `guest/build-rootfs.sh` (`spore image build`)
//! leaves in `<cache>/rootfs-<runtime>-<sha256>/` as `rootfs.ext4` beside
//! `manifest.json`. Found here so that the daemon's deploy path and the CLI
//! agree on what "the newest image of a runtime" is.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;

/// The runtimes with a recipe under `guest/runtimes/` (a test keeps the two
/// lists equal).
pub const RUNTIMES: &[&str] = &["provided", "python3"];

/// Where images are cached unless a flag or `SPORE_CACHE` says otherwise.
pub const DEFAULT_CACHE: &str = "/var/cache/spore";

/// A cached image and its manifest.
pub struct CachedImage {
    pub runtime: String,
    pub image: PathBuf,
    pub manifest: Value,
}

/// Every complete image in the cache (`rootfs-<runtime>-<sha256>/` with
/// `rootfs.ext4` and a readable `manifest.json`), oldest first.
pub fn cached_images(cache: &Path) -> anyhow::Result<Vec<CachedImage>> {
    let entries = match std::fs::read_dir(cache) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("{}", cache.display())),
    };
    let mut images = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("{}", cache.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("rootfs-") else {
            continue;
        };
        // `<runtime>-<64 hex digits>`: the runtime is what precedes the hash.
        let Some((runtime, key)) = rest.rsplit_once('-') else {
            continue;
        };
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let dir = entry.path();
        let image = dir.join("rootfs.ext4");
        let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) else {
            continue;
        };
        let Ok(manifest) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if !image.is_file() {
            continue;
        }
        images.push(CachedImage {
            runtime: runtime.to_string(),
            image,
            manifest,
        });
    }
    // RFC 3339 UTC times sort as strings; the path breaks ties.
    images.sort_by(|a, b| {
        let t = |c: &CachedImage| c.manifest["built_at"].as_str().unwrap_or("").to_string();
        t(a).cmp(&t(b)).then_with(|| a.image.cmp(&b.image))
    });
    Ok(images)
}

pub fn newest(cache: &Path, runtime: &str) -> anyhow::Result<PathBuf> {
    cached_images(cache)?
        .into_iter()
        .rev()
        .find(|i| i.runtime == runtime)
        .map(|i| i.image)
        .with_context(|| {
            format!(
                "no {runtime} image in {}; run spore image build {runtime}",
                cache.display()
            )
        })
}

/// A build's work directory older than this is a leftover of a build that
/// was killed (a live build is minutes old at most).
const STALE_BUILD: std::time::Duration = std::time::Duration::from_secs(3600);

/// What `spore image gc` would remove: for each runtime, every complete
/// image but the newest `keep` (at least one is always kept), and build
/// work directories (`.rootfs-build.*`) left for more than an hour.
/// Entries it does not recognise are never named.
pub fn gc_plan(cache: &Path, keep: usize) -> anyhow::Result<Vec<PathBuf>> {
    let keep = keep.max(1);
    let mut doomed = Vec::new();
    let images = cached_images(cache)?;
    for runtime in RUNTIMES {
        let of_runtime: Vec<&CachedImage> =
            images.iter().filter(|i| i.runtime == *runtime).collect();
        let extra = of_runtime.len().saturating_sub(keep);
        // Oldest first: the first `extra` go.
        doomed.extend(
            of_runtime[..extra]
                .iter()
                .filter_map(|i| i.image.parent().map(Path::to_path_buf)),
        );
    }
    if let Ok(entries) = std::fs::read_dir(cache) {
        for entry in entries.flatten() {
            let stale = entry
                .metadata()
                .ok()
                .filter(|m| m.is_dir())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_BUILD);
            if stale
                && entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".rootfs-build.")
            {
                doomed.push(entry.path());
            }
        }
    }
    Ok(doomed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_match_the_recipes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/runtimes");
        let mut found: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("recipe").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        assert_eq!(found, RUNTIMES);
    }

    fn fake_image(cache: &Path, runtime: &str, key_digit: char, built_at: &str) -> PathBuf {
        let dir = cache.join(format!(
            "rootfs-{runtime}-{}",
            key_digit.to_string().repeat(64)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rootfs.ext4"), b"").unwrap();
        std::fs::write(
            dir.join("manifest.json"),
            format!(r#"{{"runtime":"{runtime}","built_at":"{built_at}","packages":[]}}"#),
        )
        .unwrap();
        dir.join("rootfs.ext4")
    }

    #[test]
    fn path_finds_the_newest_complete_image() {
        let cache = std::env::temp_dir().join(format!("spore-image-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        let err = newest(&cache, "python3").unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "no python3 image in {}; run spore image build python3",
                cache.display()
            )
        );
        fake_image(&cache, "python3", 'a', "2026-01-01T00:00:00Z");
        let new = fake_image(&cache, "python3", 'b', "2026-02-01T00:00:00Z");
        let prov = fake_image(&cache, "provided", 'c', "2026-03-01T00:00:00Z");
        // Half-built (no manifest) and foreign entries are ignored.
        std::fs::create_dir_all(cache.join(format!("rootfs-python3-{}", "d".repeat(64)))).unwrap();
        std::fs::create_dir_all(cache.join(".rootfs-build.x")).unwrap();
        assert_eq!(newest(&cache, "python3").unwrap(), new);
        assert_eq!(newest(&cache, "provided").unwrap(), prov);
        assert_eq!(cached_images(&cache).unwrap().len(), 3);
        std::fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn gc_keeps_the_newest_of_each_runtime() {
        let cache = std::env::temp_dir().join(format!("spore-image-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        assert!(
            gc_plan(&cache, 1).unwrap().is_empty(),
            "no cache, nothing to do"
        );
        let old = fake_image(&cache, "python3", 'a', "2026-01-01T00:00:00Z");
        let mid = fake_image(&cache, "python3", 'b', "2026-02-01T00:00:00Z");
        let new = fake_image(&cache, "python3", 'e', "2026-03-01T00:00:00Z");
        fake_image(&cache, "provided", 'c', "2026-01-01T00:00:00Z");
        // A build under way (fresh) and an entry gc does not know stay.
        std::fs::create_dir_all(cache.join(".rootfs-build.live")).unwrap();
        std::fs::create_dir_all(cache.join("kernel-x")).unwrap();
        let dir = |p: &PathBuf| p.parent().unwrap().to_path_buf();
        let mut plan = gc_plan(&cache, 1).unwrap();
        plan.sort();
        assert_eq!(plan, vec![dir(&old), dir(&mid)]);
        assert_eq!(gc_plan(&cache, 2).unwrap(), vec![dir(&old)]);
        // keep 0 still keeps one: a daemon always has an image to boot.
        assert_eq!(gc_plan(&cache, 0).unwrap().len(), 2);
        assert!(!gc_plan(&cache, 1).unwrap().contains(&dir(&new)));
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
