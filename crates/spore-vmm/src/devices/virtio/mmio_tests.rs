//! Tests of the virtio-mmio transport against a recording fake device.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]

use std::sync::{Arc, Mutex};

use virtio_queue::mock::MockSplitQueue;
use virtio_queue::QueueT;
use vm_memory::GuestAddress;

use super::*;
use crate::devices::virtio::ActivateError;
use crate::devices::wake::GuestWake;

const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
const FAKE_FEATURE: u64 = 1 << 3;

/// A queue as the device saw it: (size, desc, avail, used, ready).
type QueueView = (u16, u64, u64, u64, bool);

#[derive(Default)]
struct Record {
    /// Per activation: the queues, the number of queue eventfds, acked features.
    activations: Vec<(Vec<QueueView>, usize, u64)>,
    resets: usize,
    config_writes: Vec<(u64, Vec<u8>)>,
}

struct FakeDevice {
    record: Arc<Mutex<Record>>,
    fail_activate: bool,
}

impl VirtioDevice for FakeDevice {
    fn device_type(&self) -> u32 {
        42
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16, 8]
    }
    fn avail_features(&self) -> u64 {
        VERSION_1 | FAKE_FEATURE
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = (offset as u8).wrapping_add(i as u8);
        }
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.record
            .lock()
            .unwrap()
            .config_writes
            .push((offset, data.to_vec()));
    }
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        if self.fail_activate {
            return Err(ActivateError::Device("refused".into()));
        }
        let queues = ctx
            .queues
            .iter()
            .map(|q| {
                (
                    q.size(),
                    q.desc_table(),
                    q.avail_ring(),
                    q.used_ring(),
                    q.ready(),
                )
            })
            .collect();
        self.record.lock().unwrap().activations.push((
            queues,
            ctx.queue_events.len(),
            ctx.acked_features,
        ));
        Ok(())
    }
    fn reset(&mut self) {
        self.record.lock().unwrap().resets += 1;
    }
}

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
}

fn transport(fail_activate: bool) -> (MmioTransport, Arc<Mutex<Record>>) {
    let record = Arc::new(Mutex::new(Record::default()));
    let device = FakeDevice {
        record: record.clone(),
        fail_activate,
    };
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let interrupt = Arc::new(VirtioInterrupt::new(
        irq,
        Arc::new(GuestWake::new().unwrap()),
    ));
    let t = MmioTransport::new(Box::new(device), memory(), interrupt).unwrap();
    (t, record)
}

fn rd(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

fn wr(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

fn ack_features(t: &mut MmioTransport, features: u64) {
    wr(t, REG_DRIVER_FEATURES_SEL, 0);
    wr(t, REG_DRIVER_FEATURES, features as u32);
    wr(t, REG_DRIVER_FEATURES_SEL, 1);
    wr(t, REG_DRIVER_FEATURES, (features >> 32) as u32);
}

/// Drives the transport to FEATURES_OK with `features`; returns the status read back.
fn negotiate(t: &mut MmioTransport, features: u64) -> u32 {
    wr(t, REG_STATUS, ACKNOWLEDGE);
    wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    ack_features(t, features);
    wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    rd(t, REG_STATUS)
}

fn setup_queue(t: &mut MmioTransport, index: u32, size: u16, desc: u64, avail: u64, used: u64) {
    wr(t, REG_QUEUE_SEL, index);
    wr(t, REG_QUEUE_NUM, u32::from(size));
    wr(t, REG_QUEUE_DESC_LOW, desc as u32);
    wr(t, REG_QUEUE_DESC_HIGH, (desc >> 32) as u32);
    wr(t, REG_QUEUE_DRIVER_LOW, avail as u32);
    wr(t, REG_QUEUE_DRIVER_HIGH, (avail >> 32) as u32);
    wr(t, REG_QUEUE_DEVICE_LOW, used as u32);
    wr(t, REG_QUEUE_DEVICE_HIGH, (used >> 32) as u32);
    wr(t, REG_QUEUE_READY, 1);
}

#[test]
fn identity_registers() {
    let (mut t, _) = transport(false);
    assert_eq!(rd(&mut t, REG_MAGIC), 0x7472_6976);
    assert_eq!(rd(&mut t, REG_VERSION), 2);
    assert_eq!(rd(&mut t, REG_DEVICE_ID), 42);
    assert_eq!(rd(&mut t, REG_VENDOR_ID), VENDOR_ID);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), FAKE_FEATURE as u32);
    wr(&mut t, REG_DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 1);
    wr(&mut t, REG_DEVICE_FEATURES_SEL, 2);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 0);
    assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 16);
    wr(&mut t, REG_QUEUE_SEL, 1);
    assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 8);
    wr(&mut t, REG_QUEUE_SEL, 2);
    assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 0);
    assert_eq!(rd(&mut t, REG_SHM_LEN_LOW), u32::MAX);
    assert_eq!(rd(&mut t, REG_CONFIG_GENERATION), 0);
}

