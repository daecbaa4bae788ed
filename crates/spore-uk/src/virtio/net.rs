//! The virtio-net driver (device id 1, virtio 1.2 §5.1), polled.
//!
//! Features: `VERSION_1` (required), `MAC` and `MRG_RXBUF` when offered; no
//! checksum or segmentation offloads, so every frame the device hands over
//! is a plain Ethernet frame with valid checksums and every frame sent
//! carries a zeroed header. With `VERSION_1` the header is always the
//! 12-byte `virtio_net_hdr_v1`; its `num_buffers` counts only with
//! `MRG_RXBUF` (a frame spread over several receive buffers).
//!
//! Queues: receive (0) kept full of [`BUF_SIZE`]-byte buffers, recycled once
//! the stack has consumed the frame in them; transmit (1) with a pool of as
//! many buffers as descriptors. Notifications (each a VM exit) are batched:
//! [`VirtioNet::flush`] sends at most one per queue, and only if the device
//! did not ask to be left alone (`VIRTQ_USED_F_NO_NOTIFY`).
//!
//! The device is trusted less than nothing: used ids are checked by the
//! queue, used lengths are clamped to the buffer, a header that is short or
//! claims zero or more buffers than the queue holds drops the frame.

use alloc::vec::Vec;

use super::mmio::{Transport, F_VERSION_1};
use super::queue::VirtQueue;
use super::{find_device, VirtioError};
use crate::BootInfo;

/// Virtio device id of a network card.
pub const DEVICE_ID: u32 = super::device_id::NET;
/// VIRTIO_NET_F_MAC: the config space holds the MAC address.
pub const F_MAC: u64 = 1 << 5;
/// VIRTIO_NET_F_MRG_RXBUF: a received frame may span several buffers.
pub const F_MRG_RXBUF: u64 = 1 << 15;

const RXQ: u16 = 0;
const TXQ: u16 = 1;
/// `virtio_net_hdr_v1`: flags, gso_type, hdr_len, gso_size, csum_start,
/// csum_offset, num_buffers.
pub const HDR_LEN: usize = 12;
const NUM_BUFFERS_OFFSET: usize = 10;
/// One receive or transmit buffer: header and a whole 1514-byte frame fit
/// (the spec asks for at least 1526 bytes without `MRG_RXBUF`).
pub const BUF_SIZE: usize = 2048;
/// Largest frame the stack may send: Ethernet header and a 1500-byte MTU.
pub const MAX_FRAME: usize = 1514;
/// Largest frame reassembled from several mergeable buffers; longer ones
/// are dropped (nothing negotiated allows more than an Ethernet frame).
pub const MAX_ASSEMBLED: usize = 16 * 1024;
const RX_BUFS: u16 = 256;
const TX_BUFS: u16 = 256;

/// How many buffers a received frame spans, from the header at the start
/// of its first buffer (`written` = the bytes the device wrote there).
/// None for a frame to drop: a header cut short, or a count of 0 or above
/// `queue_size` (the device cannot have used more buffers than it had).
pub fn rx_buffer_count(written: &[u8], mergeable: bool, queue_size: u16) -> Option<u16> {
    if written.len() < HDR_LEN {
        return None;
    }
    if !mergeable {
        // Without MRG_RXBUF the field has no meaning: one buffer per frame.
        return Some(1);
    }
    let n = u16::from_le_bytes([written[NUM_BUFFERS_OFFSET], written[NUM_BUFFERS_OFFSET + 1]]);
    (1..=queue_size).contains(&n).then_some(n)
}

/// A frame spread over several mergeable buffers, copied together.
#[derive(Debug)]
pub struct Assembly {
    data: Vec<u8>,
    /// Buffers still to come.
    remaining: u16,
    /// The frame grew past [`MAX_ASSEMBLED`]: drop it once complete.
    overflow: bool,
}

impl Assembly {
    fn new() -> Result<Self, VirtioError> {
        let mut data = Vec::new();
        data.try_reserve_exact(MAX_ASSEMBLED)
            .map_err(|_| VirtioError::OutOfMemory)?;
        Ok(Assembly {
            data,
            remaining: 0,
            overflow: false,
        })
    }

    pub fn in_progress(&self) -> bool {
        self.remaining > 0
    }

    /// Starts a frame of `count` buffers with the payload of the first.
    pub fn start(&mut self, first_payload: &[u8], count: u16) {
        self.data.clear();
        self.overflow = false;
        self.remaining = count;
        self.push(first_payload);
    }

