//! The virtio-mmio register file (virtio 1.2 §4.2.2, version 2 layout) from
//! the driver's side: reset, status, feature negotiation, queue setup and
//! notification.
//!
//! Register accesses are volatile 32-bit loads and stores; each one is an
//! MMIO exit to the VMM, so drivers touch registers only at setup and to
//! notify.

use spore_abi::boot::MmioDevice;

use super::queue::VirtQueue;
use super::VirtioError;

const MAGIC: u32 = 0x7472_6976; // "virt"

const REG_MAGIC: usize = 0x000;
const REG_VERSION: usize = 0x004;
const REG_DEVICE_ID: usize = 0x008;
const REG_DEVICE_FEATURES: usize = 0x010;
const REG_DEVICE_FEATURES_SEL: usize = 0x014;
const REG_DRIVER_FEATURES: usize = 0x020;
const REG_DRIVER_FEATURES_SEL: usize = 0x024;
const REG_QUEUE_SEL: usize = 0x030;
const REG_QUEUE_NUM_MAX: usize = 0x034;
const REG_QUEUE_NUM: usize = 0x038;
const REG_QUEUE_READY: usize = 0x044;
const REG_QUEUE_NOTIFY: usize = 0x050;
const REG_INTERRUPT_STATUS: usize = 0x060;
const REG_INTERRUPT_ACK: usize = 0x064;
const REG_STATUS: usize = 0x070;
const REG_QUEUE_DESC_LOW: usize = 0x080;
const REG_QUEUE_DESC_HIGH: usize = 0x084;
const REG_QUEUE_DRIVER_LOW: usize = 0x090;
const REG_QUEUE_DRIVER_HIGH: usize = 0x094;
const REG_QUEUE_DEVICE_LOW: usize = 0x0a0;
const REG_QUEUE_DEVICE_HIGH: usize = 0x0a4;
const REG_CONFIG_GENERATION: usize = 0x0fc;
/// Device-specific configuration space.
const CONFIG: usize = 0x100;

/// Device status bits (§2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const FAILED: u32 = 128;
}

/// VIRTIO_F_VERSION_1: the modern interface; every driver here needs it.
pub const F_VERSION_1: u64 = 1 << 32;

/// One virtio-mmio device's registers.
pub struct Transport {
    base: usize,
    device_id: u32,
}

impl Transport {
    /// Checks the registers at `dev.base`, resets the device and negotiates
    /// features: `required` must all be offered, `optional` are taken where
    /// offered. Returns the transport and the accepted features.
    ///
    /// # Safety
    /// `dev` must describe a virtio-mmio window mapped at its base (the boot
    /// protocol identity-maps the MMIO hole), used by no other driver.
    pub unsafe fn init(
        dev: &MmioDevice,
        required: u64,
        optional: u64,
    ) -> Result<(Self, u64), VirtioError> {
        let t = Transport {
            base: dev.base as usize,
            device_id: dev.device_id,
        };
        let magic = t.read(REG_MAGIC);
        let version = t.read(REG_VERSION);
        if magic != MAGIC || version != 2 {
            return Err(VirtioError::NotVirtio {
                base: dev.base,
                magic,
                version,
            });
        }
        let found = t.read(REG_DEVICE_ID);
        if found != dev.device_id {
            return Err(VirtioError::WrongDevice {
                base: dev.base,
                expected: dev.device_id,
                found,
            });
        }
        t.write(REG_STATUS, 0);
        t.write(REG_STATUS, status::ACKNOWLEDGE);
        t.write(REG_STATUS, status::ACKNOWLEDGE | status::DRIVER);
        let offered = t.device_features();
        if offered & required != required {
            t.fail();
            return Err(VirtioError::FeaturesRefused(required & !offered));
        }
        let accepted = required | (optional & offered);
        t.write(REG_DRIVER_FEATURES_SEL, 0);
        t.write(REG_DRIVER_FEATURES, accepted as u32);
        t.write(REG_DRIVER_FEATURES_SEL, 1);
        t.write(REG_DRIVER_FEATURES, (accepted >> 32) as u32);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        t.write(REG_STATUS, s);
        if t.read(REG_STATUS) & status::FEATURES_OK == 0 {
            t.fail();
            return Err(VirtioError::FeaturesRefused(accepted));
        }
        Ok((t, accepted))
    }