#[test]
fn full_negotiation_activates_device() {
    let mem = memory();
    let (mut t, record) = transport(false);
    assert_eq!(
        negotiate(&mut t, VERSION_1 | FAKE_FEATURE),
        ACKNOWLEDGE | DRIVER | FEATURES_OK
    );
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), 16);
    let (d, a, u) = (vq.desc_table_addr().0, vq.avail_addr().0, vq.used_addr().0);
    setup_queue(&mut t, 0, 16, d, a, u);
    assert_eq!(rd(&mut t, REG_QUEUE_READY), 1);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert_eq!(
        rd(&mut t, REG_STATUS),
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
    );
    assert!(t.is_activated());
    let rec = record.lock().unwrap();
    assert_eq!(rec.activations.len(), 1);
    let (queues, events, acked) = &rec.activations[0];
    assert_eq!(queues[0], (16, d, a, u, true));
    // Queue 1 was never set up: handed over not ready.
    assert!(!queues[1].4);
    assert_eq!(*events, 2);
    assert_eq!(*acked, VERSION_1 | FAKE_FEATURE);
}

#[test]
fn features_ok_refused_for_bad_feature_sets() {
    let (mut t, _) = transport(false);
    // Without VIRTIO_F_VERSION_1 (a legacy driver).
    assert_eq!(negotiate(&mut t, FAKE_FEATURE), ACKNOWLEDGE | DRIVER);
    wr(&mut t, REG_STATUS, 0);
    // A feature the device never offered.
    assert_eq!(negotiate(&mut t, VERSION_1 | 1 << 7), ACKNOWLEDGE | DRIVER);
    wr(&mut t, REG_STATUS, 0);
    // Bits in a feature page past the second.
    wr(&mut t, REG_STATUS, ACKNOWLEDGE);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    ack_features(&mut t, VERSION_1);
    wr(&mut t, REG_DRIVER_FEATURES_SEL, 5);
    wr(&mut t, REG_DRIVER_FEATURES, 1);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
    // DRIVER_OK without FEATURES_OK is ignored too.
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | DRIVER_OK);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
    assert!(!t.is_activated());
}

#[test]
fn out_of_order_status_writes_are_ignored() {
    let (mut t, record) = transport(false);
    // DRIVER before ACKNOWLEDGE, two steps at once, unknown bits.
    wr(&mut t, REG_STATUS, DRIVER);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | 0x10);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE);
    // Features written before DRIVER are ignored.
    wr(&mut t, REG_DRIVER_FEATURES, FAKE_FEATURE as u32);
    assert_eq!(t.acked_features(), 0);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    // Clearing a bit is not a reset.
    wr(&mut t, REG_STATUS, DRIVER);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
    // Queue registers before FEATURES_OK are ignored.
    wr(&mut t, REG_QUEUE_READY, 1);
    assert_eq!(rd(&mut t, REG_QUEUE_READY), 0);
    // FAILED is always accepted, and then only a reset helps.
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FAILED);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FAILED);
    ack_features(&mut t, VERSION_1);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FAILED | FEATURES_OK,
    );
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FAILED);
    assert_eq!(record.lock().unwrap().activations.len(), 0);
}

