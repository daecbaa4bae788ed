//! virtio-rng: filling chains directly, and end to end through the transport.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::devices::bus::BusDevice;
use crate::devices::virtio::interrupt::INT_VRING;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::VirtioInterrupt;
use crate::devices::wake::GuestWake;
use crate::host_usize;

const W: u16 = VRING_DESC_F_WRITE as u16;
const MEM_SIZE: u64 = 0x40_0000;
const POISON: u8 = 0x5a;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), host_usize::from_u64(MEM_SIZE))]).unwrap()
}

fn d(addr: u64, len: u32, flags: u16) -> Descriptor {
    Descriptor::new(addr, len, flags, 0)
}

fn poison(mem: &GuestMemoryMmap, addr: u64, len: usize) {
    mem.write_slice(&vec![POISON; len], GuestAddress(addr))
        .unwrap();
}

fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

/// Random bytes: not a constant run (probability of a false failure: 2^-2040).
fn looks_random(bytes: &[u8]) -> bool {
    bytes.len() >= 256 && bytes.iter().any(|&b| b != bytes[0])
}

#[test]
fn fills_writable_descriptors_in_order() {
    let mem = memory();
    poison(&mem, 0x1_0000, 0x3000);
    let chain = [
        d(0x1_0000, 300, W),
        d(0x1_1000, 300, 0),
        d(0x1_2000, 5000, W),
    ];
    assert_eq!(fill_chain(chain.into_iter(), &mem), 5300);
    assert!(looks_random(&read(&mem, 0x1_0000, 300)));
    assert_eq!(read(&mem, 0x1_0000 + 300, 10), vec![POISON; 10]);
    // The readable descriptor is left alone.
    assert_eq!(read(&mem, 0x1_1000, 300), vec![POISON; 300]);
    assert!(looks_random(&read(&mem, 0x1_2000, 5000)));
}

#[test]
fn output_per_chain_is_bounded() {
    let mem = memory();
    let big = 0x10_0000u32;
    poison(&mem, 0x10_0000, big as usize + 0x1000);
    let chain = [d(0x10_0000, big, W), d(0x20_0000, big, W)];
    assert_eq!(fill_chain(chain.into_iter(), &mem), MAX_BYTES_PER_CHAIN);
    let end = 0x10_0000 + u64::from(MAX_BYTES_PER_CHAIN);
    assert!(looks_random(&read(&mem, end - 4096, 4096)));
    assert_eq!(read(&mem, end, 4096), vec![POISON; 4096]);
}

#[test]
fn buffers_outside_memory_end_the_chain() {
    let mem = memory();
    // Entirely outside, straddling the end, at the top of the address space.
    for (addr, len) in [(MEM_SIZE, 64), (u64::MAX - 10, 100), (u64::MAX, 1)] {
        assert_eq!(fill_chain([d(addr, len, W)].into_iter(), &mem), 0);
    }
    // Bytes before the bad buffer count; nothing after it is touched.
    poison(&mem, 0x1_0000, 64);
    let chain = [d(0x1000, 64, W), d(MEM_SIZE - 8, 64, W), d(0x1_0000, 64, W)];
    assert_eq!(fill_chain(chain.into_iter(), &mem), 64);
    assert_eq!(read(&mem, 0x1_0000, 64), vec![POISON; 64]);
    // A chain with no writable buffer gets nothing.
    assert_eq!(fill_chain([d(0x1000, 64, 0)].into_iter(), &mem), 0);
    assert_eq!(fill_chain(std::iter::empty(), &mem), 0);
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

/// Activates an Rng behind a transport, driven through `vq`.
fn activate(mem: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>) -> MmioTransport {
    activate_with(mem, vq, Rng::new(None).unwrap())
}

fn activate_with(
    mem: &GuestMemoryMmap,
    vq: &MockSplitQueue<GuestMemoryMmap>,
    rng: Rng,
) -> MmioTransport {
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Arc::new(GuestWake::new().unwrap()),
    ));
    let features = rng.avail_features();
    let mut t = MmioTransport::new(Box::new(rng), mem.clone(), interrupt).unwrap();
    assert_eq!(t.device_type(), 4);
    for (reg, v) in [
        (0x70, 1),
        (0x70, 3),
        (0x24, 0),
        (0x20, features as u32),
        (0x24, 1),
        (0x20, (features >> 32) as u32),
        (0x70, 0xb),
        (0x80, vq.desc_table_addr().0 as u32),
        (0x90, vq.avail_addr().0 as u32),
        (0xa0, vq.used_addr().0 as u32),
        (0x44, 1),
        (0x70, 0xf),
    ] {
        wr(&mut t, reg, v);
    }
    assert!(t.is_activated());
    t
}

