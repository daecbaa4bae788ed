//! Signal port: guest → VMM events through one 32-bit register: port I/O on
//! x86_64 ([`SIGNAL_PORT`]), MMIO on aarch64 ([`SIGNAL_MMIO_ADDR`]).
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
//! | 0x05   | `FORK`     | clone count (0: the count set with `PUT /clone/config`) | the VMM pauses the VM at this instruction, turns it into a clone template and starts that many clones (see below) |
//! | 0x06   | `DONE`     | ignored                                     | the VM ends without a guest shutdown; the VMM exits 0 (a clone whose job is done) |
//! | 0x07   | `GENERATION` | (ignored)                                 | the result becomes the VM's clone generation (low 32 bits) |
//!
//! A 32-bit `in eax, dx` from the same port returns the result of the last
//! operation on that vCPU: for `WAIT`, [`WAIT_WOKEN`] if a device had work,
//! [`WAIT_TIMED_OUT`] if the timeout passed; for `GENERATION`, the generation.
//! The first `in` on a vCPU of a VM restored from a snapshot returns
//! [`RESTORED`] instead, once, whatever ran in between: a guest that polls
//! the port learns it was restored (and where its first instruction after the
//! restore ran). Writes of another width or with an unknown opcode are
//! ignored by the VMM (and logged): a misbehaving guest cannot stop or crash
//! the VMM through this port.
//!
//! ## Clone generation
//!
//! Every VM has a generation, 0 when booted. The VMM gives each clone a new
//! one before it resumes (and keeps it in snapshots), so a guest that sees its
//! generation change knows it is a copy: it must reseed its random number
//! generators (from virtio-rng), and treat connections and identities it held
//! as gone. How the guest learns of the change:
//!
//! - **Unikernel:** the VMM also writes the full 64-bit generation at guest
//!   physical [`crate::boot::GENERATION_ADDR`], so the runtime compares one
//!   memory word (no VM exit) before handing out random numbers; and a `WAIT`
//!   in progress (or the next one) returns [`WAIT_WOKEN`].
//! - **Linux:** a program blocks in `accept()` on vsock port
//!   [`GENERATION_VSOCK_PORT`]. After a clone the VMM resets the vsock
//!   transport (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET: Linux re-reads the guest
//!   CID, which a clone may have changed), and once the guest has handled that
//!   event it connects to this port and sends `generation N\n` and
//!   `time SECONDS.NANOSECONDS\n` (the host's wall clock, nine digits after
//!   the point: the guest's clock is the snapshot's, so it steps to this),
//!   then closes.
//!   A clone given a new network identity (`crate::net`) gets more lines
//!   after it, one per changed interface, in the order of the VM's
//!   `network-interfaces`: `mac IFACE_ID XX:XX:XX:XX:XX:XX\n` and, with an
//!   address, `ipv4 IFACE_ID A.B.C.D/P GATEWAY\n` (`-` for no gateway).
//!   The program may also read the generation through this port (it needs
//!   I/O-port access, `ioperm`); its low 32 bits are what `GENERATION` gives.
//!
//! `FORK` works like `fork()`: the guest reads the result with an `in` right
//! after the `out`. Each clone reads its clone number (1, 2, ... in the order
//! its template served them); the source reads 0 when it goes on running
//! (`continue` mode; in `zygote` mode it stays frozen as the template and
//! never reads), and [`FORK_FAILED`] when no clone could be made (no fork
//! support in this VMM, the template's clone cap reached, a clone failed to
//! start).
//!
//! `SNAPSHOT` writes `<directory>/tag-<T>.state` and `<directory>/tag-<T>.mem`
//! (T in decimal), replacing an older snapshot of the same tag atomically.
//! The directory, the snapshot type (full or diff) and what happens after
//! (resume, or stop the VM with exit code 0) are host configuration
//! (`PUT /snapshot/guest-triggered`); the result register of the vCPU that
//! asked is part of the snapshot. After `SNAPSHOT` the `in` reads
//! [`SNAPSHOT_TAKEN`] in the VM that took the snapshot (it goes on running),
//! [`SNAPSHOT_RESTORED`] (= [`RESTORED`]) in a VM restored from it (it resumes
//! right after the `out`, like the two returns of `fork`), [`SNAPSHOT_FAILED`]
//! if the VMM could not write it (its log says why) and
//! [`SNAPSHOT_NOT_CONFIGURED`] if no snapshot directory is configured (the
//! request is ignored).

/// I/O port of the signal register (x86_64: `out`/`in` of 32 bits).
pub const SIGNAL_PORT: u16 = 0x0510;

/// Guest-physical address of the signal register on aarch64, which has no
/// port I/O: a 32-bit store to this address is the `out`, a 32-bit load the
/// `in`, with the same values and meanings as on x86_64. The register sits
/// alone in a 4 KiB page ([`SIGNAL_MMIO_SIZE`]) of the MMIO area below RAM,
/// so a Linux guest can map exactly that page (`/dev/mem`) and nothing else.
pub const SIGNAL_MMIO_ADDR: u64 = 0x0902_0000;
/// Size of the page that holds the aarch64 signal register.
pub const SIGNAL_MMIO_SIZE: u64 = 0x1000;

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
    Generation = 0x07,
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
            0x07 => Self::Generation,
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

/// Guest vsock port a Linux guest listens on for clone notifications.
pub const GENERATION_VSOCK_PORT: u32 = 0x5350;

/// Value returned by the first `in` on a vCPU after the VM was restored
/// from a snapshot (then the port reads as usual again).
pub const RESTORED: u32 = 2;

/// Value a `FORK` returns when no clone was made (the guest goes on).
pub const FORK_FAILED: u32 = 0xFFFF_FFFF;

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
            SignalOp::Generation,
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
