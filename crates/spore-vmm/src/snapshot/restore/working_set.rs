//! Working sets (REAP): the pages a restored guest touched on its first
//! run, in first-touch order, stored beside the snapshot with their data
//! packed so a later restore loads them with one sequential read.
//!
//! Recording: the first `working_set` restore of a snapshot serves every
//! page through the built-in userfaultfd handler, which logs each page the
//! guest (or a device) touches for the first time. Recording ends when the
//! VM stops, or `record_for` after the guest started if that was given;
//! then the file is written (data read from the snapshot layers, not from
//! the guest's possibly changed RAM) under a temporary name, synced, and
//! renamed into place.
//!
//! Loading: the pages are read straight from the file into guest RAM (a
//! memfd not yet registered with userfaultfd) with `preadv`, zero pages are
//! allocated with `fallocate`, then the checksum is verified. A file that
//! is missing is recorded anew; one that is corrupt, truncated, for another
//! memory size or recorded for another snapshot id (the snapshot was
//! re-created) is ignored with a warning and recorded anew.
//!
//! File layout (little endian):
//!
//! ```text
//! 0   magic "SPOREWS1"
//! 8   u32 version (1)         12  u32 page size (4096)
//! 16  u64 memory size         24  u64 entry count N
//! 32  32 bytes snapshot id (ASCII, zero padded)
//! 64  u32 CRC-32 of the header (this field zero), entries and data
//! 68  u32 zero
//! 72  N × u64 entries: page number, bit 63 set for an all-zero page (no data)
//! ..  zero padding to a 4096-byte boundary
//! ..  one 4096-byte page of data per entry without bit 63, in entry order
//! ```

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::uffd::{PageSource, ServeLog};
use crate::memory::GuestRam;

const MAGIC: &[u8; 8] = b"SPOREWS1";
const VERSION: u32 = 1;
const PAGE: u64 = 4096;
const HEADER: usize = 72;
const ZERO_BIT: u64 = 1 << 63;
const ID_LEN: usize = 32;

/// Why a working set was not loaded.
#[derive(Debug, PartialEq, Eq)]
pub enum WsLoad {
    /// No file yet.
    Absent,
    /// Present but unusable (the reason).
    Ignored(String),
}

struct Header {
    mem_size: u64,
    count: u64,
    id: String,
}

