//! The host side of a network interface: a tap device opened by name.
//!
//! [`Tap::open`] runs on the main thread when the VM is built (or restored,
//! or a clone starts): opening `/dev/net/tun` and `TUNSETIFF` need the VMM
//! filter, and a name that cannot be opened must fail `InstanceStart`, not
//! the guest's activation. `TUNSETOFFLOAD` depends on what the driver
//! acked, so the worker thread (VMM filter too) sets it when it starts;
//! the vCPU thread that activates the device never touches the tap.
//!
//! The worker only sees a [`NetBackend`], so tests can use a socketpair.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use super::header::VNET_HDR_LEN;
use crate::config::MAX_TAP_NAME_LEN;

/// What the worker needs from the host side: whole frames (each with its
/// virtio-net header) in and out, non-blocking.
pub trait NetBackend: Send + 'static {
    /// Reads one frame into `buf`; `WouldBlock` when there is none.
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes one frame.
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<usize>;
    /// The fd the worker waits on for frames to read.
    fn fd(&self) -> RawFd;
    /// Tells the host which offloads the guest accepts on rx (`TUN_F_*`).
    fn set_offload(&mut self, _tun_flags: u32) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(#[source] io::Error),
    #[error("tap name {0:?} is longer than {MAX_TAP_NAME_LEN} bytes")]
    NameTooLong(String),
    #[error(
        "tap device {0}: this clone was given fewer /dev/net/tun descriptors than it has taps"
    )]
    NoTunGiven(String),
    #[error("tap device {name} is in use by another process or interface (EBUSY)")]
    Busy { name: String },
    #[error("not allowed to open tap device {name} (needs CAP_NET_ADMIN, or a tap owned by this user): {source}")]
    Permission {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot open tap device {name}: {source}")]
    SetIff {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("tap device {name}: cannot set its virtio-net header size: {source}")]
    VnetHdr {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags, in a
/// 40-byte union.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open tap device (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking).
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Opens the tap called `name` with 12-byte virtio-net headers.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        if name.len() > MAX_TAP_NAME_LEN {
            return Err(TapError::NameTooLong(name.into()));
        }
        let file = match crate::privilege::take_tun() {
            // A VMM that became an unprivileged user opened it before, or a
            // clone was given it, opened in its namespace.
            Some(file) => file,
            None if crate::privilege::tuns_given() => {
                return Err(TapError::NoTunGiven(name.into()))
            }
            None => {
                // SAFETY: a constant NUL-terminated path; the result is checked.
                let fd = unsafe {
                    libc::open(
                        c"/dev/net/tun".as_ptr(),
                        libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err(TapError::OpenTun(io::Error::last_os_error()));
                }
                // SAFETY: `fd` is a fresh fd owned by nobody else.
                unsafe { File::from_raw_fd(fd) }
            }
        };
        #[allow(
            clippy::cast_possible_truncation,
            reason = "IFF_TAP | IFF_NO_PI | IFF_VNET_HDR is 0x5002"
        )]
        let mut req = IfReqFlags {
            name: [0; 16],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads (and may write) a 40-byte ifreq, which `req` is.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
        if r < 0 {
            let source = io::Error::last_os_error();
            let name = name.to_string();
            return Err(match source.raw_os_error() {
                Some(libc::EBUSY) => TapError::Busy { name },
                Some(libc::EPERM) | Some(libc::EACCES) => TapError::Permission { name, source },
                _ => TapError::SetIff { name, source },
            });
        }
        #[allow(clippy::cast_possible_truncation, reason = "VNET_HDR_LEN is 12")]
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ as _, &hdr_len) };
        if r < 0 {
            return Err(TapError::VnetHdr {
                name: name.into(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(Tap {
            file,
            name: name.into(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl NetBackend for Tap {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut self.file, buf)
    }

    fn write_frame(&mut self, frame: &[u8]) -> io::Result<usize> {
        // writev: the header and frame go out as one packet either way.
        io::Write::write_vectored(&mut self.file, &[io::IoSlice::new(frame)])
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn set_offload(&mut self, tun_flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD as _,
                libc::c_ulong::from(tun_flags),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// One end of a datagram socketpair standing in for a tap (tests and the
/// fuzz targets): one datagram per frame, header included.
#[cfg(any(test, feature = "fuzzing"))]
pub struct SocketBackend(pub std::os::unix::net::UnixDatagram);

#[cfg(any(test, feature = "fuzzing"))]
impl SocketBackend {
    /// The backend (non-blocking) and the host's end of the pair.
    pub fn pair() -> io::Result<(SocketBackend, std::os::unix::net::UnixDatagram)> {
        let (ours, host) = std::os::unix::net::UnixDatagram::pair()?;
        ours.set_nonblocking(true)?;
        Ok((SocketBackend(ours), host))
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl NetBackend for SocketBackend {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.recv(buf)
    }
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<usize> {
        self.0.send(frame)
    }
    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The tap offloads matching the guest's acked rx features: the tap may
/// then hand us frames with partial checksums or GSO, which the guest
/// accepts as they are.
pub fn tun_offload_flags(acked_features: u64) -> u32 {
    use virtio_bindings::virtio_net::{
        VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_GUEST_UFO,
    };
    let acked = |bit: u32| acked_features & (1 << bit) != 0;
    let mut flags = 0;
    if acked(VIRTIO_NET_F_GUEST_CSUM) {
        flags |= libc::TUN_F_CSUM;
        // GSO frames always come with partial checksums: only with CSUM.
        if acked(VIRTIO_NET_F_GUEST_TSO4) {
            flags |= libc::TUN_F_TSO4;
        }
        if acked(VIRTIO_NET_F_GUEST_TSO6) {
            flags |= libc::TUN_F_TSO6;
        }
        if acked(VIRTIO_NET_F_GUEST_UFO) {
            flags |= libc::TUN_F_UFO;
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloads_follow_the_acked_features() {
        use virtio_bindings::virtio_net::*;
        assert_eq!(tun_offload_flags(0), 0);
        let all = 1 << VIRTIO_NET_F_GUEST_CSUM
            | 1 << VIRTIO_NET_F_GUEST_TSO4
            | 1 << VIRTIO_NET_F_GUEST_TSO6
            | 1 << VIRTIO_NET_F_GUEST_UFO;
        assert_eq!(
            tun_offload_flags(all),
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO
        );
        // TSO without checksum offload is not offered to the tap.
        assert_eq!(tun_offload_flags(1 << VIRTIO_NET_F_GUEST_TSO4), 0);
    }

    #[test]
    fn long_names_are_refused_before_any_syscall() {
        assert!(matches!(
            Tap::open("sixteen-bytes-xx"),
            Err(TapError::NameTooLong(_))
        ));
    }
}
