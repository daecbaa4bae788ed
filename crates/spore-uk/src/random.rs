//! Random numbers that stay unpredictable across clones.
//!
//! A ChaCha20 stream keyed with 32 bytes from the host's virtio-rng device.
//! A clone starts with a copy of its source's memory, hence of this
//! generator's state: without a reseed every clone would hand out the same
//! numbers. So before every use the runtime compares the VM's clone
//! generation (the word the VMM writes at `spore_abi::boot::GENERATION_ADDR`,
//! one memory read, no VM exit) with the one it seeded at, and reseeds from
//! virtio-rng when it changed. The key is never derived from the TSC, RDRAND
//! or anything else a clone shares with its source.

use spore_abi::boot::{CLONE_INDEX_ADDR, GENERATION_ADDR};

use crate::virtio::rng::{RngError, VirtioRng};
use crate::virtio::VirtioError;

/// Why no random number could be produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RandomError {
    /// No virtio-rng device, or it did not come up.
    Device(VirtioError),
    /// The device failed a request.
    Rng(RngError),
    /// Called before the runtime read the boot info.
    NotBooted,
}

struct Generator {
    rng: VirtioRng,
    /// ChaCha20 state words 4..16: key (8), counter (2), nonce (2).
    key: [u32; 8],
    counter: u64,
    block: [u8; 64],
    /// Unused bytes at the end of `block`.
    left: usize,
    /// The clone generation the key was drawn at.
    generation: u64,
    reseeds: u64,
}

static GENERATOR: spin::Mutex<Option<Generator>> = spin::Mutex::new(None);

/// The VM's clone generation: 0 when booted, changed by the VMM in each clone.
pub fn generation() -> u64 {
    // SAFETY: the boot protocol identity-maps all RAM, and the VMM reserves
    // this word of the boot-info page for the generation; it may change
    // while the guest is paused, hence the volatile read.
    unsafe { core::ptr::read_volatile(GENERATION_ADDR as *const u64) }
}

/// This VM's clone number: 0 for a booted VM, the number its source gave
/// it in a clone (valid once [`generation`] shows the change).
pub fn clone_index() -> u64 {
    // SAFETY: as for `generation`: a reserved, identity-mapped word of the
    // boot-info page that the VMM writes while the guest is paused.
    unsafe { core::ptr::read_volatile(CLONE_INDEX_ADDR as *const u64) }
}

/// How often the generator was (re)seeded from virtio-rng, and the
/// generation of the last seed; `None` before first use.
pub fn seed_info() -> Option<(u64, u64)> {
    GENERATOR.lock().as_ref().map(|g| (g.reseeds, g.generation))
}

/// A random u64; reseeds first if the VM was cloned since the last seed.
pub fn try_random_u64() -> Result<u64, RandomError> {
    let mut b = [0u8; 8];
    try_fill(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// [`try_random_u64`], panicking (exit code 101) if the VM has no working
/// virtio-rng device; the spore VMM always gives one.
pub fn random_u64() -> u64 {
    match try_random_u64() {
        Ok(v) => v,
        Err(e) => panic!("no random numbers: {e:?}"),
    }
}

/// Fills `buf` with random bytes; reseeds first if the VM was cloned.
pub fn try_fill(buf: &mut [u8]) -> Result<(), RandomError> {
    let mut guard = GENERATOR.lock();
    let now = generation();
    let g = match guard.as_mut() {
        Some(g) => g,
        None => {
            let info = crate::boot::boot_info().ok_or(RandomError::NotBooted)?;
            let rng = VirtioRng::new(info).map_err(RandomError::Device)?;
            guard.insert(Generator {
                rng,
                key: [0; 8],
                counter: 0,
                block: [0; 64],
                left: 0,
                // Forces the seed below.
                generation: now.wrapping_add(1),
                reseeds: 0,
            })
        }
    };
    if g.generation != now {
        g.reseed(now)?;
    }
    for byte in buf.iter_mut() {
        if g.left == 0 {
            g.refill();
        }
        *byte = g.block[64 - g.left];
        g.left -= 1;
    }
    Ok(())
}

impl Generator {
    fn reseed(&mut self, generation: u64) -> Result<(), RandomError> {
        let mut seed = [0u8; 32];
        self.rng.fill(&mut seed).map_err(RandomError::Rng)?;
        for (k, c) in self.key.iter_mut().zip(seed.chunks_exact(4)) {
            *k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        seed.fill(0);
        self.counter = 0;
        // Bytes of the old stream must not be handed out after a reseed.
        self.left = 0;
        self.generation = generation;
        self.reseeds += 1;
        Ok(())
    }

    fn refill(&mut self) {
        self.block = chacha20_block(&self.key, self.counter, [0, 0]);
        self.counter = self.counter.wrapping_add(1);
        self.left = 64;
    }
}

/// One ChaCha20 block (RFC 8439 §2.3, with a 64-bit counter and 64-bit nonce).
pub fn chacha20_block(key: &[u32; 8], counter: u64, nonce: [u32; 2]) -> [u8; 64] {
    let mut init = [0u32; 16];
    init[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    init[4..12].copy_from_slice(key);
    init[12] = counter as u32;
    init[13] = (counter >> 32) as u32;
    init[14] = nonce[0];
    init[15] = nonce[1];
    let mut x = init;
    fn qr(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    }
    for _ in 0..10 {
        qr(&mut x, 0, 4, 8, 12);
        qr(&mut x, 1, 5, 9, 13);
        qr(&mut x, 2, 6, 10, 14);
        qr(&mut x, 3, 7, 11, 15);
        qr(&mut x, 0, 5, 10, 15);
        qr(&mut x, 1, 6, 11, 12);
        qr(&mut x, 2, 7, 8, 13);
        qr(&mut x, 3, 4, 9, 14);
    }
    let mut out = [0u8; 64];
    for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&x[i].wrapping_add(init[i]).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8439 §2.3.2's test vector (its 32-bit counter 1 and 96-bit nonce
    /// 00:00:00:09 00:00:00:4a 00:00:00:00 map onto words 12..16 as below).
    #[test]
    fn chacha20_matches_rfc8439() {
        let key: [u32; 8] = core::array::from_fn(|i| {
            u32::from_le_bytes([
                4 * i as u8,
                4 * i as u8 + 1,
                4 * i as u8 + 2,
                4 * i as u8 + 3,
            ])
        });
        // Words 12, 13 = counter 1, nonce word 0x09000000; 14, 15 = 0x4a000000, 0.
        let counter = 1u64 | (0x0900_0000u64 << 32);
        let out = chacha20_block(&key, counter, [0x4a00_0000, 0]);
        assert_eq!(
            &out[..16],
            &[
                0x10, 0xf1, 0xe7, 0xe4, 0xd1, 0x3b, 0x59, 0x15, 0x50, 0x0f, 0xdd, 0x1f, 0xa3, 0x20,
                0x71, 0xc4
            ]
        );
        assert_eq!(&out[60..], &[0xa2, 0x50, 0x3c, 0x4e]);
    }
}
