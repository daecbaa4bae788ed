//! On-disk layout of a copy-on-write overlay file.
//!
//! ```text
//! 0            4 KiB header (little-endian):
//!                0  magic "SPORECOW"
//!                8  version (u32) = 1
//!               12  block size in bytes (u32, a power of two, 512..=1 MiB)
//!               16  disk size in bytes (u64) = the base's size when created
//!               24  bitmap offset (u64) = 4096
//!               32  data offset (u64), block-aligned, after the bitmap
//! 4096         bitmap: bit i (byte i / 8, bit i % 8) set = block i is in the overlay
//! data offset  block i at data_offset + i * block_size; absent blocks are holes
//! ```
//!
//! The file is sparse: only blocks a clone wrote take space. The block map
//! lives in the file itself, so an overlay survives a VMM restart, a snapshot
//! restore, or being copied as the starting point of a clone's own overlay.
//! This module only encodes and checks the layout; it does no I/O.

use super::OverlayError;
use crate::host_usize;

pub const MAGIC: [u8; 8] = *b"SPORECOW";
pub const VERSION: u32 = 1;
/// Bytes of the header; the bitmap follows.
pub const HEADER_LEN: u64 = 4096;
/// Block size of new overlays: the page size, so a guest's 4 KiB writes
/// never need a read of the base.
pub const DEFAULT_BLOCK_SIZE: u64 = 4096;
const MIN_BLOCK_SIZE: u64 = 512;
const MAX_BLOCK_SIZE: u64 = 1 << 20;

/// Where things are in an overlay file, for a disk of `disk_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u64,
    pub disk_size: u64,
    pub bitmap_offset: u64,
    pub data_offset: u64,
}

impl Layout {
    /// The layout of a new overlay over a disk of `disk_size` bytes.
    pub fn new(disk_size: u64, block_size: u64) -> Result<Self, String> {
        if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
        {
            return Err(format!(
                "block size {block_size} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
            ));
        }
        let blocks = disk_size.div_ceil(block_size);
        let bitmap_len = blocks.div_ceil(8);
        let data_offset = HEADER_LEN
            .checked_add(bitmap_len)
            .and_then(|end| end.checked_next_multiple_of(block_size))
            .ok_or_else(|| format!("disk size {disk_size} is too large"))?;
        // The data area must be addressable too.
        data_offset
            .checked_add(blocks.saturating_mul(block_size))
            .ok_or_else(|| format!("disk size {disk_size} is too large"))?;
        Ok(Self {
            block_size,
            disk_size,
            bitmap_offset: HEADER_LEN,
            data_offset,
        })
    }

    pub fn blocks(&self) -> u64 {
        self.disk_size.div_ceil(self.block_size)
    }

    pub fn bitmap_len(&self) -> u64 {
        self.blocks().div_ceil(8)
    }

    /// Length of the file once every block is present (the file is created
    /// at this length, sparse).
    pub fn file_len(&self) -> u64 {
        self.data_offset + self.blocks() * self.block_size
    }

    /// File offset of block `block`'s data.
    pub fn data_at(&self, block: u64) -> u64 {
        self.data_offset + block * self.block_size
    }

    /// Bytes of block `block` that lie on the disk (the last block may be short).
    pub fn block_len(&self, block: u64) -> u64 {
        let start = block * self.block_size;
        self.disk_size.saturating_sub(start).min(self.block_size)
    }

    pub fn encode(&self) -> [u8; host_usize::from_u64(HEADER_LEN)] {
        let mut h = [0u8; host_usize::from_u64(HEADER_LEN)];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        #[allow(
            clippy::cast_possible_truncation,
            reason = "checked to fit in `new`/`decode`"
        )]
        let block_size = self.block_size as u32;
        h[12..16].copy_from_slice(&block_size.to_le_bytes());
        h[16..24].copy_from_slice(&self.disk_size.to_le_bytes());
        h[24..32].copy_from_slice(&self.bitmap_offset.to_le_bytes());
        h[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        h
    }

    /// Parses and checks a header read from `path`.
    pub fn decode(h: &[u8], path: &std::path::Path) -> Result<Self, OverlayError> {
        let corrupt = |detail: String| OverlayError::Corrupt {
            path: path.to_path_buf(),
            detail,
        };
        if h.len() < 40 || h[0..8] != MAGIC {
            return Err(OverlayError::NotAnOverlay {
                path: path.to_path_buf(),
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(corrupt(format!(
                "format version {version}, this spore reads version {VERSION}"
            )));
        }
        let expected = Self::new(u64_at(16), u64::from(u32_at(12))).map_err(corrupt)?;
        let found = Self {
            bitmap_offset: u64_at(24),
            data_offset: u64_at(32),
            ..expected
        };
        if found != expected {
            return Err(corrupt(format!(
                "bitmap/data offsets {}/{} do not match the layout ({}/{})",
                found.bitmap_offset,
                found.data_offset,
                expected.bitmap_offset,
                expected.data_offset
            )));
        }
        Ok(expected)
    }
}

/// Which blocks the overlay holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMap {
    bits: Vec<u8>,
    blocks: u64,
}

