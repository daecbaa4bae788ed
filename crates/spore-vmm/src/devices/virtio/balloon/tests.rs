//! virtio-balloon against real memfd-backed guest RAM: the worker is driven
//! by hand through mock queues, and the host side is checked on the memfd
//! itself (content and allocated blocks).
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::worker::BalloonWorker;
use super::*;
#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::layout::{MMIO_HOLE_END, MMIO_HOLE_START};
use crate::devices::bus::BusDevice;
use crate::devices::virtio::interrupt::{INT_CONFIG, INT_VRING};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::{ActivateContext, GuestMemoryMmap, VirtioDevice, VirtioInterrupt};
use crate::devices::wake::GuestWake;
use crate::host_usize;
use crate::memory::GuestRam;

const QLEN: u16 = 16;
const R: u16 = 0;
const W: u16 = VRING_DESC_F_WRITE as u16;
/// Where PFN arrays and stats buffers are written.
const BUF: u64 = 0x10_0000;
/// The data pages the tests balloon.
const DATA: u64 = 0x40_0000;
const PAGE: u64 = 4096;

fn settings(mem_mib: u64) -> BalloonSettings {
    BalloonSettings {
        amount_mib: 0,
        deflate_on_oom: true,
        stats_polling_interval_s: 1,
        free_page_reporting: true,
        free_page_hinting: false,
        mem_mib,
    }
}

struct Rig<'a> {
    mem: &'a GuestMemoryMmap,
    queues: Vec<MockSplitQueue<'a, GuestMemoryMmap>>,
    /// Next free descriptor index per queue.
    next: Vec<u16>,
    interrupt: Arc<VirtioInterrupt>,
}

impl<'a> Rig<'a> {
    fn new(mem: &'a GuestMemoryMmap) -> Self {
        let queues = (0..5)
            .map(|i| MockSplitQueue::create(mem, GuestAddress(i * 0x1000), QLEN))
            .collect();
        let interrupt = Arc::new(VirtioInterrupt::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            Arc::new(GuestWake::new().unwrap()),
        ));
        Self {
            mem,
            queues,
            next: vec![0; 5],
            interrupt,
        }
    }

    fn context(&self, acked: u64) -> ActivateContext {
        ActivateContext {
            mem: self.mem.clone(),
            interrupt: self.interrupt.clone(),
            queues: self
                .queues
                .iter()
                .map(|q| q.create_queue().unwrap())
                .collect(),
            queue_events: (0..5)
                .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
                .collect(),
            acked_features: acked,
        }
    }

    /// Makes one chain available on queue `q`.
    fn chain(&mut self, q: usize, descs: &[(u64, u32, u16)]) {
        let first = self.next[q];
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let last = i + 1 == descs.len();
                let flags = if last {
                    flags
                } else {
                    flags | VRING_DESC_F_NEXT as u16
                };
                let next = if last { 0 } else { first + i as u16 + 1 };
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
            })
            .collect();
        self.queues[q].add_desc_chains(&raw, first).unwrap();
        self.next[q] += descs.len() as u16;
    }

    /// Writes `pfns` at `at` and offers them on queue `q`.
    fn pfns(&mut self, q: usize, at: u64, pfns: &[u32]) {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.mem.write_slice(&bytes, GuestAddress(at)).unwrap();
        self.chain(q, &[(at, bytes.len() as u32, R)]);
    }

    fn used_idx(&self, q: usize) -> u16 {
        let used = self.queues[q].used_addr();
        self.mem.read_obj::<u16>(GuestAddress(used.0 + 2)).unwrap()
    }
}

fn fill(ram: &GuestRam, gpa: u64, len: u64, byte: u8) {
    ram.memory()
        .write_slice(&vec![byte; host_usize::from_u64(len)], GuestAddress(gpa))
        .unwrap();
}

fn read(ram: &GuestRam, gpa: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0; host_usize::from_u64(len)];
    ram.memory().read_slice(&mut v, GuestAddress(gpa)).unwrap();
    v
}

/// 512-byte blocks the memfd has allocated.
fn blocks(ram: &GuestRam) -> u64 {
    ram.memfd().metadata().unwrap().blocks()
}

fn pfn(gpa: u64) -> u32 {
    (gpa / PAGE) as u32
}

#[test]
fn inflate_punches_holes_then_deflate_gives_pages_back() {
    // Released before the chain is returned, and after (MUST_TELL_HOST).
    inflate_then_deflate(0);
    inflate_then_deflate(F_MUST_TELL_HOST);
}

