//! Replacing a file so that readers see the old content or the new, never
//! part of it: the data goes to a temporary file next to the destination,
//! which is synced and then renamed over it. A write that fails or is
//! abandoned (the client went away) removes its temporary file.

use std::fs::OpenOptions;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

/// How temporary files start; watchers leave them out of their events.
pub const TEMP_PREFIX: &str = ".spore-upload.";

/// A file being written in place of `dest`.
pub struct AtomicFile {
    file: Option<tokio::fs::File>,
    temp: PathBuf,
    dest: PathBuf,
    len: u64,
    committed: bool,
}

/// A random 64-bit value (std's hasher keys are seeded from the OS).
pub(crate) fn random() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    hasher.finish()
}

/// `name`'s first bytes, at most `max`, on a character boundary.
fn truncated(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

fn create_temp(dest: &Path, owner: Option<(u32, u32)>) -> io::Result<(std::fs::File, PathBuf)> {
    let dir = dest.parent().unwrap_or(Path::new("/"));
    let base = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // An existing file keeps its permission bits (as an in-place write would).
    let keep_mode = match std::fs::metadata(dest) {
        Ok(m) if m.is_file() => Some(m.permissions().mode() & 0o7777),
        _ => None,
    };
    let mut attempts = 0;
    let (file, temp) = loop {
        // Stays within NAME_MAX (255) whatever the destination's name.
        let temp = dir.join(format!(
            "{TEMP_PREFIX}{:016x}.{}",
            random(),
            truncated(&base, 200)
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&temp)
        {
            Ok(file) => break (file, temp),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let handed_over = (|| {
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        // After the chown, which clears set-id bits.
        if let Some(mode) = keep_mode {
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    })();
    if let Err(e) = handed_over {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok((file, temp))
}

impl AtomicFile {
    /// Starts a file that will replace `dest` (whose directory exists),
    /// belonging to `owner` if given.
    pub async fn create(dest: PathBuf, owner: Option<(u32, u32)>) -> io::Result<AtomicFile> {
        let (file, temp, dest) = tokio::task::spawn_blocking(move || {
            create_temp(&dest, owner).map(|(file, temp)| (file, temp, dest))
        })
        .await
        .map_err(io::Error::other)??;
        Ok(AtomicFile {
            file: Some(tokio::fs::File::from_std(file)),
            temp,
            dest,
            len: 0,
            committed: false,
        })
    }

    pub async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("file already closed"))?;
        file.write_all(data).await?;
        self.len += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Syncs the data and puts the file in place.
    pub async fn commit(mut self) -> io::Result<()> {
        let mut file = self
            .file
            .take()
            .ok_or_else(|| io::Error::other("file already closed"))?;
        file.flush().await?;
        file.sync_all().await?;
        let file = file.into_std().await;
        let (temp, dest, len) = (self.temp.clone(), self.dest.clone(), self.len);
        tokio::task::spawn_blocking(move || {
            std::fs::rename(&temp, &dest)?;
            // A same-size truncate changes nothing but tells inotify the file
            // under its new name was written: watchers see WRITE on it, as
            // they do when E2B's envd writes in place.
            let _ = file.set_len(len);
            Ok::<_, io::Error>(())
        })
        .await
        .map_err(io::Error::other)??;
        self.committed = true;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let temp = std::mem::take(&mut self.temp);
        let file = self.file.take();
        let remove = move || {
            drop(file);
            let _ = std::fs::remove_file(&temp);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_committed_file_replaces_the_old_one_keeping_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        std::fs::write(&dest, b"old").unwrap();
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o750)).unwrap();
        let mut file = AtomicFile::create(dest.clone(), None).await.unwrap();
        file.write(b"new ").await.unwrap();
        file.write(b"content").await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(file.len(), 11);
        file.commit().await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new content");
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
            0o750
        );
        assert_eq!(names(dir.path()), ["f"]);
    }

    #[tokio::test]
    async fn an_abandoned_write_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("g");
        std::fs::write(&dest, b"keep").unwrap();
        let mut file = AtomicFile::create(dest.clone(), None).await.unwrap();
        file.write(&[7u8; 100_000]).await.unwrap();
        assert_eq!(names(dir.path()).len(), 2);
        drop(file);
        // The temporary file goes on the blocking pool.
        for _ in 0..100 {
            if names(dir.path()).len() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(names(dir.path()), ["g"]);
        assert_eq!(std::fs::read(&dest).unwrap(), b"keep");
        // A destination whose directory is missing fails at once.
        assert!(AtomicFile::create(dir.path().join("no/such"), None)
            .await
            .is_err());
    }

    #[test]
    fn long_names_are_cut_on_character_boundaries() {
        assert_eq!(truncated("héllo", 2), "h");
        assert_eq!(truncated("abc", 10), "abc");
    }
}
