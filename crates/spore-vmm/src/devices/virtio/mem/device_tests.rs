#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: byte patterns and addresses the test builds itself"
)]
use vm_memory::{Address, GuestAddress, GuestMemoryBackend};

use super::*;
use crate::devices::virtio::mem::request::{REQ_PLUG, RESP_BUSY};
use crate::host_usize;

const BASE: u64 = 4 << 30;
const BS: u64 = 2 * MIB;

fn device(blocks: u64, slot_blocks: u64) -> (VirtioMem, MemHandle) {
    let backing = HotplugMemory::new(BASE, blocks * BS, slot_blocks * BS).unwrap();
    VirtioMem::new(backing, BS, slot_blocks * BS)
}

fn config_u64(dev: &VirtioMem, at: u64) -> u64 {
    let mut b = [0u8; 8];
    dev.read_config(at, &mut b);
    u64::from_le_bytes(b)
}

fn plug(h: &MemHandle, first: u64, n: u64) -> Response {
    h.handle_request(Request::Plug {
        addr: BASE + first * BS,
        nb_blocks: n,
    })
}

fn unplug(h: &MemHandle, first: u64, n: u64) -> Response {
    h.handle_request(Request::Unplug {
        addr: BASE + first * BS,
        nb_blocks: n,
    })
}

#[test]
fn config_space_reads() {
    let (dev, h) = device(64, 32);
    assert_eq!(dev.device_type(), 24);
    assert_eq!(
        dev.avail_features(),
        (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE)
    );
    assert_eq!(config_u64(&dev, 0x00), BS);
    assert_eq!(config_u64(&dev, 0x08) & 0xffff, 0, "node_id");
    assert_eq!(config_u64(&dev, 0x10), BASE);
    assert_eq!(config_u64(&dev, 0x18), 64 * BS);
    assert_eq!(config_u64(&dev, 0x20), 64 * BS);
    assert_eq!(config_u64(&dev, 0x28), 0);
    assert_eq!(config_u64(&dev, 0x30), 0);
    h.set_requested_mib(8).unwrap();
    assert_eq!(config_u64(&dev, 0x30), 8 * MIB);
    assert_eq!(plug(&h, 3, 2).resp_type, RESP_ACK);
    assert_eq!(config_u64(&dev, 0x28), 4 * MIB);
    // 32-bit halves, as the MMIO transport reads them.
    let mut lo = [0u8; 4];
    dev.read_config(0x10, &mut lo);
    assert_eq!(u32::from_le_bytes(lo), BASE as u32);
    dev.read_config(0x14, &mut lo);
    assert_eq!(u32::from_le_bytes(lo), (BASE >> 32) as u32);
    // Past the end reads as zeros; odd offsets never panic.
    let mut b = [0xffu8; 8];
    dev.read_config(52, &mut b);
    assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0]);
    dev.read_config(u64::MAX, &mut b);
    assert_eq!(b, [0; 8]);
    // The driver cannot change the config.
    let mut dev = dev;
    dev.write_config(0x30, &u64::MAX.to_le_bytes());
    dev.write_config(0x28, &0u64.to_le_bytes());
    assert_eq!(config_u64(&dev, 0x30), 8 * MIB);
    assert_eq!(config_u64(&dev, 0x28), 4 * MIB);
}

