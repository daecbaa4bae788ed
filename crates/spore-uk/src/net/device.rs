//! smoltcp's `phy::Device` over the virtio-net driver.
//!
//! A receive token borrows the driver's receive ring and a transmit token
//! its transmit ring, so the stack can answer a frame (ARP, ping) while it
//! holds it. Frames are handed over in place (no copy) and their buffers
//! go back to the device when the token is consumed.

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use crate::virtio::net::{RxRing, TxRing, VirtioNet, MAX_FRAME};

impl phy::Device for VirtioNet {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        // A reply needs a transmit buffer; without one the frame waits.
        if !self.has_frame() || !self.can_send() {
            return None;
        }
        let (rx, tx) = self.split();
        Some((RxToken { rx }, TxToken { tx }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        if !self.can_send() {
            return None;
        }
        let (_, tx) = self.split();
        Some(TxToken { tx })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME;
        // Checksums are computed and verified in software (no offloads).
        caps
    }
}

pub struct RxToken<'a> {
    rx: &'a mut RxRing,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        self.rx.consume(f)
    }
}

pub struct TxToken<'a> {
    tx: &'a mut TxRing,
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        self.tx.send(len, f)
    }
}
