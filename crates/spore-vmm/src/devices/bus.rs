//! Address-range dispatch of port-I/O and MMIO exits to devices.
//!
//! A vCPU exit carries an address and a data buffer; the bus finds the device
//! whose range holds the address and hands it the offset into that range.
//! Accesses that hit no device read as all-ones (an empty bus) and writes to
//! them are dropped: a guest probing absent hardware must not stop the VM.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::host::lock;

/// A device reachable through port I/O or MMIO.
pub trait BusDevice: Send {
    /// Guest reads `data.len()` bytes at `offset` into the device's range.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Guest writes `data` at `offset` into the device's range.
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("bus range {base:#x}+{len:#x} is empty or overflows")]
    BadRange { base: u64, len: u64 },
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap { base: u64, len: u64 },
}

#[derive(Clone)]
struct Entry {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// A set of non-overlapping device ranges.
#[derive(Clone, Default)]
pub struct Bus {
    // Keyed by range base.
    entries: BTreeMap<u64, Entry>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(
        &mut self,
        base: u64,
        len: u64,
        device: Arc<Mutex<dyn BusDevice>>,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        if let Some((b, e)) = self.entries.range(..end).next_back() {
            if b + e.len > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        self.entries.insert(base, Entry { len, device });
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(&Entry, u64)> {
        let (base, entry) = self.entries.range(..=addr).next_back()?;
        let offset = addr - base;
        // The whole access must fall inside the device's range.
        (offset.checked_add(size as u64)? <= entry.len).then_some((entry, offset))
    }

    /// Dispatches a read; returns false (and fills with 0xff) if no device answers.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((entry, offset)) => {
                lock(&entry.device).read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Dispatches a write; returns false if no device answers.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((entry, offset)) => {
                lock(&entry.device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill((offset & 0xff) as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatch_and_bounds() {
        let mut bus = Bus::new();
        let dev = Arc::new(Mutex::new(Echo(Vec::new())));
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        assert_eq!(
            bus.insert(0x10f, 1, dev.clone()),
            Err(BusError::Overlap {
                base: 0x10f,
                len: 1
            })
        );
        assert!(bus.insert(0xf0, 0x11, dev.clone()).is_err());
        assert!(bus.insert(u64::MAX, 2, dev.clone()).is_err());
        bus.insert(0x110, 0x10, dev.clone()).unwrap();

        let mut b = [0u8; 2];
        assert!(bus.read(0x104, &mut b));
        assert_eq!(b, [4, 4]);
        // Straddles the end of the first range: no device answers.
        assert!(!bus.read(0x10f, &mut b));
        assert_eq!(b, [0xff, 0xff]);
        assert!(!bus.write(0x50, &[1]));
        assert!(bus.write(0x111, &[7]));
        assert_eq!(dev.lock().unwrap().0, vec![(1, vec![7])]);
    }
}