#[test]
fn refusal_rules() {
    let (_dev, h) = device(64, 32);
    // Target checks.
    assert!(matches!(
        h.set_requested_mib(3),
        Err(MemError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        h.set_requested_mib(130),
        Err(MemError::TooLarge { .. })
    ));
    assert!(matches!(
        h.set_requested_mib(u64::MAX),
        Err(MemError::TooLarge { .. })
    ));
    h.set_requested_mib(16).unwrap();
    // Plug beyond the target: NACK, nothing plugged.
    assert_eq!(plug(&h, 0, 9).resp_type, RESP_NACK);
    assert_eq!(h.status().plugged_size_mib, 0);
    assert_eq!(plug(&h, 0, 8).resp_type, RESP_ACK);
    assert_eq!(plug(&h, 8, 1).resp_type, RESP_NACK);
    // Plug of plugged or mixed blocks: ERROR.
    h.set_requested_mib(128).unwrap();
    assert_eq!(plug(&h, 0, 1).resp_type, RESP_ERROR);
    assert_eq!(plug(&h, 7, 2).resp_type, RESP_ERROR);
    // Unplug of unplugged or mixed blocks: ERROR.
    assert_eq!(unplug(&h, 8, 1).resp_type, RESP_ERROR);
    assert_eq!(unplug(&h, 7, 2).resp_type, RESP_ERROR);
    // Ranges: misaligned, out of the region, empty, wrapping.
    for req in [
        Request::Plug {
            addr: BASE + 4096,
            nb_blocks: 1,
        },
        Request::Plug {
            addr: BASE - BS,
            nb_blocks: 1,
        },
        Request::Plug {
            addr: BASE + 63 * BS,
            nb_blocks: 2,
        },
        Request::Plug {
            addr: BASE,
            nb_blocks: 0,
        },
        Request::Plug {
            addr: u64::MAX - BS + 1,
            nb_blocks: 65_535,
        },
        Request::Unplug {
            addr: BASE + 1,
            nb_blocks: 1,
        },
        Request::Unplug {
            addr: 0,
            nb_blocks: 1,
        },
        Request::State {
            addr: BASE + 64 * BS,
            nb_blocks: 1,
        },
        Request::State {
            addr: BASE,
            nb_blocks: 65,
        },
    ] {
        assert_eq!(h.handle_request(req).resp_type, RESP_ERROR, "{req:?}");
    }
    assert_eq!(h.status().plugged_size_mib, 16);
    // The device never answers BUSY.
    assert_ne!(plug(&h, 20, 1).resp_type, RESP_BUSY);
    // Unplug below the target is allowed (the guest decides what to give back).
    assert_eq!(unplug(&h, 20, 1).resp_type, RESP_ACK);
    // UNPLUG_ALL empties everything.
    assert_eq!(h.handle_request(Request::UnplugAll).resp_type, RESP_ACK);
    assert_eq!(h.status().plugged_size_mib, 0);
    assert_eq!(h.registered_slots(), 0);
    let _ = REQ_PLUG;
}

/// Small deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 1,000 blocks, plugged and unplugged in random order, checked after every
/// request against a host-side model: answers, plugged size, slots.
#[test]
fn random_requests_match_model() {
    const N: u64 = 1000;
    const SLOT: u64 = 32;
    let (dev, h) = device(N, SLOT);
    let mut model = vec![false; host_usize::from_u64(N)];
    let mut requested = N;
    h.set_requested_mib(requested * 2).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut acks, mut nacks, mut errors) = (0, 0, 0);
    for step in 0..20_000 {
        if rng.below(200) == 0 {
            requested = rng.below(N + 1);
            h.set_requested_mib(requested * 2).unwrap();
        }
        let first = rng.below(N + 8);
        let span = if rng.below(4) == 0 { 100 } else { 8 };
        let count = 1 + rng.below(span);
        let misalign = if rng.below(50) == 0 { 4096 } else { 0 };
        let addr = BASE + first * BS + misalign;
        let in_range = misalign == 0 && first + count <= N;
        let plugged_now = model.iter().filter(|p| **p).count() as u64;
        let range = first.min(N) as usize..(first + count).min(N) as usize;
        let n_plugged = model[range.clone()].iter().filter(|p| **p).count() as u64;
        let kind = rng.below(100);
        let (req, want) = if kind < 45 {
            let want = if !in_range || n_plugged != 0 {
                RESP_ERROR
            } else if plugged_now + count > requested {
                RESP_NACK
            } else {
                model[range].fill(true);
                RESP_ACK
            };
            (
                Request::Plug {
                    addr,
                    nb_blocks: count,
                },
                (want, 0),
            )
        } else if kind < 90 {
            let want = if !in_range || n_plugged != count {
                RESP_ERROR
            } else {
                model[range].fill(false);
                RESP_ACK
            };
            (
                Request::Unplug {
                    addr,
                    nb_blocks: count,
                },
                (want, 0),
            )
        } else if kind < 99 {
            let want = if !in_range {
                (RESP_ERROR, 0)
            } else if n_plugged == count {
                (RESP_ACK, STATE_PLUGGED)
            } else if n_plugged == 0 {
                (RESP_ACK, STATE_UNPLUGGED)
            } else {
                (RESP_ACK, STATE_MIXED)
            };
            (
                Request::State {
                    addr,
                    nb_blocks: count,
                },
                want,
            )
        } else {
            model.fill(false);
            (Request::UnplugAll, (RESP_ACK, 0))
        };
        let got = h.handle_request(req);
        assert_eq!((got.resp_type, got.state), want, "step {step}: {req:?}");
        match got.resp_type {
            RESP_ACK => acks += 1,
            RESP_NACK => nacks += 1,
            _ => errors += 1,
        }
        let plugged = model.iter().filter(|p| **p).count() as u64;
        assert_eq!(h.status().plugged_size_mib, plugged * 2, "step {step}");
        assert_eq!(config_u64(&dev, 0x28), plugged * BS, "step {step}");
        let used_chunks = model
            .chunks(host_usize::from_u64(SLOT))
            .filter(|c| c.iter().any(|p| *p))
            .count();
        assert_eq!(h.registered_slots(), used_chunks, "step {step}");
    }
    // The walk exercised every answer.
    assert!(
        acks > 1000 && nacks > 10 && errors > 1000,
        "{acks} {nacks} {errors}"
    );
}

