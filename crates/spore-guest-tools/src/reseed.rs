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
use std::time::Duration;

pub use spore_abi::signal::GENERATION_VSOCK_PORT;

use crate::netid;
use crate::vsock::VsockListener;

/// Bytes added per reseed: 512 bits, the size of ChaCha's state in the kernel's CRNG.
pub const RESEED_BYTES: usize = 64;

/// The hardware RNG a notice reseeds from, and the pool it feeds.
pub const HWRNG: &str = "/dev/hwrng";
pub const POOL: &str = "/dev/urandom";
/// A notice is a generation line and two lines per interface.
pub const MAX_NOTICE: u64 = 16 * 1024;

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
/// holding `bytes` (at most 256 MiB: the bit count is an int), all of whose
/// bits are credited.
pub fn rand_pool_info(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + bytes.len().next_multiple_of(4));
    // The callers' buffers are a few dozen bytes (RESEED_BYTES).
    let buf_size = i32::try_from(bytes.len()).expect("entropy buffer under 256 MiB");
    let entropy_bits = buf_size
        .checked_mul(8)
        .expect("entropy buffer under 256 MiB");
    v.extend_from_slice(&entropy_bits.to_ne_bytes());
    v.extend_from_slice(&buf_size.to_ne_bytes());
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
    let rc = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            crate::ioctl::request(RNDADDENTROPY),
            info.as_ptr(),
        )
    };
    if rc < 0 {
        return Err(ReseedError::AddEntropy {
            path: shown(pool),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: an argument-less ioctl on our own fd.
    let crng_reseeded =
        unsafe { libc::ioctl(f.as_raw_fd(), crate::ioctl::request(RNDRESEEDCRNG)) } == 0;
    Ok(Reseeded {
        bytes: got,
        crng_reseeded,
    })
}

/// Accepts generation notices on [`GENERATION_VSOCK_PORT`] forever and
/// hands each one's bytes to `on_notice` (`spore-reseed`, and `spore-agent`
/// as PID 1 of a function guest). Returns only if the port cannot be used.
pub fn watch_notices(mut on_notice: impl FnMut(&[u8])) -> Result<(), String> {
    let listener = VsockListener::bind(GENERATION_VSOCK_PORT)
        .map_err(|e| format!("vsock port {GENERATION_VSOCK_PORT}: {e}"))?;
    loop {
        let mut conn = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("accept: {e}")),
        };
        // The VMM sends a few short lines and closes. A connection reset by a
        // racing transport reset still means "cloned": reseed anyway.
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut msg = Vec::new();
        let _ = (&mut conn).take(MAX_NOTICE).read_to_end(&mut msg);
        drop(conn);
        on_notice(&msg);
    }
}

/// Reseeds once from [`HWRNG`], logging what it did; with a generation,
/// records it in `/run/spore-generation`.
pub fn reseed_once(generation: Option<u64>) -> Result<(), String> {
    let r = reseed(Path::new(HWRNG), Path::new(POOL), RESEED_BYTES).map_err(|e| e.to_string())?;
    let which = generation.map_or_else(|| "now".to_string(), |g| format!("generation {g}"));
    println!(
        "spore-reseed: {which}: added {} bytes ({} bits) from {HWRNG}, {}",
        r.bytes,
        r.bytes * 8,
        if r.crng_reseeded {
            "CRNG reseeded"
        } else {
            "CRNG NOT reseeded (RNDRESEEDCRNG failed; it rekeys within a minute)"
        }
    );
    if let Some(g) = generation {
        let _ = std::fs::create_dir_all("/run");
        let _ = std::fs::write("/run/spore-generation", format!("{g}\n"));
    }
    Ok(())
}

/// What a notice asks, done: reseed, then the new network identity, each
/// logged on the console.
pub fn handle_notice(msg: &[u8]) {
    let notice = netid::parse(msg).unwrap_or_else(|e| {
        eprintln!(
            "spore-reseed: notice {:?}: {e}; reseeding only",
            String::from_utf8_lossy(msg)
        );
        netid::Notice::default()
    });
    if let Err(e) = reseed_once(notice.generation) {
        eprintln!("spore-reseed: {e}");
    }
    if let Some(t) = notice.time {
        match step_clock(t) {
            Ok(delta) => println!("spore-reseed: clock stepped to the host's ({delta:+.3} s)"),
            Err(e) => eprintln!("spore-reseed: cannot step the clock: {e}"),
        }
    }
    for line in &notice.unknown {
        eprintln!("spore-reseed: ignored notice line '{line}'");
    }
    if !notice.interfaces.is_empty() {
        let _ = apply_net(msg, &notice);
    }
}

/// Sets `CLOCK_REALTIME` to `(secs, nanos)` (the host's time in a notice):
/// a guest restored or cloned from a snapshot wakes with the snapshot's wall
/// clock. Returns how far the clock moved, in seconds.
pub fn step_clock((secs, nanos): (i64, u32)) -> Result<f64, String> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    let target = libc::timespec {
        tv_sec: secs,
        tv_nsec: nanos as libc::c_long,
    };
    // SAFETY: clock_settime reads one valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &target) } != 0 {
        return Err(format!(
            "{} (needs root: CAP_SYS_TIME)",
            io::Error::last_os_error()
        ));
    }
    Ok((secs - now.tv_sec) as f64 + (nanos as f64 - now.tv_nsec as f64) / 1e9)
}

/// Applies a notice's interface lines; logs each; fails if any failed.
pub fn apply_net(msg: &[u8], notice: &netid::Notice) -> Result<(), String> {
    let mut failed = 0;
    for r in netid::apply(notice) {
        match r {
            Ok(s) => println!("spore-reseed: {s}"),
            Err(e) => {
                eprintln!("spore-reseed: {e}");
                failed += 1;
            }
        }
    }
    // Written after the changes: its presence says they were applied.
    let _ = std::fs::create_dir_all("/run");
    let _ = std::fs::write("/run/spore-net", msg);
    if failed > 0 {
        return Err(format!("{failed} interface(s) not configured"));
    }
    Ok(())
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