fn inflate_then_deflate(acked: u64) {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let balloon = Balloon::new(settings(16)).unwrap();
    let handle = balloon.handle();
    let mut w = BalloonWorker::for_test(rig.context(acked), &handle);

    // 64 pages of data, then inflate 48 of them in shuffled order with duplicates.
    fill(&ram, DATA, 64 * PAGE, 0xab);
    let mut pfns: Vec<u32> = (0..48).map(|i| pfn(DATA) + (i * 7) % 48).collect();
    pfns.extend([pfn(DATA), pfn(DATA) + 3]);
    rig.pfns(0, BUF, &pfns);
    let before = blocks(&ram);
    w.serve_inflate();

    assert_eq!(rig.used_idx(0), 1);
    assert_ne!(rig.interrupt.status() & INT_VRING, 0);
    // Blocks first: reading a hole in shared memory allocates the page again.
    let after = blocks(&ram);
    assert!(
        before >= after + 48 * PAGE / 512,
        "memfd blocks {before} -> {after}: the hole was not punched"
    );
    assert_eq!(
        read(&ram, DATA, 48 * PAGE),
        vec![0; 48 * host_usize::from_u64(PAGE)]
    );
    assert_eq!(
        read(&ram, DATA + 48 * PAGE, 16 * PAGE),
        vec![0xab; 16 * host_usize::from_u64(PAGE)]
    );
    let c = handle.counters();
    assert_eq!((c.inflated_pages, c.refused), (48, 0));
    assert_eq!(c.release_calls, 1, "48 adjacent pages, shuffled: one range");

    // Deflate: the pages are the guest's again and usable.
    rig.pfns(
        1,
        BUF + 0x1000,
        &(0..48).map(|i| pfn(DATA) + i).collect::<Vec<_>>(),
    );
    w.serve_deflate();
    assert_eq!(rig.used_idx(1), 1);
    assert_eq!(handle.counters().deflated_pages, 48);
    fill(&ram, DATA, PAGE, 0x11);
    assert_eq!(read(&ram, DATA, 4), vec![0x11; 4]);
}

// x86_64's layout: the only one with a hole in RAM.
#[cfg(target_arch = "x86_64")]
#[test]
fn pfns_outside_ram_or_in_the_mmio_hole_are_refused() {
    // RAM split around the MMIO hole: [0, 3 GiB) and [4 GiB, 4 GiB + 16 MiB).
    let size = MMIO_HOLE_START + (16 << 20);
    let ram = GuestRam::new(size).unwrap();
    let mut rig = Rig::new(ram.memory());
    let balloon = Balloon::new(settings(size >> 20)).unwrap();
    let handle = balloon.handle();
    let mut w = BalloonWorker::for_test(rig.context(0), &handle);

    let high = MMIO_HOLE_END + 0x20_0000;
    fill(&ram, DATA, PAGE, 0x5a);
    fill(&ram, MMIO_HOLE_START - PAGE, PAGE, 0x5b);
    fill(&ram, MMIO_HOLE_END, PAGE, 0x5c);
    fill(&ram, high, PAGE, 0x5d);
    let hostile = [
        pfn(MMIO_HOLE_START),            // first page of the hole
        pfn(MMIO_HOLE_END) - 1,          // last page of the hole
        pfn(MMIO_HOLE_END + (16 << 20)), // just past the end of RAM
        u32::MAX,                        // far past it
    ];
    rig.pfns(0, BUF, &hostile);
    w.serve_inflate();
    assert_eq!(rig.used_idx(0), 1, "the chain is still returned");
    assert_eq!(handle.counters().refused, 4);
    assert_eq!(handle.counters().inflated_pages, 0);
    for (gpa, b) in [
        (DATA, 0x5a),
        (MMIO_HOLE_START - PAGE, 0x5b),
        (MMIO_HOLE_END, 0x5c),
        (high, 0x5d),
    ] {
        assert_eq!(
            read(&ram, gpa, PAGE),
            vec![b; host_usize::from_u64(PAGE)],
            "{gpa:#x} untouched"
        );
    }

    // A valid page above the hole is released at its memfd offset, which is
    // its address minus the hole.
    let file_off = high - (MMIO_HOLE_END - MMIO_HOLE_START);
    let mut probe = [0u8; 4];
    ram.memfd().read_exact_at(&mut probe, file_off).unwrap();
    assert_eq!(probe, [0x5d; 4]);
    rig.pfns(0, BUF + 0x1000, &[pfn(high), pfn(MMIO_HOLE_START)]);
    w.serve_inflate();
    assert_eq!(handle.counters().inflated_pages, 1);
    assert_eq!(handle.counters().refused, 5);
    ram.memfd().read_exact_at(&mut probe, file_off).unwrap();
    assert_eq!(
        probe, [0; 4],
        "the hole is punched at the page's file offset"
    );
    assert_eq!(
        read(&ram, MMIO_HOLE_END, 4),
        vec![0x5c; 4],
        "its neighbours stay"
    );
}

#[test]
fn pfn_buffers_in_odd_shapes() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let handle = Balloon::new(settings(16)).unwrap().handle();
    let mut w = BalloonWorker::for_test(rig.context(0), &handle);
    fill(&ram, DATA, 4 * PAGE, 0x77);
    // A trailing partial PFN, a write-only descriptor (ignored), a buffer
    // outside guest memory: none of them releases anything extra.
    let bytes: Vec<u8> = [pfn(DATA)]
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .chain([1, 2])
        .collect();
    ram.memory().write_slice(&bytes, GuestAddress(BUF)).unwrap();
    let other = pfn(DATA + PAGE).to_le_bytes();
    ram.memory()
        .write_slice(&other, GuestAddress(BUF + 0x100))
        .unwrap();
    rig.chain(0, &[(BUF, 6, R), (BUF + 0x100, 4, W), (1 << 40, 4, R)]);
    w.serve_inflate();
    assert_eq!(rig.used_idx(0), 1);
    assert_eq!(handle.counters().inflated_pages, 1);
    assert_eq!(read(&ram, DATA, 4), vec![0; 4]);
    assert_eq!(read(&ram, DATA + PAGE, 4), vec![0x77; 4]);
}