fn encode_header(h: &Header, crc: u32) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
    b[16..24].copy_from_slice(&h.mem_size.to_le_bytes());
    b[24..32].copy_from_slice(&h.count.to_le_bytes());
    let id = h.id.as_bytes();
    let n = id.len().min(ID_LEN);
    b[32..32 + n].copy_from_slice(&id[..n]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn data_offset(count: u64) -> u64 {
    (HEADER as u64 + count * 8).div_ceil(PAGE) * PAGE
}

/// Writes a working set for `order` (page numbers, first-touch order),
/// with the snapshot's data for each page. Returns (entries, data pages).
pub fn write(
    path: &Path,
    id: &str,
    order: &[u64],
    source: &PageSource,
) -> std::io::Result<(u64, u64)> {
    let size = source.layers().size();
    let mut seen = std::collections::HashSet::with_capacity(order.len());
    let entries: Vec<u64> = order
        .iter()
        .copied()
        .filter(|&p| p * PAGE < size && seen.insert(p))
        .map(|p| match source.layer_of(p * PAGE) {
            Some(_) => p,
            None => p | ZERO_BIT,
        })
        .collect();
    let data_pages = entries.iter().filter(|&&e| e & ZERO_BIT == 0).count() as u64;
    let header = Header {
        mem_size: size,
        count: entries.len() as u64,
        id: id.to_string(),
    };
    let list: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    let pad = data_offset(header.count) as usize - HEADER - list.len();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&encode_header(&header, 0));
    hasher.update(&list);

    crate::files::check_target(path)?;
    let tmp = crate::files::temp_path(path)?;
    crate::files::remove_stale_temps(crate::files::dir_of(path));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> std::io::Result<()> {
        let file = crate::files::create_new_private(&tmp)?;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
        // Header placeholder, rewritten with the CRC at the end.
        f.write_all(&[0u8; HEADER])?;
        f.write_all(&list)?;
        f.write_all(&vec![0u8; pad])?;
        let mut buf = vec![0u8; PAGE as usize];
        for &e in &entries {
            if e & ZERO_BIT != 0 {
                continue;
            }
            if !source.read_page(e * PAGE, &mut buf)? {
                buf.fill(0);
            }
            hasher.update(&buf);
            f.write_all(&buf)?;
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.write_all_at(&encode_header(&header, hasher.clone().finalize()), 0)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| (header.count, data_pages))
}

/// Host address of memory-file offset `off` in `ram`.
fn host_addr(spans: &[(u64, *mut u8, usize)], off: u64) -> Option<*mut u8> {
    spans.iter().find_map(|&(s, ptr, len)| {
        let d = off.checked_sub(s)?;
        // SAFETY: d < len: an address inside the span's mapping.
        (d + PAGE <= len as u64).then(|| unsafe { ptr.add(d as usize) })
    })
}

/// Loads a working set into `ram` (a fresh memfd RAM, before userfaultfd
/// registration). Returns the pages loaded.
pub fn load(path: &Path, id: &str, ram: &GuestRam) -> Result<u64, WsLoad> {
    let f = match crate::files::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(WsLoad::Absent),
        Err(e) => return Err(WsLoad::Ignored(format!("cannot open it: {e}"))),
    };
    let bad = |s: String| WsLoad::Ignored(s);
    let len = f.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut hb = [0u8; HEADER];
    f.read_exact_at(&mut hb, 0)
        .map_err(|_| bad("too short for a working-set header".into()))?;
    if &hb[0..8] != MAGIC {
        return Err(bad("not a spore working-set file".into()));
    }
    if u32_at(&hb, 8) != VERSION || u32_at(&hb, 12) != PAGE as u32 {
        return Err(bad(format!(
            "unsupported version {} / page size {}",
            u32_at(&hb, 8),
            u32_at(&hb, 12)
        )));
    }
    let mem_size = u64_at(&hb, 16);
    let count = u64_at(&hb, 24);
    let file_id = String::from_utf8_lossy(&hb[32..64])
        .trim_end_matches('\0')
        .to_string();
    if file_id != id {
        return Err(bad(format!(
            "it was recorded for snapshot {file_id}, this is snapshot {id}"
        )));
    }
    if mem_size != ram.size() {
        return Err(bad(format!(
            "it is for {mem_size} bytes of memory, the VM has {}",
            ram.size()
        )));
    }
    if count > mem_size / PAGE {
        return Err(bad(format!(
            "it lists {count} pages, more than the memory has"
        )));
    }
    let crc = u32_at(&hb, 64);
    let mut list = vec![0u8; count as usize * 8];
    f.read_exact_at(&mut list, HEADER as u64)
        .map_err(|_| bad("truncated page list".into()))?;
    let entries: Vec<u64> = list.chunks_exact(8).map(|c| u64_at(c, 0)).collect();
    let spans = super::spans(ram);
    let mut data = Vec::with_capacity(entries.len());
    let mut zeros = Vec::new();
    for &e in &entries {
        let page = e & !ZERO_BIT;
        let addr = page
            .checked_mul(PAGE)
            .and_then(|off| host_addr(&spans, off))
            .ok_or_else(|| bad(format!("page {page} lies outside guest memory")))?;
        if e & ZERO_BIT != 0 {
            zeros.push(page);
        } else {
            data.push((page, addr));
        }
    }
    let expected = data_offset(count) + data.len() as u64 * PAGE;
    if len != expected {
        return Err(bad(format!(
            "it has {len} bytes, its header says {expected} (truncated?)"
        )));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&encode_header(
        &Header {
            mem_size,
            count,
            id: file_id.clone(),
        },
        0,
    ));
    hasher.update(&list);
    let undo = |why: String| {
        punch(ram, &entries);
        bad(why)
    };
    // One sequential read, scattered straight into guest RAM.
    let mut off = data_offset(count);
    for chunk in data.chunks(1024) {
        let iov: Vec<libc::iovec> = chunk
            .iter()
            .map(|&(_, a)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: PAGE as usize,
            })
            .collect();
        let want = iov.len() * PAGE as usize;
        let mut done = 0usize;
        while done < want {
            // Resume a short read from the first unfinished iovec.
            let skip = done / PAGE as usize;
            let part = done % PAGE as usize;
            let mut rest: Vec<libc::iovec> = iov[skip..].to_vec();
            // SAFETY: adjusts within the first iovec's page.
            rest[0].iov_base = unsafe { (rest[0].iov_base as *mut u8).add(part) } as *mut _;
            rest[0].iov_len -= part;
            // SAFETY: every iovec is one page of guest RAM owned by `ram`
            // (nothing runs in the guest yet); preadv writes only there.
            let n = unsafe {
                libc::preadv(
                    f.as_raw_fd(),
                    rest.as_ptr(),
                    rest.len().min(1024) as libc::c_int,
                    (off + done as u64) as libc::off_t,
                )
            };
            if n <= 0 {
                return Err(undo(format!(
                    "reading its data failed: {}",
                    std::io::Error::last_os_error()
                )));
            }
            done += n as usize;
        }
        for &(_, a) in chunk {
            // SAFETY: the page was just filled; nothing else writes it.
            hasher.update(unsafe { std::slice::from_raw_parts(a, PAGE as usize) });
        }
        off += want as u64;
    }
    if hasher.finalize() != crc {
        return Err(undo("checksum mismatch (corrupt file)".into()));
    }
    // Zero pages: allocate them so they never fault either.
    for &p in &zeros {
        // SAFETY: fallocate on our memfd within its size.
        unsafe { libc::fallocate(ram.memfd().as_raw_fd(), 0, (p * PAGE) as i64, PAGE as i64) };
    }
    Ok(entries.len() as u64)
}

