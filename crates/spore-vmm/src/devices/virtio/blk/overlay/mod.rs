//! Copy-on-write disks: a read-only base image plus a private, sparse,
//! block-granular overlay.
//!
//! A [`CowDisk`] reads a block from the overlay if the overlay holds it and
//! from the base otherwise; every write goes to the overlay. The first write
//! to a block copies it up: a write that covers only part of a block first
//! reads the rest of the block (from the base), so the overlay only ever
//! holds whole blocks. The base is opened read-only and never written, so any
//! number of clones can share it; each writes only its own overlay.
//!
//! The overlay is a file ([`format`]: header, block bitmap, sparse data) or,
//! with `in_memory`, the same layout in a memfd that dies with the process.
//! A base that shrinks or vanishes underneath gives I/O errors on the reads
//! that reach it (the guest sees VIRTIO_BLK_S_IOERR), never a panic.
//!
//! [`clone_drive`] gives a clone its own overlay over a source drive's base;
//! [`CowDisk::spill`] turns an in-memory overlay into a file one.

pub mod format;

#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use format::{BlockMap, Layout, DEFAULT_BLOCK_SIZE, HEADER_LEN};

use crate::config::{CowOverlayConfig, DriveConfig};
use crate::host_usize;

/// The agreed name of a drive's configuration (Firecracker calls the body of
/// `PUT /drives/{id}` a block device).
pub type BlockDeviceConfig = DriveConfig;

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("overlay {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("base image {path}: {op}: {source}")]
    Base {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("base image {path} is {size} bytes: not a non-empty multiple of 512")]
    BaseSize { path: PathBuf, size: u64 },
    #[error("{path} is not a spore copy-on-write overlay (no SPORECOW header); remove it or choose another path")]
    NotAnOverlay { path: PathBuf },
    #[error("overlay {path} is damaged: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("overlay {path} was made for a {overlay_size}-byte disk, but base {base} has {base_size} bytes: it belongs to another base image")]
    WrongBase {
        path: PathBuf,
        base: PathBuf,
        overlay_size: u64,
        base_size: u64,
    },
    #[error("overlay {path} already exists; a clone's overlay must be new (pick another clone name or remove the file)")]
    Exists { path: PathBuf },
    #[error("drive {drive}: its overlay lives only in the source VMM's memory; call Vm::freeze_disks_for_clone first (it moves in-memory overlays to files)")]
    InMemoryParent { drive: String },
    #[error("cannot create an in-memory overlay: {0}")]
    Memfd(#[source] std::io::Error),
    #[error("invalid clone name {0:?}: use letters, digits, '-', '_' and '.' only")]
    Name(String),
}

/// Why one guest I/O on a copy-on-write disk failed.
#[derive(Debug, thiserror::Error)]
pub enum CowIoError {
    #[error("byte range {offset}+{len} is outside the {size}-byte disk")]
    Range { offset: u64, len: u64, size: u64 },
    #[error("reading the base image at byte {offset}: {source}")]
    Base {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("overlay I/O at file byte {offset}: {source}")]
    Overlay {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

/// A base image plus a private overlay.
#[derive(Debug)]
pub struct CowDisk {
    base: File,
    base_path: PathBuf,
    overlay: File,
    /// `None` for an in-memory overlay.
    overlay_path: Option<PathBuf>,
    layout: Layout,
    map: BlockMap,
    durable_flush: bool,
    /// Holds one block while it is copied up (allocated once).
    scratch: Vec<u8>,
}

impl CowDisk {
    /// Opens `base` read-only and the overlay `cfg` names: an existing overlay
    /// file is reopened (its block map is in it), a missing or empty one is
    /// created; `in_memory` makes a fresh memfd.
    pub fn open(
        base_path: &Path,
        cfg: &CowOverlayConfig,
        durable_flush: bool,
    ) -> Result<Self, OverlayError> {
        let (base, size) = open_base(base_path)?;
        if cfg.in_memory {
            let overlay = memfd("spore-cow-overlay")?;
            if let Some(p) = cfg.path.as_deref() {
                // Start from the file's blocks; the file is never written.
                let path = PathBuf::from(p);
                let from = crate::files::open_regular(&path).map_err(io(&path, "open"))?;
                let (layout, map) = read_layout(&from, &path, base_path, size)?;
                copy_overlay_into(&from, &path, &layout, &map, &overlay, Path::new("<memory>"))?;
            }
            return Self::from_files(base, base_path, size, overlay, None, durable_flush);
        }
        let (overlay, overlay_path) = match cfg.path.as_deref() {
            Some(p) => {
                let path = PathBuf::from(p);
                // An existing overlay must be a regular file (never a FIFO).
                let file =
                    match crate::files::open_checked(&path, true, crate::files::Expect::Regular) {
                        Err(e) if e.kind() == ErrorKind::NotFound => OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .mode(0o600)
                            .open(&path),
                        other => other,
                    }
                    .map_err(io(&path, "open"))?;
                (file, Some(path))
            }
            None => (memfd("spore-cow-overlay")?, None),
        };
        Self::from_files(base, base_path, size, overlay, overlay_path, durable_flush)
    }

    fn from_files(
        base: File,
        base_path: &Path,
        size: u64,
        overlay: File,
        overlay_path: Option<PathBuf>,
        durable_flush: bool,
    ) -> Result<Self, OverlayError> {
        let shown = overlay_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("<memory>"));
        let len = overlay.metadata().map_err(io(&shown, "stat"))?.len();
        let (layout, map) = if len == 0 {
            let layout =
                Layout::new(size, DEFAULT_BLOCK_SIZE).map_err(|detail| OverlayError::Corrupt {
                    path: shown.clone(),
                    detail,
                })?;
            overlay
                .write_all_at(&layout.encode(), 0)
                .map_err(io(&shown, "write header"))?;
            // Sparse: the data area takes no space until blocks are written.
            overlay
                .set_len(layout.file_len())
                .map_err(io(&shown, "size"))?;
            (layout, BlockMap::empty(layout.blocks()))
        } else {
            read_layout(&overlay, &shown, base_path, size)?
        };
        Ok(Self {
            base,
            base_path: base_path.to_path_buf(),
            overlay,
            overlay_path,
            scratch: vec![0; host_usize::from_u64(layout.block_size)],
            layout,
            map,
            durable_flush,
        })
    }

    /// Size of the disk in bytes (the base's size).
    pub fn size(&self) -> u64 {
        self.layout.disk_size
    }

    pub fn block_size(&self) -> u64 {
        self.layout.block_size
    }

    pub fn base_path(&self) -> &Path {
        &self.base_path
    }

    /// The overlay file, `None` when it lives in memory.
    pub fn overlay_path(&self) -> Option<&Path> {
        self.overlay_path.as_deref()
    }

    /// Blocks the overlay holds.
    pub fn blocks_present(&self) -> u64 {
        self.map.present()
    }

    /// This overlay's configuration.
    pub fn overlay_config(&self) -> CowOverlayConfig {
        CowOverlayConfig {
            path: self.overlay_path.as_ref().map(|p| p.display().to_string()),
            in_memory: self.overlay_path.is_none(),
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), CowIoError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.layout.disk_size => Ok(()),
            _ => Err(CowIoError::Range {
                offset,
                len,
                size: self.layout.disk_size,
            }),
        }
    }

    /// Reads `buf.len()` bytes at disk byte `offset`, merging overlay and base
    /// block by block.
    pub fn read_at(&self, mut offset: u64, mut buf: &mut [u8]) -> Result<(), CowIoError> {
        self.check_range(offset, buf.len() as u64)?;
        let bs = self.layout.block_size;
        while !buf.is_empty() {
            let block = offset / bs;
            let within = offset % bs;
            let n = host_usize::from_u64(bs - within).min(buf.len());
            let (piece, rest) = buf.split_at_mut(n);
            if self.map.contains(block) {
                let at = self.layout.data_at(block) + within;
                read_full_at(&self.overlay, piece, at)
                    .map_err(|source| CowIoError::Overlay { offset: at, source })?;
            } else {
                read_full_at(&self.base, piece, offset)
                    .map_err(|source| CowIoError::Base { offset, source })?;
            }
            offset += n as u64;
            buf = rest;
        }
        Ok(())
    }

    /// Writes `data` at disk byte `offset` into the overlay, copying up the
    /// rest of every block it touches for the first time.
    pub fn write_at(&mut self, mut offset: u64, mut data: &[u8]) -> Result<(), CowIoError> {
        self.check_range(offset, data.len() as u64)?;
        let bs = self.layout.block_size;
        while !data.is_empty() {
            let block = offset / bs;
            let within = offset % bs;
            let n = host_usize::from_u64(bs - within).min(data.len());
            let (piece, rest) = data.split_at(n);
            self.write_in_block(block, within, piece)?;
            offset += n as u64;
            data = rest;
        }
        Ok(())
    }

    fn write_in_block(&mut self, block: u64, within: u64, piece: &[u8]) -> Result<(), CowIoError> {
        let at = self.layout.data_at(block);
        let overlay_err = |offset| move |source| CowIoError::Overlay { offset, source };
        if self.map.contains(block) {
            return self
                .overlay
                .write_all_at(piece, at + within)
                .map_err(overlay_err(at + within));
        }
        let block_len = host_usize::from_u64(self.layout.block_len(block));
        let whole = &mut self.scratch[..block_len];
        if within != 0 || piece.len() != block_len {
            // Copy-up: the block's other bytes come from the base.
            let start = block * self.layout.block_size;
            read_full_at(&self.base, whole, start).map_err(|source| CowIoError::Base {
                offset: start,
                source,
            })?;
        }
        whole[host_usize::from_u64(within)..host_usize::from_u64(within) + piece.len()]
            .copy_from_slice(piece);
        self.overlay
            .write_all_at(whole, at)
            .map_err(overlay_err(at))?;
        // The data is in place before the map says so: a crash in between
        // loses the write, never exposes a block of garbage.
        if let Some((byte, value)) = self.map.insert(block) {
            let off = self.layout.bitmap_offset + byte;
            self.overlay
                .write_all_at(&[value], off)
                .map_err(overlay_err(off))?;
        }
        Ok(())
    }

    /// Makes completed writes durable when the drive promises durability
    /// (the base is never written, so only the overlay is synced).
    pub fn flush(&self) -> Result<(), CowIoError> {
        if self.durable_flush && self.overlay_path.is_some() {
            self.overlay
                .sync_data()
                .map_err(|source| CowIoError::Overlay { offset: 0, source })?;
        }
        Ok(())
    }

    /// Copies this overlay (header, map, present blocks) into a new file at
    /// `path`: the starting point of a clone's overlay, or an in-memory
    /// overlay moved to a file. The caller keeps the source from writing
    /// meanwhile (the VM is paused).
    pub fn copy_overlay_to(&self, path: &Path) -> Result<(), OverlayError> {
        let shown = self
            .overlay_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("<memory>"));
        copy_overlay(&self.overlay, &shown, &self.layout, &self.map, path)
    }

    /// Moves an in-memory overlay into a new file at `path` and uses that file
    /// from now on. A file overlay is left alone. Returns the configuration.
    pub fn spill(&mut self, path: &Path) -> Result<CowOverlayConfig, OverlayError> {
        if self.overlay_path.is_none() {
            self.copy_overlay_to(path)?;
            self.overlay = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(io(path, "open"))?;
            self.overlay_path = Some(path.to_path_buf());
        }
        Ok(self.overlay_config())
    }

    /// A new, empty overlay file at `path` (which must not exist) over
    /// `base_path`: how a clone, or a frozen raw drive, starts.
    pub fn create_over(
        base_path: &Path,
        path: &Path,
        durable_flush: bool,
    ) -> Result<Self, OverlayError> {
        let (base, size) = open_base(base_path)?;
        Self::create_over_file(base, base_path, size, path, durable_flush)
    }

    /// [`Self::create_over`] with the base already open (`size` bytes): a
    /// running drive frozen in place keeps reading the very file it had.
    pub fn create_over_file(
        base: File,
        base_path: &Path,
        size: u64,
        path: &Path,
        durable_flush: bool,
    ) -> Result<Self, OverlayError> {
        let overlay = create_new(path)?;
        Self::from_files(
            base,
            base_path,
            size,
            overlay,
            Some(path.to_path_buf()),
            durable_flush,
        )
    }
}