#[test]
fn pfn_batches_in_any_order_give_the_same_ranges() {
    use super::request::{parse_pfns, GuestRange};
    let ram = GuestRam::new(16 << 20).unwrap();
    let mem = ram.memory();
    let bytes = |pfns: &[u32]| -> Vec<u8> { pfns.iter().flat_map(|p| p.to_le_bytes()).collect() };
    let base = pfn(DATA);
    // Two runs with a gap, a PFN past the end of RAM (16 MiB = PFN 4096).
    let ascending: Vec<u32> = (base..base + 8)
        .chain(base + 20..base + 24)
        .chain([5000])
        .collect();
    let want = parse_pfns(mem, &bytes(&ascending));
    assert_eq!(want.pages, 12);
    assert_eq!(want.refused, 1);
    assert_eq!(
        want.ranges,
        vec![
            GuestRange {
                addr: DATA,
                len: 8 * PAGE
            },
            GuestRange {
                addr: DATA + 20 * PAGE,
                len: 4 * PAGE
            },
        ]
    );
    // As Linux's balloon hands them over (going down), shuffled, and with
    // duplicates: the same pages, ranges and refusals.
    let descending: Vec<u32> = ascending.iter().rev().copied().collect();
    assert_eq!(parse_pfns(mem, &bytes(&descending)), want);
    let mut shuffled = ascending.clone();
    shuffled.swap(0, 9);
    shuffled.swap(3, 12);
    shuffled.extend([base + 2, base + 21]);
    assert_eq!(parse_pfns(mem, &bytes(&shuffled)), want);
    // A deflate's PFNs are counted as they come: the same refusals, a
    // duplicate counted twice, a trailing partial PFN ignored.
    use super::request::count_pfns;
    assert_eq!(count_pfns(mem, &bytes(&descending)), (12, 1));
    assert_eq!(count_pfns(mem, &bytes(&shuffled)), (14, 1));
    let mut odd = bytes(&ascending);
    odd.push(7);
    assert_eq!(count_pfns(mem, &odd), (12, 1));
    assert_eq!(count_pfns(mem, &[]), (0, 0));
}

fn stat(tag: u16, val: u64) -> Vec<u8> {
    let mut v = tag.to_le_bytes().to_vec();
    v.extend_from_slice(&val.to_le_bytes());
    v
}

#[test]
fn statistics_are_kept_and_the_buffer_held_until_polled() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let balloon = Balloon::new(settings(16)).unwrap();
    let handle = balloon.handle();
    let mut w = BalloonWorker::for_test(rig.context(F_STATS_VQ), &handle);
    assert!(handle.statistics().unwrap().last_update_ms.is_none());

    let mut buf = stat(4, 10 << 20);
    buf.extend(stat(5, 16 << 20));
    buf.extend(stat(0x7777, 1)); // unknown tag
    buf.extend(&stat(6, 1)[..5]); // truncated
    ram.memory().write_slice(&buf, GuestAddress(BUF)).unwrap();
    rig.chain(2, &[(BUF, buf.len() as u32, R)]);
    w.serve_stats();
    assert_eq!(rig.used_idx(2), 0, "the device holds the stats buffer");
    let s = handle.statistics().unwrap();
    assert_eq!(s.stats.free_memory, Some(10 << 20));
    assert_eq!(s.stats.total_memory, Some(16 << 20));
    assert_eq!(s.stats.available_memory, None);
    assert!(s.last_update_ms.is_some());
    let json = serde_json::to_value(&s).unwrap();
    for key in [
        "target_pages",
        "actual_pages",
        "target_mib",
        "actual_mib",
        "free_memory",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert!(
        json.get("swap_in").is_none(),
        "unreported stats are omitted"
    );

    // Polling returns the buffer so the driver refills it.
    rig.interrupt.ack(u32::MAX);
    w.poll_stats();
    assert_eq!(rig.used_idx(2), 1);
    assert_ne!(rig.interrupt.status() & INT_VRING, 0);
    w.poll_stats();
    assert_eq!(rig.used_idx(2), 1, "nothing held, nothing returned");
    let _ = w.queue(2).size();
}

#[test]
fn free_page_reports_are_released_and_checked() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let handle = Balloon::new(settings(16)).unwrap().handle();
    // No stats negotiated: reporting is the third queue (index 2).
    let mut w = BalloonWorker::for_test(rig.context(F_REPORTING), &handle);
    let range = 0x20_0000u64;
    fill(&ram, DATA, 2 * range, 0x42);
    let before = blocks(&ram);
    rig.chain(
        2,
        &[
            (DATA, range as u32, W),
            (DATA + range + 1, PAGE as u32, W),      // misaligned
            ((16 << 20) - PAGE, 2 * PAGE as u32, W), // runs past the end of RAM
        ],
    );
    w.serve_report();
    assert_eq!(rig.used_idx(2), 1);
    assert_eq!(
        w.queue(3).size(),
        QLEN,
        "queue index 2 is served as the report queue"
    );
    let after = blocks(&ram);
    assert!(
        before >= after + range / 512,
        "memfd blocks {before} -> {after}"
    );
    assert_eq!(
        read(&ram, DATA, range),
        vec![0; host_usize::from_u64(range)]
    );
    assert_eq!(read(&ram, DATA + range, 8), vec![0x42; 8]);
    let c = handle.counters();
    assert_eq!((c.reported_bytes, c.refused), (range, 2));
}

