//! tmem from Linux user space (see `spore_abi::tmem` for the call).
//!
//! The device takes guest-physical addresses, and each key, value and batch
//! array must be physically contiguous. A user process sees virtual memory,
//! so this module:
//!
//! - keeps every buffer it hands the VMM in its own pages, `mmap`ped and
//!   `mlock`ed (locked pages stay resident; their frame does not change
//!   under reclaim), and translates them with `/proc/self/pagemap` (which
//!   shows frame numbers to `CAP_SYS_ADMIN` only, so: root);
//! - never lets a buffer cross a page boundary: a request block, a key, one
//!   page of value, one page of batch entries (64) each sit in one page.
//!
//! With 4 KiB pages only, a value larger than a page cannot be one object.
//! So a value of at most [`PAGE`] bytes is stored as one plain object under
//! its key (what any other tmem client sees), and a larger one as **chunks**:
//! page-sized objects under `key ‖ "\0spore-chunk" ‖ generation (u64 LE) ‖
//! index (u32 LE)`, written with `BATCH` calls of 64 entries, plus a 32-byte
//! **manifest** under the key itself: `"spore-tmem-chunk"`, total length
//! (u64 LE), generation (u64 LE). A put writes the new generation's chunks,
//! then the manifest, then drops the old generation's chunks, so a put
//! refused for the quota leaves the previous value whole. A small value that
//! happens to look like a manifest is stored chunked, so reads never confuse
//! the two. A plain object larger than a page (put by another client) cannot
//! be read from here, and says so.
//!
//! Known limit: `mlock` does not forbid page *migration* (compaction,
//! memory hot-unplug). Each call re-checks the frames of the pages it used
//! afterwards and reports [`TmemError::PageMoved`] if one moved; the window
//! is a few microseconds and a freshly booted test guest does not compact.

use std::fs::File;
use std::os::unix::fs::FileExt;

#[cfg(target_arch = "x86_64")]
use spore_abi::tmem::TMEM_PORT;
use spore_abi::tmem::{op, Status, MAX_BATCH, MAX_VALUE_LEN, TMEM_ADDR_SHIFT};
use thiserror::Error;

pub const PAGE: usize = 4096;
/// Batch entries per page (64-byte blocks).
pub const ENTRIES_PER_PAGE: usize = PAGE / 64;
pub const MANIFEST_MAGIC: &[u8; 16] = b"spore-tmem-chunk";
pub const MANIFEST_LEN: usize = 32;
const CHUNK_TAG: &[u8; 12] = b"\0spore-chunk";
const CHUNK_SUFFIX_LEN: usize = CHUNK_TAG.len() + 8 + 4;
/// Longest key this tool accepts: a chunk key must still fit in one page.
pub const MAX_TOOL_KEY_LEN: usize = PAGE - CHUNK_SUFFIX_LEN;

#[derive(Debug, Error)]
pub enum TmemError {
    #[cfg(target_arch = "x86_64")]
    #[error("ioperm({port:#x}) failed: {source} (needs root and CONFIG_X86_IOPL_IOPERM)")]
    Ioperm { port: u16, source: std::io::Error },
    #[cfg(target_arch = "x86_64")]
    #[error("no hypervisor detected (CPUID.1:ECX bit 31 clear); refusing to write port {0:#x} on bare metal")]
    NotVirtualized(u16),
    #[cfg(not(target_arch = "x86_64"))]
    #[error("tmem is not supported on this architecture (the device is reached through an x86 I/O port)")]
    UnsupportedArch,
    #[error("cannot allocate and lock {pages} page(s): {source}")]
    Alloc {
        pages: usize,
        source: std::io::Error,
    },
    #[error("cannot read /proc/self/pagemap: {0}")]
    Pagemap(std::io::Error),
    #[error("/proc/self/pagemap shows no frame numbers (run as root: CAP_SYS_ADMIN)")]
    NoFrameNumbers,
    #[error(
        "page at guest-physical {0:#x} is above what the 32-bit port value can address (64 GiB)"
    )]
    TooHigh(u64),
    #[error("a locked page moved during a call (page migration); retry")]
    PageMoved,
    #[error("no VMM answered the tmem call (status still pending: not running under spore?)")]
    NoAnswer,
    #[error("the VMM answered an unknown status {0:#x}")]
    UnknownStatus(u32),
    #[error("key is empty or longer than {MAX_TOOL_KEY_LEN} bytes (this tool's limit)")]
    KeyLength,
    #[error("value is longer than {MAX_VALUE_LEN} bytes")]
    ValueLength,
    #[error("tmem refused: {0:?}")]
    Refused(Status),
    #[error("object is a plain {0}-byte value: larger than a page, so not readable from Linux user space")]
    TooLargeForUserSpace(u64),
    #[error(
        "chunk {index} of the value is missing or has the wrong size (invalidated concurrently?)"
    )]
    BrokenChunk { index: u64 },
}