#[test]
fn reset_clears_everything_and_allows_reactivation() {
    let mem = memory();
    let (mut t, record) = transport(false);
    negotiate(&mut t, VERSION_1);
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), 16);
    setup_queue(
        &mut t,
        0,
        8,
        vq.desc_table_addr().0,
        vq.avail_addr().0,
        vq.used_addr().0,
    );
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert!(t.is_activated());
    t.interrupt().signal_used_queue();
    wr(&mut t, REG_QUEUE_NOTIFY, 0);

    wr(&mut t, REG_STATUS, 0);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    assert!(!t.is_activated());
    assert_eq!(record.lock().unwrap().resets, 1);
    assert_eq!(rd(&mut t, REG_QUEUE_READY), 0);
    assert_eq!(rd(&mut t, REG_INTERRUPT_STATUS), 0);
    assert_eq!(t.acked_features(), 0);
    // The stale notification was dropped.
    assert!(t.queue_events()[0].read().is_err());

    negotiate(&mut t, VERSION_1);
    setup_queue(
        &mut t,
        0,
        16,
        vq.desc_table_addr().0,
        vq.avail_addr().0,
        vq.used_addr().0,
    );
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    let rec = record.lock().unwrap();
    assert_eq!(rec.activations.len(), 2);
    // The size reverted to the maximum on reset and was set again.
    assert_eq!(rec.activations[0].0[0].0, 8);
    assert_eq!(rec.activations[1].0[0].0, 16);
}

#[test]
fn invalid_queue_sets_needs_reset() {
    let (mut t, record) = transport(false);
    negotiate(&mut t, VERSION_1);
    // Descriptor table past the end of guest memory.
    setup_queue(&mut t, 0, 16, 0xffff_fff0_0000, 0x2000, 0x3000);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert!(!t.is_activated());
    assert_ne!(rd(&mut t, REG_STATUS) & NEEDS_RESET, 0);
    assert_eq!(rd(&mut t, REG_INTERRUPT_STATUS) & INT_CONFIG, INT_CONFIG);
    assert_eq!(rd(&mut t, REG_CONFIG_GENERATION), 1);
    assert!(record.lock().unwrap().activations.is_empty());
    wr(&mut t, REG_INTERRUPT_ACK, INT_CONFIG);
    assert_eq!(rd(&mut t, REG_INTERRUPT_STATUS), 0);
    // The driver echoing NEEDS_RESET back changes nothing; a reset recovers.
    let s = rd(&mut t, REG_STATUS);
    wr(&mut t, REG_STATUS, s);
    wr(&mut t, REG_STATUS, 0);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
}

#[test]
fn failed_activation_sets_needs_reset() {
    let (mut t, _) = transport(true);
    negotiate(&mut t, VERSION_1);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert!(!t.is_activated());
    assert_ne!(rd(&mut t, REG_STATUS) & NEEDS_RESET, 0);
    assert_eq!(t.interrupt().status() & INT_CONFIG, INT_CONFIG);
}

#[test]
fn notify_writes_the_queue_eventfd() {
    let (mut t, _) = transport(false);
    wr(&mut t, REG_QUEUE_NOTIFY, 1);
    wr(&mut t, REG_QUEUE_NOTIFY, 1);
    assert_eq!(t.queue_events()[1].read().unwrap(), 2);
    assert!(t.queue_events()[0].read().is_err());
    // Absent queues are ignored.
    wr(&mut t, REG_QUEUE_NOTIFY, 2);
    wr(&mut t, REG_QUEUE_NOTIFY, u32::MAX);
}