    /// Adds the next buffer (continuation buffers carry no header).
    /// Returns true when the frame is complete.
    pub fn push(&mut self, payload: &[u8]) -> bool {
        if self.remaining == 0 {
            return false;
        }
        if self.data.len() + payload.len() > MAX_ASSEMBLED {
            self.overflow = true;
        } else {
            self.data.extend_from_slice(payload);
        }
        self.remaining -= 1;
        self.remaining == 0
    }

    /// The complete frame, None if it overflowed or is empty.
    pub fn frame(&self) -> Option<&[u8]> {
        (self.remaining == 0 && !self.overflow && !self.data.is_empty())
            .then_some(self.data.as_slice())
    }
}

/// Counters of what the driver did.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    pub rx_frames: u64,
    pub rx_dropped: u64,
    pub tx_frames: u64,
    pub notifies: u64,
}

/// A frame ready for the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    /// In receive buffer `id`, `len` bytes after the header.
    Single { id: u16, len: usize },
    /// In the assembly buffer.
    Assembled,
}

/// The receive side: queue, buffers, a frame being reassembled.
pub struct RxRing {
    queue: VirtQueue,
    /// `queue.size()` buffers of [`BUF_SIZE`]; descriptor id = index.
    bufs: Vec<u8>,
    mergeable: bool,
    assembly: Assembly,
    ready: Option<Ready>,
    notify_pending: bool,
    frames: u64,
    dropped: u64,
}

/// The transmit side: queue and its buffer pool.
pub struct TxRing {
    queue: VirtQueue,
    /// `queue.size()` buffers of [`BUF_SIZE`]; descriptor id = index.
    bufs: Vec<u8>,
    notify_pending: bool,
    frames: u64,
}

pub struct VirtioNet {
    transport: Transport,
    features: u64,
    mac: [u8; 6],
    rx: RxRing,
    tx: TxRing,
    notifies: u64,
}

fn zeroed(n: usize) -> Result<Vec<u8>, VirtioError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| VirtioError::OutOfMemory)?;
    v.resize(n, 0);
    Ok(v)
}

/// A random unicast, locally administered MAC, for a device without `MAC`.
fn random_mac() -> [u8; 6] {
    random_mac_from(crate::random::try_random_u64().unwrap_or_else(|_| crate::clock::rdtsc()))
}