impl TmemError {
    /// The tmem status behind this error, if the VMM gave one.
    pub fn status(&self) -> Option<Status> {
        match self {
            TmemError::Refused(s) => Some(*s),
            _ => None,
        }
    }
}

/// `n` anonymous pages, locked in memory, with their guest-physical addresses.
struct LockedPages {
    ptr: *mut u8,
    pages: usize,
    gpas: Vec<u64>,
}

impl LockedPages {
    fn new(pages: usize, pagemap: &Pagemap) -> Result<Self, TmemError> {
        let len = pages * PAGE;
        let alloc = |source| TmemError::Alloc { pages, source };
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(alloc(std::io::Error::last_os_error()));
        }
        let mut me = Self {
            ptr: ptr.cast(),
            pages,
            gpas: Vec::new(),
        };
        // mlock faults every page in, writable (no shared zero page).
        // SAFETY: the range is the mapping just made.
        if unsafe { libc::mlock(ptr, len) } != 0 {
            return Err(alloc(std::io::Error::last_os_error()));
        }
        me.gpas = (0..pages)
            .map(|i| pagemap.gpa(me.ptr as usize + i * PAGE))
            .collect::<Result<_, _>>()?;
        if let Some(&g) = me.gpas.iter().find(|&&g| g >> (32 + TMEM_ADDR_SHIFT) != 0) {
            return Err(TmemError::TooHigh(g));
        }
        Ok(me)
    }

    fn page(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.pages);
        // SAFETY: page i lies inside the mapping, which lives as long as self.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(i * PAGE), PAGE) }
    }

    /// Re-reads the frames: a call whose pages moved may have missed them.
    fn check_unmoved(&self, pagemap: &Pagemap) -> Result<(), TmemError> {
        for (i, &g) in self.gpas.iter().enumerate() {
            if pagemap.gpa(self.ptr as usize + i * PAGE)? != g {
                return Err(TmemError::PageMoved);
            }
        }
        Ok(())
    }
}

impl Drop for LockedPages {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.pages * PAGE) };
    }
}

struct Pagemap(File);

impl Pagemap {
    fn open() -> Result<Self, TmemError> {
        File::open("/proc/self/pagemap")
            .map(Pagemap)
            .map_err(TmemError::Pagemap)
    }

    /// Guest-physical address of a resident virtual address.
    fn gpa(&self, vaddr: usize) -> Result<u64, TmemError> {
        let mut e = [0u8; 8];
        self.0
            .read_exact_at(&mut e, (vaddr / PAGE) as u64 * 8)
            .map_err(TmemError::Pagemap)?;
        frame_address(u64::from_le_bytes(e), vaddr)
    }
}

/// Decodes a pagemap entry (bit 63 present, bits 0..55 frame number).
fn frame_address(entry: u64, vaddr: usize) -> Result<u64, TmemError> {
    let pfn = entry & ((1 << 55) - 1);
    if entry >> 63 == 0 || pfn == 0 {
        return Err(TmemError::NoFrameNumbers);
    }
    Ok(pfn * PAGE as u64 + (vaddr % PAGE) as u64)
}

/// A request block as the guest writes it.
#[derive(Clone, Copy, Default)]
struct Block {
    op: u32,
    key_addr: u64,
    key_len: u64,
    value_addr: u64,
    value_len: u64,
}