    pub fn device_id(&self) -> u32 {
        self.device_id
    }

    fn device_features(&self) -> u64 {
        self.write(REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.read(REG_DEVICE_FEATURES) as u64;
        self.write(REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.read(REG_DEVICE_FEATURES) as u64;
        lo | hi << 32
    }

    /// Creates queue `index` with at most `want` entries (capped by the
    /// device's maximum, rounded down to a power of two) and registers it.
    pub fn setup_queue(&self, index: u16, want: u16) -> Result<VirtQueue, VirtioError> {
        self.write(REG_QUEUE_SEL, index as u32);
        let max = self.read(REG_QUEUE_NUM_MAX);
        if max == 0 {
            return Err(VirtioError::QueueUnavailable { index, max });
        }
        let size = (want as u32).min(max).min(32768);
        // Split queues need a power-of-two size.
        let size = 1u32 << (31 - size.leading_zeros());
        let q = VirtQueue::new(index, size as u16)?;
        let (desc, driver, device) = q.addresses();
        self.write(REG_QUEUE_NUM, size);
        self.write(REG_QUEUE_DESC_LOW, desc as u32);
        self.write(REG_QUEUE_DESC_HIGH, (desc >> 32) as u32);
        self.write(REG_QUEUE_DRIVER_LOW, driver as u32);
        self.write(REG_QUEUE_DRIVER_HIGH, (driver >> 32) as u32);
        self.write(REG_QUEUE_DEVICE_LOW, device as u32);
        self.write(REG_QUEUE_DEVICE_HIGH, (device >> 32) as u32);
        self.write(REG_QUEUE_READY, 1);
        Ok(q)
    }

    /// Tells the device the driver is ready; it starts serving the queues.
    pub fn driver_ok(&self) {
        let s = self.read(REG_STATUS);
        self.write(REG_STATUS, s | status::DRIVER_OK);
    }

    /// Marks the device as given up by the driver.
    pub fn fail(&self) {
        let s = self.read(REG_STATUS);
        self.write(REG_STATUS, s | status::FAILED);
    }

    /// Tells the device that queue `index` has new available buffers.
    pub fn notify(&self, index: u16) {
        self.write(REG_QUEUE_NOTIFY, index as u32);
    }

    /// Reads and acknowledges the interrupt status (bit 0: used buffers,
    /// bit 1: configuration change).
    pub fn ack_interrupt(&self) -> u32 {
        let s = self.read(REG_INTERRUPT_STATUS);
        if s != 0 {
            self.write(REG_INTERRUPT_ACK, s);
        }
        s
    }

    /// A 32-bit word of the device configuration space.
    pub fn config_u32(&self, offset: usize) -> u32 {
        self.read(CONFIG + offset)
    }

    /// A byte of the device configuration space. The spec wants 8-bit
    /// fields (a MAC address) read with 8-bit accesses.
    pub fn config_u8(&self, offset: usize) -> u8 {
        // SAFETY: as for `read`; the config space is byte-addressable.
        unsafe { core::ptr::read_volatile((self.base + CONFIG + offset) as *const u8) }
    }

    /// A 16-bit field of the configuration space (`offset` 2-aligned).
    pub fn config_u16(&self, offset: usize) -> u16 {
        // SAFETY: as for `config_u8`, with an aligned 16-bit access.
        unsafe { core::ptr::read_volatile((self.base + CONFIG + (offset & !1)) as *const u16) }
    }

    /// Changes whenever the device changes its configuration space: a read
    /// of several fields is consistent if this is the same before and after.
    pub fn config_generation(&self) -> u32 {
        self.read(REG_CONFIG_GENERATION)
    }

    fn read(&self, reg: usize) -> u32 {
        // SAFETY: `init`'s caller guarantees the window is mapped device
        // registers; `reg` is one of the offsets above, 4-byte aligned.
        unsafe { core::ptr::read_volatile((self.base + reg) as *const u32) }
    }

    fn write(&self, reg: usize, value: u32) {
        // SAFETY: as for `read`.
        unsafe { core::ptr::write_volatile((self.base + reg) as *mut u32, value) }
    }
}
