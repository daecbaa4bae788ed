//! E2B's `minFreeDiskMb`: a built image grown, never shrunk, until its file
//! system has at least that much space a user may fill, after the steps
//! ran (best effort, as on E2B). Done on the host with e2fsprogs
//! (`dumpe2fs`, `e2fsck`, `resize2fs`) on the image file, which nothing
//! else has open then; the file grows sparse, so the space costs nothing
//! until the sandbox writes it.

use std::path::Path;
use std::process::Command;

use crate::code::disk::e2fsprogs_tool;

/// The most free space a build may ask for.
pub const MAX_MIN_FREE_MIB: u32 = 256 << 10;

/// An ext4 image's size and what a user may still write in it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub size: u64,
    pub free: u64,
}

/// Grows the ext4 image at `image` so that at least `min_free_mib` MiB of
/// it are free for a user (free blocks less those reserved for root);
/// returns its space before and after. An image that is another file's
/// link (a build cache layer) is copied first: the layer stays as it was.
pub fn ensure_free(image: &Path, min_free_mib: u32) -> Result<(Space, Space), String> {
    let before = space(image)?;
    let wanted = u64::from(min_free_mib) << 20;
    if before.free >= wanted {
        return Ok((before, before));
    }
    unlink_layer(image).map_err(|e| format!("copying the image before growing it: {e}"))?;
    // resize2fs spends part of what it adds on inode tables and group
    // descriptors (about 2 % at ext4's defaults): ask for a little more.
    let missing = wanted - before.free;
    let grow = (missing + missing / 25 + (16 << 20)).next_multiple_of(1 << 20);
    let size = before.size + grow;
    std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .and_then(|f| f.set_len(size).and_then(|()| f.sync_all()))
        .map_err(|e| format!("growing {}: {e}", image.display()))?;
    // resize2fs wants a file system checked since it was last mounted.
    run("e2fsck", &["-f", "-y"], image, &[0, 1])?;
    run("resize2fs", &[], image, &[0])?;
    let after = space(image)?;
    Ok((before, after))
}

/// The image's size and user-writable free space, from its superblock.
pub fn space(image: &Path) -> Result<Space, String> {
    let out = run("dumpe2fs", &["-h"], image, &[0])?;
    let field = |name: &str| -> Result<u64, String> {
        out.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{}: dumpe2fs shows no {name:?}", image.display()))
    };
    let block = field("Block size")?;
    let free = field("Free blocks")?.saturating_sub(field("Reserved block count")?);
    let size = std::fs::metadata(image)
        .map_err(|e| format!("{}: {e}", image.display()))?
        .len();
    Ok(Space {
        size,
        free: free.saturating_mul(block),
    })
}

/// Runs e2fsprogs' `tool` with `args` and the image; its standard output,
/// or an error with its last words when its status is not in `ok`.
fn run(tool: &str, args: &[&str], image: &Path, ok: &[i32]) -> Result<String, String> {
    let path =
        e2fsprogs_tool(tool).ok_or_else(|| format!("{tool}: not found (install e2fsprogs)"))?;
    let out = Command::new(&path)
        .args(args)
        .arg(image)
        .output()
        .map_err(|e| format!("{tool}: {e}"))?;
    match out.status.code() {
        Some(c) if ok.contains(&c) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Err(format!(
                "{tool} {}: {} ({last})",
                image.display(),
                out.status
            ))
        }
    }
}

/// A hard-linked image (the build cache's layer is the same file) made a
/// file of its own: copied sparse beside it and renamed over it.
fn unlink_layer(image: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    if std::fs::metadata(image)?.nlink() <= 1 {
        return Ok(());
    }
    let tmp = image.with_extension("ext4.grow");
    crate::fs::copy_sparse(image, &tmp)?;
    std::fs::rename(&tmp, image)?;
    crate::fs::sync_dir(image.parent().unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_grows_to_the_free_space_asked_and_its_layer_stays() {
        let Some(mkfs) = crate::code::disk::mkfs_ext4() else {
            eprintln!("no mkfs.ext4: skipped");
            return;
        };
        let dir = std::env::temp_dir().join(format!("spore-free-space-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let layer = dir.join("layer.ext4");
        let f = std::fs::File::create(&layer).unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let made = Command::new(mkfs)
            .args(["-q", "-F"])
            .arg(&layer)
            .status()
            .unwrap();
        assert!(made.success());
        let image = dir.join("rootfs.ext4");
        std::fs::hard_link(&layer, &image).unwrap();
        let (before, after) = ensure_free(&image, 100).unwrap();
        assert_eq!(before, space(&layer).unwrap());
        assert!(before.free < 100 << 20, "{before:?}");
        assert!(
            after.free >= 100 << 20 && after.size > before.size,
            "{after:?}"
        );
        // Already enough: nothing changes.
        assert_eq!(ensure_free(&image, 50).unwrap(), (after, after));
        // The layer it was linked to is untouched.
        assert_eq!(space(&layer).unwrap(), before);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