#[test]
fn config_space_target_and_actual() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let rig = Rig::new(ram.memory());
    let mut balloon = Balloon::new(BalloonSettings {
        amount_mib: 4,
        ..settings(16)
    })
    .unwrap();
    let handle = balloon.handle();
    let features = balloon.avail_features();
    assert_ne!(features & F_STATS_VQ, 0);
    assert_ne!(features & F_REPORTING, 0);
    assert_ne!(features & (1 << 2), 0, "deflate on oom");
    assert_eq!(balloon.queue_max_sizes().len(), 4);
    assert_eq!(balloon.device_type(), 5);

    let mut c = [0u8; 8];
    balloon.read_config(0, &mut c);
    assert_eq!(u32::from_le_bytes(c[..4].try_into().unwrap()), 1024);
    // The driver writes actual; num_pages is read-only.
    balloon.write_config(4, &300u32.to_le_bytes());
    balloon.write_config(0, &7u32.to_le_bytes());
    balloon.read_config(0, &mut c);
    assert_eq!(u32::from_le_bytes(c[..4].try_into().unwrap()), 1024);
    assert_eq!(u32::from_le_bytes(c[4..].try_into().unwrap()), 300);
    let mut tail = [9u8; 4];
    balloon.read_config(14, &mut tail);
    assert_eq!(tail, [0; 4]);

    // Before activation a new target raises no interrupt; after, it does.
    handle.set_target_mib(8).unwrap();
    assert_eq!(rig.interrupt.status(), 0);
    balloon
        .activate(rig.context(F_STATS_VQ | F_REPORTING))
        .unwrap();
    handle.set_target_mib(2).unwrap();
    assert_ne!(rig.interrupt.status() & INT_CONFIG, 0);
    let s = handle.status();
    assert_eq!(
        (s.target_pages, s.actual_pages, s.actual_mib),
        (512, 300, 1)
    );
    assert!(s.target_updated_ms.is_some() && s.actual_updated_ms.is_some());
    assert!(s.actual_updated_ms <= s.target_updated_ms);
    assert!(handle.set_target_mib(17).is_err());
    assert!(handle.set_stats_interval(0).is_err());
    handle.set_stats_interval(5).unwrap();
    assert_eq!(handle.status().stats_polling_interval_s, 5);
    balloon.reset();
}

#[test]
fn stats_disabled_means_no_stats_queue() {
    let b = Balloon::new(BalloonSettings {
        stats_polling_interval_s: 0,
        free_page_reporting: false,
        ..settings(16)
    })
    .unwrap();
    assert_eq!(b.avail_features() & (F_STATS_VQ | F_REPORTING), 0);
    assert_eq!(b.queue_max_sizes().len(), 2);
    assert_eq!(b.handle().statistics(), Err(BalloonError::StatsDisabled));
    assert!(b.handle().set_stats_interval(1).is_err());
    assert!(Balloon::new(BalloonSettings {
        amount_mib: 17,
        ..settings(16)
    })
    .is_err());
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

/// Waits up to `secs` for `f` to hold.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

#[test]
fn worker_thread_end_to_end_through_the_transport() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let balloon = Balloon::new(settings(16)).unwrap();
    let handle = balloon.handle();
    let mut t = MmioTransport::new(
        Box::new(balloon),
        ram.memory().clone(),
        rig.interrupt.clone(),
    )
    .unwrap();
    bring_up(&mut t, &rig);
    assert!(t.is_activated());

    // Inflate through the worker thread, woken by the queue's eventfd.
    fill(&ram, DATA, 8 * PAGE, 0xcd);
    rig.pfns(0, BUF, &(0..8).map(|i| pfn(DATA) + i).collect::<Vec<_>>());
    t.queue_events()[0].write(1).unwrap();
    assert!(
        eventually(5, || rig.used_idx(0) == 1),
        "inflate chain not used"
    );
    assert!(eventually(5, || handle.counters().inflated_pages == 8));
    assert!(eventually(5, || read(&ram, DATA, PAGE)
        .iter()
        .all(|&b| b == 0)));

    // The stats buffer is held, then handed back by the 1 s poll.
    let buf = stat(5, 16 << 20);
    ram.memory()
        .write_slice(&buf, GuestAddress(BUF + 0x800))
        .unwrap();
    rig.chain(2, &[(BUF + 0x800, buf.len() as u32, R)]);
    t.queue_events()[2].write(1).unwrap();
    assert!(eventually(5, || handle
        .statistics()
        .unwrap()
        .stats
        .total_memory
        .is_some()));
    assert_eq!(rig.used_idx(2), 0);
    assert!(eventually(5, || rig.used_idx(2) == 1), "stats not polled");

    // A new interval asks for fresh statistics at once (the timer, now at
    // 60 s and then 30 s, cannot be what returns the buffer).
    handle.set_stats_interval(60).unwrap();
    let buf = stat(4, 1 << 20);
    ram.memory()
        .write_slice(&buf, GuestAddress(BUF + 0x900))
        .unwrap();
    rig.chain(2, &[(BUF + 0x900, buf.len() as u32, R)]);
    t.queue_events()[2].write(1).unwrap();
    assert!(eventually(5, || handle
        .statistics()
        .unwrap()
        .stats
        .free_memory
        .is_some()));
    assert_eq!(rig.used_idx(2), 1);
    handle.set_stats_interval(30).unwrap();
    assert!(eventually(2, || rig.used_idx(2) == 2), "no immediate poll");

    // A new target reaches the driver as a config-change interrupt.
    rig.interrupt.ack(u32::MAX);
    handle.set_target_mib(4).unwrap();
    assert_ne!(rig.interrupt.status() & INT_CONFIG, 0);
    let mut c = [0u8; 4];
    t.read(0x100, &mut c);
    assert_eq!(u32::from_le_bytes(c), 1024);
    // Reset stops the worker.
    wr(&mut t, 0x70, 0);
    assert!(!t.is_activated());
}

