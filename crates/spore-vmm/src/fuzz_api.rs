//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`)
//! and for the regression replay in `cargo test` (always compiled in tests).
//!
//! Each function takes the raw fuzz input and drives one of spore's parsers
//! through the same code the VMM runs: virtio devices through their mmio
//! transport and worker thread over a guest memory built from the input, the
//! API through hyper and the dispatcher of a pre-boot [`Vmm`], the snapshot
//! state decoder with its integrity checks, the `--config-file` parser and
//! the tmem port. None of them changes what the VMM does: they only build
//! the inputs a guest, a client or a file would give. A function returns
//! normally for any input; a panic (or an abort, an endless loop or an
//! unbounded allocation) is a bug in spore.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::api::{ActionType, ApiError, ApiHandler, ApiRequest, ApiResponse};
use crate::devices::bus::BusDevice;
use crate::devices::tmem::{Compression, TmemDevice};
use crate::devices::virtio::balloon::{Balloon, BalloonSettings};
use crate::devices::virtio::blk::Block;
use crate::devices::virtio::mem::VirtioMem;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::tap::SocketBackend;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::Vsock;
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::wake::GuestWake;
use crate::memory::hotplug::HotplugMemory;

/// Guest RAM of every device target: two regions with a hole between them,
/// so buffers that cross a region's end are part of what is tried.
const REGIONS: [(u64, usize); 2] = [(0, 0x1_0000), (0x2_0000, 0x1_0000)];

fn guest_memory(image: &[u8]) -> Option<GuestMemoryMmap> {
    let ranges: Vec<_> = REGIONS.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).ok()?;
    let mut rest = image;
    for &(addr, len) in &REGIONS {
        let n = rest.len().min(len);
        mem.write_slice(&rest[..n], GuestAddress(addr)).ok()?;
        rest = &rest[n..];
    }
    Some(mem)
}

fn interrupt() -> Option<Arc<VirtioInterrupt>> {
    Some(Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).ok()?,
        Arc::new(GuestWake::new().ok()?),
    )))
}

/// A per-process scratch directory for the files a device needs (a disk
/// image, a vsock socket), each name used once.
fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("spore-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join(format!("{name}-{n}"))
}

/// The virtio devices the targets drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Blk,
    Rng,
    Balloon,
    Vsock,
    Mem,
    Net,
}

impl DeviceKind {
    pub const ALL: [DeviceKind; 6] = [
        DeviceKind::Blk,
        DeviceKind::Rng,
        DeviceKind::Balloon,
        DeviceKind::Vsock,
        DeviceKind::Mem,
        DeviceKind::Net,
    ];
}

/// Keeps what a device needs alive (and removes its files) for one input.
struct DeviceFiles {
    paths: Vec<PathBuf>,
    /// The host's end of a net device's socketpair (closing it would drop
    /// the frames queued for the guest).
    _peer: Option<std::os::unix::net::UnixDatagram>,
}

impl DeviceFiles {
    fn paths(paths: Vec<PathBuf>) -> Self {
        DeviceFiles { paths, _peer: None }
    }
}

