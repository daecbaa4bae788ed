//! Recording a working set: the first-touch order the built-in userfaultfd
//! handler logs, ended by a timer or when the VM stops, written as a
//! version-3 file (temporary name, synced, renamed into place).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::format::{
    data_offset, encode_header, encode_runs, touch_runs, Header, CHUNK_PAGES, HEADER, PAGE, VERSION,
};
use crate::snapshot::restore::uffd::{PageSource, ServeLog};

/// Writes a working set for `order` (page numbers, first-touch order),
/// with the snapshot's data for each page. Returns (pages, runs).
pub fn write(
    path: &Path,
    id: &str,
    order: &[u64],
    source: &PageSource,
) -> std::io::Result<(u64, u64)> {
    let size = source.layers().size();
    let runs = touch_runs(order, size / PAGE);
    let pages: u64 = runs.iter().map(|r| r.1).sum();
    let header = Header {
        version: VERSION,
        mem_size: size,
        count: runs.len() as u64,
        id: id.to_string(),
    };
    let list = encode_runs(&runs);
    let chunks = crate::host_usize::from_u64(pages.div_ceil(CHUNK_PAGES));
    let total = u32::try_from(pages)
        .map_err(|_| std::io::Error::other("a working set of more than 2^32 pages"))?;
    let table_len = chunks * 4;

    crate::files::check_target(path)?;
    let tmp = crate::files::temp_path(path)?;
    crate::files::remove_stale_temps(crate::files::dir_of(path));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> std::io::Result<()> {
        let file = crate::files::create_new_private(&tmp)?;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
        // Header and chunk-CRC placeholders, rewritten at the end.
        f.write_all(&[0u8; HEADER])?;
        f.write_all(&list)?;
        f.write_all(&vec![0u8; table_len])?;
        let pad = crate::host_usize::from_u64(data_offset((list.len() + table_len) as u64))
            - HEADER
            - list.len()
            - table_len;
        f.write_all(&vec![0u8; pad])?;
        let mut crcs: Vec<u32> = Vec::with_capacity(chunks);
        let mut chunk_crc = crc32fast::Hasher::new();
        let mut in_chunk = 0u64;
        let mut buf = vec![0u8; crate::host_usize::from_u64(PAGE)];
        for &(first, n) in &runs {
            for p in first..first + n {
                if !source.read_page(p * PAGE, &mut buf)? {
                    buf.fill(0);
                }
                chunk_crc.update(&buf);
                f.write_all(&buf)?;
                in_chunk += 1;
                if in_chunk == CHUNK_PAGES {
                    crcs.push(std::mem::take(&mut chunk_crc).finalize());
                    in_chunk = 0;
                }
            }
        }
        if in_chunk > 0 {
            crcs.push(chunk_crc.finalize());
        }
        let table: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&encode_header(&header, 0, total));
        hasher.update(&list);
        hasher.update(&table);
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.write_all_at(&table, (HEADER + list.len()) as u64)?;
        f.write_all_at(&encode_header(&header, hasher.finalize(), total), 0)?;
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
    result.map(|()| (pages, header.count))
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
        Ok((n, r)) => tracing::info!(
            "working set recorded: {n} pages in {r} runs in {}",
            path.display()
        ),
        Err(e) => tracing::warn!("cannot write the working set {}: {e}", path.display()),
    }
}