#[test]
fn a_corrupt_avail_index_does_not_hang_the_worker() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let handle = Balloon::new(settings(16)).unwrap().handle();
    let mut w = BalloonWorker::for_test(rig.context(0), &handle);
    rig.pfns(0, BUF, &[pfn(DATA)]);
    // The driver claims far more chains than the ring holds.
    let avail = rig.queues[0].avail_addr();
    ram.memory()
        .write_obj(1000u16, GuestAddress(avail.0 + 2))
        .unwrap();
    w.serve_inflate();
    w.serve_inflate();
    assert!(rig.used_idx(0) <= 1);
    assert_eq!(handle.counters().refused, 0);
}

/// The driver's side of initialization (virtio 1.2, §3.1.1), all 4 queues.
fn bring_up(t: &mut MmioTransport, rig: &Rig) {
    let features = (1u64 << 32) | F_MUST_TELL_HOST | F_STATS_VQ | F_REPORTING;
    wr(t, 0x70, 1);
    wr(t, 0x70, 3);
    wr(t, 0x24, 0);
    wr(t, 0x20, features as u32);
    wr(t, 0x24, 1);
    wr(t, 0x20, (features >> 32) as u32);
    wr(t, 0x70, 0xb);
    assert_eq!(t.status(), 0xb, "features refused");
    for (i, vq) in rig.queues.iter().enumerate() {
        wr(t, 0x30, i as u32);
        wr(t, 0x38, u32::from(QLEN));
        for (reg, addr) in [
            (0x80, vq.desc_table_addr().0),
            (0x90, vq.avail_addr().0),
            (0xa0, vq.used_addr().0),
        ] {
            wr(t, reg, addr as u32);
            wr(t, reg + 4, (addr >> 32) as u32);
        }
        wr(t, 0x44, 1);
    }
    wr(t, 0x70, 0xf);
}

/// A snapshot of a running balloon: target, actual and counters survive,
/// and the statistics buffer the device held is held again by the
/// restored device and handed back at its next poll (else the driver would
/// never send statistics again).
#[test]
fn snapshot_round_trip_keeps_the_held_stats_buffer() {
    let ram = GuestRam::new(16 << 20).unwrap();
    let mut rig = Rig::new(ram.memory());
    let balloon = Balloon::new(settings(16)).unwrap();
    let handle = balloon.handle();
    let mut t = MmioTransport::new(
        Box::new(balloon),
        ram.memory().clone(),
        rig.interrupt.clone(),
    )
    .unwrap();
    bring_up(&mut t, &rig);
    assert!(t.is_activated());
    handle.set_target_mib(2).unwrap();
    wr(&mut t, 0x104, 512);
    rig.pfns(0, BUF, &[pfn(DATA), pfn(DATA) + 1]);
    t.queue_events()[0].write(1).unwrap();
    assert!(eventually(5, || handle.counters().inflated_pages == 2));
    let buf = stat(5, 16 << 20);
    ram.memory()
        .write_slice(&buf, GuestAddress(BUF + 0x800))
        .unwrap();
    rig.chain(2, &[(BUF + 0x800, buf.len() as u32, R)]);
    t.queue_events()[2].write(1).unwrap();
    assert!(eventually(5, || handle
        .statistics()
        .unwrap()
        .stats
        .total_memory
        .is_some()));
    // Snapshot as `snapshot::create` does: quiesce, save both, resume.
    t.quiesce().unwrap();
    let tstate = t.save();
    let bstate = handle.save();
    t.resume();
    assert_eq!(bstate.target_pages, 512);
    assert_eq!(bstate.actual_pages, 512);
    assert_eq!(bstate.counters.inflated_pages, 2);
    assert_eq!(bstate.held_stats, Some(0));
    assert_eq!(rig.used_idx(2), 0, "the buffer is still held");
    wr(&mut t, 0x70, 0);
    drop(t);

    let bytes = bincode::serialize(&bstate).unwrap();
    let bstate: BalloonState = bincode::deserialize(&bytes).unwrap();
    let restored = Balloon::restore(settings(16), &bstate).unwrap();
    let h2 = restored.handle();
    let mut t2 = MmioTransport::restore(
        Box::new(restored),
        ram.memory().clone(),
        rig.interrupt.clone(),
        &tstate,
    )
    .unwrap();
    // As the builder does once vCPU and VM state are restored.
    t2.finish_restore().unwrap();
    assert!(t2.is_activated());
    let st = h2.status();
    assert_eq!((st.target_mib, st.actual_mib), (2, 2));
    assert_eq!(h2.counters().inflated_pages, 2);
    assert!(h2.statistics().unwrap().stats.total_memory.is_some());
    assert!(
        eventually(5, || rig.used_idx(2) == 1),
        "the restored device never returned the held stats buffer"
    );

    // A configuration that contradicts the snapshot is refused.
    let mut other = settings(16);
    other.deflate_on_oom = false;
    assert!(Balloon::restore(other, &bstate).is_err());
    let mut other = settings(16);
    other.stats_polling_interval_s = 0;
    assert!(Balloon::restore(other, &bstate).is_err());
    assert!(Balloon::restore(settings(1), &bstate).is_err());
}