#[test]
fn bad_accesses_are_ignored() {
    let (mut t, _) = transport(false);
    // Wrong widths and alignment on registers.
    let mut b1 = [0xaa];
    t.read(REG_MAGIC, &mut b1);
    assert_eq!(b1, [0]);
    let mut b8 = [0xaa; 8];
    t.read(REG_MAGIC, &mut b8);
    assert_eq!(b8, [0; 8]);
    let mut b4 = [0xaa; 4];
    t.read(REG_MAGIC + 1, &mut b4);
    assert_eq!(b4, [0; 4]);
    t.write(REG_STATUS, &[ACKNOWLEDGE as u8]);
    t.write(REG_STATUS, &(ACKNOWLEDGE as u64).to_le_bytes());
    t.write(REG_STATUS + 2, &ACKNOWLEDGE.to_le_bytes());
    t.write(REG_STATUS, &[]);
    t.read(REG_STATUS, &mut []);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    // Unknown, write-only and read-only registers.
    assert_eq!(rd(&mut t, 0x0f0), 0);
    assert_eq!(rd(&mut t, REG_QUEUE_NOTIFY), 0);
    wr(&mut t, REG_MAGIC, 0);
    wr(&mut t, 0x0f0, 1);
    assert_eq!(rd(&mut t, REG_MAGIC), MAGIC_VALUE);
    // Queue registers for an absent queue.
    negotiate(&mut t, VERSION_1);
    wr(&mut t, REG_QUEUE_SEL, u32::MAX);
    wr(&mut t, REG_QUEUE_NUM, 4);
    wr(&mut t, REG_QUEUE_READY, 1);
    assert_eq!(rd(&mut t, REG_QUEUE_READY), 0);
    // Sizes that are too large, zero, or not a power of two keep the old size.
    wr(&mut t, REG_QUEUE_SEL, 0);
    wr(&mut t, REG_QUEUE_NUM, 0x1_0000);
    wr(&mut t, REG_QUEUE_NUM, 0);
    wr(&mut t, REG_QUEUE_NUM, 12);
    wr(&mut t, REG_QUEUE_NUM, 32);
    assert_eq!(t.queues[0].size(), 16);
    // Misaligned ring addresses are refused.
    wr(&mut t, REG_QUEUE_DESC_LOW, 0x1001);
    assert_eq!(t.queues[0].desc_table(), 0);
}

#[test]
fn config_space_any_width() {
    let (mut t, record) = transport(false);
    let mut b = [0u8; 3];
    t.read(CONFIG_SPACE + 5, &mut b);
    assert_eq!(b, [5, 6, 7]);
    let mut b = [0u8; 8];
    t.read(CONFIG_SPACE, &mut b);
    assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7]);
    t.write(CONFIG_SPACE + 2, &[9, 9]);
    assert_eq!(record.lock().unwrap().config_writes, vec![(2, vec![9, 9])]);
}

#[test]
fn event_idx_follows_acked_features() {
    struct EventIdxDevice(Arc<Mutex<Vec<bool>>>);
    impl VirtioDevice for EventIdxDevice {
        fn device_type(&self) -> u32 {
            1
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[4]
        }
        fn avail_features(&self) -> u64 {
            VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX
        }
        fn read_config(&self, _: u64, _: &mut [u8]) {}
        fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
            self.0
                .lock()
                .unwrap()
                .push(ctx.queues[0].event_idx_enabled());
            Ok(())
        }
        fn reset(&mut self) {}
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Arc::new(GuestWake::new().unwrap()),
    ));
    let mut t =
        MmioTransport::new(Box::new(EventIdxDevice(seen.clone())), memory(), interrupt).unwrap();
    for features in [VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX, VERSION_1] {
        negotiate(&mut t, features);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        wr(&mut t, REG_STATUS, 0);
    }
    assert_eq!(*seen.lock().unwrap(), vec![true, false]);
}
