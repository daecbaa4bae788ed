//! The virtio-mem block map: which blocks of the device region are plugged,
//! and the range checks every request goes through.
//!
//! The region is `nb_blocks` blocks of `block_size` bytes starting at guest
//! address `addr`, grouped in KVM memory-slot chunks of `blocks_per_slot`
//! blocks. Besides one bit per block, the map counts plugged blocks per chunk:
//! a chunk's KVM slot exists exactly while that count is non-zero, so the
//! device learns from [`BlockMap::set`] which slots to add or remove.
//!
//! All arithmetic is on `u64` block indices: a request's 16-bit `nb_blocks`
//! is widened before use and region sizes far beyond 65,535 blocks work.

use crate::host_usize;

/// A validated, non-empty run of blocks inside the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRange {
    pub first: u64,
    pub count: u64,
}

/// What STATE answers for a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeState {
    Plugged,
    Unplugged,
    Mixed,
}

/// Why a range from the guest is refused (answered with ERROR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("zero blocks requested")]
    Empty,
    #[error("address {0:#x} is not aligned to the block size")]
    Misaligned(u64),
    #[error("range at {addr:#x} of {count} blocks is outside the usable region")]
    OutOfRange { addr: u64, count: u64 },
}

/// Plugged state of every block, plus per-chunk counts.
#[derive(Clone, Debug)]
pub struct BlockMap {
    addr: u64,
    block_size: u64,
    nb_blocks: u64,
    blocks_per_slot: u64,
    bits: Vec<u64>,
    chunk_plugged: Vec<u64>,
    plugged: u64,
}

/// How plugging or unplugging a range changed the chunks' slot needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkChanges {
    /// Chunks that had no plugged block and now have some.
    pub now_used: Vec<u64>,
    /// Chunks whose last plugged block went away.
    pub now_empty: Vec<u64>,
}