/// Free page hinting: what a Linux driver does, by hand.
mod hinting {
    use super::*;

    fn hint_settings() -> BalloonSettings {
        BalloonSettings {
            stats_polling_interval_s: 0,
            free_page_hinting: true,
            ..settings(16)
        }
    }

    fn cmd_id(b: &Balloon) -> u32 {
        let mut c = [0u8; 4];
        b.read_config(8, &mut c);
        u32::from_le_bytes(c)
    }

    /// The driver sends a command id: a 4-byte device-readable buffer.
    fn send_cmd(rig: &mut Rig, q: usize, at: u64, cmd: u32) {
        rig.mem
            .write_slice(&cmd.to_le_bytes(), GuestAddress(at))
            .unwrap();
        rig.chain(q, &[(at, 4, R)]);
    }

    fn status(h: &BalloonHandle) -> (u32, Option<u32>) {
        let s = h.hinting_status().unwrap();
        (s.host_cmd, s.guest_cmd)
    }

    #[test]
    fn feature_and_queue_layout() {
        let b = Balloon::new(hint_settings()).unwrap();
        assert_ne!(b.avail_features() & F_FREE_PAGE_HINT, 0);
        assert_eq!(
            b.queue_max_sizes().len(),
            4,
            "inflate, deflate, hint, report"
        );
        let all = Balloon::new(BalloonSettings {
            stats_polling_interval_s: 1,
            ..hint_settings()
        })
        .unwrap();
        assert_eq!(all.queue_max_sizes().len(), 5);
        let none = Balloon::new(settings(16)).unwrap();
        assert_eq!(none.avail_features() & F_FREE_PAGE_HINT, 0);
        assert_eq!(none.queue_max_sizes().len(), 4);
        assert_eq!(cmd_id(&b), CMD_ID_STOP, "no run before the first start");

        // Stats, hint, report negotiated: the hint queue is index 3, the
        // report queue 4; without stats, 2 and 3.
        let ram = GuestRam::new(16 << 20).unwrap();
        let rig = Rig::new(ram.memory());
        let h = all.handle();
        let w =
            BalloonWorker::for_test(rig.context(F_STATS_VQ | F_FREE_PAGE_HINT | F_REPORTING), &h);
        assert_eq!(
            w.queue(4).desc_table(),
            rig.queues[3]
                .create_queue::<virtio_queue::Queue>()
                .unwrap()
                .desc_table(),
            "the hint queue is the driver's fourth"
        );
        assert_eq!(
            w.queue(3).desc_table(),
            rig.queues[4]
                .create_queue::<virtio_queue::Queue>()
                .unwrap()
                .desc_table(),
            "the report queue is the driver's fifth"
        );
        let rig2 = Rig::new(ram.memory());
        let h2 = b.handle();
        let w2 = BalloonWorker::for_test(rig2.context(F_FREE_PAGE_HINT | F_REPORTING), &h2);
        assert_eq!(
            w2.queue(4).desc_table(),
            rig2.queues[2]
                .create_queue::<virtio_queue::Queue>()
                .unwrap()
                .desc_table()
        );
    }

    #[test]
    fn not_enabled_or_not_activated_is_refused() {
        let plain = Balloon::new(settings(16)).unwrap().handle();
        assert_eq!(
            plain.start_hinting(true),
            Err(BalloonError::HintingNotEnabled)
        );
        assert_eq!(plain.stop_hinting(), Err(BalloonError::HintingNotEnabled));
        assert_eq!(plain.hinting_status(), Err(BalloonError::HintingNotEnabled));
        // Enabled, but no driver yet: status answers, commands are refused.
        let b = Balloon::new(hint_settings()).unwrap();
        let h = b.handle();
        assert_eq!(status(&h), (CMD_ID_STOP, None));
        assert_eq!(h.start_hinting(true), Err(BalloonError::NotActivated));
        assert_eq!(h.stop_hinting(), Err(BalloonError::NotActivated));
        assert_eq!(cmd_id(&b), CMD_ID_STOP);
        let json = serde_json::to_value(h.hinting_status().unwrap()).unwrap();
        assert_eq!(json, serde_json::json!({"host_cmd": 0, "guest_cmd": null}));
        assert_eq!(
            serde_json::to_value(h.status()).unwrap()["free_page_hinting"],
            true
        );
    }

