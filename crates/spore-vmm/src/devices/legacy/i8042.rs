//! A minimal i8042 keyboard controller on ports 0x60 (data) and 0x64
//! (status/command).
//!
//! It exists for two things: the guest resets the machine by pulsing the CPU
//! reset line (command 0xFE, Linux's `reboot=k`), which ends the VMM; and the
//! VMM injects Ctrl+Alt+Del as keyboard scancodes (`SendCtrlAltDel`).
//! vm-superio's i8042 only does the former, hence this small model: enough of
//! the controller and the keyboard protocol for Linux's i8042/atkbd drivers.

use std::collections::VecDeque;

use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;

const DATA: u64 = 0;
const STATUS_COMMAND: u64 = 4;

// Status register bits.
const SB_OUT_FULL: u8 = 0x01;
const SB_SYSTEM: u8 = 0x04;
const SB_LAST_WAS_COMMAND: u8 = 0x08;
const SB_UNLOCKED: u8 = 0x10;

// Controller command byte bits.
const CB_KBD_INT: u8 = 0x01;
const CB_SYSTEM: u8 = 0x04;

// Controller commands.
const CMD_READ_CCB: u8 = 0x20;
const CMD_WRITE_CCB: u8 = 0x60;
const CMD_SELF_TEST: u8 = 0xAA;
const CMD_KBD_TEST: u8 = 0xAB;
const CMD_KBD_DISABLE: u8 = 0xAD;
const CMD_KBD_ENABLE: u8 = 0xAE;
const CMD_READ_OUTPUT_PORT: u8 = 0xD0;
const CMD_WRITE_OUTPUT_PORT: u8 = 0xD1;
const CMD_WRITE_KBD_BUFFER: u8 = 0xD2;
const CMD_RESET_CPU: u8 = 0xFE;

// Keyboard replies.
const KBD_ACK: u8 = 0xFA;
const KBD_SELF_TEST_OK: u8 = 0xAA;

/// Bytes the output buffer holds before input is dropped.
const OUT_CAPACITY: usize = 16;

/// What the controller expects the next data-port byte to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Pending {
    None,
    CommandByte,
    OutputPort,
    KbdBuffer,
    /// Parameter of a keyboard command (LEDs, scancode set, typematic).
    KbdParameter,
}

pub struct I8042 {
    ccb: u8,
    status: u8,
    pending: Pending,
    out: VecDeque<u8>,
    kbd_irq: EventFd,
    on_reset: Box<dyn Fn() + Send>,
}

/// The controller's registers and output buffer, for snapshots.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct I8042State {
    pub ccb: u8,
    pub status: u8,
    pub pending: Pending,
    pub out: Vec<u8>,
}

impl I8042 {
    pub fn save(&self) -> I8042State {
        I8042State {
            ccb: self.ccb,
            status: self.status,
            pending: self.pending,
            out: self.out.iter().copied().collect(),
        }
    }

    /// Rebuilds the controller; the output buffer keeps its usual bound.
    pub fn restore(kbd_irq: EventFd, on_reset: Box<dyn Fn() + Send>, s: &I8042State) -> Self {
        let mut dev = Self::new(kbd_irq, on_reset);
        dev.ccb = s.ccb;
        dev.status = s.status;
        dev.pending = s.pending;
        dev.out = s.out.iter().take(OUT_CAPACITY).copied().collect();
        dev
    }

    /// `kbd_irq` is the irqfd of IRQ 1; `on_reset` runs when the guest resets the CPU.
    pub fn new(kbd_irq: EventFd, on_reset: Box<dyn Fn() + Send>) -> Self {
        Self {
            ccb: CB_KBD_INT | CB_SYSTEM,
            status: SB_SYSTEM | SB_UNLOCKED,
            pending: Pending::None,
            out: VecDeque::new(),
            kbd_irq,
            on_reset,
        }
    }

    /// Injects Ctrl+Alt+Del (scancode set 2, press then release).
    pub fn send_ctrl_alt_del(&mut self) {
        for b in [
            0x14, 0x11, 0xe0, 0x71, // press Ctrl, Alt, Del
            0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14, // release them
        ] {
            self.push(b);
        }
    }

    fn push(&mut self, byte: u8) {
        if self.out.len() >= OUT_CAPACITY {
            return;
        }
        self.out.push_back(byte);
        self.status |= SB_OUT_FULL;
        if self.ccb & CB_KBD_INT != 0 {
            let _ = self.kbd_irq.write(1);
        }
    }

    fn command(&mut self, cmd: u8) {
        self.status |= SB_LAST_WAS_COMMAND;
        match cmd {
            CMD_READ_CCB => self.push(self.ccb),
            CMD_WRITE_CCB => self.pending = Pending::CommandByte,
            CMD_SELF_TEST => self.push(0x55),
            CMD_KBD_TEST => self.push(0x00),
            CMD_KBD_DISABLE | CMD_KBD_ENABLE => {}
            CMD_READ_OUTPUT_PORT => self.push(0x01),
            CMD_WRITE_OUTPUT_PORT => self.pending = Pending::OutputPort,
            CMD_WRITE_KBD_BUFFER => self.pending = Pending::KbdBuffer,
            CMD_RESET_CPU => (self.on_reset)(),
            _ => {}
        }
    }

