//! Signal port: guest → VMM events through one 32-bit port-I/O register.
//!
//! A guest writes one 32-bit value with `out dx, eax` to [`SIGNAL_PORT`]:
//!
//! ```text
//!  31        24 23                                  0
//! +------------+-------------------------------------+
//! |   opcode   |             argument (24 bits)      |
//! +------------+-------------------------------------+
//! ```
//!
//! | opcode | name       | argument                                   | effect |
//! |--------|------------|--------------------------------------------|--------|
//! | 0x01   | `EXIT`     | exit code (low 8 bits used)                 | the VM stops; the VMM exits with that code |
//! | 0x02   | `MARK`     | mark number                                 | the VMM records (number, host monotonic time) |
//! | 0x03   | `WAIT`     | timeout in microseconds (max ~16.7 s)       | the vCPU sleeps in the VMM until a device has work for the guest or the timeout passes |
//! | 0x04   | `SNAPSHOT` | tag (any 24-bit number)                     | the VMM pauses every vCPU at this instruction, writes a snapshot named by the tag into the configured directory, then resumes or stops the VM as configured (see below) |
//! | 0x05   | `FORK`     | clone count (reserved)                      | reserved for guest-triggered fork |
//! | 0x06   | `DONE`     | (reserved)                                  | reserved: a clone says it is done |
//!
//! A 32-bit `in eax, dx` from the same port returns the result of the last
//! operation on that vCPU: for `WAIT`, [`WAIT_WOKEN`] if a device had work,
//! [`WAIT_TIMED_OUT`] if the timeout passed; for `SNAPSHOT`,
//! [`SNAPSHOT_TAKEN`] in the VM that took the snapshot (it goes on running),
//! [`SNAPSHOT_RESTORED`] in a VM restored from that snapshot (it resumes
//! right after the `out`, like the two returns of `fork`),
//! [`SNAPSHOT_FAILED`] if the VMM could not write it (its log says why) and
//! [`SNAPSHOT_NOT_CONFIGURED`] if no snapshot directory is configured (the
//! request is ignored).
//!
//! `SNAPSHOT` writes `<directory>/tag-<T>.state` and `<directory>/tag-<T>.mem`
//! (T in decimal), replacing an older snapshot of the same tag atomically.
//! The directory, the snapshot type (full or diff) and what happens after
//! (resume, or stop the VM with exit code 0) are host configuration
//! (`PUT /snapshot/guest-triggered`); the result register of the vCPU that
//! asked is part of the snapshot. Writes of another width or with
//! an unknown opcode are ignored by the VMM (and logged): a misbehaving guest
//! cannot stop or crash the VMM through this port.

/// I/O port of the signal register.
pub const SIGNAL_PORT: u16 = 0x0510;

/// Opcode of a signal (high byte of the written value).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    Exit = 0x01,
    Mark = 0x02,
    Wait = 0x03,
    Snapshot = 0x04,
    Fork = 0x05,
    Done = 0x06,
}

impl SignalOp {
    pub const fn from_u8(op: u8) -> Option<Self> {
        Some(match op {
            0x01 => Self::Exit,
            0x02 => Self::Mark,
            0x03 => Self::Wait,
            0x04 => Self::Snapshot,
            0x05 => Self::Fork,
            0x06 => Self::Done,
            _ => return None,
        })
    }
}

/// Largest argument a signal can carry.
pub const ARG_MASK: u32 = 0x00FF_FFFF;

/// Value returned by an `in` after a `WAIT` that a device ended.
pub const WAIT_WOKEN: u32 = 1;
/// Value returned by an `in` after a `WAIT` whose timeout passed.
pub const WAIT_TIMED_OUT: u32 = 0;

/// `SNAPSHOT` result: the snapshot could not be written.
pub const SNAPSHOT_FAILED: u32 = 0;
/// `SNAPSHOT` result: the snapshot was written; this VM goes on.
pub const SNAPSHOT_TAKEN: u32 = 1;
/// `SNAPSHOT` result: this VM was restored from the snapshot.
pub const SNAPSHOT_RESTORED: u32 = 2;
/// `SNAPSHOT` result: the host configured no snapshot directory.
pub const SNAPSHOT_NOT_CONFIGURED: u32 = 3;

/// Encodes a signal; the argument is truncated to 24 bits.
pub const fn encode(op: SignalOp, arg: u32) -> u32 {
    ((op as u32) << 24) | (arg & ARG_MASK)
}

/// Splits a written value into (opcode, argument); `None` for unknown opcodes.
pub const fn decode(value: u32) -> Option<(SignalOp, u32)> {
    match SignalOp::from_u8((value >> 24) as u8) {
        Some(op) => Some((op, value & ARG_MASK)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for op in [
            SignalOp::Exit,
            SignalOp::Mark,
            SignalOp::Wait,
            SignalOp::Snapshot,
            SignalOp::Fork,
            SignalOp::Done,
        ] {
            assert_eq!(decode(encode(op, 0x12_3456)), Some((op, 0x12_3456)));
        }
        assert_eq!(
            decode(encode(SignalOp::Exit, 0xFFFF_FFFF)),
            Some((SignalOp::Exit, ARG_MASK))
        );
        assert_eq!(decode(0x7F00_0000), None);
        assert_eq!(decode(0), None);
    }
}
