//! virtio-blk driven end to end: a mock driver, the mmio transport, the
//! device's worker thread and a real image file.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_RO, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::tempfile::TempFile;

use super::*;
use crate::devices::bus::BusDevice;
use crate::devices::virtio::interrupt::INT_VRING;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::{GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::wake::GuestWake;
use crate::host_usize;

const W: u16 = VRING_DESC_F_WRITE as u16;
const R: u16 = 0;
const MEM_SIZE: usize = 0x40_0000;
const SECTORS: u64 = 8;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn image(len: usize) -> (TempFile, Vec<u8>) {
    let f = TempFile::new().unwrap();
    let content: Vec<u8> = (0..len).map(|i| (i * 7 + i / 512) as u8).collect();
    std::fs::write(f.as_path(), &content).unwrap();
    (f, content)
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

/// Plays the driver's part of device initialization (virtio 1.2, §3.1.1).
fn activate(
    device: Block,
    mem: &GuestMemoryMmap,
    vq: &MockSplitQueue<GuestMemoryMmap>,
    features: u64,
) -> MmioTransport {
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Arc::new(GuestWake::new().unwrap()),
    ));
    let mut t = MmioTransport::new(Box::new(device), mem.clone(), interrupt).unwrap();
    wr(&mut t, 0x70, 1);
    wr(&mut t, 0x70, 3);
    wr(&mut t, 0x24, 0);
    wr(&mut t, 0x20, features as u32);
    wr(&mut t, 0x24, 1);
    wr(&mut t, 0x20, (features >> 32) as u32);
    wr(&mut t, 0x70, 0xb);
    assert_eq!(t.status(), 0xb, "features refused");
    wr(&mut t, 0x30, 0);
    wr(&mut t, 0x38, u32::from(QUEUE_SIZE));
    for (reg, addr) in [
        (0x80, vq.desc_table_addr().0),
        (0x90, vq.avail_addr().0),
        (0xa0, vq.used_addr().0),
    ] {
        wr(&mut t, reg, addr as u32);
        wr(&mut t, reg + 4, (addr >> 32) as u32);
    }
    wr(&mut t, 0x44, 1);
    wr(&mut t, 0x70, 0xf);
    assert!(t.is_activated());
    t
}

/// A mock driver: builds chains, kicks the device and waits for completions.
struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    vq: MockSplitQueue<'a, GuestMemoryMmap>,
    next_desc: u16,
    submitted: u16,
}

impl<'a> Driver<'a> {
    fn new(mem: &'a GuestMemoryMmap) -> Self {
        Driver {
            mem,
            vq: MockSplitQueue::create(mem, GuestAddress(0), QUEUE_SIZE),
            next_desc: 0,
            submitted: 0,
        }
    }

    /// Adds one chain of (addr, len, flags) and kicks the device through the transport.
    fn submit(&mut self, t: &mut MmioTransport, parts: &[(u64, u32, u16)]) {
        let first = self.next_desc;
        let descs: Vec<RawDescriptor> = parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let last = i == parts.len() - 1;
                let flags = if last {
                    flags
                } else {
                    flags | VRING_DESC_F_NEXT as u16
                };
                let next = if last { 0 } else { first + i as u16 + 1 };
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
            })
            .collect();
        self.vq.add_desc_chains(&descs, first).unwrap();
        self.next_desc += parts.len() as u16;
        self.submitted += 1;
        wr(t, 0x50, 0);
    }

    /// Waits until every submitted chain is used; returns the used lengths.
    fn wait_all(&self) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.vq.used().idx().load() != self.submitted {
            assert!(
                Instant::now() < deadline,
                "device did not complete requests"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        (0..self.submitted as usize)
            .map(|i| self.vq.used().ring().ref_at(i).unwrap().load().len())
            .collect()
    }

    fn header(&self, at: u64, ty: u32, sector: u64) -> (u64, u32, u16) {
        self.mem.write_obj(ty.to_le(), GuestAddress(at)).unwrap();
        self.mem.write_obj(0u32, GuestAddress(at + 4)).unwrap();
        self.mem
            .write_obj(sector.to_le(), GuestAddress(at + 8))
            .unwrap();
        (at, 16, R)
    }

    fn status(&self, at: u64) -> u8 {
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }
}

const STATUS_POISON: u8 = 0xee;