impl Block {
    fn write_to(&self, out: &mut [u8]) {
        out[..64].fill(0);
        out[0..4].copy_from_slice(&self.op.to_le_bytes());
        out[4..8].copy_from_slice(&(Status::Pending as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.key_addr.to_le_bytes());
        out[24..32].copy_from_slice(&self.key_len.to_le_bytes());
        out[32..40].copy_from_slice(&self.value_addr.to_le_bytes());
        out[40..48].copy_from_slice(&self.value_len.to_le_bytes());
    }
}

/// Status and `value_len` of a block after the call.
fn read_result(block: &[u8]) -> Result<(Status, u64), TmemError> {
    // SAFETY: volatile reads of bytes the VMM wrote while this vCPU was
    // stopped; `block` is at least 48 bytes.
    let (status, len) = unsafe {
        (
            core::ptr::read_volatile(block.as_ptr().add(4).cast::<[u8; 4]>()),
            core::ptr::read_volatile(block.as_ptr().add(40).cast::<[u8; 8]>()),
        )
    };
    let raw = u32::from_le_bytes(status);
    match Status::from_u32(raw) {
        Some(Status::Pending) => Err(TmemError::NoAnswer),
        Some(s) => Ok((s, u64::from_le_bytes(len))),
        None => Err(TmemError::UnknownStatus(raw)),
    }
}

/// What a `get` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Manifest {
    Plain,
    Chunked { len: u64, generation: u64 },
}

pub fn encode_manifest(len: u64, generation: u64) -> [u8; MANIFEST_LEN] {
    let mut m = [0u8; MANIFEST_LEN];
    m[..16].copy_from_slice(MANIFEST_MAGIC);
    m[16..24].copy_from_slice(&len.to_le_bytes());
    m[24..32].copy_from_slice(&generation.to_le_bytes());
    m
}

pub fn decode_manifest(v: &[u8]) -> Manifest {
    if v.len() != MANIFEST_LEN || &v[..16] != MANIFEST_MAGIC {
        return Manifest::Plain;
    }
    let u = |o: usize| u64::from_le_bytes(v[o..o + 8].try_into().unwrap_or([0; 8]));
    Manifest::Chunked {
        len: u(16),
        generation: u(24),
    }
}

pub fn chunk_key(key: &[u8], generation: u64, index: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + CHUNK_SUFFIX_LEN);
    k.extend_from_slice(key);
    k.extend_from_slice(CHUNK_TAG);
    k.extend_from_slice(&generation.to_le_bytes());
    k.extend_from_slice(&index.to_le_bytes());
    k
}

pub fn chunk_count(len: u64) -> u64 {
    len.div_ceil(PAGE as u64)
}

/// Length of chunk `i` of a `total`-byte value.
pub fn chunk_len(total: u64, i: u64) -> u64 {
    total.saturating_sub(i * PAGE as u64).min(PAGE as u64)
}

/// Pool statistics (`STATS`).
pub type Stats = spore_abi::tmem::TmemStats;

/// A connection to the tmem device: port access and a few locked pages.
pub struct Tmem {
    pagemap: Pagemap,
    /// Page 0: request block; page 1: key; page 2: one page of value.
    scratch: LockedPages,
}

impl Tmem {
    pub fn open() -> Result<Self, TmemError> {
        grant_port_access()?;
        let pagemap = Pagemap::open()?;
        let scratch = LockedPages::new(3, &pagemap)?;
        Ok(Self { pagemap, scratch })
    }

    /// Runs the block in scratch page 0.
    fn call_scratch(&mut self, b: Block) -> Result<(Status, u64), TmemError> {
        b.write_to(self.scratch.page(0));
        let gpa = self.scratch.gpas[0];
        port_call(gpa);
        let r = read_result(self.scratch.page(0))?;
        self.scratch.check_unmoved(&self.pagemap)?;
        Ok(r)
    }

    /// Places `key` in scratch page 1.
    fn key_block(&mut self, op: u32, key: &[u8]) -> Result<Block, TmemError> {
        if key.is_empty() || key.len() > MAX_TOOL_KEY_LEN {
            return Err(TmemError::KeyLength);
        }
        self.scratch.page(1)[..key.len()].copy_from_slice(key);
        Ok(Block {
            op,
            key_addr: self.scratch.gpas[1],
            key_len: key.len() as u64,
            ..Default::default()
        })
    }

    fn put_small(&mut self, key: &[u8], value: &[u8]) -> Result<(), TmemError> {
        let mut b = self.key_block(op::PUT, key)?;
        self.scratch.page(2)[..value.len()].copy_from_slice(value);
        b.value_addr = self.scratch.gpas[2];
        b.value_len = value.len() as u64;
        match self.call_scratch(b)? {
            (Status::Ok, _) => Ok(()),
            (s, _) => Err(TmemError::Refused(s)),
        }
    }

