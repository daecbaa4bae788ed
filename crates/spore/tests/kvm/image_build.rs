//! `spore image build provided` end to end, without a VM: the image is built
//! from Debian packages into a temporary cache (root and the host's Debian
//! mirror needed; about 30-60 s cold), read back with debugfs, and a second
//! build is a cache hit. `make images-test` runs just this.

use std::path::Path;
use std::time::Instant;

use crate::common::*;

fn debugfs(image: &Path, request: &str) -> String {
    let debugfs = ["/usr/sbin/debugfs", "/sbin/debugfs"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("debugfs");
    let out = std::process::Command::new(debugfs)
        .args(["-R", request])
        .arg(image)
        .output()
        .expect("debugfs (e2fsprogs) runs");
    assert!(out.status.success(), "debugfs -R '{request}': {out:?}");
    stdout_of(&out)
}

/// The mode column of `name` in a `debugfs ls -l` listing.
fn mode_of(listing: &str, name: &str) -> String {
    listing
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.last() == Some(&name))
        .and_then(|w| w.get(1).map(|m| m.to_string()))
        .unwrap_or_else(|| panic!("{name} not in {listing}"))
}

#[test]
fn image_build_provided() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() },
        0,
        "building a runtime image needs root (mmdebstrap, chroot)"
    );
    let dir = Scratch::new("image-build");
    let cache = dir.path("cache");
    let agent = dir.path("agent");
    std::fs::write(&agent, b"#!/bin/sh\necho stand-in agent\n").unwrap();

    let build = || {
        let t = Instant::now();
        let out = spore()
            .args(["image", "build", "provided", "--agent"])
            .arg(&agent)
            .arg("--cache")
            .arg(&cache)
            .output()
            .unwrap();
        assert!(out.status.success(), "stderr: {}", stderr_of(&out));
        let path = stdout_of(&out).trim().to_string();
        (path, t.elapsed(), stderr_of(&out))
    };
    let (path, cold, _) = build();
    let image = Path::new(&path);
    assert!(image.is_file(), "{path}");
    assert!(image.starts_with(&cache), "{path} is not in the cache");
    let entry = image.parent().unwrap();
    let name = entry.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("rootfs-provided-") && name.len() == "rootfs-provided-".len() + 64);

    // The manifest: the recipe's packages and their closure, none of the
    // build-only ones, the agent's hash.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(entry.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["runtime"], "provided");
    assert_eq!(
        manifest["size_bytes"].as_u64(),
        Some(std::fs::metadata(image).unwrap().len())
    );
    let packages: Vec<&str> = manifest["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for p in ["busybox", "dash", "ca-certificates", "libc6"] {
        assert!(packages.contains(&p), "{p} missing from {packages:?}");
    }
    for p in ["perl-base", "coreutils", "dpkg", "debconf", "openssl"] {
        assert!(!packages.contains(&p), "{p} is build-only: {packages:?}");
    }
    assert_eq!(manifest["agent"]["present"], true);
    assert_eq!(manifest["agent"]["sha256"].as_str().unwrap().len(), 64);

    // The file system, read without mounting it.
    let root = debugfs(image, "ls -l /");
    assert_eq!(mode_of(&root, "tmp"), "41777");
    assert_eq!(mode_of(&root, "opt"), "40755");
    let var = debugfs(image, "ls -l /var");
    assert_eq!(mode_of(&var, "task"), "40755");
    assert_eq!(mode_of(&var, "runtime"), "40755");
    assert_eq!(
        mode_of(&debugfs(image, "ls -l /usr/sbin"), "spore-agent"),
        "100755"
    );
    assert_eq!(
        debugfs(image, "cat /usr/sbin/spore-agent"),
        "#!/bin/sh\necho stand-in agent\n"
    );
    assert!(debugfs(image, "stat /etc/ssl/certs/ca-certificates.crt").contains("Type: regular"));
    assert!(debugfs(image, "ls /usr/local/bin").contains("wget"));
    let share = debugfs(image, "ls -l /usr/share");
    for stripped in ["man", "locale", "info", "lintian"] {
        assert!(
            !share
                .lines()
                .any(|l| l.trim_end().ends_with(&format!(" {stripped}"))),
            "/usr/share/{stripped} is in the image: {share}"
        );
    }

    // The same inputs again: a cache hit, the same image.
    let (again, cached, stderr) = build();
    assert_eq!(again, path);
    assert!(stderr.contains("cached"), "{stderr}");
    eprintln!(
        "provided image: {} KiB, built in {:.1} s, cached in {:.1} s",
        manifest["size_bytes"].as_u64().unwrap_or(0) / 1024,
        cold.as_secs_f64(),
        cached.as_secs_f64()
    );

    let out = spore()
        .args(["image", "path", "provided", "--cache"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), path);
    let out = spore()
        .args(["image", "path", "python3", "--cache"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_of(&out).trim(),
        format!(
            "spore: error: no python3 image in {}; run spore image build python3",
            cache.display()
        )
    );
}