fn status_desc(mem: &GuestMemoryMmap, at: u64) -> (u64, u32, u16) {
    mem.write_obj(STATUS_POISON, GuestAddress(at)).unwrap();
    (at, 1, W)
}

#[test]
fn read_write_flush_get_id_round_trip() {
    let (file, mut content) = image(host_usize::from_u64(SECTORS) * 512);
    let mem = memory();
    let mut d = Driver::new(&mem);
    let block = Block::new("drive-1".into(), file.as_path(), false, true).unwrap();
    assert_eq!(block.capacity_sectors(), SECTORS);
    let mut t = activate(block, &mem, &d.vq, 1 << VIRTIO_F_VERSION_1);

    // OUT: sectors 2..4 from two buffers.
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    mem.write_slice(&pattern[..512], GuestAddress(0x2_0000))
        .unwrap();
    mem.write_slice(&pattern[512..], GuestAddress(0x3_0000))
        .unwrap();
    let h = d.header(0x1_0000, VIRTIO_BLK_T_OUT, 2);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, R), (0x3_0000, 512, R), s]);
    // IN: sectors 1..5 into one buffer, after the write.
    let h = d.header(0x1_1000, VIRTIO_BLK_T_IN, 1);
    let s = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, (0x4_0000, 2048, W), s]);
    let h = d.header(0x1_2000, VIRTIO_BLK_T_FLUSH, 0);
    let s = status_desc(&mem, 0x1_2100);
    d.submit(&mut t, &[h, s]);
    let h = d.header(0x1_3000, VIRTIO_BLK_T_GET_ID, 0);
    let s = status_desc(&mem, 0x1_3100);
    d.submit(&mut t, &[h, (0x5_0000, 20, W), s]);

    // OUT and IN may be served in one batch, but in order.
    assert_eq!(d.wait_all(), vec![1, 2049, 1, 21]);
    for at in [0x1_0100, 0x1_1100, 0x1_2100, 0x1_3100] {
        assert_eq!(d.status(at), VIRTIO_BLK_S_OK as u8);
    }
    content[1024..2048].copy_from_slice(&pattern);
    let mut read = vec![0u8; 2048];
    mem.read_slice(&mut read, GuestAddress(0x4_0000)).unwrap();
    assert_eq!(read, content[512..2560]);
    assert_eq!(std::fs::read(file.as_path()).unwrap(), content);
    let mut id = [0xffu8; 20];
    mem.read_slice(&mut id, GuestAddress(0x5_0000)).unwrap();
    assert_eq!(&id[..7], b"drive-1");
    assert!(id[7..].iter().all(|&b| b == 0));
    assert_eq!(t.interrupt().status() & INT_VRING, INT_VRING);
}

#[test]
fn hostile_requests_get_errors_and_the_device_keeps_going() {
    let (file, content) = image(host_usize::from_u64(SECTORS) * 512);
    let mem = memory();
    let mut d = Driver::new(&mem);
    let block = Block::new("d".into(), file.as_path(), false, false).unwrap();
    let mut t = activate(block, &mem, &d.vq, 1 << VIRTIO_F_VERSION_1);

    // Beyond capacity.
    let h = d.header(0x1_0000, VIRTIO_BLK_T_IN, SECTORS);
    let s1 = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, W), s1]);
    // Unsupported type (DISCARD).
    let h = d.header(0x1_1000, 11, 0);
    let s2 = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, s2]);
    // Data outside guest memory, and overflowing the address space.
    let h = d.header(0x1_2000, VIRTIO_BLK_T_OUT, 0);
    let s3 = status_desc(&mem, 0x1_2100);
    d.submit(&mut t, &[h, (MEM_SIZE as u64 - 512, 1024, R), s3]);
    let h = d.header(0x1_3000, VIRTIO_BLK_T_IN, 0);
    let s4 = status_desc(&mem, 0x1_3100);
    d.submit(&mut t, &[h, (u64::MAX - 511, 512, W), s4]);
    // Read-only status descriptor: nothing can be reported, the chain is dropped.
    let h = d.header(0x1_4000, VIRTIO_BLK_T_IN, 0);
    mem.write_obj(STATUS_POISON, GuestAddress(0x1_4100))
        .unwrap();
    d.submit(&mut t, &[h, (0x2_0000, 512, W), (0x1_4100, 1, R)]);
    // Partial sector.
    let h = d.header(0x1_5000, VIRTIO_BLK_T_OUT, 0);
    let s6 = status_desc(&mem, 0x1_5100);
    d.submit(&mut t, &[h, (0x2_0000, 100, R), s6]);
    // And a good read afterwards.
    let h = d.header(0x1_6000, VIRTIO_BLK_T_IN, 7);
    let s7 = status_desc(&mem, 0x1_6100);
    d.submit(&mut t, &[h, (0x6_0000, 512, W), s7]);

    assert_eq!(d.wait_all(), vec![1, 1, 1, 1, 0, 1, 513]);
    let io = VIRTIO_BLK_S_IOERR as u8;
    assert_eq!(d.status(0x1_0100), io);
    assert_eq!(d.status(0x1_1100), VIRTIO_BLK_S_UNSUPP as u8);
    assert_eq!(d.status(0x1_2100), io);
    assert_eq!(d.status(0x1_3100), io);
    assert_eq!(d.status(0x1_4100), STATUS_POISON);
    assert_eq!(d.status(0x1_5100), io);
    assert_eq!(d.status(0x1_6100), VIRTIO_BLK_S_OK as u8);
    let mut last = vec![0u8; 512];
    mem.read_slice(&mut last, GuestAddress(0x6_0000)).unwrap();
    assert_eq!(last, content[7 * 512..]);
    assert_eq!(std::fs::read(file.as_path()).unwrap(), content);
}