impl BlockMap {
    /// A map of `nb_blocks` unplugged blocks. `block_size` must be a power of
    /// two and `blocks_per_slot` non-zero (the config checks both).
    pub fn new(addr: u64, block_size: u64, nb_blocks: u64, blocks_per_slot: u64) -> Self {
        let blocks_per_slot = blocks_per_slot.max(1);
        let chunks = nb_blocks.div_ceil(blocks_per_slot);
        Self {
            addr,
            block_size,
            nb_blocks,
            blocks_per_slot,
            bits: vec![0; host_usize::from_u64(nb_blocks.div_ceil(64))],
            chunk_plugged: vec![0; host_usize::from_u64(chunks)],
            plugged: 0,
        }
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    pub fn nb_blocks(&self) -> u64 {
        self.nb_blocks
    }

    pub fn nb_chunks(&self) -> u64 {
        self.chunk_plugged.len() as u64
    }

    pub fn blocks_per_slot(&self) -> u64 {
        self.blocks_per_slot
    }

    /// Plugged blocks in the whole region.
    pub fn plugged_blocks(&self) -> u64 {
        self.plugged
    }

    /// Plugged blocks in chunk `chunk` (0 for a chunk out of range).
    pub fn chunk_plugged(&self, chunk: u64) -> u64 {
        self.chunk_plugged
            .get(host_usize::from_u64(chunk))
            .copied()
            .unwrap_or(0)
    }

    /// Checks a guest range: `addr` block-aligned, `count` > 0 blocks, all of
    /// it inside the first `usable_blocks` blocks of the region.
    pub fn range(
        &self,
        addr: u64,
        count: u64,
        usable_blocks: u64,
    ) -> Result<BlockRange, RangeError> {
        if count == 0 {
            return Err(RangeError::Empty);
        }
        let out = RangeError::OutOfRange { addr, count };
        let offset = addr.checked_sub(self.addr).ok_or(out)?;
        if !offset.is_multiple_of(self.block_size) {
            return Err(RangeError::Misaligned(addr));
        }
        let first = offset / self.block_size;
        let end = first.checked_add(count).ok_or(out)?;
        if end > usable_blocks.min(self.nb_blocks) {
            return Err(out);
        }
        Ok(BlockRange { first, count })
    }

    pub fn is_plugged(&self, block: u64) -> bool {
        block < self.nb_blocks && self.bits[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    /// Plugged blocks in `r`.
    pub fn count_plugged(&self, r: BlockRange) -> u64 {
        (r.first..r.first + r.count)
            .filter(|&b| self.is_plugged(b))
            .count() as u64
    }

    pub fn state(&self, r: BlockRange) -> RangeState {
        match self.count_plugged(r) {
            0 => RangeState::Unplugged,
            n if n == r.count => RangeState::Plugged,
            _ => RangeState::Mixed,
        }
    }

    /// Sets every block of `r` to `plugged`; blocks already in that state are
    /// left alone. Returns the chunks whose slot need changed.
    pub fn set(&mut self, r: BlockRange, plugged: bool) -> ChunkChanges {
        let mut changes = ChunkChanges::default();
        for b in r.first..r.first + r.count {
            if self.is_plugged(b) == plugged {
                continue;
            }
            let word = &mut self.bits[(b / 64) as usize];
            *word ^= 1 << (b % 64);
            let chunk = b / self.blocks_per_slot;
            let count = &mut self.chunk_plugged[host_usize::from_u64(chunk)];
            if plugged {
                if *count == 0 {
                    changes.now_used.push(chunk);
                }
                *count += 1;
                self.plugged += 1;
            } else {
                *count -= 1;
                if *count == 0 {
                    changes.now_empty.push(chunk);
                }
                self.plugged -= 1;
            }
        }
        changes
    }

    /// Unplugs everything; returns the chunks that had plugged blocks.
    pub fn clear(&mut self) -> Vec<u64> {
        let used = (0..self.nb_chunks())
            .filter(|&c| self.chunk_plugged(c) > 0)
            .collect();
        self.bits.fill(0);
        self.chunk_plugged.fill(0);
        self.plugged = 0;
        used
    }

    /// The plugged bitmap, one bit per block (for snapshots and tests).
    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    /// A map with the plugged blocks of `bits` (as [`Self::bits`] gave
    /// them), per-chunk counts rebuilt. `None` if `bits` has the wrong
    /// length or marks blocks past the region's end.
    pub fn from_bits(
        addr: u64,
        block_size: u64,
        nb_blocks: u64,
        blocks_per_slot: u64,
        bits: &[u64],
    ) -> Option<Self> {
        let mut map = Self::new(addr, block_size, nb_blocks, blocks_per_slot);
        if bits.len() != map.bits.len() {
            return None;
        }
        let tail = nb_blocks % 64;
        if tail != 0 && bits.last().is_some_and(|&w| w >> tail != 0) {
            return None;
        }
        for (i, &word) in bits.iter().enumerate() {
            let mut w = word;
            while w != 0 {
                let b = i as u64 * 64 + u64::from(w.trailing_zeros());
                w &= w - 1;
                map.set(BlockRange { first: b, count: 1 }, true);
            }
        }
        Some(map)
    }

    /// Runs of consecutive plugged blocks, in order.
    pub fn plugged_runs(&self) -> Vec<BlockRange> {
        let mut out: Vec<BlockRange> = Vec::new();
        for b in 0..self.nb_blocks {
            if !self.is_plugged(b) {
                continue;
            }
            match out.last_mut() {
                Some(r) if r.first + r.count == b => r.count += 1,
                _ => out.push(BlockRange { first: b, count: 1 }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 4 << 30;

    #[test]
    fn range_checks() {
        let m = BlockMap::new(BASE, 2 * MIB, 100, 64);
        assert_eq!(m.range(BASE, 1, 100), Ok(BlockRange { first: 0, count: 1 }));
        assert_eq!(
            m.range(BASE + 98 * 2 * MIB, 2, 100),
            Ok(BlockRange {
                first: 98,
                count: 2
            })
        );
        assert_eq!(m.range(BASE, 0, 100), Err(RangeError::Empty));
        assert_eq!(
            m.range(BASE + 4096, 1, 100),
            Err(RangeError::Misaligned(BASE + 4096))
        );
        assert!(matches!(
            m.range(BASE - 2 * MIB, 1, 100),
            Err(RangeError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.range(BASE + 99 * 2 * MIB, 2, 100),
            Err(RangeError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.range(BASE, 101, 100),
            Err(RangeError::OutOfRange { .. })
        ));
        // Outside the usable part, though inside the region.
        assert!(matches!(
            m.range(BASE, 51, 50),
            Err(RangeError::OutOfRange { .. })
        ));
        assert!(m.range(u64::MAX - 1, 1, 100).is_err());
        assert!(matches!(
            m.range(u64::MAX - (2 * MIB - 1), 2, 100),
            Err(RangeError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.range(BASE, u64::MAX, 100),
            Err(RangeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn chunk_accounting() {
        let mut m = BlockMap::new(BASE, 2 * MIB, 256, 64);
        let r = |first, count| BlockRange { first, count };
        let c = m.set(r(60, 10), true);
        assert_eq!(c.now_used, vec![0, 1]);
        assert!(c.now_empty.is_empty());
        assert_eq!(m.plugged_blocks(), 10);
        assert_eq!(m.chunk_plugged(0), 4);
        assert_eq!(m.chunk_plugged(1), 6);
        assert_eq!(m.state(r(60, 10)), RangeState::Plugged);
        assert_eq!(m.state(r(59, 2)), RangeState::Mixed);
        assert_eq!(m.state(r(0, 60)), RangeState::Unplugged);
        let c = m.set(r(60, 4), false);
        assert_eq!(c.now_empty, vec![0]);
        assert_eq!(m.clear(), vec![1]);
        assert_eq!(m.plugged_blocks(), 0);
    }

    #[test]
    fn bits_round_trip() {
        let mut m = BlockMap::new(BASE, 2 * MIB, 130, 64);
        let r = |first, count| BlockRange { first, count };
        m.set(r(3, 2), true);
        m.set(r(63, 3), true);
        m.set(r(129, 1), true);
        let back = BlockMap::from_bits(BASE, 2 * MIB, 130, 64, m.bits()).unwrap();
        assert_eq!(back.plugged_blocks(), 6);
        assert_eq!(back.chunk_plugged(0), 3);
        assert_eq!(back.chunk_plugged(1), 2);
        assert_eq!(back.chunk_plugged(2), 1);
        assert_eq!(back.plugged_runs(), vec![r(3, 2), r(63, 3), r(129, 1)]);
        // Wrong length, or a bit past the last block.
        assert!(BlockMap::from_bits(BASE, 2 * MIB, 130, 64, &m.bits()[..2]).is_none());
        let mut bad = m.bits().to_vec();
        bad[2] |= 1 << 5;
        assert!(BlockMap::from_bits(BASE, 2 * MIB, 130, 64, &bad).is_none());
    }

    /// More blocks than a u16 counts: nothing truncates.
    #[test]
    fn wide_regions() {
        let n = 70_000u64;
        let mut m = BlockMap::new(BASE, 2 * MIB, n, 64);
        let r = m.range(BASE + 65_536 * 2 * MIB, 4000, n).unwrap();
        assert_eq!(r.first, 65_536);
        m.set(r, true);
        assert_eq!(m.plugged_blocks(), 4000);
        assert_eq!(m.clear().len(), 4000usize.div_ceil(64));
    }
}