impl Drop for DeviceFiles {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
            // The scratch directory goes too once empty (the last input).
            if let Some(dir) = p.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// Builds a device as the VMM would; `knobs` picks its settings.
fn make_device(kind: DeviceKind, knobs: u8) -> Option<(Box<dyn VirtioDevice>, DeviceFiles)> {
    match kind {
        DeviceKind::Blk => {
            // A 4 KiB image (8 sectors) with recognisable content.
            let path = scratch("disk");
            let content: Vec<u8> = (0..4096u32).map(|i| ((i * 7) & 0xff) as u8).collect();
            std::fs::write(&path, content).ok()?;
            let read_only = knobs & 1 != 0;
            let dev = Block::new("fuzz".into(), &path, read_only, false).ok()?;
            Some((Box::new(dev), DeviceFiles::paths(vec![path])))
        }
        DeviceKind::Rng => {
            // With the knob, a rate limiter (roomy: chains go through its
            // accounting without waiting on its timer).
            let limits = crate::config::RateLimiterConfig {
                bandwidth: Some(crate::config::TokenBucketConfig {
                    size: 1 << 20,
                    one_time_burst: None,
                    refill_time: 100,
                }),
                ops: None,
            };
            let limits = (knobs & 0x80 != 0).then_some(&limits);
            Some((Box::new(Rng::new(limits).ok()?), DeviceFiles::paths(vec![])))
        }
        DeviceKind::Balloon => {
            let settings = BalloonSettings {
                amount_mib: u32::from(knobs >> 4),
                deflate_on_oom: knobs & 1 != 0,
                stats_polling_interval_s: u16::from(knobs & 2 != 0),
                free_page_reporting: knobs & 4 != 0,
                free_page_hinting: knobs & 8 != 0,
                mem_mib: 16,
            };
            Some((
                Box::new(Balloon::new(settings).ok()?),
                DeviceFiles::paths(vec![]),
            ))
        }
        DeviceKind::Vsock => {
            let path = scratch("v.sock");
            let dev = Vsock::new(3, path.clone()).ok()?;
            Some((Box::new(dev), DeviceFiles::paths(vec![path])))
        }
        DeviceKind::Mem => {
            // 8 blocks of 2 MiB at 4 GiB, 4 blocks a KVM slot (no VM here:
            // the slots are only counted).
            const BS: u64 = 2 << 20;
            let backing = HotplugMemory::new(4 << 30, 8 * BS, 4 * BS).ok()?;
            let (dev, handle) = VirtioMem::new(backing, BS, 4 * BS);
            // A target lets the guest plug; 0 makes it unplug.
            let _ = handle.set_requested_mib(u64::from(knobs % 9) * 2);
            Some((Box::new(dev), DeviceFiles::paths(vec![])))
        }
        DeviceKind::Net => {
            // A socketpair for the tap, holding two frames for rx (a short
            // one and one that spans buffers); tx frames queue on the
            // host's end.
            let (backend, host) = SocketBackend::pair().ok()?;
            for len in [60usize, 3000] {
                let frame: Vec<u8> = (0..12 + len)
                    .map(|i: usize| if i < 12 { 0 } else { i.to_le_bytes()[0] })
                    .collect();
                host.send(&frame).ok()?;
            }
            let cfg = crate::config::NetworkInterfaceConfig {
                iface_id: "fuzz".into(),
                host_dev_name: "fuzz".into(),
                guest_mac: (knobs & 1 != 0).then_some(crate::config::MacAddr([6, 0, 0, 0, 0, 1])),
                mtu: None,
                rx_rate_limiter: None,
                tx_rate_limiter: None,
            };
            let dev = Net::with_backend(&cfg, Box::new(backend)).ok()?;
            let files = DeviceFiles {
                paths: Vec::new(),
                _peer: Some(host),
            };
            Some((Box::new(dev), files))
        }
    }
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

/// Queue `i`'s rings: descriptor table, avail ring, used ring.
fn ring_addrs(i: u64) -> [u64; 3] {
    let base = i * 0x1000;
    [base, base + 0x800, base + 0xc00]
}

/// One virtio device served over a queue layout read from the input.
///
/// Input: 8 bytes of driver features (acked where the device offers them),
/// one byte of queue size (a power of two, at most 256), one byte of device
/// settings, then the guest memory image. Queue `i` has its descriptor table
/// at `i * 0x1000`, its avail ring at `+0x800` and its used ring at `+0xc00`,
/// so the image's first pages are the rings. The driver's initialization is
/// played through the mmio registers; activation starts the device's worker,
/// which serves every chain already available; the device is then reset
/// (which stops and joins the worker).
pub fn virtio_queue(kind: DeviceKind, data: &[u8]) {
    let _ = virtio_queue_used(kind, data);
}

/// [`virtio_queue`], returning each queue's used index afterwards (the
/// chains the device handed back), so tests can see the seeds reach the
/// device.
pub fn virtio_queue_used(kind: DeviceKind, data: &[u8]) -> Option<Vec<u16>> {
    if data.len() < 10 {
        return None;
    }
    let features = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
    let size = 1u32 << (data[8] % 9);
    let knobs = data[9];
    let mem = guest_memory(&data[10..])?;
    let (device, _files) = make_device(kind, knobs)?;
    let irq = interrupt()?;
    let mut t = MmioTransport::new(device, mem.clone(), irq).ok()?;
    // Status ACKNOWLEDGE | DRIVER, then the features the device offers.
    wr(&mut t, 0x70, 1);
    wr(&mut t, 0x70, 3);
    let mut offered = 0u64;
    for sel in 0..2u32 {
        wr(&mut t, 0x14, sel);
        let mut b = [0u8; 4];
        t.read(0x10, &mut b);
        offered |= u64::from(u32::from_le_bytes(b)) << (32 * sel);
    }
    let acked = offered & features;
    for sel in 0..2u32 {
        wr(&mut t, 0x24, sel);
        wr(&mut t, 0x20, ((acked >> (32 * sel)) & 0xffff_ffff) as u32);
    }
    wr(&mut t, 0x70, 0xb);
    let queues = t.queue_events().len() as u64;
    for q in 0..queues {
        wr(&mut t, 0x30, (q & 0xffff_ffff) as u32);
        wr(&mut t, 0x38, size);
        for (reg, addr) in [0x80, 0x90, 0xa0].into_iter().zip(ring_addrs(q)) {
            wr(&mut t, reg, (addr & 0xffff_ffff) as u32);
            wr(&mut t, reg + 4, (addr >> 32) as u32);
        }
        wr(&mut t, 0x44, 1);
    }
    wr(&mut t, 0x70, 0xf);
    // Reset: stops the worker after its first round over the rings.
    wr(&mut t, 0x70, 0);
    let used = (0..queues)
        .map(|q| {
            mem.read_obj::<u16>(GuestAddress(ring_addrs(q)[2] + 2))
                .unwrap_or(0)
        })
        .collect();
    Some(used)
}

/// The virtio-mmio transport's register file, driven by a sequence of
/// register accesses from the input (which is also the guest memory
/// image, so queue addresses can point at bytes the fuzzer chose).
///
/// Input: byte 0 picks the device, byte 1 its settings; then records of
/// 7 bytes: a flag byte (bit 0: write, bits 1-2: access width 1/2/4/8), a
/// 16-bit register offset, a 32-bit value.
pub fn mmio_registers(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let kind = DeviceKind::ALL[usize::from(data[0]) % DeviceKind::ALL.len()];
    let Some(mem) = guest_memory(data) else {
        return;
    };
    let Some((device, _files)) = make_device(kind, data[1]) else {
        return;
    };
    let Some(irq) = interrupt() else {
        return;
    };
    let Ok(mut t) = MmioTransport::new(device, mem, irq) else {
        return;
    };
    for rec in data[2..].chunks_exact(7).take(256) {
        let width = 1usize << ((rec[0] >> 1) & 3);
        let offset = u64::from(u16::from_le_bytes([rec[1], rec[2]])) % 0x1000;
        let value = u64::from(u32::from_le_bytes([rec[3], rec[4], rec[5], rec[6]]));
        let bytes = (value | value << 32).to_le_bytes();
        if rec[0] & 1 != 0 {
            t.write(offset, &bytes[..width]);
        } else {
            let mut out = [0u8; 8];
            t.read(offset, &mut out[..width]);
        }
    }
    // A reset stops any worker the sequence started.
    wr(&mut t, 0x70, 0);
}

/// The vsock packet parser alone, over every chain of a tx queue laid out
/// as in [`virtio_queue`] (the device target covers it too, behind the
/// transport; this one reaches the parser's checks without a handshake).
pub fn vsock_tx(data: &[u8]) {
    use virtio_queue::{Queue, QueueT};
    if data.len() < 2 {
        return;
    }
    let Some(mem) = guest_memory(&data[1..]) else {
        return;
    };
    let Ok(mut q) = Queue::new(256) else {
        return;
    };
    q.set_size(1 << (data[0] % 9));
    let [desc, avail, used] = ring_addrs(0);
    q.set_desc_table_address(Some((desc & 0xffff_ffff) as u32), Some(0));
    q.set_avail_ring_address(Some((avail & 0xffff_ffff) as u32), Some(0));
    q.set_used_ring_address(Some((used & 0xffff_ffff) as u32), Some(0));
    q.set_ready(true);
    let mut n = 0;
    while let Some(chain) = q.pop_descriptor_chain(&mem) {
        let _ = crate::devices::virtio::vsock::packet::parse_tx(&mem, chain, 3);
        n += 1;
        if n > 1024 {
            break;
        }
    }
    let _ = crate::devices::virtio::vsock::listener::parse_connect(data);
}

/// The tmem port: the input is the guest memory image; its first byte
/// picks the compression, the next 4-byte words are the values written to
/// the port (a block's address >> 4), at most 16 calls.
pub fn tmem_calls(data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let compression = if data[0] & 1 == 0 {
        Compression::None
    } else {
        Compression::Lz4
    };
    let Some(mem) = guest_memory(data) else {
        return;
    };
    let dev = TmemDevice::new(64 * 1024, compression);
    for w in data[1..].chunks_exact(4).take(16) {
        let _ = dev.port_write(&mem, w);
    }
    let _ = dev.stats();
    // What a snapshot of this pool would hold must load back.
    let state = dev.save();
    if let Err(e) = TmemDevice::restore(&state) {
        panic!("a saved tmem state does not load back: {e}");
    }
}

/// The snapshot key the state target also decodes under (32 bytes, the
/// shortest key spore takes).
pub const FUZZ_KEY: &[u8] = b"spore-fuzz-key-0123456789abcdef!";

/// A snapshot state file's bytes → the decoder (magic, version, manifest,
/// CRC, MAC under no key and under a key) → the state's own decoding and
/// its checks against the manifest; and the memory file's trailer page.
///
/// A fuzzer cannot forge a CRC or a MAC, so an input that does not start
/// with the state file's magic is read as a 4-byte manifest length, the
/// manifest's JSON and the state's bytes: these are encoded into a state
/// file (with a correct CRC and MAC) that then takes the same path, so the
/// state decoding behind the checksums is fuzzed too.
pub fn snapshot_state(data: &[u8]) {
    use crate::snapshot::format::{decode_with, encode_with, Manifest};
    use crate::snapshot::integrity::SnapshotKey;
    let key = SnapshotKey::new(FUZZ_KEY);
    let decode = |file: &[u8]| {
        for k in [None, key.as_ref()] {
            if let Ok((manifest, state)) = decode_with("fuzz.state", file, k) {
                let _ = crate::snapshot::decode_state("fuzz.state", &manifest, state);
            }
        }
    };
    if data.starts_with(crate::snapshot::format::MAGIC) || data.len() < 4 {
        decode(data);
    } else {
        let len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let rest = &data[4..];
        let Some(json) = rest.get(..len) else {
            return;
        };
        let Ok(manifest) = serde_json::from_slice::<Manifest>(json) else {
            return;
        };
        for k in [None, key.as_ref()] {
            if let Ok(file) = encode_with(&manifest, &rest[len..], k) {
                decode(&file);
            }
        }
    }
    let _ = crate::snapshot::trailer::decode(data);
}

/// A `--config-file` as `spore vmm` reads it: UTF-8, JSON into
/// [`crate::config::VmConfig`], then validated; what parses must
/// serialize (GET /vm/config shows it).
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = serde_json::from_str::<crate::config::VmConfig>(text) else {
        return;
    };
    let _ = config.validate();
    if let Err(e) = serde_json::to_string(&config) {
        panic!("a parsed configuration does not serialize: {e}");
    }
}

/// Hands requests to a pre-boot [`Vmm`], except those that would reach out
/// of the process (KVM, files named by the body, other processes): those
/// are parsed, then answered without running.
struct PreBootHandler(crate::vmm::Vmm);

impl ApiHandler for PreBootHandler {
    fn handle(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        match req {
            ApiRequest::Action(ActionType::InstanceStart)
            | ApiRequest::LoadSnapshot(_)
            | ApiRequest::PutLogger(_)
            | ApiRequest::PutMetrics(_)
            | ApiRequest::PutClone(_) => Ok(ApiResponse::NoContent),
            other => self.0.handle(other),
        }
    }
}

/// Raw bytes on an API connection → hyper's HTTP/1.1 parser → the body
/// limit → spore's request parser → dispatch on a pre-boot VMM (several
/// requests on one connection run in order, as on the socket).
pub fn api_http(data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    let vmm = crate::vmm::Vmm::new(
        "fuzz".into(),
        crate::config::VmConfig::default(),
        Box::new(std::io::sink()),
    );
    let handler: Arc<dyn ApiHandler> = Arc::new(PreBootHandler(vmm));
    let permits = Arc::new(tokio::sync::Semaphore::new(1));
    rt.block_on(async move {
        let Ok(permit) = permits.try_acquire_owned() else {
            return;
        };
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let conn = tokio::spawn(crate::api::server::serve_connection(
            server,
            handler,
            permit,
            crate::api::server::MAX_BODY_BYTES,
        ));
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let _ = client.read_to_end(&mut out).await;
        let _ = conn.await;
    });
}

/// The request parser alone (method, path, body), for inputs hyper would
/// turn away: the first line is `METHOD PATH`, the rest the body.
pub fn api_request(data: &[u8]) {
    let (head, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(head) = std::str::from_utf8(head) else {
        return;
    };
    let mut parts = head.splitn(2, ' ');
    let (Some(m), Some(path)) = (parts.next(), parts.next()) else {
        return;
    };
    let Ok(method) = hyper::Method::from_bytes(m.as_bytes()) else {
        return;
    };
    let _ = crate::api::request::parse_request(&method, path, body);
    let _ = crate::api::request::allowed_methods(path);
}

/// Every target by name, as the `fuzz/` crate and the regression replay
/// call them.
/// A target: its name (a `[[bin]]` of fuzz/Cargo.toml) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// A working-set file (`STATE.ws`) as a restore reads it (versions 1 to 3):
/// the header, then the run list and what follows. The snapshot id and the
/// memory size a restore would compare are taken from the input itself
/// (the size capped at 1 GiB), so that inputs get past those checks. What
/// loads must list disjoint runs inside memory.
pub fn working_set(data: &[u8]) {
    use crate::snapshot::restore::working_set::load;
    const PAGE: u64 = 4096;
    let Ok(fd) = memfd::create() else { return };
    let mut f = std::fs::File::from(fd);
    if std::io::Write::write_all(&mut f, data).is_err() {
        return;
    }
    let id = data
        .get(32..64)
        .map(|b| {
            String::from_utf8_lossy(b)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
    let mem = data
        .get(16..24)
        .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .filter(|&m| m > 0 && m <= 1 << 30 && m % PAGE == 0)
        .unwrap_or(64 << 20);
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&f)
    ));
    let Ok(ws) = load(&path, &id, mem) else {
        return;
    };
    let mut end = 0;
    for &(s, n) in ws.sorted_runs() {
        assert!(n > 0 && s >= end && s + n <= mem / PAGE, "run {s}+{n}");
        end = s + n;
    }
    assert_eq!(
        ws.pages(),
        ws.sorted_runs().iter().map(|r| r.1).sum::<u64>()
    );
}

/// Anonymous files for [`working_set`].
mod memfd {
    use std::os::fd::{FromRawFd, OwnedFd};

    pub fn create() -> std::io::Result<OwnedFd> {
        // SAFETY: a NUL-terminated name and flags; returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"spore-fuzz-ws".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is new and owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

pub const TARGETS: &[Target] = &[
    ("virtio_blk", |d| virtio_queue(DeviceKind::Blk, d)),
    ("virtio_rng", |d| virtio_queue(DeviceKind::Rng, d)),
    ("virtio_balloon", |d| virtio_queue(DeviceKind::Balloon, d)),
    ("virtio_vsock", |d| virtio_queue(DeviceKind::Vsock, d)),
    ("virtio_mem", |d| virtio_queue(DeviceKind::Mem, d)),
    ("virtio_net", |d| virtio_queue(DeviceKind::Net, d)),
    ("virtio_mmio", mmio_registers),
    ("vsock_packet", vsock_tx),
    ("tmem", tmem_calls),
    ("snapshot_state", snapshot_state),
    ("working_set", working_set),
    ("config_file", config_file),
    ("api_http", api_http),
    ("api_request", api_request),
];

#[cfg(test)]
mod tests;