#[test]
fn read_only_drive_refuses_writes() {
    let (file, content) = image(4096);
    let mem = memory();
    let mut d = Driver::new(&mem);
    let block = Block::new("ro".into(), file.as_path(), true, false).unwrap();
    assert!(block.read_only());
    assert_ne!(block.avail_features() & 1 << VIRTIO_BLK_F_RO, 0);
    let features = block.avail_features();
    let mut t = activate(block, &mem, &d.vq, features);
    let h = d.header(0x1_0000, VIRTIO_BLK_T_OUT, 0);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, R), s]);
    let h = d.header(0x1_1000, VIRTIO_BLK_T_FLUSH, 0);
    let s = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, s]);
    assert_eq!(d.wait_all(), vec![1, 1]);
    assert_eq!(d.status(0x1_0100), VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(d.status(0x1_1100), VIRTIO_BLK_S_OK as u8);
    assert_eq!(std::fs::read(file.as_path()).unwrap(), content);
}

#[test]
fn event_idx_and_reset_then_reactivate() {
    let (file, content) = image(4096);
    let mem = memory();
    let block = Block::new("e".into(), file.as_path(), false, false).unwrap();
    let features = block.avail_features();
    assert_ne!(features & 1 << VIRTIO_RING_F_EVENT_IDX, 0);
    let mut d = Driver::new(&mem);
    let mut t = activate(block, &mem, &d.vq, features);
    let h = d.header(0x1_0000, VIRTIO_BLK_T_IN, 0);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, W), s]);
    assert_eq!(d.wait_all(), vec![513]);

    // Reset stops the worker; a fresh set-up of the same queue memory works again.
    wr(&mut t, 0x70, 0);
    assert!(!t.is_activated());
    let mut d = Driver::new(&mem);
    wr(&mut t, 0x70, 1);
    wr(&mut t, 0x70, 3);
    for (sel, v) in [(0, features as u32), (1, (features >> 32) as u32)] {
        wr(&mut t, 0x24, sel);
        wr(&mut t, 0x20, v);
    }
    wr(&mut t, 0x70, 0xb);
    for (reg, addr) in [
        (0x80, d.vq.desc_table_addr().0),
        (0x90, d.vq.avail_addr().0),
        (0xa0, d.vq.used_addr().0),
    ] {
        wr(&mut t, reg, addr as u32);
    }
    wr(&mut t, 0x44, 1);
    wr(&mut t, 0x70, 0xf);
    assert!(t.is_activated());
    let h = d.header(0x1_0000, VIRTIO_BLK_T_IN, 3);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 1024, W), s]);
    assert_eq!(d.wait_all(), vec![1025]);
    let mut read = vec![0u8; 1024];
    mem.read_slice(&mut read, GuestAddress(0x2_0000)).unwrap();
    assert_eq!(read, content[3 * 512..5 * 512]);
}

