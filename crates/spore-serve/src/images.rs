//! The cache of Linux guest artifacts (`/var/cache/spore`, or `$SPORE_CACHE`):
//! runtime images (`rootfs-<runtime>-<sha256>/rootfs.ext4` with its
//! `manifest.json`, made by `guest/build-rootfs.sh` through `spore image
//! build`) and guest kernels (`kernel-<sha256>/vmlinux`, made by
//! `guest/build-kernel.sh`). Images are found by [`crate::runtime_image`],
//! as `spore image path` finds them, so the daemon boots what it prints;
//! this module adds the daemon's error for a missing image and the kernel.

use std::path::{Path, PathBuf};

/// `flag`, else `$SPORE_CACHE`, else the default cache (`spore image`'s).
pub fn cache_dir(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("SPORE_CACHE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(crate::runtime_image::DEFAULT_CACHE))
}

/// No image of a runtime in the cache.
#[derive(Debug, thiserror::Error)]
#[error("runtime image {runtime} is not built; run spore image build {runtime} (cache {})", cache.display())]
pub struct NotBuilt {
    pub runtime: String,
    pub cache: PathBuf,
}

/// The newest complete image of `runtime`.
pub fn newest(cache: &Path, runtime: &str) -> Result<PathBuf, NotBuilt> {
    let not_built = || NotBuilt {
        runtime: runtime.to_string(),
        cache: cache.to_path_buf(),
    };
    crate::runtime_image::cached_images(cache)
        .map_err(|_| not_built())?
        .into_iter()
        .rev()
        .find(|i| i.runtime == runtime)
        .map(|i| i.image)
        .ok_or_else(not_built)
}

/// The newest guest kernel in the cache (`kernel-<64 hex>/vmlinux`, by
/// modification time).
pub fn newest_kernel(cache: &Path) -> Option<PathBuf> {
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("kernel-"))
                .is_some_and(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .map(|e| e.path().join("vmlinux"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_kernel_is_found_and_others_ignored() {
        let cache = std::env::temp_dir().join(format!("spore-kernels-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        assert_eq!(newest_kernel(&cache), None);
        let k = cache.join(format!("kernel-{}", "a".repeat(64)));
        std::fs::create_dir_all(&k).unwrap();
        assert_eq!(newest_kernel(&cache), None, "no vmlinux yet");
        std::fs::write(k.join("vmlinux"), b"").unwrap();
        std::fs::create_dir_all(cache.join("kernel-short")).unwrap();
        std::fs::write(cache.join("kernel-short/vmlinux"), b"").unwrap();
        assert_eq!(newest_kernel(&cache), Some(k.join("vmlinux")));
        let err = newest(&cache, "python3").unwrap_err().to_string();
        assert!(
            err.starts_with("runtime image python3 is not built; run spore image build python3")
        );
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