/// The clone's configuration of `drive`: the same base read-only plus a new
/// overlay file `<dir>/<name>.<drive_id>.cow`. A drive that already has an
/// overlay (a clone of a clone) gives the new overlay a copy of its contents,
/// so the caller must keep the source from writing until this returns (the
/// source is paused). Read-only drives are shared as they are.
pub fn clone_drive(
    drive: &BlockDeviceConfig,
    dir: &Path,
    name: &str,
) -> Result<BlockDeviceConfig, OverlayError> {
    clone_drive_to(drive, dir, name, OverlayPlace::File)
}

/// Where a clone keeps its overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlayPlace {
    /// `<dir>/<name>.<drive_id>.cow`: persisted, snapshots of the clone work.
    File,
    /// A memfd in the clone's VMM, gone when it exits (and the clone cannot
    /// be snapshotted). Over a raw drive nothing is created at all; over a
    /// drive with an overlay, `<dir>/<name>.<drive_id>.cow` is a frozen copy
    /// of it that the clone loads into memory and never writes.
    Memory,
}

/// [`clone_drive`] with the overlay kept where `place` says.
pub fn clone_drive_to(
    drive: &BlockDeviceConfig,
    dir: &Path,
    name: &str,
    place: OverlayPlace,
) -> Result<BlockDeviceConfig, OverlayError> {
    if drive.is_read_only {
        return Ok(drive.clone());
    }
    if name.is_empty()
        || name == "."
        || name == ".."
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(OverlayError::Name(name.into()));
    }
    let path = dir.join(format!("{name}.{}.cow", sanitize(&drive.drive_id)));
    let base = Path::new(&drive.path_on_host);
    let in_memory = place == OverlayPlace::Memory;
    match &drive.cow_overlay {
        None if in_memory => {
            // Nothing to copy: check the base now rather than in the clone.
            open_base(base)?;
            return Ok(BlockDeviceConfig {
                cow_overlay: Some(CowOverlayConfig {
                    path: None,
                    in_memory: true,
                }),
                ..drive.clone()
            });
        }
        None => {
            CowDisk::create_over(base, &path, false)?;
        }
        Some(o) if o.in_memory => {
            return Err(OverlayError::InMemoryParent {
                drive: drive.drive_id.clone(),
            })
        }
        Some(o) => {
            let parent = CowDisk::open(base, o, false)?;
            parent.copy_overlay_to(&path)?;
        }
    }
    Ok(BlockDeviceConfig {
        cow_overlay: Some(CowOverlayConfig {
            path: Some(path.display().to_string()),
            in_memory,
        }),
        ..drive.clone()
    })
}