fn random_mac_from(r: u64) -> [u8; 6] {
    let b = r.to_le_bytes();
    [(b[0] & 0xfe) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// `mac` if a station can use it: not multicast (nor broadcast), not zero.
pub fn usable_mac(mac: [u8; 6]) -> Option<[u8; 6]> {
    (mac[0] & 1 == 0 && mac != [0; 6]).then_some(mac)
}

impl VirtioNet {
    /// Finds the first virtio-net device in the boot info and brings it up
    /// with its receive queue full.
    pub fn new(info: &BootInfo) -> Result<VirtioNet, VirtioError> {
        let dev = find_device(info, DEVICE_ID).ok_or(VirtioError::NoDevice(DEVICE_ID))?;
        // SAFETY: the boot info lists this window as a virtio-mmio device,
        // identity-mapped by the boot protocol; only this driver uses it.
        let (transport, features) =
            unsafe { Transport::init(&dev, F_VERSION_1, F_MAC | F_MRG_RXBUF)? };
        let rxq = transport.setup_queue(RXQ, RX_BUFS)?;
        let txq = transport.setup_queue(TXQ, TX_BUFS)?;
        let rx = RxRing {
            bufs: zeroed(rxq.size() as usize * BUF_SIZE)?,
            queue: rxq,
            mergeable: features & F_MRG_RXBUF != 0,
            assembly: Assembly::new()?,
            ready: None,
            notify_pending: false,
            frames: 0,
            dropped: 0,
        };
        let tx = TxRing {
            bufs: zeroed(txq.size() as usize * BUF_SIZE)?,
            queue: txq,
            notify_pending: false,
            frames: 0,
        };
        let mut net = VirtioNet {
            transport,
            features,
            mac: [0; 6],
            rx,
            tx,
            notifies: 0,
        };
        net.mac = net.read_mac();
        // Buffers go in before DRIVER_OK so the device has them from the start.
        net.rx.post_free();
        net.transport.driver_ok();
        net.flush();
        Ok(net)
    }

    /// The features both sides agreed on.
    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Reads the MAC again (a clone's VMM may have rewritten it); a device
    /// without `MAC` gets a new random one (the random source is reseeded
    /// in each clone). Returns the MAC now in use.
    pub fn reread_mac(&mut self) -> [u8; 6] {
        self.mac = self.read_mac();
        self.mac
    }

    fn read_mac(&self) -> [u8; 6] {
        if self.features & F_MAC == 0 {
            return random_mac();
        }
        // The config generation brackets the six byte reads (§4.2.2.2).
        let mut mac: [u8; 6] = core::array::from_fn(|i| self.transport.config_u8(i));
        for _ in 0..16 {
            let before = self.transport.config_generation();
            mac = core::array::from_fn(|i| self.transport.config_u8(i));
            if self.transport.config_generation() == before {
                break;
            }
        }
        usable_mac(mac).unwrap_or_else(random_mac)
    }

    pub fn stats(&self) -> NetStats {
        NetStats {
            rx_frames: self.rx.frames,
            rx_dropped: self.rx.dropped,
            tx_frames: self.tx.frames,
            notifies: self.notifies,
        }
    }

    /// The receive and transmit sides, borrowed separately (a stack may
    /// answer a frame while it holds it).
    pub fn split(&mut self) -> (&mut RxRing, &mut TxRing) {
        (&mut self.rx, &mut self.tx)
    }

    /// True if a received frame is ready (reassembling as needed).
    pub fn has_frame(&mut self) -> bool {
        self.rx.next_frame()
    }

    /// True if a transmit buffer is free; if none is, kicks the device so
    /// that it drains the queue.
    pub fn can_send(&mut self) -> bool {
        if self.tx.has_room() {
            return true;
        }
        self.flush();
        self.tx.has_room()
    }

    /// Sends the notifications owed: at most one per queue.
    pub fn flush(&mut self) {
        if self.rx.notify_pending {
            self.rx.notify_pending = false;
            if self.rx.queue.device_wants_notify() {
                self.transport.notify(RXQ);
                self.notifies += 1;
            }
        }
        if self.tx.notify_pending {
            self.tx.notify_pending = false;
            if self.tx.queue.device_wants_notify() {
                self.transport.notify(TXQ);
                self.notifies += 1;
            }
        }
    }
}

impl RxRing {
    /// Offers every free descriptor's buffer to the device.
    fn post_free(&mut self) {
        while let Some(&id) = self.queue.peek_free() {
            let start = id as usize * BUF_SIZE;
            let Some(buf) = self.bufs.get_mut(start..start + BUF_SIZE) else {
                return;
            };
            // SAFETY: the buffer lives in `bufs` as long as the driver, and
            // the driver reads it only after the device returns it.
            if unsafe { self.queue.add(buf.as_mut_ptr(), BUF_SIZE as u32, true) }.is_none() {
                return;
            }
            self.notify_pending = true;
        }
    }

    /// Pops used buffers until a whole frame is ready; true if one is.
    fn next_frame(&mut self) -> bool {
        if self.ready.is_some() {
            return true;
        }
        while let Some(used) = self.queue.pop_used() {
            let id = used.id;
            let start = id as usize * BUF_SIZE;
            let written = (used.len as usize).min(BUF_SIZE);
            let Some(buf) = self.bufs.get(start..start + written) else {
                self.post_free();
                continue;
            };
            if self.assembly.in_progress() {
                let complete = self.assembly.push(buf);
                self.post_free();
                if complete {
                    if self.assembly.frame().is_some() {
                        self.ready = Some(Ready::Assembled);
                        return true;
                    }
                    self.dropped += 1;
                }
                continue;
            }
            match rx_buffer_count(buf, self.mergeable, self.queue.size()) {
                // The buffer stays out of the free descriptors' reach until
                // `consume`: `post_free` runs only after the frame is used.
                Some(1) if written > HDR_LEN => {
                    self.ready = Some(Ready::Single {
                        id,
                        len: written - HDR_LEN,
                    });
                    return true;
                }
                Some(n) if n > 1 => {
                    self.assembly.start(&buf[HDR_LEN..], n);
                    self.post_free();
                }
                _ => {
                    self.dropped += 1;
                    self.post_free();
                }
            }
        }
        false
    }

    /// Hands the ready frame to `f`, then gives its buffer back to the
    /// device. Without a ready frame `f` sees an empty slice (which a
    /// stack drops as malformed): callers check [`VirtioNet::has_frame`].
    pub fn consume<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> R {
        if !self.next_frame() {
            return f(&[]);
        }
        self.frames += 1;
        match self.ready.take() {
            Some(Ready::Single { id, len }) => {
                let start = id as usize * BUF_SIZE + HDR_LEN;
                let r = f(self.bufs.get(start..start + len).unwrap_or(&[]));
                self.post_free();
                r
            }
            Some(Ready::Assembled) => f(self.assembly.frame().unwrap_or(&[])),
            None => f(&[]),
        }
    }
}

impl TxRing {
    /// Takes back buffers the device has sent.
    fn reclaim(&mut self) {
        while self.queue.pop_used().is_some() {}
    }

    fn has_room(&mut self) -> bool {
        if self.queue.peek_free().is_none() {
            self.reclaim();
        }
        self.queue.peek_free().is_some()
    }

    /// Builds a frame of `len` bytes (at most [`MAX_FRAME`]) with `f` in a
    /// free buffer and queues it. With no free buffer, `f` writes into a
    /// scratch frame that is dropped (callers check
    /// [`VirtioNet::can_send`] first).
    pub fn send<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let len = len.min(BUF_SIZE - HDR_LEN);
        let id = match self.queue.peek_free() {
            Some(&id) => id,
            None => {
                let mut scratch = [0u8; BUF_SIZE];
                return f(&mut scratch[..len]);
            }
        };
        let start = id as usize * BUF_SIZE;
        let Some(buf) = self.bufs.get_mut(start..start + BUF_SIZE) else {
            let mut scratch = [0u8; BUF_SIZE];
            return f(&mut scratch[..len]);
        };
        // No offloads: an all-zero header (num_buffers is ignored on tx).
        buf[..HDR_LEN].fill(0);
        let r = f(&mut buf[HDR_LEN..HDR_LEN + len]);
        // SAFETY: the buffer lives in `bufs` as long as the driver; the
        // driver writes it again only after the device returns it.
        if unsafe { self.queue.add(buf.as_ptr(), (HDR_LEN + len) as u32, false) }.is_some() {
            self.notify_pending = true;
            self.frames += 1;
        }
        r
    }
}

// SAFETY: the raw pointers inside (queue memory, device registers) are owned
// by this driver alone; moving it moves that ownership.
unsafe impl Send for VirtioNet {}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(num_buffers: u16) -> [u8; HDR_LEN] {
        let mut h = [0u8; HDR_LEN];
        h[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        h
    }

    #[test]
    fn buffer_count_needs_a_whole_header() {
        assert_eq!(rx_buffer_count(&[0u8; 11], false, 256), None);
        assert_eq!(rx_buffer_count(&[0u8; 11], true, 256), None);
        assert_eq!(rx_buffer_count(&[], true, 256), None);
    }

    #[test]
    fn num_buffers_counts_only_with_mrg_rxbuf() {
        // Without MRG_RXBUF a garbage num_buffers is ignored.
        assert_eq!(rx_buffer_count(&header(0), false, 256), Some(1));
        assert_eq!(rx_buffer_count(&header(9), false, 256), Some(1));
        assert_eq!(rx_buffer_count(&header(1), true, 256), Some(1));
        assert_eq!(rx_buffer_count(&header(3), true, 256), Some(3));
        assert_eq!(rx_buffer_count(&header(256), true, 256), Some(256));
    }

    #[test]
    fn impossible_num_buffers_drop_the_frame() {
        assert_eq!(rx_buffer_count(&header(0), true, 256), None);
        assert_eq!(rx_buffer_count(&header(257), true, 256), None);
        assert_eq!(rx_buffer_count(&header(u16::MAX), true, 8), None);
    }

    fn rx_ring(mergeable: bool) -> RxRing {
        let queue = VirtQueue::new(0, 4).unwrap();
        let mut rx = RxRing {
            bufs: zeroed(4 * BUF_SIZE).unwrap(),
            queue,
            mergeable,
            assembly: Assembly::new().unwrap(),
            ready: None,
            notify_pending: false,
            frames: 0,
            dropped: 0,
        };
        rx.post_free();
        rx
    }

    /// Plays the device: writes `data` into buffer `id` and publishes used
    /// element number `n` for it with length `len`.
    fn device_fills(rx: &mut RxRing, n: u16, id: u16, data: &[u8], len: u32) {
        let start = id as usize * BUF_SIZE;
        rx.bufs[start..start + data.len()].copy_from_slice(data);
        let (_, _, used) = rx.queue.addresses();
        let used = used as *mut u8;
        // SAFETY: the used ring lies in the queue's block; slot < size.
        unsafe {
            let e = used.add(4 + 8 * (n % 4) as usize) as *mut u32;
            e.write_volatile(id as u32);
            e.add(1).write_volatile(len);
            (used.add(2) as *mut u16).write_volatile(n + 1);
        }
    }

    fn frame_with(num_buffers: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = header(num_buffers).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn rx_ring_hands_over_frames_and_recycles_buffers() {
        let mut rx = rx_ring(false);
        assert_eq!(rx.queue.free_count(), 0, "every buffer offered");
        assert!(!rx.next_frame());
        // Buffers were posted from the top of the free list: ids 0..4.
        device_fills(&mut rx, 0, 0, &frame_with(77, b"frame-one"), 21);
        assert!(rx.next_frame());
        assert_eq!(rx.queue.free_count(), 1, "held until consumed");
        assert_eq!(rx.consume(|f| f.to_vec()), b"frame-one");
        assert_eq!(rx.queue.free_count(), 0, "recycled");
        // A used length past the buffer is clamped, not trusted.
        device_fills(&mut rx, 1, 1, &frame_with(1, b"x"), u32::MAX);
        assert_eq!(rx.consume(|f| f.len()), BUF_SIZE - HDR_LEN);
        // A header cut short is dropped and its buffer recycled.
        device_fills(&mut rx, 2, 2, &[0; 4], 4);
        assert!(!rx.next_frame());
        assert_eq!((rx.dropped, rx.queue.free_count()), (1, 0));
        assert_eq!(rx.consume(|f| f.len()), 0, "no frame: empty slice");
    }

    #[test]
    fn rx_ring_merges_buffers_across_polls() {
        let mut rx = rx_ring(true);
        device_fills(&mut rx, 0, 0, &frame_with(2, b"head-"), 17);
        assert!(!rx.next_frame(), "second buffer not there yet");
        device_fills(&mut rx, 1, 1, b"tail", 4);
        assert!(rx.next_frame());
        assert_eq!(rx.consume(|f| f.to_vec()), b"head-tail");
        assert_eq!(rx.queue.free_count(), 0);
        // num_buffers larger than the queue: dropped.
        device_fills(&mut rx, 2, 2, &frame_with(5, b"bad"), 15);
        assert!(!rx.next_frame());
        assert_eq!(rx.dropped, 1);
    }

    #[test]
    fn only_unicast_macs_are_used() {
        assert_eq!(
            usable_mac([0x52, 0x54, 0, 1, 2, 3]),
            Some([0x52, 0x54, 0, 1, 2, 3])
        );
        assert_eq!(usable_mac([0; 6]), None);
        assert_eq!(usable_mac([0xff; 6]), None);
        assert_eq!(usable_mac([0x01, 0, 0x5e, 0, 0, 1]), None);
        let r = random_mac_from(0x0123_4567_89ab_cdef);
        assert_eq!(r[0] & 3, 2, "locally administered unicast");
    }

    #[test]
    fn assembly_joins_buffers_in_order() {
        let mut a = Assembly::new().unwrap();
        assert!(!a.push(b"stray"), "no frame in progress");
        a.start(b"abc", 3);
        assert!(a.in_progress());
        assert_eq!(a.frame(), None);
        assert!(!a.push(b"def"));
        assert!(a.push(b"gh"));
        assert_eq!(a.frame(), Some(&b"abcdefgh"[..]));
        assert!(!a.in_progress());
    }

    #[test]
    fn oversized_assembly_is_dropped() {
        let mut a = Assembly::new().unwrap();
        let chunk = [7u8; BUF_SIZE];
        let n = (MAX_ASSEMBLED / BUF_SIZE + 2) as u16;
        a.start(&chunk, n);
        let mut complete = false;
        for _ in 1..n {
            complete = a.push(&chunk);
        }
        assert!(complete);
        assert_eq!(a.frame(), None);
        // The next frame starts clean.
        a.start(b"x", 1);
        assert_eq!(a.frame(), Some(&b"x"[..]));
    }

    #[test]
    fn empty_assembly_is_no_frame() {
        let mut a = Assembly::new().unwrap();
        a.start(b"", 2);
        assert!(a.push(b""));
        assert_eq!(a.frame(), None);
    }
}
