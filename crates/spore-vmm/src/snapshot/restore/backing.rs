//! The files a restored VM's memory still depends on, and a check that they
//! have not changed since the restore.
//!
//! A lazily restored VM maps its snapshot's memory files privately: every
//! page the guest has not written yet is read from the file when touched,
//! and a userfaultfd handler reads pages from the files on demand too. If
//! such a file is truncated or rewritten in place, those pages are gone or
//! different (truncated pages read as a fault or vanish from the mapping),
//! and a snapshot of the VM would silently hold zeros. So the restore
//! records each file's identity, size and modification time
//! ([`Backing::record`]), and before every snapshot of the VM
//! [`Backing::check`] compares them with the open files: any change makes
//! the snapshot fail. A file *replaced* by a rename is harmless (the VM
//! holds the old inode open, whose contents do not change) and is not
//! refused.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// What is recorded of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(f: &File) -> std::io::Result<Self> {
        let md = f.metadata()?;
        Ok(Self {
            size: md.size(),
            mtime: md.mtime(),
            mtime_nsec: md.mtime_nsec(),
        })
    }
}

/// The memory files a restored VM depends on, each with its stamp at
/// restore time.
#[derive(Default)]
pub struct Backing {
    files: Vec<(File, Stamp)>,
}

impl Backing {
    /// Records `files` (duplicated descriptors: the caller keeps its own).
    pub fn record(files: &[File]) -> std::io::Result<Self> {
        let mut out = Vec::with_capacity(files.len());
        for f in files {
            out.push((f.try_clone()?, Stamp::of(f)?));
        }
        Ok(Self { files: out })
    }

    /// Fails, naming the file and what changed, if any recorded file was
    /// truncated, extended or modified since it was recorded.
    pub fn check(&self) -> Result<(), String> {
        for (f, then) in &self.files {
            // The file's name only for a message (checked before every
            // snapshot and clone request, which mostly find nothing).
            let name = || {
                std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "a snapshot memory file".into())
            };
            let now = Stamp::of(f).map_err(|e| format!("{}: {e}", name()))?;
            let what = if now.size != then.size {
                format!(
                    "its size changed from {} to {} bytes (truncated or extended)",
                    then.size, now.size
                )
            } else if (now.mtime, now.mtime_nsec) != (then.mtime, then.mtime_nsec) {
                "it was modified".to_string()
            } else {
                continue;
            };
            return Err(format!(
                "the memory file {} this microVM was restored from changed under it since \
                 the restore ({what}): memory the guest had not touched yet is lost, so a \
                 snapshot or a clone of it would not hold the guest's memory; restore the VM \
                 again from an intact snapshot",
                name()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn truncation_and_writes_are_found_renames_are_not() {
        let dir = std::env::temp_dir().join(format!("spore-backing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("mem");
        std::fs::write(&p, vec![1u8; 8192]).unwrap();
        let f = File::open(&p).unwrap();
        let b = Backing::record(std::slice::from_ref(&f)).unwrap();
        assert!(b.check().is_ok());
        // Replaced by a rename: the VM keeps the old inode.
        std::fs::write(dir.join("new"), vec![2u8; 4096]).unwrap();
        std::fs::rename(dir.join("new"), &p).unwrap();
        assert!(b.check().is_ok());
        // Truncated in place.
        let f2 = File::options().write(true).open(&p).unwrap();
        let b2 = Backing::record(&[File::open(&p).unwrap()]).unwrap();
        f2.set_len(0).unwrap();
        let e = b2.check().unwrap_err();
        assert!(
            e.contains("from 4096 to 0 bytes") && e.contains("mem"),
            "{e}"
        );
        // Rewritten in place (same size).
        f2.set_len(4096).unwrap();
        let b3 = Backing::record(&[File::open(&p).unwrap()]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        f2.write_all_at(&[9], 10).unwrap();
        let e = b3.check().unwrap_err();
        assert!(e.contains("modified"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