impl BlockMap {
    pub fn empty(blocks: u64) -> Self {
        Self {
            bits: vec![0; host_usize::from_u64(blocks.div_ceil(8))],
            blocks,
        }
    }

    /// A map read from a file; bits past `blocks` must be clear.
    pub fn from_bytes(bits: Vec<u8>, blocks: u64) -> Result<Self, String> {
        if bits.len() as u64 != blocks.div_ceil(8) {
            return Err(format!(
                "bitmap has {} bytes, {blocks} blocks need {}",
                bits.len(),
                blocks.div_ceil(8)
            ));
        }
        let map = Self { bits, blocks };
        if !blocks.is_multiple_of(8) {
            let last = map.bits[map.bits.len() - 1];
            if last >> (blocks % 8) != 0 {
                return Err("bitmap marks blocks past the end of the disk".into());
            }
        }
        Ok(map)
    }

    pub fn contains(&self, block: u64) -> bool {
        block < self.blocks && self.bits[(block / 8) as usize] & (1 << (block % 8)) != 0
    }

    /// Marks `block` present; returns the index and new value of the byte
    /// that changed (to write through to the file), or `None` if it was set.
    pub fn insert(&mut self, block: u64) -> Option<(u64, u8)> {
        if block >= self.blocks || self.contains(block) {
            return None;
        }
        let i = (block / 8) as usize;
        self.bits[i] |= 1 << (block % 8);
        Some((i as u64, self.bits[i]))
    }

    pub fn present(&self) -> u64 {
        self.bits.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// Indices of the blocks present, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.blocks).filter(|&b| self.contains(b))
    }

    /// Runs of consecutive present blocks, as `(first, end)` (end exclusive).
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut next = 0;
        std::iter::from_fn(move || {
            let first = (next..self.blocks).find(|&b| self.contains(b))?;
            let end = (first..self.blocks)
                .find(|&b| !self.contains(b))
                .unwrap_or(self.blocks);
            next = end;
            Some((first, end))
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bits
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn layout_round_trip_and_checks() {
        let l = Layout::new(10 * 4096 + 512, 4096).unwrap();
        assert_eq!(l.blocks(), 11);
        assert_eq!(l.block_len(10), 512);
        assert_eq!(l.block_len(9), 4096);
        assert_eq!(l.data_offset, 8192);
        let back = Layout::decode(&l.encode(), Path::new("x")).unwrap();
        assert_eq!(back, l);
        let mut bad = l.encode();
        bad[32] ^= 1;
        assert!(matches!(
            Layout::decode(&bad, Path::new("x")),
            Err(OverlayError::Corrupt { .. })
        ));
        let mut bad = l.encode();
        bad[0] = b'X';
        assert!(matches!(
            Layout::decode(&bad, Path::new("x")),
            Err(OverlayError::NotAnOverlay { .. })
        ));
        assert!(Layout::decode(&[0; 10], Path::new("x")).is_err());
        assert!(Layout::new(4096, 3000).is_err());
        assert!(Layout::new(u64::MAX, 4096).is_err());
    }

    #[test]
    fn block_map() {
        let mut m = BlockMap::empty(11);
        assert_eq!(m.insert(3), Some((0, 8)));
        assert_eq!(m.insert(3), None);
        assert_eq!(m.insert(11), None);
        assert!(m.contains(3) && !m.contains(4) && !m.contains(100));
        assert_eq!(m.insert(10), Some((1, 4)));
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![3, 10]);
        m.insert(4);
        m.insert(9);
        assert_eq!(m.runs().collect::<Vec<_>>(), vec![(3, 5), (9, 11)]);
        assert_eq!(BlockMap::empty(5).runs().count(), 0);
        assert_eq!(m.present(), 4);
        assert!(BlockMap::from_bytes(vec![0, 0x08], 11).is_err());
        assert!(BlockMap::from_bytes(vec![0], 11).is_err());
        assert_eq!(BlockMap::from_bytes(m.as_bytes().to_vec(), 11).unwrap(), m);
    }
}