    #[test]
    fn a_run_releases_hinted_pages_then_done() {
        let ram = GuestRam::new(16 << 20).unwrap();
        let mut rig = Rig::new(ram.memory());
        let b = Balloon::new(hint_settings()).unwrap();
        let h = b.handle();
        // No stats: the hint queue is index 2.
        let mut w = BalloonWorker::for_test(rig.context(F_FREE_PAGE_HINT | F_REPORTING), &h);
        const Q: usize = 2;
        let block = 0x20_0000u64; // what a guest hints at once (Linux: 4 MiB)
        fill(&ram, DATA, 3 * block, 0x42);
        fill(&ram, (16 << 20) - PAGE, PAGE, 0x55);

        h.start_hinting(true).unwrap();
        assert_eq!(cmd_id(&b), 2, "the first run's id is 2");
        assert_ne!(rig.interrupt.status() & INT_CONFIG, 0);
        assert_eq!(status(&h), (2, None));
        rig.interrupt.ack(u32::MAX);

        // A hint before the driver named its run is not released.
        rig.chain(Q, &[(DATA, block as u32, W)]);
        w.serve_hint();
        assert_eq!(read(&ram, DATA, 8), vec![0x42; 8]);
        assert_eq!(h.counters().hints_ignored, 1);

        // The run: its id, then free blocks (one good, three out of bounds).
        send_cmd(&mut rig, Q, BUF, 2);
        let before = blocks(&ram);
        rig.chain(
            Q,
            &[
                (DATA, block as u32, W),
                (DATA + block + 1, PAGE as u32, W), // misaligned
                ((16 << 20) - PAGE, 2 * PAGE as u32, W), // past the end of RAM
                (1 << 40, block as u32, W),         // far outside
            ],
        );
        w.serve_hint();
        assert_eq!(rig.used_idx(Q), 3, "every chain is returned");
        assert_ne!(rig.interrupt.status() & INT_VRING, 0);
        assert_eq!(status(&h), (2, Some(2)));
        let after = blocks(&ram);
        assert!(
            before >= after + block / 512,
            "memfd blocks {before} -> {after}"
        );
        assert_eq!(
            read(&ram, DATA, block),
            vec![0; host_usize::from_u64(block)]
        );
        assert_eq!(read(&ram, DATA + block, 8), vec![0x42; 8], "neighbour kept");
        assert_eq!(
            read(&ram, (16 << 20) - PAGE, 8),
            vec![0x55; 8],
            "not half-released"
        );
        let c = h.counters();
        assert_eq!((c.hinted_bytes, c.refused), (block, 3));

        // The driver is done (STOP): acknowledge_on_stop answers DONE.
        rig.interrupt.ack(u32::MAX);
        send_cmd(&mut rig, Q, BUF + 0x10, CMD_ID_STOP);
        w.serve_hint();
        assert_eq!(status(&h), (CMD_ID_DONE, Some(CMD_ID_STOP)));
        assert_eq!(cmd_id(&b), CMD_ID_DONE);
        assert_ne!(rig.interrupt.status() & INT_CONFIG, 0);

        // After DONE the guest reuses its pages: a late hint is not released.
        rig.chain(Q, &[(DATA + block, block as u32, W)]);
        w.serve_hint();
        assert_eq!(read(&ram, DATA + block, 8), vec![0x42; 8]);
        assert_eq!(h.counters().hinted_bytes, block);

        // A command buffer of the wrong size is refused, nothing else.
        rig.chain(Q, &[(BUF, 8, R)]);
        w.serve_hint();
        assert_eq!(h.counters().refused, 4);
        assert_eq!(status(&h), (CMD_ID_DONE, Some(CMD_ID_STOP)));
    }

    #[test]
    fn without_ack_the_run_ends_on_stop_and_stale_hints_are_ignored() {
        let ram = GuestRam::new(16 << 20).unwrap();
        let mut rig = Rig::new(ram.memory());
        let b = Balloon::new(hint_settings()).unwrap();
        let h = b.handle();
        let mut w = BalloonWorker::for_test(rig.context(F_FREE_PAGE_HINT), &h);
        const Q: usize = 2;
        fill(&ram, DATA, 4 * PAGE, 0x33);
        h.start_hinting(false).unwrap();
        h.start_hinting(false).unwrap();
        assert_eq!(cmd_id(&b), 3, "each start is a new run");

        // The driver still answers run 2: its hints are stale.
        send_cmd(&mut rig, Q, BUF, 2);
        rig.chain(Q, &[(DATA, PAGE as u32, W)]);
        w.serve_hint();
        assert_eq!(read(&ram, DATA, 8), vec![0x33; 8]);
        // Run 3: released.
        send_cmd(&mut rig, Q, BUF + 0x10, 3);
        rig.chain(Q, &[(DATA + PAGE, PAGE as u32, W)]);
        send_cmd(&mut rig, Q, BUF + 0x20, CMD_ID_STOP);
        w.serve_hint();
        assert_eq!(read(&ram, DATA + PAGE, 8), vec![0; 8]);
        assert_eq!(h.counters().hinted_bytes, PAGE);
        assert_eq!(h.counters().hints_ignored, 1);
        // No acknowledgement: the guest keeps the pages until stop.
        assert_eq!(status(&h), (3, Some(CMD_ID_STOP)));
        h.stop_hinting().unwrap();
        assert_eq!((cmd_id(&b), status(&h).0), (CMD_ID_DONE, CMD_ID_DONE));
    }