#[test]
fn config_space() {
    let (file, _) = image(3 * 512);
    let block = Block::new("c".into(), file.as_path(), false, false).unwrap();
    let mut cap = [0u8; 8];
    block.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 3);
    let mut word = [0u8; 4];
    block.read_config(4, &mut word);
    assert_eq!(word, [0; 4]);
    block.read_config(12, &mut word);
    assert_eq!(u32::from_le_bytes(word), u32::from(QUEUE_SIZE) - 2);
    block.read_config(20, &mut word);
    assert_eq!(u32::from_le_bytes(word), 512);
    // Straddling the end, past it, and at absurd offsets: zeros.
    let mut tail = [0xffu8; 8];
    block.read_config(20, &mut tail);
    assert_eq!(tail, [0, 2, 0, 0, 0, 0, 0, 0]);
    block.read_config(0xf00, &mut word);
    assert_eq!(word, [0; 4]);
    block.read_config(u64::MAX, &mut word);
    assert_eq!(word, [0; 4]);
}

#[test]
fn open_errors_are_clear() {
    let missing = std::env::temp_dir().join("spore-blk-test-does-not-exist.img");
    let err = Block::new("m".into(), &missing, true, false).err().unwrap();
    assert!(matches!(err, BlockError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("does not exist"));

    let (empty, _) = image(0);
    let err = Block::new("e".into(), empty.as_path(), false, false)
        .err()
        .unwrap();
    assert!(matches!(err, BlockError::Empty { .. }), "{err}");

    let (odd, _) = image(1000);
    let err = Block::new("o".into(), odd.as_path(), false, false)
        .err()
        .unwrap();
    assert!(
        matches!(err, BlockError::NotSectorMultiple { size: 1000, .. }),
        "{err}"
    );

    let err = Block::new("d".into(), &std::env::temp_dir(), true, false)
        .err()
        .unwrap();
    assert!(matches!(err, BlockError::NotAFile { .. }), "{err}");
}

#[test]
fn activation_needs_one_ready_queue() {
    let (file, _) = image(512);
    let mem = memory();
    let mut block = Block::new("q".into(), file.as_path(), false, false).unwrap();
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Arc::new(GuestWake::new().unwrap()),
    ));
    let ctx = |ready: bool, n: usize| {
        let queues = (0..n)
            .map(|_| {
                let mut q: virtio_queue::Queue = virtio_queue::QueueT::new(QUEUE_SIZE).unwrap();
                virtio_queue::QueueT::set_ready(&mut q, ready);
                q
            })
            .collect();
        crate::devices::virtio::ActivateContext {
            mem: mem.clone(),
            interrupt: interrupt.clone(),
            queues,
            queue_events: (0..n)
                .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
                .collect(),
            acked_features: 1 << VIRTIO_F_VERSION_1,
        }
    };
    assert!(block.activate(ctx(true, 2)).is_err());
    assert!(block.activate(ctx(true, 0)).is_err());
    assert!(block.activate(ctx(false, 1)).is_err());
    assert!(block.activate(ctx(true, 1)).is_ok());
    block.reset();
}

fn cow_drive(base: &std::path::Path, overlay: Option<crate::config::CowOverlayConfig>) -> Block {
    Block::open(&crate::config::DriveConfig {
        drive_id: "cow".into(),
        path_on_host: base.display().to_string(),
        is_root_device: false,
        is_read_only: false,
        partuuid: None,
        cache_type: None,
        io_engine: None,
        cow_overlay: overlay,
        rate_limiter: None,
        socket: None,
    })
    .unwrap()
}