/// Unplugged blocks go back to the host: the memfd shrinks.
#[test]
fn unplug_releases_host_memory() {
    let backing = HotplugMemory::new(BASE, 64 * BS, 32 * BS).unwrap();
    let region = backing.region();
    let (_dev, h) = VirtioMem::new(backing, BS, 32 * BS);
    let mem = GuestMemoryMmap::from_arc_regions(vec![region]).unwrap();
    h.set_requested_mib(64).unwrap();
    assert_eq!(plug(&h, 10, 32).resp_type, RESP_ACK);
    let data = vec![1u8; host_usize::from_u64(32 * BS)];
    mem.write_slice(&data, GuestAddress(BASE + 10 * BS))
        .unwrap();
    assert!(h.resident_bytes() >= 64 * MIB);
    assert_eq!(unplug(&h, 10, 16).resp_type, RESP_ACK);
    let left = h.resident_bytes();
    assert!((31 * MIB..=33 * MIB).contains(&left), "{left}");
    assert_eq!(h.handle_request(Request::UnplugAll).resp_type, RESP_ACK);
    assert!(h.resident_bytes() < MIB);
    assert!(mem.find_region(GuestAddress(BASE)).is_some());
    assert_eq!(GuestAddress(BASE).raw_value(), BASE);
}

/// A chunk emptied by UNPLUG keeps its slot until the round is over; a PLUG
/// into it meanwhile reuses the slot, and retiring then leaves it alone.
#[test]
fn emptied_slots_retire_after_the_round() {
    let (_dev, h) = device(64, 32);
    h.set_requested_mib(128).unwrap();
    assert_eq!(plug(&h, 0, 4).resp_type, RESP_ACK);
    let unplug_req = Request::Unplug {
        addr: BASE,
        nb_blocks: 4,
    };
    let plug_req = Request::Plug {
        addr: BASE + 2 * BS,
        nb_blocks: 1,
    };
    {
        let mut s = h.shared.lock();
        assert_eq!(s.handle(unplug_req).resp_type, RESP_ACK);
        assert!(s.backing.is_registered(0), "deleted only after the round");
        assert_eq!(s.handle(plug_req).resp_type, RESP_ACK);
        s.retire_slots();
        assert!(
            s.backing.is_registered(0),
            "chunk 0 has a plugged block again"
        );
        assert_eq!(
            s.handle(Request::Unplug {
                addr: BASE + 2 * BS,
                nb_blocks: 1
            })
            .resp_type,
            RESP_ACK
        );
        s.retire_slots();
        assert!(!s.backing.is_registered(0));
    }
    assert_eq!(h.registered_slots(), 0);
}

/// The worker deletes emptied chunks' slots once the queue has been idle
/// for [`RETIRE_AFTER_IDLE`], not while the driver is still unplugging.
#[test]
fn emptied_slots_wait_for_an_idle_queue() {
    let (_dev, h) = device(64, 32);
    h.set_requested_mib(128).unwrap();
    assert_eq!(plug(&h, 0, 4).resp_type, RESP_ACK);
    let mut worker = RequestHandler {
        shared: h.shared.clone(),
    };
    assert_eq!(worker.idle_timeout(), None, "nothing to retire");
    {
        let mut s = h.shared.lock();
        assert_eq!(
            s.handle(Request::Unplug {
                addr: BASE,
                nb_blocks: 4
            })
            .resp_type,
            RESP_ACK
        );
    }
    worker.after_round();
    assert_eq!(worker.idle_timeout(), Some(RETIRE_AFTER_IDLE));
    assert_eq!(h.registered_slots(), 1, "kept through the burst");
    worker.on_idle();
    assert_eq!(h.registered_slots(), 0);
    assert_eq!(worker.idle_timeout(), None);
}
