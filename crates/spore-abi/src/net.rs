//! A guest's network identity as the VMM gives it, for the unikernel.
//!
//! The MAC address lives where virtio puts it (the virtio-net config space,
//! `VIRTIO_NET_F_MAC`); the IPv4 settings start on the command line
//! (`ip=A.B.C.D/P gw=A.B.C.D`). A clone may be given a new MAC and a new
//! address: the VMM rewrites the MAC in the device's config space and, for an
//! address, writes a [`NetIdentity`] at [`NET_IDENTITY_ADDR`], both before the
//! clone first runs, then changes the clone generation
//! ([`crate::boot::GENERATION_ADDR`]). A unikernel that sees its generation
//! change re-reads both: the MAC from config space, and this block, which
//! overrides the command line when its `magic` is [`NET_IDENTITY_MAGIC`].
//! A booted VM has zeros here.
//!
//! Linux guests learn the same through the generation notice over vsock
//! (`signal::GENERATION_VSOCK_PORT`): the notice's `mac` and `ipv4` lines.

use crate::boot::{BOOT_INFO_ADDR, GENERATION_ADDR};

/// "SPNI" as a little-endian u32.
pub const NET_IDENTITY_MAGIC: u32 = u32::from_le_bytes(*b"SPNI");

/// Guest-physical address of the block: the 32 bytes right below the
/// generation word, in the boot-info page.
pub const NET_IDENTITY_ADDR: u64 = GENERATION_ADDR - 32;

/// The IPv4 identity of interface `iface` (0: the first virtio-net device in
/// the boot info's device list). Addresses are in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetIdentity {
    pub magic: u32,
    pub iface: u32,
    pub ipv4: [u8; 4],
    pub prefix_len: u8,
    pub _pad: [u8; 3],
    pub gateway: [u8; 4],
    /// The MAC the VMM put in the config space (the same bytes), so that a
    /// guest can tell which identity this block belongs to.
    pub mac: [u8; 6],
    pub _pad2: [u8; 6],
}

impl NetIdentity {
    pub fn is_valid(&self) -> bool {
        self.magic == NET_IDENTITY_MAGIC && self.prefix_len <= 32
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C), integers and byte arrays with explicit padding
        // fields: every byte is initialised.
        unsafe {
            core::slice::from_raw_parts(
                core::ptr::from_ref(self).cast::<u8>(),
                core::mem::size_of::<Self>(),
            )
        }
    }
}

const _: () = assert!(core::mem::size_of::<NetIdentity>() == 32);
const _: () = assert!(NET_IDENTITY_ADDR + 32 == GENERATION_ADDR);
const _: () = assert!(NET_IDENTITY_ADDR > BOOT_INFO_ADDR);