/// Through the queue: a write straddling a 4 KiB block boundary from uneven
/// buffers lands in the overlay only; reads merge it with the base; a base
/// truncated underneath gives IOERR and the device keeps serving.
#[test]
fn cow_drive_through_the_queue() {
    let sectors = 24usize; // three 4 KiB blocks
    let (file, mut content) = image(sectors * 512);
    let original = content.clone();
    let mem = memory();
    let mut d = Driver::new(&mem);
    let overlay = crate::config::CowOverlayConfig {
        path: None,
        in_memory: true,
    };
    let block = cow_drive(file.as_path(), Some(overlay));
    assert_eq!(block.capacity_sectors(), sectors as u64);
    assert!(!block.read_only());
    let mut t = activate(block, &mem, &d.vq, 1 << VIRTIO_F_VERSION_1);

    // Sectors 7..10 (bytes 3584..5120) from a 100-byte and a 1436-byte buffer.
    let pattern: Vec<u8> = (0..1536u32).map(|i| (i % 253) as u8 ^ 0x5a).collect();
    mem.write_slice(&pattern[..100], GuestAddress(0x2_0000))
        .unwrap();
    mem.write_slice(&pattern[100..], GuestAddress(0x3_0000))
        .unwrap();
    let h = d.header(0x1_0000, VIRTIO_BLK_T_OUT, 7);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 100, R), (0x3_0000, 1436, R), s]);
    let h = d.header(0x1_1000, VIRTIO_BLK_T_IN, 0);
    let s = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, (0x4_0000, (sectors * 512) as u32, W), s]);
    assert_eq!(d.wait_all(), vec![1, sectors as u32 * 512 + 1]);
    assert_eq!(d.status(0x1_0100), VIRTIO_BLK_S_OK as u8);
    assert_eq!(d.status(0x1_1100), VIRTIO_BLK_S_OK as u8);
    content[3584..5120].copy_from_slice(&pattern);
    let mut read = vec![0u8; sectors * 512];
    mem.read_slice(&mut read, GuestAddress(0x4_0000)).unwrap();
    assert_eq!(read, content);
    assert_eq!(std::fs::read(file.as_path()).unwrap(), original);

    // The base shrinks to one block: block 2 cannot be read any more.
    std::fs::OpenOptions::new()
        .write(true)
        .open(file.as_path())
        .unwrap()
        .set_len(4096)
        .unwrap();
    let h = d.header(0x1_2000, VIRTIO_BLK_T_IN, 16);
    let s = status_desc(&mem, 0x1_2100);
    d.submit(&mut t, &[h, (0x5_0000, 512, W), s]);
    // Block 1 is in the overlay: still served.
    let h = d.header(0x1_3000, VIRTIO_BLK_T_IN, 8);
    let s = status_desc(&mem, 0x1_3100);
    d.submit(&mut t, &[h, (0x6_0000, 512, W), s]);
    d.wait_all();
    assert_eq!(d.status(0x1_2100), VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(d.status(0x1_3100), VIRTIO_BLK_S_OK as u8);
    mem.read_slice(&mut read[..512], GuestAddress(0x6_0000))
        .unwrap();
    assert_eq!(read[..512], content[4096..4608]);
}

/// A raw read-write drive frozen in place: later writes go to a new overlay
/// and the image keeps the contents it had at the freeze.
#[test]
fn freeze_switches_a_raw_drive_to_copy_on_write() {
    let (file, content) = image(host_usize::from_u64(SECTORS) * 512);
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let mem = memory();
    let mut d = Driver::new(&mem);
    let block = cow_drive(file.as_path(), None);
    let handle = block.handle();
    assert_eq!(handle.overlay_config(), None);
    let mut t = activate(block, &mem, &d.vq, 1 << VIRTIO_F_VERSION_1);
    // The image's path now names another file: the freeze keeps the open one.
    std::fs::remove_file(file.as_path()).unwrap();
    std::fs::write(file.as_path(), vec![0u8; content.len()]).unwrap();
    let cfg = handle.freeze(dir.as_path(), "src").unwrap().unwrap();
    assert!(cfg.path.as_ref().unwrap().ends_with("src.cow.cow"));
    // A second freeze changes nothing.
    assert_eq!(handle.freeze(dir.as_path(), "src").unwrap(), None);
    mem.write_slice(&[0xabu8; 512], GuestAddress(0x2_0000))
        .unwrap();
    let h = d.header(0x1_0000, VIRTIO_BLK_T_OUT, 1);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, R), s]);
    let h = d.header(0x1_1000, VIRTIO_BLK_T_IN, 0);
    let s = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, (0x3_0000, 1024, W), s]);
    d.wait_all();
    assert_eq!(d.status(0x1_1100), VIRTIO_BLK_S_OK as u8);
    let mut read = vec![0u8; 1024];
    mem.read_slice(&mut read, GuestAddress(0x3_0000)).unwrap();
    assert_eq!(read[..512], content[..512]);
    assert_eq!(read[512..], [0xab; 512]);
    assert_eq!(
        std::fs::read(file.as_path()).unwrap(),
        vec![0u8; content.len()]
    );
}

