//! The PL031 real-time clock (vm-superio) on aarch64: where an arm64 Linux
//! guest reads the wall clock at boot (x86 guests use kvmclock instead).
//! The alarm interrupt is not wired: spore guests do not sleep on it.

use vm_superio::rtc_pl031::{NoEvents, RtcState};
use vm_superio::Rtc;

use crate::devices::bus::BusDevice;

pub struct RtcDevice {
    rtc: Rtc<NoEvents>,
}

impl Default for RtcDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl RtcDevice {
    pub fn new() -> Self {
        Self { rtc: Rtc::new() }
    }
}

/// The clock's registers, for snapshots (mirrors vm-superio's `RtcState`,
/// which has no serde support). `offset` keeps the guest's clock where it
/// was set relative to the host's.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RtcSnapshot {
    pub lr: u32,
    pub offset: i64,
    pub mr: u32,
    pub imsc: u32,
    pub ris: u32,
}

impl crate::persist::Persist for RtcDevice {
    type State = RtcSnapshot;
    type Args = ();
    type Error = String;

    fn save(&self) -> RtcSnapshot {
        let s = self.rtc.state();
        RtcSnapshot {
            lr: s.lr,
            offset: s.offset,
            mr: s.mr,
            imsc: s.imsc,
            ris: s.ris,
        }
    }

    fn restore((): (), s: &RtcSnapshot) -> Result<Self, String> {
        let state = RtcState {
            lr: s.lr,
            offset: s.offset,
            mr: s.mr,
            imsc: s.imsc,
            ris: s.ris,
        };
        Ok(Self {
            rtc: Rtc::from_state(&state, NoEvents),
        })
    }
}

impl BusDevice for RtcDevice {
    // Registers are 32 bits wide; other widths read as zero and are dropped.
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match (u16::try_from(offset), <&mut [u8; 4]>::try_from(&mut *data)) {
            (Ok(off), Ok(word)) => self.rtc.read(off, word),
            _ => data.fill(0),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), Ok(word)) = (u16::try_from(offset), <&[u8; 4]>::try_from(data)) {
            self.rtc.write(off, word);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::Persist;

    #[test]
    fn reads_the_wall_clock_and_round_trips() {
        let mut rtc = RtcDevice::new();
        let mut word = [0u8; 4];
        rtc.read(0, &mut word); // RTCDR: seconds since the epoch
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(u64::from(u32::from_le_bytes(word)).abs_diff(now) < 5);
        rtc.write(8, &1_000u32.to_le_bytes()); // RTCLR: set the clock
        let saved = rtc.save();
        let mut back = RtcDevice::restore((), &saved).unwrap();
        back.read(0, &mut word);
        assert!(u32::from_le_bytes(word).abs_diff(1_000) < 5);
        // Odd widths and offsets never panic.
        back.read(0, &mut [0u8; 2]);
        back.write(u64::MAX, &[1, 2, 3, 4]);
        back.read(0xffc, &mut word);
    }
}