/// Frees pages a failed load wrote, so the handler serves them again.
fn punch(ram: &GuestRam, entries: &[u64]) {
    for &e in entries {
        let p = e & !ZERO_BIT;
        // SAFETY: punching a hole in our memfd within its size.
        unsafe {
            libc::fallocate(
                ram.memfd().as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (p * PAGE) as i64,
                PAGE as i64,
            )
        };
    }
}

/// Records a working set while the built-in handler serves faults.
pub struct Recorder {
    path: PathBuf,
    id: String,
    log: Arc<ServeLog>,
    source: Arc<PageSource>,
    record_for: Option<Duration>,
    timer: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    /// The guest ran: a VM that never ran has no working set to keep.
    started: bool,
}

impl Recorder {
    pub fn new(
        path: PathBuf,
        id: String,
        log: Arc<ServeLog>,
        source: Arc<PageSource>,
        record_for: Option<Duration>,
    ) -> Self {
        Self {
            path,
            id,
            log,
            source,
            record_for,
            timer: None,
            started: false,
        }
    }

    /// Starts the `record_for` timer (when the guest starts running).
    pub fn start_timer(&mut self) {
        self.started = true;
        let Some(d) = self.record_for else { return };
        if self.timer.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<()>();
        let (path, id, log, source) = (
            self.path.clone(),
            self.id.clone(),
            self.log.clone(),
            self.source.clone(),
        );
        let spawned = crate::seccomp::spawn(
            crate::seccomp::ThreadKind::Vmm,
            "ws-record".into(),
            move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(d) {
                    end(&path, &id, &log, &source);
                }
            },
        );
        match spawned {
            Ok(h) => self.timer = Some((tx, h)),
            Err(e) => tracing::warn!(
                "cannot start the working-set timer: {e}; recording until the VM stops"
            ),
        }
    }

    /// Ends recording now (if the timer did not) and writes the file.
    pub fn finish(mut self) {
        if let Some((tx, h)) = self.timer.take() {
            let _ = tx.send(());
            let _ = h.join();
        }
        if self.started {
            end(&self.path, &self.id, &self.log, &self.source);
        } else {
            self.cancel();
        }
    }

    /// Ends recording without writing anything (the restore failed).
    pub fn cancel(self) {
        self.log.recording.store(false, Ordering::Relaxed);
        self.log
            .order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

/// Stops recording and writes the set, once (whoever takes the log).
fn end(path: &Path, id: &str, log: &ServeLog, source: &PageSource) {
    log.recording.store(false, Ordering::Relaxed);
    let order = log.order.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(order) = order.filter(|o| !o.is_empty()) else {
        return;
    };
    match write(path, id, &order, source) {
        Ok((n, d)) => tracing::info!(
            "working set recorded: {n} pages ({d} with data) in {}",
            path.display()
        ),
        Err(e) => tracing::warn!("cannot write the working set {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::layers::MemoryLayers;
    use crate::snapshot::restore::uffd::regions_of;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn round_trip_and_refusals() {
        let dir = std::env::temp_dir().join(format!("spore-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = 8u64 << 20;
        let mem = dir.join("mem");
        let f = File::create(&mem).unwrap();
        f.set_len(size).unwrap();
        for p in [3u64, 4, 100, 1500] {
            f.write_all_at(&[p as u8; 4096], p * PAGE).unwrap();
        }
        let ram0 = GuestRam::new(size).unwrap();
        let source = PageSource::new(
            MemoryLayers::single(File::open(&mem).unwrap(), size),
            regions_of(&ram0),
        )
        .unwrap();
        let ws = dir.join("ws");
        // 7 is a hole (a zero entry); 100 twice is stored once.
        let (n, d) = write(&ws, "abc", &[100, 3, 7, 1500, 100], &source).unwrap();
        assert_eq!((n, d), (4, 3));

        let ram = GuestRam::new(size).unwrap();
        assert_eq!(load(&ws, "abc", &ram), Ok(4));
        for p in [3u64, 100, 1500] {
            let v: u8 = ram.memory().read_obj(GuestAddress(p * PAGE)).unwrap();
            assert_eq!(v, p as u8);
        }
        let resident = crate::memory::pages::data_ranges(ram.memfd(), size).unwrap();
        let pages: u64 = resident.iter().map(|r| r.1 / PAGE).sum();
        assert_eq!(pages, 3, "{resident:?}");
        // Loaded pages, zero ones included, never reach the handler.
        let uffd = crate::snapshot::restore::uffd::register_ram(&ram).unwrap();
        let source2 = PageSource::new(
            MemoryLayers::single(File::open(&mem).unwrap(), size),
            regions_of(&ram),
        )
        .unwrap();
        let mut server =
            crate::snapshot::restore::uffd::UffdServer::start(uffd, Arc::new(source2), true)
                .unwrap();
        for p in [7u64, 3, 100, 1500, 4] {
            let v: u8 = ram.memory().read_obj(GuestAddress(p * PAGE)).unwrap();
            assert_eq!(v, if p == 7 { 0 } else { p as u8 });
        }
        assert_eq!(server.log().order.lock().unwrap().clone().unwrap(), vec![4]);
        server.stop();

        // Another snapshot's set, a missing one, a flipped byte, a truncated one.
        let ram = GuestRam::new(size).unwrap();
        assert!(
            matches!(load(&ws, "other", &ram), Err(WsLoad::Ignored(w)) if w.contains("recorded for snapshot abc"))
        );
        assert_eq!(load(&dir.join("none"), "abc", &ram), Err(WsLoad::Absent));
        let mut bytes = std::fs::read(&ws).unwrap();
        let last = bytes.len() - 10;
        bytes[last] ^= 1;
        let bad = dir.join("bad");
        std::fs::write(&bad, &bytes).unwrap();
        assert!(
            matches!(load(&bad, "abc", &ram), Err(WsLoad::Ignored(w)) if w.contains("checksum"))
        );
        // The failed load left nothing behind.
        assert!(crate::memory::pages::data_ranges(ram.memfd(), size)
            .unwrap()
            .is_empty());
        std::fs::write(&bad, &bytes[..bytes.len() - 4096]).unwrap();
        assert!(
            matches!(load(&bad, "abc", &ram), Err(WsLoad::Ignored(w)) if w.contains("truncated"))
        );
        // A well-formed file (valid CRC) naming pages beyond guest memory.
        for page in [2048u64, (1 << 62) + 5] {
            let h = Header {
                mem_size: size,
                count: 1,
                id: "abc".into(),
            };
            let list = (page | ZERO_BIT).to_le_bytes();
            let mut c = crc32fast::Hasher::new();
            c.update(&encode_header(&h, 0));
            c.update(&list);
            let mut bytes = encode_header(&h, c.finalize()).to_vec();
            bytes.extend_from_slice(&list);
            bytes.resize(data_offset(1) as usize, 0);
            std::fs::write(&bad, &bytes).unwrap();
            assert!(
                matches!(load(&bad, "abc", &ram), Err(WsLoad::Ignored(w)) if w.contains("outside guest memory")),
                "page {page}"
            );
        }
        std::fs::write(&bad, b"garbage").unwrap();
        assert!(matches!(load(&bad, "abc", &ram), Err(WsLoad::Ignored(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