/// A drive id made safe for a file name.
pub(crate) fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn copy_overlay(
    src: &File,
    src_path: &Path,
    layout: &Layout,
    map: &BlockMap,
    path: &Path,
) -> Result<(), OverlayError> {
    let dst = create_new(path)?;
    let result = copy_overlay_into(src, src_path, layout, map, &dst, path);
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Reads and checks the header and block map of the overlay `f` (shown as
/// `path`) made for a `size`-byte base.
fn read_layout(
    f: &File,
    path: &Path,
    base_path: &Path,
    size: u64,
) -> Result<(Layout, BlockMap), OverlayError> {
    let len = f.metadata().map_err(io(path, "stat"))?.len();
    if len < HEADER_LEN {
        return Err(OverlayError::NotAnOverlay {
            path: path.to_path_buf(),
        });
    }
    let mut header = vec![0u8; host_usize::from_u64(HEADER_LEN)];
    read_full_at(f, &mut header, 0).map_err(io(path, "read header"))?;
    let layout = Layout::decode(&header, path)?;
    if layout.disk_size != size {
        return Err(OverlayError::WrongBase {
            path: path.to_path_buf(),
            base: base_path.to_path_buf(),
            overlay_size: layout.disk_size,
            base_size: size,
        });
    }
    let mut bits = vec![0u8; host_usize::from_u64(layout.bitmap_len())];
    read_full_at(f, &mut bits, layout.bitmap_offset).map_err(io(path, "read block map"))?;
    let map =
        BlockMap::from_bytes(bits, layout.blocks()).map_err(|detail| OverlayError::Corrupt {
            path: path.to_path_buf(),
            detail,
        })?;
    Ok((layout, map))
}

/// Writes `src`'s overlay (header, present blocks, map) into the empty `dst`.
fn copy_overlay_into(
    src: &File,
    src_path: &Path,
    layout: &Layout,
    map: &BlockMap,
    dst: &File,
    path: &Path,
) -> Result<(), OverlayError> {
    {
        dst.write_all_at(&layout.encode(), 0)
            .map_err(io(path, "write header"))?;
        dst.set_len(layout.file_len()).map_err(io(path, "size"))?;
        // One copy per run of consecutive blocks, in the kernel where it can
        // (copy_file_range; a filesystem with reflinks shares the extents).
        for (first, end) in map.runs() {
            let at = layout.data_at(first);
            let len = layout.data_at(end - 1) + layout.block_len(end - 1) - at;
            copy_range(src, dst, at, len).map_err(|source| OverlayError::Io {
                path: path.to_path_buf(),
                op: "copy blocks",
                source: std::io::Error::new(
                    source.kind(),
                    format!("from {}: {source}", src_path.display()),
                ),
            })?;
        }
        // The map last: a copy cut short reads as an overlay without those blocks.
        dst.write_all_at(map.as_bytes(), layout.bitmap_offset)
            .map_err(io(path, "write block map"))
    }
}

/// Copies `len` bytes at `offset` from `src` to the same offset in `dst`.
fn copy_range(src: &File, dst: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0u64;
    while done < len {
        let (mut off_in, mut off_out) = (
            (offset + done) as libc::loff_t,
            (offset + done) as libc::loff_t,
        );
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        // SAFETY: both fds are open files; the offsets are ours to update.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        match n {
            n if n > 0 => done += n as u64,
            // Past the source's end: it shrank under us.
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = std::io::Error::last_os_error();
                // Not supported between these files (another filesystem,
                // an old kernel): copy through memory instead.
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP)
                ) {
                    return copy_range_buffered(src, dst, offset + done, len - done);
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

fn copy_range_buffered(src: &File, dst: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; (len.min(1 << 20)) as usize];
    let mut done = 0u64;
    while done < len {
        let n = host_usize::from_u64((len - done).min(buf.len() as u64));
        read_full_at(src, &mut buf[..n], offset + done)?;
        dst.write_all_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

fn create_new(path: &Path) -> Result<File, OverlayError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| match source.kind() {
            ErrorKind::AlreadyExists => OverlayError::Exists {
                path: path.to_path_buf(),
            },
            _ => OverlayError::Io {
                path: path.to_path_buf(),
                op: "create",
                source,
            },
        })
}

fn open_base(path: &Path) -> Result<(File, u64), OverlayError> {
    let base_err = |op| {
        move |source| OverlayError::Base {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let file = crate::files::open_checked(path, false, crate::files::Expect::RegularOrBlock)
        .map_err(base_err("open read-only"))?;
    let meta = file.metadata().map_err(base_err("stat"))?;
    if meta.is_dir() {
        return Err(OverlayError::BaseSize {
            path: path.to_path_buf(),
            size: 0,
        });
    }
    // Block devices report length 0 in metadata: seek to the end instead.
    let size = {
        use std::io::{Seek, SeekFrom};
        (&file).seek(SeekFrom::End(0)).map_err(base_err("size"))?
    };
    if size == 0 || size % super::SECTOR_SIZE != 0 {
        return Err(OverlayError::BaseSize {
            path: path.to_path_buf(),
            size,
        });
    }
    Ok((file, size))
}

fn memfd(name: &str) -> Result<File, OverlayError> {
    crate::memory::create_memfd(name).map_err(|e| OverlayError::Memfd(std::io::Error::other(e)))
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl Fn(std::io::Error) -> OverlayError + 'a {
    move |source| OverlayError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// `read_exact_at`, whose short read (a file that shrank) is an
/// `UnexpectedEof` error.
fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    f.read_exact_at(buf, offset)
}
