//! The host-wide tmem cap: one budget shared by every VMM process on the
//! host, so that many VMs' pools together never hold more than the cap.
//!
//! **Where the budget lives.** One file, `<dir>/tmem-host-cap` (0600; `dir`
//! is `$SPORE_TMEM_HOST_DIR`, else `/run/spore`): a lock byte, then
//! [`MAX_VMMS`] slots of 8 bytes, each the bytes one VMM has reserved. A VMM
//! claims a free slot when its pool is built and holds an OFD write lock on
//! that slot's bytes for as long as it lives.
//!
//! **Why it survives `kill -9`.** An OFD lock belongs to the open file and
//! goes away when the process's last descriptor closes, however it ends. A
//! slot whose lock nobody holds is free: its number counts for nothing and
//! the next VMM to claim it zeroes it. So a killed VMM's share comes back
//! at once, with no cleanup step and no stale counter (a shared counter
//! decremented by its owners would leak what a killed owner held).
//!
//! **Cost.** Reserving means taking the lock byte, reading the slots (one
//! `pread`), asking which of the non-zero ones are held (`F_OFD_GETLK`), and
//! writing ours: a few syscalls on the vCPU thread, done per [`GRANULE`] of
//! growth, not per put. Shrinking gives granules back only when two are
//! unused, so a guest hovering around a boundary does not thrash.
//! Everything is `fcntl`, `pread64` and `pwrite64` on a descriptor opened
//! when the pool was built: nothing the vCPU thread's seccomp filter must
//! allow beyond those.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The environment variable with the host's cap (bytes, or with a K/M/G
/// suffix); the lower of it and the configured `tmem.host_cap_bytes` wins.
pub const HOST_CAP_ENV: &str = "SPORE_TMEM_HOST_CAP";
/// The environment variable naming the directory of the shared file.
pub const HOST_DIR_ENV: &str = "SPORE_TMEM_HOST_DIR";
pub const DEFAULT_HOST_DIR: &str = "/run/spore";
const FILE_NAME: &str = "tmem-host-cap";
/// VMMs that can share one cap at a time.
pub const MAX_VMMS: usize = 4096;
/// Reservations move by this much.
pub const GRANULE: u64 = 4 << 20;
const SLOTS_AT: u64 = 8;

#[derive(Debug, thiserror::Error)]
pub enum HostCapError {
    #[error("the tmem host cap file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the tmem host cap file {0} has no free slot: {MAX_VMMS} VMMs already share it")]
    Full(String),
    #[error("{HOST_CAP_ENV}={0:?} is not a size (bytes, or a number with K, M or G)")]
    BadEnv(String),
    #[error("the pool holds {need} bytes but the host's tmem cap ({cap} bytes) leaves {left} (other VMMs hold the rest)")]
    NoRoom { need: u64, cap: u64, left: u64 },
}

/// The cap in force: the lower of `configured` and [`HOST_CAP_ENV`].
pub fn effective_cap(configured: Option<u64>) -> Result<Option<u64>, HostCapError> {
    let env = match std::env::var(HOST_CAP_ENV) {
        Ok(v) => Some(parse_size(&v).ok_or(HostCapError::BadEnv(v))?),
        Err(_) => None,
    };
    Ok(match (configured, env) {
        (Some(c), Some(e)) => Some(c.min(e)),
        (c, e) => c.or(e),
    })
}

/// `123`, `64K`, `512M`, `2G` (powers of 1024).
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The shared file's directory: [`HOST_DIR_ENV`], else [`DEFAULT_HOST_DIR`].
pub fn host_dir() -> PathBuf {
    std::env::var_os(HOST_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_HOST_DIR.into())
}

/// This VMM's claim on the host's budget.
pub struct HostCap {
    file: File,
    path: String,
    slot: usize,
    cap: u64,
    /// What our slot holds.
    reserved: u64,
    /// Puts refused for the host's cap (not the VM's own quota).
    pub refused: u64,
}

impl std::fmt::Debug for HostCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCap")
            .field("path", &self.path)
            .field("slot", &self.slot)
            .field("cap", &self.cap)
            .field("reserved", &self.reserved)
            .finish()
    }
}

fn slot_at(slot: usize) -> u64 {
    SLOTS_AT + 8 * slot as u64
}

/// An OFD lock request on `[start, start + len)`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "kind is F_RDLCK, F_WRLCK or F_UNLCK (0 to 2) and SEEK_SET is 0: all fit c_short"
)]
fn flock_of(kind: i32, start: u64, len: u64) -> libc::flock {
    // SAFETY: a plain C struct; all zeros is a valid value (l_pid must be 0
    // for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl
}

fn fcntl_lock(file: &File, cmd: i32, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `fl` is a valid flock for the duration of the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Holds the file's lock byte until dropped.
struct Global<'a>(&'a File);

impl<'a> Global<'a> {
    fn take(file: &'a File) -> io::Result<Self> {
        let mut fl = flock_of(libc::F_WRLCK, 0, 1);
        loop {
            match fcntl_lock(file, libc::F_OFD_SETLKW, &mut fl) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map(|()| Global(file)),
            }
        }
    }
}

impl Drop for Global<'_> {
    fn drop(&mut self) {
        let mut fl = flock_of(libc::F_UNLCK, 0, 1);
        let _ = fcntl_lock(self.0, libc::F_OFD_SETLK, &mut fl);
    }
}