    /// GET into scratch page 2: `Ok(None)` if absent.
    fn get_small(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TmemError> {
        let mut b = self.key_block(op::GET, key)?;
        b.value_addr = self.scratch.gpas[2];
        b.value_len = PAGE as u64;
        match self.call_scratch(b)? {
            (Status::Ok, len) if len <= PAGE as u64 => {
                let len = usize::try_from(len).map_err(|_| TmemError::ValueLength)?;
                Ok(Some(self.scratch.page(2)[..len].to_vec()))
            }
            (Status::NotFound, _) => Ok(None),
            (Status::BufferTooSmall, len) => Err(TmemError::TooLargeForUserSpace(len)),
            (s, _) => Err(TmemError::Refused(s)),
        }
    }

    fn invalidate_one(&mut self, key: &[u8]) -> Result<Status, TmemError> {
        let b = self.key_block(op::INVALIDATE, key)?;
        Ok(self.call_scratch(b)?.0)
    }

    /// Stores `value` under `key` (chunked if larger than a page).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TmemError> {
        if key.is_empty() || key.len() > MAX_TOOL_KEY_LEN {
            return Err(TmemError::KeyLength);
        }
        if value.len() as u64 > MAX_VALUE_LEN {
            return Err(TmemError::ValueLength);
        }
        let old = match self.get_small(key) {
            Ok(Some(v)) => decode_manifest(&v),
            Ok(None) | Err(TmemError::TooLargeForUserSpace(_)) => Manifest::Plain,
            Err(e) => return Err(e),
        };
        if value.len() <= PAGE && decode_manifest(value) == Manifest::Plain {
            self.put_small(key, value)?;
        } else {
            let generation = new_generation();
            let n = value.len() as u64;
            if let Err(e) = self.chunk_batches(op::PUT, key, generation, n, Some(value)) {
                let _ = self.chunk_batches(op::INVALIDATE, key, generation, n, None);
                return Err(e);
            }
            if let Err(e) = self.put_small(key, &encode_manifest(n, generation)) {
                let _ = self.chunk_batches(op::INVALIDATE, key, generation, n, None);
                return Err(e);
            }
        }
        if let Manifest::Chunked { len, generation } = old {
            // Best effort: the new value is complete already.
            let _ = self.chunk_batches(op::INVALIDATE, key, generation, len, None);
        }
        Ok(())
    }