#[test]
fn serves_the_queue_through_the_transport() {
    let mem = memory();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0), QUEUE_SIZE);
    let mut t = activate(&mem, &vq);

    poison(&mem, 0x1_0000, 0x2_0000);
    let descs = [
        // Chain 0: one 512-byte buffer.
        RawDescriptor::from(SplitDescriptor::new(0x1_0000, 512, W, 0)),
        // Chain 1: two buffers, 128 KiB in total (more than one chain gets).
        RawDescriptor::from(SplitDescriptor::new(
            0x1_1000,
            0x1_0000,
            W | VRING_DESC_F_NEXT as u16,
            2,
        )),
        RawDescriptor::from(SplitDescriptor::new(0x2_1000, 0x1_0000, W, 0)),
    ];
    vq.add_desc_chains(&descs, 0).unwrap();
    wr(&mut t, 0x50, 0);

    let deadline = Instant::now() + Duration::from_secs(10);
    while vq.used().idx().load() != 2 {
        assert!(Instant::now() < deadline, "rng did not complete requests");
        std::thread::sleep(Duration::from_millis(1));
    }
    let used = |i| vq.used().ring().ref_at(i).unwrap().load();
    assert_eq!((used(0).id(), used(0).len()), (0, 512));
    assert_eq!((used(1).id(), used(1).len()), (1, MAX_BYTES_PER_CHAIN));
    assert!(looks_random(&read(&mem, 0x1_0000, 512)));
    assert_eq!(read(&mem, 0x2_1000, 16), vec![POISON; 16]);
    assert_eq!(t.interrupt().status() & INT_VRING, INT_VRING);

    // Reset stops the worker.
    wr(&mut t, 0x70, 0);
    assert!(!t.is_activated());
}

/// `PUT /entropy`'s limiter: with a bandwidth bucket of 1 KiB refilled
/// every 300 ms, three 1 KiB chains take two refills; the chain that waits
/// is served when the limiter's timer fires, with no new notification.
#[test]
fn the_rate_limiter_holds_chains_until_the_bucket_refills() {
    let mem = memory();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0), QUEUE_SIZE);
    let limits: crate::config::RateLimiterConfig =
        serde_json::from_str(r#"{"bandwidth": {"size": 1024, "refill_time": 300}}"#).unwrap();
    let mut t = activate_with(&mem, &vq, Rng::new(Some(&limits)).unwrap());
    let descs = [
        RawDescriptor::from(SplitDescriptor::new(0x1_0000, 1024, W, 0)),
        RawDescriptor::from(SplitDescriptor::new(0x1_1000, 1024, W, 0)),
        RawDescriptor::from(SplitDescriptor::new(0x1_2000, 1024, W, 0)),
    ];
    vq.add_desc_chains(&descs, 0).unwrap();
    let start = Instant::now();
    wr(&mut t, 0x50, 0);
    let deadline = start + Duration::from_secs(10);
    while vq.used().idx().load() != 3 {
        assert!(
            Instant::now() < deadline,
            "the held chains were never served"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(550), "served in {took:?}");
    wr(&mut t, 0x70, 0);
}

#[test]
fn corrupt_avail_index_neither_spins_nor_blocks_reset() {
    let mem = memory();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0), QUEUE_SIZE);
    let mut t = activate(&mem, &vq);
    // More chains "available" than the ring holds: virtio-queue refuses to
    // iterate; the worker must give up on the round, not retry forever.
    vq.avail().idx().store(QUEUE_SIZE + 7);
    wr(&mut t, 0x50, 0);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(vq.used().idx().load(), 0);
    let start = Instant::now();
    wr(&mut t, 0x70, 0);
    assert!(!t.is_activated());
    assert!(start.elapsed() < Duration::from_secs(5));
}
