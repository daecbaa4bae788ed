//! Reseeding the Linux kernel's random pool after a clone (`spore-reseed`).
//!
//! A clone starts with its source's kernel entropy pool, so without a
//! reseed every clone's `/dev/urandom` produces the same bytes. The VMM tells
//! the guest it was cloned by connecting to vsock port
//! [`GENERATION_VSOCK_PORT`] (see `spore_abi::signal`); on each notice this
//! reads fresh bytes from `/dev/hwrng` (virtio-rng, i.e. the host's kernel
//! RNG) and adds them to the pool with `RNDADDENTROPY`, crediting their
//! entropy, then rekeys the CRNG with `RNDRESEEDCRNG` (added entropy alone
//! reaches `/dev/urandom` only at the CRNG's next periodic reseed). Unlike
//! HyperFork's helper (which wrote 0 bytes), every reseed reports how many
//! bytes went in, and 0 is an error.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::Path;

pub use spore_abi::signal::GENERATION_VSOCK_PORT;

/// Bytes added per reseed: 512 bits, the size of ChaCha's state in the kernel's CRNG.
pub const RESEED_BYTES: usize = 64;

/// `RNDADDENTROPY` = `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG` = `_IO('R', 0x07)` (Linux 4.17+).
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// What one reseed did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reseeded {
    /// Bytes read from the hardware RNG and added (all credited).
    pub bytes: usize,
    /// Whether the kernel's CRNG was rekeyed from the pool at once.
    /// Adding entropy alone does not rekey a CRNG that is already
    /// initialised (it waits for its periodic reseed, up to a minute), so
    /// until then a clone's /dev/urandom could still follow its source's.
    pub crng_reseeded: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReseedError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} gave no bytes: nothing to reseed with")]
    Empty { path: String },
    #[error("RNDADDENTROPY on {path}: {source} (needs root: CAP_SYS_ADMIN)")]
    AddEntropy {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The generation in a notice (`generation N\n`), if it is one.
pub fn parse_notice(msg: &[u8]) -> Option<u64> {
    std::str::from_utf8(msg)
        .ok()?
        .trim()
        .strip_prefix("generation ")?
        .parse()
        .ok()
}

/// `struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }`
/// holding `bytes`, all of whose bits are credited.
pub fn rand_pool_info(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + bytes.len().next_multiple_of(4));
    v.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    v.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    v.extend_from_slice(bytes);
    // `buf` is an array of u32: pad to a whole number of them.
    v.resize(8 + bytes.len().next_multiple_of(4), 0);
    v
}

/// Reads up to `n` bytes from `source` (a hardware RNG), adds them to the
/// kernel pool through `pool` (`/dev/urandom`) and asks the kernel to rekey
/// its CRNG from the pool right away.
pub fn reseed(source: &Path, pool: &Path, n: usize) -> Result<Reseeded, ReseedError> {
    let shown = |p: &Path| p.display().to_string();
    let mut rng = File::open(source).map_err(|e| ReseedError::Open {
        path: shown(source),
        source: e,
    })?;
    let mut buf = vec![0u8; n];
    // /dev/hwrng may return fewer bytes than asked; take what one read gives
    // after a second try, never block forever on a short device.
    let mut got = 0;
    for _ in 0..4 {
        if got == n {
            break;
        }
        match rng.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(ReseedError::Read {
                    path: shown(source),
                    source: e,
                })
            }
        }
    }
    if got == 0 {
        return Err(ReseedError::Empty {
            path: shown(source),
        });
    }
    let info = rand_pool_info(&buf[..got]);
    buf.fill(0);
    let f = File::options()
        .write(true)
        .open(pool)
        .map_err(|e| ReseedError::Open {
            path: shown(pool),
            source: e,
        })?;
    // SAFETY: `info` is a valid rand_pool_info whose buf_size bytes follow
    // the header; the kernel only reads it.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) };
    if rc < 0 {
        return Err(ReseedError::AddEntropy {
            path: shown(pool),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: an argument-less ioctl on our own fd.
    let crng_reseeded = unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) } == 0;
    Ok(Reseeded {
        bytes: got,
        crng_reseeded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_and_pool_info() {
        assert_eq!(parse_notice(b"generation 7\n"), Some(7));
        assert_eq!(parse_notice(b"generation x"), None);
        assert_eq!(parse_notice(b"\xff"), None);
        assert_eq!(parse_notice(b""), None);
        let info = rand_pool_info(&[1, 2, 3, 4, 5]);
        assert_eq!(info.len(), 16);
        assert_eq!(&info[0..4], &40i32.to_ne_bytes());
        assert_eq!(&info[4..8], &5i32.to_ne_bytes());
        assert_eq!(&info[8..13], &[1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_source_without_bytes_is_an_error() {
        let empty = std::env::temp_dir().join(format!("spore-reseed-empty-{}", std::process::id()));
        std::fs::write(&empty, b"").unwrap();
        let r = reseed(&empty, Path::new("/dev/urandom"), 16);
        assert!(matches!(r, Err(ReseedError::Empty { .. })), "{r:?}");
        let _ = std::fs::remove_file(&empty);
        assert!(matches!(
            reseed(
                Path::new("/nonexistent/hwrng"),
                Path::new("/dev/urandom"),
                16
            ),
            Err(ReseedError::Open { .. })
        ));
    }

    /// As root (CI, this machine), the ioctl really adds the bytes.
    #[test]
    fn adds_entropy_as_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: RNDADDENTROPY cannot be checked here");
            return;
        }
        let r = reseed(
            Path::new("/dev/urandom"),
            Path::new("/dev/urandom"),
            RESEED_BYTES,
        )
        .unwrap();
        assert_eq!(r.bytes, RESEED_BYTES);
        assert!(r.crng_reseeded, "RNDRESEEDCRNG failed as root");
    }
}
