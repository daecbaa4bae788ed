//! Port-I/O devices: the serial port (COM1), the i8042 keyboard controller
//! (Linux guests: reboot through it), and tmem (served outside the bus, on
//! its own port). Each is made fresh or restored from its state.

use std::sync::{Arc, Mutex};

use super::persist::{restore_device, DeviceId, StateLookup};
use super::{new_irqfd, DeviceError};
use crate::arch::x86_64::layout;
use crate::arch::GuestKind;
use crate::config::TmemConfig;
use crate::devices::bus::Bus;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::serial::{IrqTrigger, SerialDevice, SerialOut};
use crate::devices::tmem::host_cap::{self, HostCap};
use crate::devices::tmem::TmemDevice;
use crate::devices::wake::GuestWake;
use kvm_ioctls::VmFd;

/// The legacy devices of a VM and the port-I/O bus they sit on.
pub(super) struct LegacyDevices {
    pub serial: Arc<Mutex<SerialDevice>>,
    pub i8042: Option<Arc<Mutex<I8042>>>,
    pub tmem: Arc<TmemDevice>,
    pub pio: Bus,
}

pub(super) struct LegacySetup<'a> {
    pub vm_fd: &'a VmFd,
    pub irqchip: bool,
    pub wake: &'a Arc<GuestWake>,
    pub kind: GuestKind,
    pub serial_out: SerialOut,
    /// The i8042's reset line.
    pub on_reset: super::ResetHook,
    pub tmem: &'a TmemConfig,
}

impl LegacySetup<'_> {
    pub fn attach(
        self,
        mut saved: Option<&mut StateLookup<'_>>,
    ) -> Result<LegacyDevices, DeviceError> {
        let mut pio = Bus::new();
        let serial_irq = new_irqfd(self.vm_fd, self.irqchip, layout::SERIAL_IRQ)?;
        let trigger = IrqTrigger::new(serial_irq, self.wake.clone());
        let serial = match saved.as_deref_mut() {
            None => SerialDevice::new(trigger, self.serial_out),
            Some(states) => restore_device::<SerialDevice>(
                &DeviceId::serial(),
                (trigger, self.serial_out),
                states.serial()?,
            )?,
        };
        let serial = Arc::new(Mutex::new(serial));
        pio.insert(
            layout::SERIAL_PORT_BASE,
            layout::SERIAL_PORT_LEN,
            serial.clone(),
        )?;
        let i8042 = if self.kind == GuestKind::Linux {
            let irq = new_irqfd(self.vm_fd, self.irqchip, layout::I8042_IRQ)?;
            let hook = self.on_reset.clone();
            let on_reset: Box<dyn Fn() + Send> = Box::new(move || hook());
            let device = match saved.as_deref_mut() {
                None => I8042::new(irq, on_reset),
                Some(states) => {
                    restore_device::<I8042>(&DeviceId::i8042(), (irq, on_reset), states.i8042()?)?
                }
            };
            let device = Arc::new(Mutex::new(device));
            pio.insert(
                layout::I8042_PORT_BASE,
                layout::I8042_PORT_LEN,
                device.clone(),
            )?;
            Some(device)
        } else {
            None
        };
        let tmem = match saved {
            // The pool's contents and quota come from the snapshot.
            Some(states) => restore_device::<TmemDevice>(&DeviceId::tmem(), (), states.tmem()?)?,
            None if self.tmem.enabled => {
                TmemDevice::new(self.tmem.quota_bytes, self.tmem.compression)
            }
            None => TmemDevice::disabled(),
        };
        let tmem = match host_cap::effective_cap(self.tmem.host_cap_bytes) {
            Ok(Some(cap)) if tmem.is_enabled() => HostCap::open(&host_cap::host_dir(), cap)
                .and_then(|c| tmem.with_host_cap(c))
                .map_err(|e| DeviceError::Restore {
                    id: DeviceId::tmem(),
                    detail: e.to_string(),
                })?,
            Ok(_) => tmem,
            Err(e) => {
                return Err(DeviceError::Restore {
                    id: DeviceId::tmem(),
                    detail: e.to_string(),
                })
            }
        };
        let tmem = if self.tmem.timing {
            tmem.with_timing()
        } else {
            tmem
        };
        Ok(LegacyDevices {
            serial,
            i8042,
            tmem: Arc::new(tmem),
            pio,
        })
    }
}