    #[test]
    fn the_end_of_an_old_run_does_not_cancel_a_new_one() {
        let ram = GuestRam::new(16 << 20).unwrap();
        let mut rig = Rig::new(ram.memory());
        let b = Balloon::new(hint_settings()).unwrap();
        let h = b.handle();
        let mut w = BalloonWorker::for_test(rig.context(F_FREE_PAGE_HINT), &h);
        h.start_hinting(true).unwrap();
        send_cmd(&mut rig, 2, BUF, 2);
        w.serve_hint();
        h.start_hinting(true).unwrap();
        send_cmd(&mut rig, 2, BUF + 0x10, CMD_ID_STOP);
        w.serve_hint();
        assert_eq!(status(&h), (3, Some(CMD_ID_STOP)), "run 3 still asked for");
    }

    #[test]
    fn snapshot_keeps_the_hinting_state() {
        let ram = GuestRam::new(16 << 20).unwrap();
        let mut rig = Rig::new(ram.memory());
        let b = Balloon::new(hint_settings()).unwrap();
        let h = b.handle();
        let mut w = BalloonWorker::for_test(rig.context(F_FREE_PAGE_HINT), &h);
        h.start_hinting(false).unwrap();
        send_cmd(&mut rig, 2, BUF, 2);
        w.serve_hint();
        let state = h.save();
        assert!(state.free_page_hinting);
        // bincode, as the snapshot file stores it.
        let bytes = bincode::serialize(&state).unwrap();
        let state: BalloonState = bincode::deserialize(&bytes).unwrap();

        let restored = Balloon::restore(hint_settings(), &state).unwrap();
        assert_eq!(cmd_id(&restored), 2);
        let rh = restored.handle();
        assert_eq!(status(&rh), (2, Some(2)));
        // The next run continues the ids.
        let mut rig2 = Rig::new(ram.memory());
        let mut w2 = BalloonWorker::for_test(rig2.context(F_FREE_PAGE_HINT), &rh);
        rh.start_hinting(true).unwrap();
        assert_eq!(cmd_id(&restored), 3);
        send_cmd(&mut rig2, 2, BUF, 3);
        send_cmd(&mut rig2, 2, BUF + 0x10, CMD_ID_STOP);
        w2.serve_hint();
        assert_eq!(status(&rh), (CMD_ID_DONE, Some(CMD_ID_STOP)));

        // The hinting queue must exist on both sides.
        let err = Balloon::restore(settings(16), &state).err().unwrap();
        assert!(err.to_string().contains("free_page_hinting"), "{err}");
    }
}

/// Released pages of memfd RAM read as zeros and are marked for the next
/// diff; released pages of RAM mapped over a snapshot file read the file
/// again and are not (a diff would fill up with the guest's free memory).
#[test]
fn release_marks_pages_dirty_only_where_they_now_read_zero() {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::GuestMemoryBackend;

    use crate::devices::virtio::balloon::request::GuestRange;
    let size = 4u64 << 20;
    let range = [GuestRange {
        addr: 1 << 20,
        len: 1 << 20,
    }];
    let dirty = |ram: &GuestRam, page: u64| -> bool {
        let region = ram.memory().iter().next().unwrap();
        let mapping: &vm_memory::MmapRegion<crate::memory::DirtyBitmap> = region;
        mapping.bitmap().dirty_at(host_usize::from_u64(page * 4096))
    };

    let shared = GuestRam::new(size).unwrap();
    shared
        .memory()
        .write_slice(&[7u8; 4096], GuestAddress(1 << 20))
        .unwrap();
    worker::release(shared.memory(), &range).unwrap();
    let v: u8 = shared.memory().read_obj(GuestAddress(1 << 20)).unwrap();
    assert_eq!(v, 0);
    assert!(dirty(&shared, 256) && dirty(&shared, 511));
    assert!(!dirty(&shared, 512));

    let path = std::env::temp_dir().join(format!("spore-balloon-file-{}", std::process::id()));
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(size).unwrap();
    file.write_all_at(&[9u8; 4096], 1 << 20).unwrap();
    let _ = std::fs::remove_file(&path);
    let restored = GuestRam::from_snapshot_file(file, size).unwrap();
    restored
        .memory()
        .write_slice(&[5u8; 4096], GuestAddress(1 << 20))
        .unwrap();
    // The VMM's own write above marked the page; start from a clean log.
    {
        let region = restored.memory().iter().next().unwrap();
        let mapping: &vm_memory::MmapRegion<crate::memory::DirtyBitmap> = region;
        mapping.bitmap().reset();
    }
    worker::release(restored.memory(), &range).unwrap();
    let v: u8 = restored.memory().read_obj(GuestAddress(1 << 20)).unwrap();
    assert_eq!(v, 9, "the snapshot's page shows again");
    assert!(!dirty(&restored, 256));
}