impl HostCap {
    /// Claims a slot in `<dir>/tmem-host-cap` (created if missing) under a
    /// cap of `cap` bytes, with nothing reserved yet.
    pub fn open(dir: &Path, cap: u64) -> Result<Self, HostCapError> {
        let path = dir.join(FILE_NAME);
        let name = path.display().to_string();
        let io = |source| HostCapError::Io {
            path: name.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(io(io::Error::other("not a regular file")));
        }
        let size = slot_at(MAX_VMMS);
        let _g = Global::take(&file).map_err(io)?;
        if meta.len() < size {
            file.set_len(size).map_err(io)?;
        }
        for slot in 0..MAX_VMMS {
            let mut fl = flock_of(libc::F_WRLCK, slot_at(slot), 8);
            match fcntl_lock(&file, libc::F_OFD_SETLK, &mut fl) {
                Ok(()) => {
                    // Free: whatever a dead owner left there counts no more.
                    file.write_all_at(&0u64.to_le_bytes(), slot_at(slot))
                        .map_err(io)?;
                    drop(_g);
                    return Ok(Self {
                        file,
                        path: name,
                        slot,
                        cap,
                        reserved: 0,
                        refused: 0,
                    });
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {}
                Err(e) => return Err(io(e)),
            }
        }
        Err(HostCapError::Full(name))
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// What the other live VMMs hold; call under the lock byte.
    fn others(&self) -> io::Result<u64> {
        let mut buf = vec![0u8; 8 * MAX_VMMS];
        self.file.read_exact_at(&mut buf, SLOTS_AT)?;
        let mut total = 0u64;
        for (slot, v) in buf.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(v);
            let bytes = u64::from_le_bytes(w);
            if slot == self.slot || bytes == 0 {
                continue;
            }
            // Counted only while its owner lives (holds the slot's lock).
            let mut fl = flock_of(libc::F_WRLCK, slot_at(slot), 8);
            fcntl_lock(&self.file, libc::F_OFD_GETLK, &mut fl)?;
            if i32::from(fl.l_type) != libc::F_UNLCK {
                total = total.saturating_add(bytes);
            }
        }
        Ok(total)
    }

    /// Writes our slot; call under the lock byte.
    fn write_own(&self, bytes: u64) -> io::Result<()> {
        self.file
            .write_all_at(&bytes.to_le_bytes(), slot_at(self.slot))
    }

    /// Makes sure at least `need` bytes are reserved for this VMM: `Ok(())`,
    /// or how much room there is when the others leave too little.
    pub fn ensure(&mut self, need: u64) -> Result<(), HostCapError> {
        if need <= self.reserved {
            return Ok(());
        }
        let io = |source| HostCapError::Io {
            path: self.path.clone(),
            source,
        };
        let g = Global::take(&self.file).map_err(io)?;
        let left = self.cap.saturating_sub(self.others().map_err(io)?);
        if need > left {
            return Err(HostCapError::NoRoom {
                need,
                cap: self.cap,
                left,
            });
        }
        let target = need.div_ceil(GRANULE).saturating_mul(GRANULE).min(left);
        self.write_own(target).map_err(io)?;
        drop(g);
        self.reserved = target;
        Ok(())
    }

    /// Gives back whole granules once two or more are unused by `used`.
    pub fn shrink(&mut self, used: u64) {
        if self.reserved < used.saturating_add(2 * GRANULE) {
            return;
        }
        let target = used.div_ceil(GRANULE) * GRANULE;
        let Ok(g) = Global::take(&self.file) else {
            return;
        };
        match self.write_own(target) {
            Ok(()) => {
                drop(g);
                self.reserved = target;
            }
            Err(e) => tracing::warn!("tmem host cap {}: giving bytes back: {e}", self.path),
        }
    }

    /// Ends this claim as `kill -9` would: the descriptor closes, the
    /// number stays in the file.
    #[cfg(test)]
    fn die(self) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; only its file is.
        drop(unsafe { std::ptr::read(&me.file) });
    }
}

impl Drop for HostCap {
    fn drop(&mut self) {
        // Not needed for correctness (the slot's lock goes with the file),
        // but leaves the file tidy for a reader.
        if let Ok(_g) = Global::take(&self.file) {
            let _ = self.write_own(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("spore-hostcap-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn vmms_share_one_cap_and_dead_ones_give_back() {
        let d = dir("share");
        let mut a = HostCap::open(&d, 20 << 20).unwrap();
        let mut b = HostCap::open(&d, 20 << 20).unwrap();
        assert_ne!(a.slot, b.slot);
        a.ensure(10 << 20).unwrap();
        assert_eq!(a.reserved(), 12 << 20); // whole granules
        assert!(matches!(
            b.ensure(9 << 20),
            Err(HostCapError::NoRoom { left, .. }) if left == 8 << 20
        ));
        b.ensure(7 << 20).unwrap();
        assert_eq!(b.reserved(), 8 << 20);
        // Shrinking gives granules back only past two unused ones.
        a.shrink(9 << 20);
        assert_eq!(a.reserved(), 12 << 20);
        a.shrink(1 << 20);
        assert_eq!(a.reserved(), 4 << 20);
        b.ensure(16 << 20).unwrap();
        // A VMM that ends (its descriptor closes) no longer counts, even
        // with its number left in the file (as after kill -9).
        let slot = a.slot;
        a.die();
        let f = std::fs::File::open(d.join(FILE_NAME)).unwrap();
        let mut w = [0u8; 8];
        f.read_exact_at(&mut w, slot_at(slot)).unwrap();
        assert_eq!(u64::from_le_bytes(w), 4 << 20, "left behind");
        b.ensure(20 << 20).unwrap();
        let c = HostCap::open(&d, 20 << 20).unwrap();
        assert_eq!(c.slot, slot, "the dead VMM's slot is reused");
        drop((b, c));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size(" 2G "), Some(2 << 30));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999G"), None);
    }
}
