//! virtio-blk: a disk backed by a raw image file, or by a read-only base
//! image plus a copy-on-write overlay (virtio 1.2, §5.2).
//!
//! - [`backend`]: the image file and the I/O between it and guest memory.
//! - [`overlay`]: copy-on-write overlays (base + sparse block overlay) and
//!   [`overlay::clone_drive`].
//! - [`disk`]: the [`disk::Disk`] a device serves (raw or copy-on-write) and
//!   the [`BlockHandle`] that switches it to copy-on-write in place.
//! - [`request`]: the guest's request format, parsed and validated in one place.
//! - [`device`]: the [`Block`] device model and its worker thread.
//!
//! One queue of [`QUEUE_SIZE`] entries; IN, OUT, FLUSH and GET_ID requests.
//! Guest data never passes through a host buffer sized by the guest: it moves
//! between the image file and guest memory directly.

pub mod async_io;
pub mod backend;
pub mod device;
pub mod disk;
pub mod overlay;
pub mod persist;
pub mod request;

use std::path::PathBuf;

pub use device::Block;
pub use disk::{BlockHandle, FreezeError, UpdateError};
pub use persist::{BlockState, BlockStateError};

/// Bytes per virtio-blk sector, whatever the image's real block size.
pub const SECTOR_SIZE: u64 = 512;
/// Entries in the device's only queue.
pub const QUEUE_SIZE: u16 = 256;
/// Length of the serial returned by GET_ID.
pub const ID_BYTES: usize = virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES as usize;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("drive image {path} does not exist")]
    NotFound { path: PathBuf },
    #[error("permission denied opening drive image {path} for {mode}; fix the file's permissions or make the drive read-only")]
    PermissionDenied { path: PathBuf, mode: &'static str },
    #[error("cannot open drive image {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("drive image {}: {detail}", path.display())]
    NotAFile { path: PathBuf, detail: String },
    #[error("cannot determine the size of drive image {path}: {source}")]
    Size {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("drive image {path} is empty")]
    Empty { path: PathBuf },
    #[error("drive image {path} is {size} bytes, not a multiple of 512; pad or truncate it to whole sectors")]
    NotSectorMultiple { path: PathBuf, size: u64 },
    #[error(transparent)]
    Overlay(#[from] overlay::OverlayError),
    #[error("cannot create the drive's rate limiter timer: {0}")]
    Timer(#[source] std::io::Error),
    #[error("io_engine \"Async\": cannot set up an io_uring: {0}")]
    Async(#[source] std::io::Error),
}

#[cfg(test)]
mod tests;
