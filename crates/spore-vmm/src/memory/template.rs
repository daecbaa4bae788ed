//! Guest RAM as layers of frozen memory files, for clone templates.
//!
//! A clone template is a stack of memfds: a base holding the whole RAM, and
//! overlays holding only the pages some VM wrote after it was itself mapped
//! from a template (a clone of a clone, a source cloned again in continue
//! mode). Offsets in every layer are RAM offsets (boot RAM regions back to
//! back, as in [`GuestRam`]'s memfd). A VM maps the base privately and each
//! overlay's runs privately on top (`MAP_FIXED`), so it shares every page
//! copy-on-write with the template and pays only for what it writes.
//!
//! Layers are never written once they are part of a template: this module
//! only creates them (copying pages out of a private mapping) and maps them.
//! They are freed by the kernel when the last fd and mapping is gone.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::{create_memfd, GuestRam, MemoryError};
use crate::host_usize;

const PAGE: u64 = 4096;

/// One layer of a template: a memory file and where its data lies. `None`
/// runs means the whole RAM (a base layer).
#[derive(Clone, Debug)]
pub struct MemoryLayer {
    pub file: Arc<File>,
    pub runs: Option<Vec<(u64, u64)>>,
}

impl MemoryLayer {
    /// Bytes of RAM this layer provides.
    pub fn data_bytes(&self, ram_size: u64) -> u64 {
        match &self.runs {
            None => ram_size,
            Some(r) => r.iter().map(|&(_, l)| l).sum(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("a template needs a base layer first")]
    NoBase,
    #[error("template layer run {offset:#x}+{len:#x} is not page-aligned or lies outside {size:#x} bytes of RAM")]
    BadRun { offset: u64, len: u64, size: u64 },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> TemplateError {
    move |source| TemplateError::Io { what, source }
}

/// (RAM offset, host address, length) of each mapped region.
fn spans(ram: &GuestRam) -> Vec<(u64, *mut u8, u64)> {
    let mut off = 0;
    ram.memory()
        .iter()
        .map(|r| {
            let s = (off, r.as_ptr(), r.len());
            off += r.len();
            s
        })
        .collect()
}

/// The ranges of `file` (up to `size`) that hold data, page-aligned
/// (`SEEK_DATA`/`SEEK_HOLE`); empty if the file system cannot say.
fn data_ranges(file: &File, size: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on an fd we hold; results are checked.
        let start = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if start < 0 {
            break;
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        if end <= start {
            break;
        }
        let lo = start as u64 & !(PAGE - 1);
        let hi = (end as u64).min(size).div_ceil(PAGE) * PAGE;
        out.push((lo, hi.min(size) - lo));
        pos = end;
    }
    out
}

impl GuestRam {
    /// Maps `layers` (base first) privately: the RAM of a clone.
    pub fn from_template_layers(layers: &[MemoryLayer], size: u64) -> Result<Self, TemplateError> {
        let (base, overlays) = layers.split_first().ok_or(TemplateError::NoBase)?;
        if base.runs.is_some() {
            return Err(TemplateError::NoBase);
        }
        let file = base.file.try_clone().map_err(MemoryError::Memfd)?;
        let mut ram = GuestRam::from_snapshot_file(file, size)?;
        for layer in overlays {
            ram.map_runs(layer)?;
        }
        ram.mapped_from = layers.to_vec();
        Ok(ram)
    }

    /// Re-maps this RAM privately over `layer`'s runs (or all of it for a
    /// base layer), in place: guest addresses and host addresses stay the
    /// same, KVM's memory slots follow through its MMU notifier. Used when a
    /// running VM becomes a template and goes on (continue mode): afterwards
    /// it writes only its own copies. The vCPUs must be parked and device
    /// workers stopped.
    pub fn remap_private(&self, layer: &MemoryLayer) -> Result<(), TemplateError> {
        self.map_runs(layer)?;
        self.private
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn map_runs(&self, layer: &MemoryLayer) -> Result<(), TemplateError> {
        let whole = [(0, self.size)];
        let runs = layer.runs.as_deref().unwrap_or(&whole);
        let spans = spans(self);
        for &(offset, len) in runs {
            if offset % PAGE != 0
                || len % PAGE != 0
                || offset.checked_add(len).is_none_or(|e| e > self.size)
            {
                return Err(TemplateError::BadRun {
                    offset,
                    len,
                    size: self.size,
                });
            }
            for &(span_off, ptr, span_len) in &spans {
                let lo = offset.max(span_off);
                let hi = (offset + len).min(span_off + span_len);
                if lo >= hi {
                    continue;
                }
                // SAFETY: [addr, addr + hi - lo) lies inside a mapping this
                // GuestRam owns (checked against the span); MAP_FIXED
                // replaces it with a private view of the same size of a file
                // that holds the same guest pages. Nobody accesses the range
                // meanwhile (vCPUs parked, devices stopped, or not started).
                let r = unsafe {
                    libc::mmap(
                        ptr.add(host_usize::from_u64(lo - span_off))
                            .cast::<libc::c_void>(),
                        host_usize::from_u64(hi - lo),
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                        layer.file.as_raw_fd(),
                        lo as libc::off_t,
                    )
                };
                if r == libc::MAP_FAILED {
                    return Err(io("mapping a template layer")(
                        std::io::Error::last_os_error(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The pages this private mapping holds as its own copies (written
    /// since it was mapped from its layers), as runs of RAM offsets. Read
    /// from `/proc/self/pagemap`: a present page that is not a file page,
    /// or a swapped one, is a private copy. Without /proc, all of RAM.
    pub fn private_runs(&self) -> Result<Vec<(u64, u64)>, TemplateError> {
        let pagemap = match File::open("/proc/self/pagemap") {
            Ok(f) => f,
            // No /proc (a jail): every page counts as written. The layer
            // is as large as RAM, and still exactly its contents.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut runs: Vec<(u64, u64)> = Vec::new();
                for (off, _, len) in spans(self) {
                    match runs.last_mut() {
                        Some((o, l)) if *o + *l == off => *l += len,
                        _ => runs.push((off, len)),
                    }
                }
                return Ok(runs);
            }
            Err(e) => return Err(io("opening pagemap")(e)),
        };
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut buf = vec![0u8; 8 * 8192];
        for (span_off, ptr, span_len) in spans(self) {
            let pages = span_len / PAGE;
            let mut done = 0u64;
            while done < pages {
                let n = (pages - done).min(8192);
                let vpn = ptr as u64 / PAGE + done;
                let bytes = &mut buf[..host_usize::from_u64(n * 8)];
                pagemap
                    .read_exact_at(bytes, vpn * 8)
                    .map_err(io("reading pagemap"))?;
                for (i, e) in bytes.chunks_exact(8).enumerate() {
                    let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
                    let present = e >> 63 & 1 == 1;
                    let swapped = e >> 62 & 1 == 1;
                    let file = e >> 61 & 1 == 1;
                    if (present && !file) || swapped {
                        let off = span_off + (done + i as u64) * PAGE;
                        match runs.last_mut() {
                            Some((o, l)) if *o + *l == off => *l += PAGE,
                            _ => runs.push((off, PAGE)),
                        }
                    }
                }
                done += n;
            }
        }
        Ok(runs)
    }

    /// Copies this mapping's private pages into a new memory file: the
    /// overlay layer that, on top of the layers this RAM was mapped from,
    /// gives its current contents. `None` when it wrote nothing.
    pub fn private_layer(&self) -> Result<Option<MemoryLayer>, TemplateError> {
        let runs = self.private_runs()?;
        if runs.is_empty() {
            return Ok(None);
        }
        let file = create_memfd("spore-clone-layer")?;
        file.set_len(self.size)
            .map_err(|source| MemoryError::Truncate {
                size: self.size,
                source,
            })?;
        let spans = spans(self);
        for &(offset, len) in &runs {
            for &(span_off, ptr, span_len) in &spans {
                let lo = offset.max(span_off);
                let hi = (offset + len).min(span_off + span_len);
                if lo >= hi {
                    continue;
                }
                // SAFETY: inside a live mapping of guest RAM owned by self;
                // the VM is paused and devices stopped, nobody writes it.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        ptr.add(host_usize::from_u64(lo - span_off)),
                        host_usize::from_u64(hi - lo),
                    )
                };
                file.write_all_at(bytes, lo)
                    .map_err(io("writing a template layer"))?;
            }
        }
        Ok(Some(MemoryLayer {
            file: Arc::new(file),
            runs: Some(runs),
        }))
    }

    /// A private mapping of an empty memory file of `size` bytes: the host
    /// addresses a standby clone process registers with KVM before it
    /// knows its template ([`Self::adopt_layers`] maps the template there).
    pub fn placeholder(size: u64) -> Result<Self, TemplateError> {
        let file = create_memfd("spore-clone-placeholder")?;
        file.set_len(size)
            .map_err(|source| MemoryError::Truncate { size, source })?;
        Ok(GuestRam::from_snapshot_file(file, size)?)
    }

    /// Maps `layers` (base first) over this RAM in place, at the same host
    /// addresses: a placeholder becomes a clone's RAM without touching its
    /// KVM memory slots (KVM's MMU notifier drops the old translations).
    pub fn adopt_layers(&mut self, layers: &[MemoryLayer]) -> Result<(), TemplateError> {
        let base = layers.first().ok_or(TemplateError::NoBase)?;
        if base.runs.is_some() {
            return Err(TemplateError::NoBase);
        }
        for layer in layers {
            self.map_runs(layer)?;
        }
        self.memfd = base.file.try_clone().map_err(MemoryError::Memfd)?;
        self.mapped_from = layers.to_vec();
        self.private
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Fills the host page tables for the data `layers` hold (read-only:
    /// pages stay shared with the template), so that a standby clone's
    /// first guest accesses do not fault on the host. Best effort: a kernel
    /// without `MADV_POPULATE_READ` (before 5.14) just skips it.
    pub fn prefault_layers(&self, layers: &[MemoryLayer]) {
        const MADV_POPULATE_READ: libc::c_int = 22;
        let spans = spans(self);
        for layer in layers {
            let ranges = match &layer.runs {
                Some(r) => r.clone(),
                None => data_ranges(&layer.file, self.size),
            };
            for (offset, len) in ranges {
                for &(span_off, ptr, span_len) in &spans {
                    let lo = offset.max(span_off);
                    let hi = (offset + len).min(span_off + span_len);
                    if lo >= hi {
                        continue;
                    }
                    // SAFETY: a range inside a mapping this GuestRam owns;
                    // populating reads it, nothing is written.
                    unsafe {
                        libc::madvise(
                            ptr.add(host_usize::from_u64(lo - span_off))
                                .cast::<libc::c_void>(),
                            host_usize::from_u64(hi - lo),
                            MADV_POPULATE_READ,
                        )
                    };
                }
            }
        }
    }

    /// This RAM's memfd as a base layer (a VM that was never cloned).
    pub fn base_layer(&self) -> Result<MemoryLayer, TemplateError> {
        Ok(MemoryLayer {
            file: Arc::new(self.memfd.try_clone().map_err(MemoryError::Memfd)?),
            runs: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    /// A VM restored from a snapshot chain (a base file and a diff whose
    /// runs are partly mapped, partly read in) becomes a template: its
    /// clones see exactly what it sees, the files untouched.
    #[test]
    fn a_vm_restored_from_snapshot_files_is_a_template() {
        use crate::memory::layers::MemoryLayers;
        let size: u64 = 8 << 20;
        let dir =
            std::env::temp_dir().join(format!("spore-template-restored-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mk = |name: &str, pages: &[(u64, u8)]| {
            let f = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .unwrap();
            f.set_len(size).unwrap();
            for &(p, v) in pages {
                f.write_all_at(&[v; 4096], p * 4096).unwrap();
            }
            f
        };
        let base = mk("base", &[(0, 1), (1, 1), (2, 1)]);
        // Page 1 alone (read in), pages 32..48 (a 64 KiB run: mapped).
        let mut diff_pages = vec![(1, 2)];
        diff_pages.extend((32..48).map(|p| (p, 3)));
        let diff = mk("diff", &diff_pages);
        let ram = GuestRam::from_layers(&MemoryLayers::new(vec![base, diff], size)).unwrap();
        assert!(ram.is_private());
        assert_eq!(ram.mapped_from().len(), 2, "base and the diff's mapped run");
        ram.memory().write_obj(9u8, GuestAddress(2 * 4096)).unwrap();

        let mut layers = ram.mapped_from().to_vec();
        layers.extend(ram.private_layer().unwrap());
        let clone = GuestRam::from_template_layers(&layers, size).unwrap();
        let page =
            |r: &GuestRam, p: u64| r.memory().read_obj::<u8>(GuestAddress(p * 4096)).unwrap();
        for p in [0, 1, 2, 3, 32, 47, 48] {
            assert_eq!(page(&clone, p), page(&ram, p), "page {p}");
        }
        assert_eq!(
            [0, 1, 2, 3, 32, 47].map(|p| page(&clone, p)),
            [1, 2, 9, 0, 3, 3]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn layers_stack_and_private_pages_become_an_overlay() {
        let size = 8 << 20;
        let src = GuestRam::new(size).unwrap();
        src.memory().write_obj(1u64, GuestAddress(0)).unwrap();
        src.memory().write_obj(2u64, GuestAddress(0x5000)).unwrap();
        let base = src.base_layer().unwrap();

        // A clone of the source writes one page of its own.
        let clone = GuestRam::from_template_layers(std::slice::from_ref(&base), size).unwrap();
        assert!(clone.is_private());
        assert_eq!(clone.memory().read_obj::<u64>(GuestAddress(0)).unwrap(), 1);
        clone
            .memory()
            .write_obj(3u64, GuestAddress(0x5000))
            .unwrap();
        clone
            .memory()
            .write_obj(4u64, GuestAddress(0x7008))
            .unwrap();
        let runs = clone.private_runs().unwrap();
        assert_eq!(runs, vec![(0x5000, 0x1000), (0x7000, 0x1000)]);
        // The template is untouched.
        assert_eq!(
            src.memory().read_obj::<u64>(GuestAddress(0x5000)).unwrap(),
            2
        );

        // A clone of the clone sees the clone's pages over the base.
        let overlay = clone.private_layer().unwrap().unwrap();
        let layers = [base.clone(), overlay];
        let grand = GuestRam::from_template_layers(&layers, size).unwrap();
        assert_eq!(grand.memory().read_obj::<u64>(GuestAddress(0)).unwrap(), 1);
        assert_eq!(
            grand
                .memory()
                .read_obj::<u64>(GuestAddress(0x5000))
                .unwrap(),
            3
        );
        assert_eq!(
            grand
                .memory()
                .read_obj::<u64>(GuestAddress(0x7008))
                .unwrap(),
            4
        );
        assert!(grand.private_runs().unwrap().is_empty());
        grand
            .memory()
            .write_obj(5u64, GuestAddress(0x5000))
            .unwrap();
        assert_eq!(
            clone
                .memory()
                .read_obj::<u64>(GuestAddress(0x5000))
                .unwrap(),
            3
        );

        // The source goes on privately (continue mode): its writes reach
        // neither the template nor the clones.
        src.remap_private(&base).unwrap();
        assert!(src.is_private());
        assert_eq!(
            src.memory().read_obj::<u64>(GuestAddress(0x5000)).unwrap(),
            2
        );
        src.memory().write_obj(9u64, GuestAddress(0)).unwrap();
        let again = GuestRam::from_template_layers(std::slice::from_ref(&base), size).unwrap();
        assert_eq!(again.memory().read_obj::<u64>(GuestAddress(0)).unwrap(), 1);

        // A placeholder adopts the layers at its own addresses.
        let mut ph = GuestRam::placeholder(size).unwrap();
        let addr = ph.memory().get_host_address(GuestAddress(0)).unwrap();
        ph.adopt_layers(std::slice::from_ref(&base)).unwrap();
        assert_eq!(ph.memory().get_host_address(GuestAddress(0)).unwrap(), addr);
        assert_eq!(
            ph.memory().read_obj::<u64>(GuestAddress(0x5000)).unwrap(),
            2
        );

        // Runs outside RAM are refused.
        let bad = MemoryLayer {
            file: base.file.clone(),
            runs: Some(vec![(size, 4096)]),
        };
        assert!(matches!(
            GuestRam::from_template_layers(&[base, bad], size),
            Err(TemplateError::BadRun { .. })
        ));
    }
}