fn async_drive(path: &std::path::Path, durable: bool) -> Block {
    Block::open(&crate::config::DriveConfig {
        drive_id: "async".into(),
        path_on_host: path.display().to_string(),
        is_root_device: false,
        is_read_only: false,
        partuuid: None,
        cache_type: Some(if durable { "Writeback" } else { "Unsafe" }.into()),
        io_engine: Some("Async".into()),
        cow_overlay: None,
        rate_limiter: None,
        socket: None,
    })
    .unwrap()
}

/// io_engine "Async": the same requests through the io_uring, each chain
/// returned only once its completion arrived, with the data in place.
#[test]
fn async_engine_reads_writes_and_flushes() {
    let (file, mut content) = image(host_usize::from_u64(SECTORS) * 512);
    let mem = memory();
    let mut d = Driver::new(&mem);
    let mut t = activate(
        async_drive(file.as_path(), true),
        &mem,
        &d.vq,
        1 << VIRTIO_F_VERSION_1,
    );
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i % 253) as u8).collect();
    mem.write_slice(&pattern[..512], GuestAddress(0x2_0000))
        .unwrap();
    mem.write_slice(&pattern[512..], GuestAddress(0x3_0000))
        .unwrap();
    let h = d.header(0x1_0000, VIRTIO_BLK_T_OUT, 2);
    let s = status_desc(&mem, 0x1_0100);
    d.submit(&mut t, &[h, (0x2_0000, 512, R), (0x3_0000, 512, R), s]);
    assert_eq!(d.wait_all(), vec![1]);
    // Virtio orders nothing between requests in flight: wait, then read.
    let h = d.header(0x1_1000, VIRTIO_BLK_T_IN, 1);
    let s = status_desc(&mem, 0x1_1100);
    d.submit(&mut t, &[h, (0x4_0000, 2048, W), s]);
    assert_eq!(d.wait_all(), vec![1, 2049]);
    let h = d.header(0x1_2000, VIRTIO_BLK_T_FLUSH, 0);
    let s = status_desc(&mem, 0x1_2100);
    d.submit(&mut t, &[h, s]);
    let h = d.header(0x1_3000, VIRTIO_BLK_T_GET_ID, 0);
    let s = status_desc(&mem, 0x1_3100);
    d.submit(&mut t, &[h, (0x5_0000, 20, W), s]);
    let mut lens = d.wait_all();
    lens[2..].sort();
    assert_eq!(lens, vec![1, 2049, 1, 21]);
    for at in [0x1_0100, 0x1_1100, 0x1_2100, 0x1_3100] {
        assert_eq!(d.status(at), VIRTIO_BLK_S_OK as u8);
    }
    content[1024..2048].copy_from_slice(&pattern);
    let mut read = vec![0u8; 2048];
    mem.read_slice(&mut read, GuestAddress(0x4_0000)).unwrap();
    assert_eq!(read, content[512..2560]);
    assert_eq!(std::fs::read(file.as_path()).unwrap(), content);
    assert_eq!(t.interrupt().status() & INT_VRING, INT_VRING);

    // Past the end of a file that shrank underneath: a short read, IOERR.
    std::fs::OpenOptions::new()
        .write(true)
        .open(file.as_path())
        .unwrap()
        .set_len(1024)
        .unwrap();
    let h = d.header(0x1_4000, VIRTIO_BLK_T_IN, 4);
    let s = status_desc(&mem, 0x1_4100);
    d.submit(&mut t, &[h, (0x6_0000, 1024, W), s]);
    assert_eq!(d.wait_all().len(), 5);
    assert_eq!(d.status(0x1_4100), VIRTIO_BLK_S_IOERR as u8);
}

#[test]
fn async_engine_accepts_copy_on_write_and_refuses_unknown_engines() {
    let mut cfg = crate::config::DriveConfig {
        drive_id: "a".into(),
        path_on_host: "/x".into(),
        is_root_device: false,
        is_read_only: false,
        partuuid: None,
        cache_type: None,
        io_engine: Some("Async".into()),
        cow_overlay: Some(crate::config::CowOverlayConfig {
            path: None,
            in_memory: true,
        }),
        rate_limiter: None,
        socket: None,
    };
    // Accepted: a copy-on-write disk is served synchronously.
    cfg.validate().unwrap();
    cfg.cow_overlay = None;
    cfg.validate().unwrap();
    cfg.io_engine = Some("Fast".into());
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("\"Sync\" or \"Async\""), "{e}");
}
