//! `spore image`: runtime images (read-only ext4 root file systems for Linux
//! function guests, built from Debian packages) and function code disks.
//!
//! `build` runs the repository's `guest/build-rootfs.sh` rather than a copy
//! embedded in the binary: the script sources `lib.sh` and reads the
//! runtime's recipe and `bootstrap.py`, and its own bytes are part of the
//! cache key, so running the checkout's files means `make images` and
//! `spore image build` share cache entries and never build from stale
//! embedded copies. A binary outside the repository is pointed at it with
//! `SPORE_GUEST_DIR`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde_json::Value;
use spore_serve::runtime_image::{cached_images, newest, DEFAULT_CACHE, RUNTIMES};

#[derive(Subcommand)]
pub enum ImageCommand {
    /// Build (or find cached) the runtime image of RUNTIME; prints its path.
    Build {
        /// provided or python3.
        runtime: String,
        /// The guest agent to install as /sbin/spore-agent.
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// The cache directory (default: $SPORE_CACHE, else /var/cache/spore).
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
    /// List the cached runtime images with their manifests.
    List {
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
        /// Print the manifests as a JSON array (each with its image's path).
        #[arg(long)]
        json: bool,
    },
    /// Print the path of the newest cached image of RUNTIME.
    Path {
        runtime: String,
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
    /// Remove old runtime images: all but the newest KEEP of each runtime,
    /// and build directories left by killed builds. Snapshots of functions
    /// deployed on a removed image are rebuilt on their next start.
    Gc {
        /// Images kept per runtime (at least 1).
        #[arg(long, default_value_t = 1)]
        keep: usize,
        /// Only print what would be removed.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
    /// Make the code disk of a function: ZIP unpacked into a small read-only
    /// ext4 image at OUT (mode 0600, written atomically).
    Code { zip: PathBuf, out: PathBuf },
}

pub fn run(cmd: ImageCommand) -> anyhow::Result<u8> {
    match cmd {
        ImageCommand::Build {
            runtime,
            agent,
            cache,
        } => {
            check_runtime(&runtime)?;
            let flags: Vec<(&str, &Path)> = agent
                .as_deref()
                .map(|a| ("--agent", a))
                .into_iter()
                .collect();
            let path = build(&runtime, &flags, &cache_dir(cache))?;
            println!("{}", path.display());
        }
        ImageCommand::List { cache, json } => {
            let cache = cache_dir(cache);
            let images = cached_images(&cache)?;
            if json {
                let all: Vec<Value> = images
                    .into_iter()
                    .map(|i| {
                        let mut m = i.manifest;
                        if let Some(o) = m.as_object_mut() {
                            o.insert("path".into(), i.image.display().to_string().into());
                        }
                        m
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if images.is_empty() {
                eprintln!("no runtime images in {}", cache.display());
            } else {
                println!(
                    "{:<10} {:>8} {:>5} {:<6} {:<20} PATH",
                    "RUNTIME", "SIZE", "PKGS", "AGENT", "BUILT"
                );
                for i in images {
                    let m = &i.manifest;
                    println!(
                        "{:<10} {:>5}MiB {:>5} {:<6} {:<20} {}",
                        i.runtime,
                        m["size_bytes"].as_u64().unwrap_or(0).div_ceil(1 << 20),
                        m["packages"].as_array().map_or(0, |p| p.len()),
                        if m["agent"]["present"].as_bool() == Some(true) {
                            "yes"
                        } else {
                            "no"
                        },
                        m["built_at"].as_str().unwrap_or("?"),
                        i.image.display()
                    );
                }
            }
        }
        ImageCommand::Path { runtime, cache } => {
            check_runtime(&runtime)?;
            let cache = cache_dir(cache);
            let path = newest(&cache, &runtime)?;
            println!("{}", path.display());
        }
        ImageCommand::Gc {
            keep,
            dry_run,
            cache,
        } => {
            let cache = cache_dir(cache);
            let plan = spore_serve::runtime_image::gc_plan(&cache, keep)?;
            let mut freed = 0u64;
            for dir in &plan {
                let bytes = disk_usage(dir);
                if dry_run {
                    println!("would remove {} ({} MiB)", dir.display(), bytes >> 20);
                    continue;
                }
                std::fs::remove_dir_all(dir)
                    .with_context(|| format!("removing {}", dir.display()))?;
                freed += bytes;
                println!("removed {} ({} MiB)", dir.display(), bytes >> 20);
            }
            if !dry_run {
                eprintln!(
                    "spore image gc: {} entries removed, {} MiB freed in {}",
                    plan.len(),
                    freed >> 20,
                    cache.display()
                );
            }
        }
        ImageCommand::Code { zip, out } => {
            let meta = std::fs::metadata(&zip).with_context(|| format!("{}", zip.display()))?;
            if meta.len() > spore_serve::code::MAX_ZIP_BYTES as u64 {
                bail!(
                    "{}: larger than {} bytes",
                    zip.display(),
                    spore_serve::code::MAX_ZIP_BYTES
                );
            }
            let data = std::fs::read(&zip).with_context(|| format!("{}", zip.display()))?;
            let disk = spore_serve::code_disk::build(&data, &out)
                .with_context(|| format!("{}", zip.display()))?;
            eprintln!(
                "{}: {} files, {} directories, {} symlinks, {} bytes of content; image {} KiB",
                out.display(),
                disk.contents.files,
                disk.contents.dirs,
                disk.contents.symlinks,
                disk.contents.bytes,
                disk.size / 1024
            );
            println!("{}", disk.path.display());
        }
    }
    Ok(0)
}

/// Bytes allocated on disk under `dir` (files only; symlinks not followed).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

fn check_runtime(runtime: &str) -> anyhow::Result<()> {
    if !RUNTIMES.contains(&runtime) {
        bail!(
            "unknown runtime '{runtime}' (known: {})",
            RUNTIMES.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn cache_dir(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("SPORE_CACHE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
}

/// The repository's `guest/` directory: `SPORE_GUEST_DIR`, else the first
/// ancestor of the binary (`target/release/spore`,
/// `target/<triple>/release/spore`) or of the working directory that holds
/// `guest/build-rootfs.sh`.
pub(crate) fn guest_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SPORE_GUEST_DIR").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("build-rootfs.sh").is_file() {
            return Ok(dir);
        }
        bail!("SPORE_GUEST_DIR={} holds no build-rootfs.sh", dir.display());
    }
    let mut starts = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    for start in &starts {
        for dir in start.ancestors().take(6) {
            let guest = dir.join("guest");
            if guest.join("build-rootfs.sh").is_file() {
                return Ok(guest);
            }
        }
    }
    bail!("cannot find guest/build-rootfs.sh near the spore binary or the working directory (set SPORE_GUEST_DIR to the repository's guest/ directory)")
}

/// Runs `build-rootfs.sh NAME` with `flags` (`--agent`, `--envd`,
/// `--recipe`, each a file); its progress goes to our stderr, its last
/// stdout line is the image. The script's own `error:` line is held back
/// and becomes spore's one error line.
pub(crate) fn build(
    runtime: &str,
    flags: &[(&str, &Path)],
    cache: &Path,
) -> anyhow::Result<PathBuf> {
    use std::io::BufRead;
    let script = guest_dir()?.join("build-rootfs.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(runtime);
    for (flag, file) in flags {
        if !file.is_file() {
            bail!(
                "{} not found: {}",
                flag.trim_start_matches("--"),
                file.display()
            );
        }
        cmd.arg(flag).arg(file);
    }
    let mut child = cmd
        .env("SPORE_CACHE", cache)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", script.display()))?;
    let stderr = child.stderr.take().context("the script's stderr")?;
    let relay = std::thread::spawn(move || {
        let mut error = None;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            match line.split_once("] error: ") {
                Some((_, e)) if line.starts_with('[') => error = Some(e.to_string()),
                _ => eprintln!("{line}"),
            }
        }
        error
    });
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut stdout)
            .with_context(|| format!("reading {}'s output", script.display()))?;
    }
    let status = child.wait()?;
    let error = relay.join().ok().flatten();
    if !status.success() {
        match error {
            Some(e) => bail!("{e}"),
            None => bail!("{} {runtime} failed ({status})", script.display()),
        }
    }
    let last = stdout.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    let path = PathBuf::from(last.trim());
    if !path.is_file() {
        bail!("{} printed no image path (got '{last}')", script.display());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_runtimes_are_named() {
        let err = check_runtime("nodejs").unwrap_err().to_string();
        assert_eq!(err, "unknown runtime 'nodejs' (known: provided, python3)");
    }
}