    /// Reads the value under `key`; `Ok(None)` if absent.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TmemError> {
        let Some(v) = self.get_small(key)? else {
            return Ok(None);
        };
        match decode_manifest(&v) {
            Manifest::Plain => Ok(Some(v)),
            Manifest::Chunked { len, generation } => {
                if len > MAX_VALUE_LEN {
                    return Err(TmemError::ValueLength);
                }
                let out = self.chunk_batches(op::GET, key, generation, len, None)?;
                Ok(Some(out))
            }
        }
    }

    /// Removes `key` (and its chunks); `false` if it was absent.
    pub fn invalidate(&mut self, key: &[u8]) -> Result<bool, TmemError> {
        let old = match self.get_small(key) {
            Ok(None) => return Ok(false),
            Ok(Some(v)) => decode_manifest(&v),
            Err(TmemError::TooLargeForUserSpace(_)) => Manifest::Plain,
            Err(e) => return Err(e),
        };
        let found = match self.invalidate_one(key)? {
            Status::Ok => true,
            Status::NotFound => false,
            s => return Err(TmemError::Refused(s)),
        };
        if let Manifest::Chunked { len, generation } = old {
            self.chunk_batches(op::INVALIDATE, key, generation, len, None)?;
        }
        Ok(found)
    }

    pub fn flush(&mut self) -> Result<(), TmemError> {
        match self.call_scratch(Block {
            op: op::FLUSH,
            ..Default::default()
        })? {
            (Status::Ok, _) => Ok(()),
            (s, _) => Err(TmemError::Refused(s)),
        }
    }

    pub fn stats(&mut self) -> Result<Stats, TmemError> {
        let b = Block {
            op: op::STATS,
            value_addr: self.scratch.gpas[2],
            value_len: PAGE as u64,
            ..Default::default()
        };
        match self.call_scratch(b)? {
            (Status::Ok, _) => {}
            (s, _) => return Err(TmemError::Refused(s)),
        }
        let p = self.scratch.page(2);
        let f = |i: usize| u64::from_le_bytes(p[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Ok(Stats {
            objects: f(0),
            bytes_used: f(1),
            bytes_stored: f(2),
            quota_bytes: f(3),
            puts: f(4),
            gets: f(5),
            get_hits: f(6),
            invalidates: f(7),
            flushes: f(8),
            batches: f(9),
            refused: f(10),
        })
    }

    /// Runs `op` (PUT, GET or INVALIDATE) on the chunks of a `total_len`-byte
    /// value of one generation, 64 per `BATCH` call. PUT takes its data from
    /// `value`; GET returns the value (each chunk checked for its length).
    /// INVALIDATE ignores missing chunks.
    fn chunk_batches(
        &mut self,
        op: u32,
        key: &[u8],
        generation: u64,
        total_len: u64,
        value: Option<&[u8]>,
    ) -> Result<Vec<u8>, TmemError> {
        let n = chunk_count(total_len);
        debug_assert!(n <= MAX_BATCH);
        let key_len = key.len() + CHUNK_SUFFIX_LEN;
        let keys_per_page = PAGE / key_len;
        let mut out = Vec::new();
        let mut index = 0u64;
        while index < n {
            let count = usize::try_from((n - index).min(ENTRIES_PER_PAGE as u64))
                .map_err(|_| TmemError::ValueLength)?;
            // Page 0: entries; then key pages; then one value page per chunk.
            let key_pages = count.div_ceil(keys_per_page);
            let mut pages = LockedPages::new(1 + key_pages + count, &self.pagemap)?;
            for j in 0..count {
                let i = index + j as u64;
                let (kp, ko) = (1 + j / keys_per_page, (j % keys_per_page) * key_len);
                let k = chunk_key(
                    key,
                    generation,
                    u32::try_from(i).map_err(|_| TmemError::ValueLength)?,
                );
                pages.page(kp)[ko..ko + key_len].copy_from_slice(&k);
                let vp = 1 + key_pages + j;
                let data_len = match value {
                    Some(v) => {
                        let start = usize::try_from(i).map_err(|_| TmemError::ValueLength)? * PAGE;
                        let chunk = &v[start..(start + PAGE).min(v.len())];
                        pages.page(vp)[..chunk.len()].copy_from_slice(chunk);
                        chunk.len()
                    }
                    None => PAGE,
                };
                let b = Block {
                    op,
                    key_addr: pages.gpas[kp] + ko as u64,
                    key_len: key_len as u64,
                    value_addr: if op == op::INVALIDATE {
                        0
                    } else {
                        pages.gpas[vp]
                    },
                    value_len: if op == op::INVALIDATE {
                        0
                    } else {
                        data_len as u64
                    },
                };
                b.write_to(&mut pages.page(0)[j * 64..]);
            }
            let batch = Block {
                op: op::BATCH,
                value_addr: pages.gpas[0],
                value_len: count as u64,
                ..Default::default()
            };
            match self.call_scratch(batch)? {
                (Status::Ok, _) => {}
                (s, _) => return Err(TmemError::Refused(s)),
            }
            pages.check_unmoved(&self.pagemap)?;
            for j in 0..count {
                let (status, len) = read_result(&pages.page(0)[j * 64..])?;
                match (op, status) {
                    (op::INVALIDATE, Status::Ok | Status::NotFound) => {}
                    (op::GET, Status::Ok) if len == chunk_len(total_len, index + j as u64) => {
                        let len = usize::try_from(len).map_err(|_| TmemError::ValueLength)?;
                        out.extend_from_slice(&pages.page(1 + key_pages + j)[..len]);
                    }
                    (op::GET, _) => {
                        return Err(TmemError::BrokenChunk {
                            index: index + j as u64,
                        })
                    }
                    (_, Status::Ok) => {}
                    (_, s) => return Err(TmemError::Refused(s)),
                }
            }
            index += count as u64;
        }
        Ok(out)
    }
}

/// A generation id for a chunked value: random, so two puts never share one.
fn new_generation() -> u64 {
    let mut g = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into `g`.
    let n = unsafe { libc::getrandom(g.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        // Fall back to time and pid: unique enough for one guest.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        return t ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_le_bytes(g)
}

/// Makes the tmem port usable by this process (x86_64: `ioperm`, refused on
/// bare metal).
#[cfg(target_arch = "x86_64")]
fn grant_port_access() -> Result<(), TmemError> {
    let leaf1 = core::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 31) == 0 {
        return Err(TmemError::NotVirtualized(TMEM_PORT));
    }
    // SAFETY: ioperm only changes this process's I/O permission bitmap.
    if unsafe { libc::ioperm(libc::c_ulong::from(TMEM_PORT), 4, 1) } != 0 {
        return Err(TmemError::Ioperm {
            port: TMEM_PORT,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The tmem device is an x86 I/O port; elsewhere there is none to reach.
#[cfg(not(target_arch = "x86_64"))]
fn grant_port_access() -> Result<(), TmemError> {
    Err(TmemError::UnsupportedArch)
}

/// One tmem call: `out` of the block's address to the port. Not `nomem`:
/// the VMM reads and writes this process's memory during the instruction.
#[cfg(target_arch = "x86_64")]
fn port_call(block_gpa: u64) {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "LockedPages::new refuses (TooHigh) a page whose gpa >> TMEM_ADDR_SHIFT exceeds 32 bits"
    )]
    let value = (block_gpa >> TMEM_ADDR_SHIFT) as u32;
    // SAFETY: `Tmem::open` granted access to this port; the VMM only touches
    // the locked pages this process described in the block.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") TMEM_PORT, in("eax") value,
            options(nostack, preserves_flags));
    }
}

/// Never reached: `Tmem::open` fails where there is no tmem port.
#[cfg(not(target_arch = "x86_64"))]
fn port_call(_block_gpa: u64) {
    unreachable!("tmem call without a tmem port (Tmem::open refuses on this architecture)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_and_are_recognized() {
        let m = encode_manifest(1 << 20, 42);
        assert_eq!(
            decode_manifest(&m),
            Manifest::Chunked {
                len: 1 << 20,
                generation: 42
            }
        );
        assert_eq!(decode_manifest(&m[..31]), Manifest::Plain);
        assert_eq!(decode_manifest(b"hello"), Manifest::Plain);
        let mut other = m;
        other[0] ^= 1;
        assert_eq!(decode_manifest(&other), Manifest::Plain);
    }

    #[test]
    fn chunk_keys_fit_a_page_and_differ() {
        let key = vec![b'k'; MAX_TOOL_KEY_LEN];
        assert_eq!(chunk_key(&key, 1, 2).len(), PAGE);
        assert_ne!(chunk_key(b"a", 1, 2), chunk_key(b"a", 1, 3));
        assert_ne!(chunk_key(b"a", 1, 2), chunk_key(b"a", 2, 2));
        assert_eq!(chunk_count(0), 0);
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(PAGE as u64 + 1), 2);
        assert_eq!(chunk_count(MAX_VALUE_LEN), MAX_BATCH);
        assert_eq!(chunk_len(PAGE as u64 + 5, 0), PAGE as u64);
        assert_eq!(chunk_len(PAGE as u64 + 5, 1), 5);
    }

    #[test]
    fn pagemap_entries() {
        assert_eq!(
            frame_address((1 << 63) | 0x1234, 0x7000_0abc).unwrap(),
            0x1234 * 4096 + 0xabc
        );
        // Not present, or present without a frame number (not root).
        assert!(frame_address(0x1234, 0).is_err());
        assert!(frame_address(1 << 63, 0).is_err());
    }

    #[test]
    fn blocks_and_results() {
        let mut b = [0xffu8; 64];
        Block {
            op: op::GET,
            key_addr: 0x1000,
            key_len: 3,
            value_addr: 0x2000,
            value_len: 4096,
        }
        .write_to(&mut b);
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), op::GET);
        assert!(b[8..16].iter().all(|&x| x == 0) && b[48..].iter().all(|&x| x == 0));
        assert!(matches!(read_result(&b), Err(TmemError::NoAnswer)));
        b[4..8].copy_from_slice(&(Status::BufferTooSmall as u32).to_le_bytes());
        b[40..48].copy_from_slice(&77u64.to_le_bytes());
        assert_eq!(read_result(&b).unwrap(), (Status::BufferTooSmall, 77));
        b[4..8].copy_from_slice(&1234u32.to_le_bytes());
        assert!(matches!(
            read_result(&b),
            Err(TmemError::UnknownStatus(1234))
        ));
    }
}
