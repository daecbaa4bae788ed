//! The event queue: a radix heap (Ahuja, Mehlhorn, Orlin and Tarjan,
//! 1990), a priority queue for keys that never go below the last key
//! taken, which a simulation's clock satisfies. An entry sits in the bucket
//! of the highest bit in which its key differs from the last key taken;
//! taking the minimum empties the lowest non-empty bucket into lower ones.
//! Each entry moves down at most 64 times and usually a few, so pushes and
//! pops cost a few cache-friendly vector operations, against a binary
//! heap's ~log₂(n) scattered comparisons: the simulation's hottest loop.
//!
//! Of entries with equal keys, which comes first depends only on the order
//! of the operations, so a run is reproducible.

/// A min-queue of (key, value), keys monotone.
pub(super) struct RadixHeap {
    /// The last key taken: no key below it may be pushed.
    last: u64,
    buckets: [Vec<(u64, u64)>; 65],
    /// Bit i set: bucket i is not empty.
    nonempty: u128,
    len: usize,
}

impl RadixHeap {
    pub(super) fn new() -> RadixHeap {
        RadixHeap {
            last: 0,
            buckets: std::array::from_fn(|_| Vec::new()),
            nonempty: 0,
            len: 0,
        }
    }

    fn bucket(last: u64, key: u64) -> usize {
        64 - (key ^ last).leading_zeros() as usize
    }

    /// Queues `value` at `key` (at least the last key taken).
    pub(super) fn push(&mut self, key: u64, value: u64) {
        debug_assert!(key >= self.last, "{key} < {}", self.last);
        let key = key.max(self.last);
        let b = Self::bucket(self.last, key);
        self.buckets[b].push((key, value));
        self.nonempty |= 1 << b;
        self.len += 1;
    }

    /// Takes an entry of the least key.
    pub(super) fn pop(&mut self) -> Option<(u64, u64)> {
        if self.nonempty & 1 == 0 {
            if self.nonempty == 0 {
                return None;
            }
            let i = self.nonempty.trailing_zeros() as usize;
            let mut moved = std::mem::take(&mut self.buckets[i]);
            self.nonempty &= !(1 << i);
            self.last = moved.iter().map(|e| e.0).min().unwrap_or(self.last);
            for &(k, v) in &moved {
                let b = Self::bucket(self.last, k);
                self.buckets[b].push((k, v));
                self.nonempty |= 1 << b;
            }
            // Give the emptied bucket its allocation back.
            moved.clear();
            self.buckets[i] = moved;
        }
        self.len -= 1;
        let e = self.buckets[0].pop();
        if self.buckets[0].is_empty() {
            self.nonempty &= !1;
        }
        e
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_sim::rng::SplitMix64;

    #[test]
    fn pops_in_key_order_with_monotone_pushes() {
        let mut q = RadixHeap::new();
        let mut r = SplitMix64::stream(1, 0);
        let mut now = 0;
        let mut taken = Vec::new();
        for i in 0..10_000u64 {
            for _ in 0..r.below(3) {
                q.push(now + u64::from(r.below(1_000_000)), i);
            }
            if let Some((k, _)) = q.pop() {
                assert!(k >= now);
                now = k;
                taken.push(k);
            }
        }
        while let Some((k, _)) = q.pop() {
            taken.push(k);
        }
        assert_eq!(q.len(), 0);
        assert!(taken.windows(2).all(|w| w[0] <= w[1]));
    }
}
