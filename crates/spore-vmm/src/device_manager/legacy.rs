//! Legacy devices: the serial console, the i8042 keyboard controller
//! (Linux guests: reboot through it) and the PL031 RTC where the
//! architecture's layout places them (port I/O on x86_64, MMIO on aarch64),
//! and tmem (served outside the buses, on its own port). Each is made fresh
//! or restored from its state.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;

use super::persist::{restore_device, DeviceId, StateLookup};
use super::{new_irqfd, DeviceError};
use crate::arch::{layout, BusKind, GuestKind, LegacyPlace};
use crate::config::TmemConfig;
use crate::devices::bus::{Bus, BusDevice};
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::RtcDevice;
use crate::devices::legacy::serial::{IrqTrigger, SerialDevice, SerialOut};
use crate::devices::tmem::host_cap::{self, HostCap};
use crate::devices::tmem::TmemDevice;
use crate::devices::wake::GuestWake;

/// The legacy devices of a VM and the port-I/O bus (x86) they sit on;
/// those on MMIO are on the caller's MMIO bus.
pub(super) struct LegacyDevices {
    pub serial: Arc<Mutex<SerialDevice>>,
    pub i8042: Option<Arc<Mutex<I8042>>>,
    pub rtc: Option<Arc<Mutex<RtcDevice>>>,
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

/// Puts `device` at `place` on the bus it names.
fn place(
    place: LegacyPlace,
    device: Arc<Mutex<dyn BusDevice>>,
    pio: &mut Bus,
    mmio: &mut Bus,
) -> Result<(), DeviceError> {
    let bus = match place.bus {
        BusKind::Pio => pio,
        BusKind::Mmio => mmio,
    };
    Ok(bus.insert(place.base, place.len, device)?)
}

impl LegacySetup<'_> {
    pub fn attach(
        self,
        mut saved: Option<&mut StateLookup<'_>>,
        mmio: &mut Bus,
    ) -> Result<LegacyDevices, DeviceError> {
        let mut pio = Bus::new();
        let serial_irq = new_irqfd(self.vm_fd, self.irqchip, layout::SERIAL.irq)?;
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
        place(layout::SERIAL, serial.clone(), &mut pio, mmio)?;
        let i8042 = match layout::I8042 {
            Some(at) if self.kind == GuestKind::Linux => {
                let irq = new_irqfd(self.vm_fd, self.irqchip, at.irq)?;
                let hook = self.on_reset.clone();
                let on_reset: Box<dyn Fn() + Send> = Box::new(move || hook());
                let device = match saved.as_deref_mut() {
                    None => I8042::new(irq, on_reset),
                    Some(states) => restore_device::<I8042>(
                        &DeviceId::i8042(),
                        (irq, on_reset),
                        states.i8042()?,
                    )?,
                };
                let device = Arc::new(Mutex::new(device));
                place(at, device.clone(), &mut pio, mmio)?;
                Some(device)
            }
            _ => None,
        };
        let rtc = match layout::RTC {
            Some(at) => {
                let device = match saved.as_deref_mut() {
                    None => RtcDevice::new(),
                    Some(states) => {
                        restore_device::<RtcDevice>(&DeviceId::rtc(), (), states.rtc()?)?
                    }
                };
                let device = Arc::new(Mutex::new(device));
                place(at, device.clone(), &mut pio, mmio)?;
                Some(device)
            }
            None => None,
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
            rtc,
            tmem: Arc::new(tmem),
            pio,
        })
    }
}
