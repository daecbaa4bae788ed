//! COM1: an 8250 UART (vm-superio) on port 0x3f8, interrupting on IRQ 4.

use std::io::Write;
use std::sync::Arc;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;
use crate::devices::wake::GuestWake;

/// Raises the serial IRQ through its irqfd and wakes a polling guest.
pub struct IrqTrigger {
    irqfd: EventFd,
    wake: Arc<GuestWake>,
}

impl IrqTrigger {
    pub fn new(irqfd: EventFd, wake: Arc<GuestWake>) -> Self {
        Self { irqfd, wake }
    }
}

impl IrqTrigger {
    /// Wakes a guest sleeping in the signal port's `WAIT` without raising
    /// the IRQ (a polling guest may have UART interrupts disabled).
    fn wake_guest(&self) {
        self.wake.notify();
    }
}

impl Trigger for IrqTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.wake.notify();
        self.irqfd.write(1)
    }
}

pub type SerialOut = Box<dyn Write + Send>;

pub struct SerialDevice {
    uart: Serial<IrqTrigger, NoEvents, SerialOut>,
}

impl SerialDevice {
    pub fn new(trigger: IrqTrigger, out: SerialOut) -> Self {
        Self {
            uart: Serial::new(trigger, out),
        }
    }

    /// Queues console input for the guest; returns how many bytes fitted.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        let room = self.uart.fifo_capacity().min(bytes.len());
        if room == 0 {
            return 0;
        }
        let queued = self.uart.enqueue_raw_bytes(&bytes[..room]).unwrap_or(0);
        if queued > 0 {
            self.uart.interrupt_evt().wake_guest();
        }
        queued
    }
}

/// The UART's registers and unread input, for snapshots (mirrors
/// vm-superio's `SerialState`, which has no serde support).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl SerialDevice {
    pub fn save(&self) -> SerialSnapshot {
        let s = self.uart.state();
        SerialSnapshot {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// Rebuilds the UART from a snapshot; fails on an over-full input FIFO.
    pub fn restore(
        trigger: IrqTrigger,
        out: SerialOut,
        s: &SerialSnapshot,
    ) -> Result<Self, String> {
        let state = vm_superio::serial::SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        };
        let uart = Serial::from_state(&state, trigger, NoEvents, out)
            .map_err(|e| format!("serial state: {e:?}"))?;
        Ok(Self { uart })
    }
}

impl crate::persist::Persist for SerialDevice {
    type State = SerialSnapshot;
    type Args = (IrqTrigger, SerialOut);
    type Error = String;

    fn save(&self) -> SerialSnapshot {
        SerialDevice::save(self)
    }

    fn restore((trigger, out): Self::Args, state: &SerialSnapshot) -> Result<Self, String> {
        SerialDevice::restore(trigger, out, state)
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if data.len() == 1 && offset < 8 {
            data[0] = self.uart.read((offset & 7) as u8);
        } else {
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if data.len() == 1 && offset < 8 {
            if let Err(e) = self.uart.write((offset & 7) as u8, data[0]) {
                tracing::debug!("serial write failed: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    #[test]
    fn input_reaches_the_guest_and_wakes_it() {
        let wake = Arc::new(GuestWake::new().unwrap());
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut dev = SerialDevice::new(IrqTrigger::new(irq, wake.clone()), Box::new(Vec::new()));
        assert_eq!(dev.enqueue_input(b"hi"), 2);
        assert!(wake.wait(Duration::from_millis(0)) || wake.wait(Duration::from_millis(1)));
        let mut b = [0u8];
        dev.read(0, &mut b);
        assert_eq!(b[0], b'h');
        // Odd widths are ignored, never a panic.
        dev.write(0, &[1, 2]);
        dev.read(100, &mut b);
    }

    #[test]
    fn state_round_trips() {
        let wake = Arc::new(GuestWake::new().unwrap());
        let irq = || IrqTrigger::new(EventFd::new(EFD_NONBLOCK).unwrap(), wake.clone());
        let mut dev = SerialDevice::new(irq(), Box::new(Vec::new()));
        dev.write(7, &[0x5a]); // scratch
        dev.write(3, &[0x03]); // 8N1
        dev.enqueue_input(b"xy");
        let saved = dev.save();
        let bytes = bincode::serialize(&saved).unwrap();
        let back: SerialSnapshot = bincode::deserialize(&bytes).unwrap();
        let mut dev2 = SerialDevice::restore(irq(), Box::new(Vec::new()), &back).unwrap();
        assert_eq!(dev2.save(), saved);
        let mut b = [0u8];
        dev2.read(0, &mut b);
        assert_eq!(b[0], b'x');
        let mut bad = saved.clone();
        bad.in_buffer = vec![0; 1 << 20];
        assert!(SerialDevice::restore(irq(), Box::new(Vec::new()), &bad).is_err());
    }
}
