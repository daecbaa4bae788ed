//! A hash map of byte keys to byte values that never allocates infallibly:
//! when the table cannot grow, an insert hands the key and value back
//! instead of aborting the program. For apps that must survive a full heap
//! (`alloc`'s own maps abort on allocation failure).
//!
//! Open addressing with linear probing and tombstones; FNV-1a hashing.

use alloc::vec::Vec;

enum Slot {
    Empty,
    Deleted,
    Full(Vec<u8>, Vec<u8>),
}

/// An insert the heap had no room for: the key and value, given back.
#[derive(Debug)]
pub struct Refused {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

#[derive(Default)]
pub struct KvMap {
    slots: Vec<Slot>,
    len: usize,
    deleted: usize,
    bytes: usize,
}

fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl KvMap {
    pub const fn new() -> Self {
        KvMap {
            slots: Vec::new(),
            len: 0,
            deleted: 0,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Index of `key`'s slot, or of the slot it would go in.
    fn find(&self, key: &[u8]) -> (usize, bool) {
        let mask = self.slots.len() - 1;
        let mut i = hash(key) as usize & mask;
        let mut first_free = None;
        loop {
            match &self.slots[i] {
                Slot::Empty => return (first_free.unwrap_or(i), false),
                Slot::Deleted => {
                    first_free.get_or_insert(i);
                }
                Slot::Full(k, _) if k.as_slice() == key => return (i, true),
                Slot::Full(..) => {}
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        if self.slots.is_empty() {
            return None;
        }
        match self.find(key) {
            (i, true) => match &self.slots[i] {
                Slot::Full(_, v) => Some(v),
                _ => None,
            },
            _ => None,
        }
    }

    /// Rebuilds the table with room for one more entry; false if the heap
    /// cannot hold the new table (the old one is untouched).
    fn make_room(&mut self) -> bool {
        let cap = self.slots.len();
        if cap > 0 && (self.len + self.deleted + 1) * 4 <= cap * 3 {
            return true;
        }
        let new_cap = if (self.len + 1) * 2 <= cap {
            cap // mostly tombstones: rebuild at the same size
        } else {
            (cap * 2).max(16)
        };
        let mut slots = Vec::new();
        if slots.try_reserve_exact(new_cap).is_err() {
            return false;
        }
        slots.resize_with(new_cap, || Slot::Empty);
        let old = core::mem::replace(&mut self.slots, slots);
        self.deleted = 0;
        for s in old {
            if let Slot::Full(k, v) = s {
                let (i, _) = self.find(&k);
                self.slots[i] = Slot::Full(k, v);
            }
        }
        true
    }

    /// Sets `key` to `value`; returns the old value. If the table cannot
    /// grow, gives both back unchanged.
    pub fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<Option<Vec<u8>>, Refused> {
        if !self.slots.is_empty() {
            if let (i, true) = self.find(&key) {
                if let Slot::Full(_, v) = &mut self.slots[i] {
                    self.bytes = self.bytes - v.len() + value.len();
                    return Ok(Some(core::mem::replace(v, value)));
                }
            }
        }
        if !self.make_room() {
            return Err(Refused { key, value });
        }
        let (i, _) = self.find(&key);
        if matches!(self.slots[i], Slot::Deleted) {
            self.deleted -= 1;
        }
        self.bytes += key.len() + value.len();
        self.slots[i] = Slot::Full(key, value);
        self.len += 1;
        Ok(None)
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        if self.slots.is_empty() {
            return None;
        }
        let (i, true) = self.find(key) else {
            return None;
        };
        match core::mem::replace(&mut self.slots[i], Slot::Deleted) {
            Slot::Full(k, v) => {
                self.len -= 1;
                self.deleted += 1;
                self.bytes -= k.len() + v.len();
                Some(v)
            }
            other => {
                self.slots[i] = other;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use super::*;

    #[test]
    fn behaves_like_a_map_under_churn() {
        let mut m = KvMap::new();
        let mut model = std::collections::HashMap::new();
        let mut x: u64 = 1;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = vec![(x % 300) as u8, (x % 7) as u8];
            if x.is_multiple_of(3) {
                assert_eq!(m.remove(&k), model.remove(&k));
            } else {
                let v = x.to_le_bytes().to_vec();
                assert_eq!(m.insert(k.clone(), v.clone()).unwrap(), model.insert(k, v));
            }
            assert_eq!(m.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(m.get(k), Some(v.as_slice()));
        }
        let bytes: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(m.bytes(), bytes);
    }
}