    fn data(&mut self, byte: u8) {
        self.status &= !SB_LAST_WAS_COMMAND;
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::CommandByte => self.ccb = byte,
            Pending::OutputPort => {
                // Bit 0 low pulses the CPU reset line.
                if byte & 1 == 0 {
                    (self.on_reset)();
                }
            }
            Pending::KbdBuffer => self.push(byte),
            Pending::KbdParameter => self.push(KBD_ACK),
            Pending::None => self.keyboard_command(byte),
        }
    }

    fn keyboard_command(&mut self, byte: u8) {
        match byte {
            0xFF => {
                self.out.clear();
                self.push(KBD_ACK);
                self.push(KBD_SELF_TEST_OK);
            }
            0xF2 => {
                self.push(KBD_ACK);
                self.push(0xAB);
                self.push(0x83);
            }
            0xED | 0xF0 | 0xF3 => {
                self.push(KBD_ACK);
                self.pending = Pending::KbdParameter;
            }
            _ => self.push(KBD_ACK),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = data.first_mut() else {
            return;
        };
        match offset {
            DATA => {
                *first = self.out.pop_front().unwrap_or(0);
                if self.out.is_empty() {
                    self.status &= !SB_OUT_FULL;
                } else if self.ccb & CB_KBD_INT != 0 {
                    let _ = self.kbd_irq.write(1);
                }
            }
            STATUS_COMMAND => *first = self.status,
            _ => {}
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&byte) = data.first() else {
            return;
        };
        match offset {
            DATA => self.data(byte),
            STATUS_COMMAND => self.command(byte),
            _ => {}
        }
    }
}

impl crate::persist::Persist for I8042 {
    type State = I8042State;
    type Args = (EventFd, Box<dyn Fn() + Send>);
    type Error = std::convert::Infallible;

    fn save(&self) -> I8042State {
        I8042::save(self)
    }

    fn restore((irq, on_reset): Self::Args, state: &I8042State) -> Result<Self, Self::Error> {
        Ok(I8042::restore(irq, on_reset, state))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    fn dev() -> (I8042, Arc<AtomicU32>, EventFd) {
        let resets = Arc::new(AtomicU32::new(0));
        let r = resets.clone();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let d = I8042::new(
            irq.try_clone().unwrap(),
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        );
        (d, resets, irq)
    }

    fn read(d: &mut I8042, off: u64) -> u8 {
        let mut b = [0u8];
        d.read(off, &mut b);
        b[0]
    }

    #[test]
    fn reset_through_command_and_output_port() {
        let (mut d, resets, _) = dev();
        d.write(STATUS_COMMAND, &[CMD_RESET_CPU]);
        d.write(STATUS_COMMAND, &[CMD_WRITE_OUTPUT_PORT]);
        d.write(DATA, &[0xFE]);
        assert_eq!(resets.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn self_test_ccb_and_keyboard() {
        let (mut d, _, irq) = dev();
        d.write(STATUS_COMMAND, &[CMD_SELF_TEST]);
        assert_ne!(read(&mut d, STATUS_COMMAND) & SB_OUT_FULL, 0);
        assert_eq!(read(&mut d, DATA), 0x55);
        assert_eq!(read(&mut d, STATUS_COMMAND) & SB_OUT_FULL, 0);
        d.write(STATUS_COMMAND, &[CMD_WRITE_CCB]);
        d.write(DATA, &[0x45]);
        d.write(STATUS_COMMAND, &[CMD_READ_CCB]);
        assert_eq!(read(&mut d, DATA), 0x45);
        d.write(DATA, &[0xFF]);
        assert_eq!((read(&mut d, DATA), read(&mut d, DATA)), (KBD_ACK, 0xAA));
        d.write(DATA, &[0xED]);
        d.write(DATA, &[0x07]);
        assert_eq!((read(&mut d, DATA), read(&mut d, DATA)), (KBD_ACK, KBD_ACK));
        assert!(irq.read().unwrap() > 0);
    }

    #[test]
    fn ctrl_alt_del_is_bounded_and_readable() {
        let (mut d, _, _) = dev();
        d.send_ctrl_alt_del();
        d.send_ctrl_alt_del();
        let mut n = 0;
        while read(&mut d, STATUS_COMMAND) & SB_OUT_FULL != 0 {
            read(&mut d, DATA);
            n += 1;
        }
        assert_eq!(n, OUT_CAPACITY);
        // Odd widths and offsets never panic.
        d.write(1, &[]);
        d.read(9, &mut []);
    }

    #[test]
    fn state_round_trips() {
        let (mut d, _, _) = dev();
        d.write(STATUS_COMMAND, &[CMD_WRITE_CCB]);
        d.write(DATA, &[0x45]);
        d.write(STATUS_COMMAND, &[CMD_READ_CCB]);
        d.write(STATUS_COMMAND, &[CMD_WRITE_OUTPUT_PORT]);
        let saved = d.save();
        let back: I8042State = bincode::deserialize(&bincode::serialize(&saved).unwrap()).unwrap();
        let (fresh, _, _) = dev();
        let mut r = I8042::restore(fresh.kbd_irq.try_clone().unwrap(), Box::new(|| {}), &back);
        assert_eq!(r.save(), saved);
        assert_eq!(read(&mut r, DATA), 0x45);
    }
}
