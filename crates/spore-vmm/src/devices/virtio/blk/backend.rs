//! The raw disk image behind a virtio-blk device.
//!
//! A [`DiskImage`] is a regular file (or block device) whose bytes are the
//! disk, sector 0 first. It moves data straight between the file and guest
//! memory, never through a host buffer sized by the guest. Callers pass
//! segments that [`super::request`] already validated; this module re-checks
//! nothing about the guest but reports every failure as an error, never a panic.

use std::fs::File;
use std::io::{ErrorKind, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use vm_memory::{GuestMemory, GuestMemoryError, Permissions, ReadVolatile, WriteVolatile};

use super::request::Segment;
use super::{BlockError, SECTOR_SIZE};
use crate::devices::virtio::GuestMemoryMmap;

/// Why a disk operation failed; the guest sees VIRTIO_BLK_S_IOERR.
#[derive(Debug, thiserror::Error)]
pub enum DiskIoError {
    #[error("sector {0} is beyond the addressable range")]
    Offset(u64),
    #[error("cannot seek the disk image: {0}")]
    Seek(#[source] std::io::Error),
    #[error("guest memory: {0}")]
    Memory(#[from] GuestMemoryError),
    #[error("disk image I/O: {0}")]
    Io(#[from] vm_memory::VolatileMemoryError),
    #[error("cannot flush the disk image: {0}")]
    Flush(#[source] std::io::Error),
    #[error("copy-on-write disk: {0}")]
    Cow(#[source] super::overlay::CowIoError),
    #[error("io_uring: {0}")]
    Async(#[source] std::io::Error),
}

#[derive(Debug)]
pub struct DiskImage {
    file: File,
    path: PathBuf,
    capacity_sectors: u64,
    read_only: bool,
    durable_flush: bool,
}

impl DiskImage {
    /// Opens `path` read-only or read-write and sizes it.
    pub fn open(path: &Path, read_only: bool, durable_flush: bool) -> Result<Self, BlockError> {
        let path_buf = path.to_path_buf();
        // A drive is a regular file or a block device; a FIFO would block.
        let file =
            crate::files::open_checked(path, !read_only, crate::files::Expect::RegularOrBlock)
                .map_err(|source| match source.kind() {
                    ErrorKind::NotFound => BlockError::NotFound {
                        path: path_buf.clone(),
                    },
                    ErrorKind::PermissionDenied => BlockError::PermissionDenied {
                        path: path_buf.clone(),
                        mode: if read_only {
                            "reading"
                        } else {
                            "reading and writing"
                        },
                    },
                    // A FIFO, a character device, a directory: named as such.
                    ErrorKind::InvalidInput => BlockError::NotAFile {
                        path: path_buf.clone(),
                        detail: source.to_string(),
                    },
                    _ => BlockError::Open {
                        path: path_buf.clone(),
                        source,
                    },
                })?;
        let meta = file.metadata().map_err(|source| BlockError::Size {
            path: path_buf.clone(),
            source,
        })?;
        if meta.is_dir() {
            return Err(BlockError::NotAFile {
                path: path_buf,
                detail: "it is a directory, not a raw disk image".into(),
            });
        }
        // Seeking to the end sizes block devices too, whose metadata length is 0.
        let size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|source| BlockError::Size {
                path: path_buf.clone(),
                source,
            })?;
        if size == 0 {
            return Err(BlockError::Empty { path: path_buf });
        }
        if size % SECTOR_SIZE != 0 {
            return Err(BlockError::NotSectorMultiple {
                path: path_buf,
                size,
            });
        }
        Ok(Self {
            file,
            path: path_buf,
            capacity_sectors: size / SECTOR_SIZE,
            read_only,
            durable_flush,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the disk in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The open image, for the Async engine's submissions.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }

    /// Whether a guest FLUSH must reach stable storage.
    pub fn durable_flush(&self) -> bool {
        self.durable_flush && !self.read_only
    }

    /// Another handle on the open image (the same file even if its path
    /// was since removed or replaced).
    pub fn try_clone_file(&self) -> std::io::Result<File> {
        self.file.try_clone()
    }

    fn seek_to(&self, sector: u64) -> Result<(), DiskIoError> {
        let offset = sector
            .checked_mul(SECTOR_SIZE)
            .ok_or(DiskIoError::Offset(sector))?;
        (&self.file)
            .seek(SeekFrom::Start(offset))
            .map(|_| ())
            .map_err(DiskIoError::Seek)
    }

    /// Reads consecutive sectors starting at `sector` into `segments`.
    pub fn read_into(
        &self,
        mem: &GuestMemoryMmap,
        sector: u64,
        segments: &[Segment],
    ) -> Result<(), DiskIoError> {
        self.seek_to(sector)?;
        let mut file = &self.file;
        for seg in segments {
            for slice in mem.get_slices(seg.addr, seg.len as usize, Permissions::Write)? {
                // read_exact: a short read (the file shrank under us) is an error.
                file.read_exact_volatile(&mut slice?)?;
            }
        }
        Ok(())
    }

    /// Writes `segments` to consecutive sectors starting at `sector`.
    pub fn write_from(
        &self,
        mem: &GuestMemoryMmap,
        sector: u64,
        segments: &[Segment],
    ) -> Result<(), DiskIoError> {
        self.seek_to(sector)?;
        let mut file = &self.file;
        for seg in segments {
            for slice in mem.get_slices(seg.addr, seg.len as usize, Permissions::Read)? {
                file.write_all_volatile(&slice?)?;
            }
        }
        Ok(())
    }

    /// Makes completed writes durable when the drive promises durability;
    /// otherwise they stay in the host page cache, which survives a guest
    /// crash but not a host crash.
    pub fn flush(&self) -> Result<(), DiskIoError> {
        if self.durable_flush && !self.read_only {
            self.file.sync_data().map_err(DiskIoError::Flush)?;
        }
        Ok(())
    }
}
