//! Polled virtio-mmio drivers.
//!
//! The unikernel takes no interrupts: a driver adds buffers to its queues,
//! notifies the device, and later polls the used rings. When nothing is left
//! to do an app sleeps in the signal port's `wait`, which the VMM ends when a
//! device raises its (unseen) interrupt.
//!
//! - [`mmio`]: the virtio 1.x mmio register file, device status and feature
//!   negotiation, queue registration ([`mmio::Transport`]).
//! - [`queue`]: split virtqueues in guest memory ([`queue::VirtQueue`]).
//! - [`vsock`]: the virtio-vsock driver (stream sockets, host-initiated).
//! - [`mem`]: the virtio-mem driver (plug/unplug blocks of the hotplug region).
//! - [`rng`]: the virtio-rng driver (host entropy for [`crate::random`]).
//! - [`blk`]: a minimal virtio-blk driver (read, write, flush of sectors).
//! - [`net`]: the virtio-net driver (Ethernet frames for [`crate::net`]'s
//!   TCP/IP stack).
//!
//! A new driver (balloon, mem) finds its device with [`find_device`], calls
//! [`mmio::Transport::init`] with the features it understands, sets up its
//! queues with [`mmio::Transport::setup_queue`] and finishes with
//! [`mmio::Transport::driver_ok`].
//!
//! All RAM is identity-mapped, so a buffer's pointer is its guest-physical
//! address, which is what descriptors carry.

pub mod blk;
pub mod mem;
pub mod mmio;
pub mod net;
pub mod queue;
pub mod rng;
pub mod vsock;

use core::fmt;

use spore_abi::boot::MmioDevice;

use crate::BootInfo;

/// Virtio device ids (virtio 1.2 §5).
pub mod device_id {
    pub const NET: u32 = 1;
    pub const BLOCK: u32 = 2;
    pub const RNG: u32 = 4;
    pub const BALLOON: u32 = 5;
    pub const VSOCK: u32 = 19;
    pub const MEM: u32 = 24;
}

/// Why a driver could not bring its device up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtioError {
    /// The boot info lists no device of this id.
    NoDevice(u32),
    /// The registers at this base do not say "virt", version 2.
    NotVirtio { base: u64, magic: u32, version: u32 },
    /// The device id in the registers differs from the boot info.
    WrongDevice {
        base: u64,
        expected: u32,
        found: u32,
    },
    /// The device did not accept the features the driver needs.
    FeaturesRefused(u64),
    /// The device offers no queue `index`, or a smaller one than needed.
    QueueUnavailable { index: u16, max: u32 },
    /// The heap could not hold the queue or the driver's buffers.
    OutOfMemory,
}

impl fmt::Display for VirtioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NoDevice(id) => write!(
                f,
                "no virtio-mmio device with id {id} in the boot info (give the VM one, e.g. --vsock CID:PATH)"
            ),
            Self::NotVirtio { base, magic, version } => write!(
                f,
                "device at {base:#x} is not virtio-mmio version 2 (magic {magic:#x}, version {version})"
            ),
            Self::WrongDevice { base, expected, found } => {
                write!(f, "device at {base:#x} has id {found}, boot info says {expected}")
            }
            Self::FeaturesRefused(feat) => {
                write!(f, "the device refused features {feat:#x}")
            }
            Self::QueueUnavailable { index, max } => {
                write!(f, "virtqueue {index} unavailable (device maximum size {max})")
            }
            Self::OutOfMemory => write!(f, "out of heap memory for virtio queues or buffers"),
        }
    }
}

/// The first device with `device_id` in the boot info.
pub fn find_device(info: &BootInfo, device_id: u32) -> Option<MmioDevice> {
    info.mmio_devices()
        .iter()
        .copied()
        .find(|d| d.device_id == device_id)
}
