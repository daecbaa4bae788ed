//! The devices' snapshot states, keyed by device id.
//!
//! Every device saves and restores its own state type through
//! [`Persist`]; this module is the one generic caller. States are found by
//! the id of the device they belong to ([`DeviceId`]), never by position,
//! so a restore notices a state for a device the VM lacks, or a device
//! with no state, and names it.

use std::any::Any;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::DeviceError;
use crate::devices::legacy::i8042::I8042State;
use crate::devices::legacy::rtc::RtcSnapshot;
use crate::devices::legacy::serial::SerialSnapshot;
use crate::devices::tmem::TmemState;
use crate::devices::virtio::balloon::{Balloon, BalloonState};
use crate::devices::virtio::blk::{Block, BlockState};
use crate::devices::virtio::mem::{VirtioMem, VirtioMemState};
use crate::devices::virtio::mmio::state::MmioTransportState;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{Net, NetState};
use crate::devices::virtio::rng::{Rng, RngState};
use crate::devices::virtio::vsock::{Vsock, VsockState};
use crate::devices::virtio::{device_type, VirtioDevice};
use crate::mmds::MmdsState;
use crate::persist::Persist;

/// A device's stable name in a snapshot: `serial`, `i8042`, `rtc`, `tmem`,
/// `drive:<drive_id>`, `net:<iface_id>`, `rng`, `vsock`, `balloon`, `mem`,
/// `mmds`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceId(String);

impl DeviceId {
    pub fn serial() -> Self {
        Self("serial".into())
    }
    pub fn i8042() -> Self {
        Self("i8042".into())
    }
    pub fn rtc() -> Self {
        Self("rtc".into())
    }
    pub fn tmem() -> Self {
        Self("tmem".into())
    }
    pub fn drive(drive_id: &str) -> Self {
        Self(format!("drive:{drive_id}"))
    }
    pub fn net(iface_id: &str) -> Self {
        Self(format!("net:{iface_id}"))
    }
    pub fn rng() -> Self {
        Self("rng".into())
    }
    pub fn vsock() -> Self {
        Self("vsock".into())
    }
    pub fn balloon() -> Self {
        Self("balloon".into())
    }
    pub fn mem() -> Self {
        Self("mem".into())
    }
    pub fn mmds() -> Self {
        Self("mmds".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One device's snapshot state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DeviceState {
    Serial(SerialSnapshot),
    I8042(I8042State),
    Tmem(TmemState),
    Virtio(VirtioState),
    /// After the others: bincode numbers the cases (x86 snapshots taken
    /// before it existed must still decode). aarch64's PL031.
    Rtc(RtcSnapshot),
    /// The MMDS data store (last, for the same reason).
    Mmds(MmdsState),
}

impl DeviceState {
    fn kind(&self) -> &'static str {
        match self {
            Self::Serial(_) => "serial",
            Self::I8042(_) => "i8042",
            Self::Tmem(_) => "tmem",
            Self::Virtio(_) => "virtio",
            Self::Rtc(_) => "rtc",
            Self::Mmds(_) => "mmds",
        }
    }
}

/// A virtio-mmio device: where it sits, its transport, and the device's own state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VirtioState {
    /// Its virtio-mmio window and IRQ (`layout::virtio_mmio_addr`): the
    /// guest found the device there, so a restore puts it back there.
    pub slot: u32,
    pub transport: MmioTransportState,
    pub device: VirtioDeviceState,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum VirtioDeviceState {
    Block(BlockState),
    Rng(RngState),
    Vsock(VsockState),
    Balloon(BalloonState),
    Mem(VirtioMemState),
    /// Last: bincode numbers the cases, and snapshots of format version 4
    /// taken before it existed must still decode. Boxed: its two rate
    /// limiters make it the largest state by far.
    Net(Box<NetState>),
}

/// Every device's state, in the order the VM attached them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeviceStates(Vec<(DeviceId, DeviceState)>);

impl DeviceStates {
    pub fn push(&mut self, id: DeviceId, state: DeviceState) {
        self.0.push((id, state));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&DeviceId, &DeviceState)> {
        self.0.iter().map(|(id, s)| (id, s))
    }

    pub fn get(&self, id: &DeviceId) -> Option<&DeviceState> {
        self.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }

    /// The virtio-mem device's state, if the VM has one.
    pub fn virtio_mem(&self) -> Option<&VirtioMemState> {
        match self.get(&DeviceId::mem()) {
            Some(DeviceState::Virtio(VirtioState {
                device: VirtioDeviceState::Mem(m),
                ..
            })) => Some(m),
            _ => None,
        }
    }
}

/// A restore's view of the saved states: each device takes its own by id,
/// and [`Self::finish`] refuses states no device took.
pub struct StateLookup<'a> {
    states: &'a DeviceStates,
    taken: Vec<bool>,
}

impl<'a> StateLookup<'a> {
    pub fn new(states: &'a DeviceStates) -> Self {
        Self {
            states,
            taken: vec![false; states.0.len()],
        }
    }

    /// The state of device `id`; a device with no state is an error.
    pub fn take(&mut self, id: &DeviceId) -> Result<&'a DeviceState, DeviceError> {
        let states = self.states;
        let found = states
            .0
            .iter()
            .enumerate()
            .find(|(i, (sid, _))| sid == id && !self.taken[*i]);
        match found {
            Some((i, (_, state))) => {
                self.taken[i] = true;
                Ok(state)
            }
            None => Err(DeviceError::MissingState(id.clone())),
        }
    }

    /// The MMDS store, if the snapshot has one (snapshots of VMs without
    /// MMDS, and older ones, do not).
    pub fn mmds(&mut self) -> Result<Option<&'a MmdsState>, DeviceError> {
        let id = DeviceId::mmds();
        if !self.states.0.iter().any(|(sid, _)| *sid == id) {
            return Ok(None);
        }
        match self.take(&id)? {
            DeviceState::Mmds(s) => Ok(Some(s)),
            other => Err(wrong_kind(id, other)),
        }
    }

    pub fn serial(&mut self) -> Result<&'a SerialSnapshot, DeviceError> {
        let id = DeviceId::serial();
        match self.take(&id)? {
            DeviceState::Serial(s) => Ok(s),
            other => Err(wrong_kind(id, other)),
        }
    }

    pub fn i8042(&mut self) -> Result<&'a I8042State, DeviceError> {
        let id = DeviceId::i8042();
        match self.take(&id)? {
            DeviceState::I8042(s) => Ok(s),
            other => Err(wrong_kind(id, other)),
        }
    }

    pub fn rtc(&mut self) -> Result<&'a RtcSnapshot, DeviceError> {
        let id = DeviceId::rtc();
        match self.take(&id)? {
            DeviceState::Rtc(s) => Ok(s),
            other => Err(wrong_kind(id, other)),
        }
    }

    pub fn tmem(&mut self) -> Result<&'a TmemState, DeviceError> {
        let id = DeviceId::tmem();
        match self.take(&id)? {
            DeviceState::Tmem(s) => Ok(s),
            other => Err(wrong_kind(id, other)),
        }
    }

    pub fn virtio(&mut self, id: &DeviceId) -> Result<&'a VirtioState, DeviceError> {
        match self.take(id)? {
            DeviceState::Virtio(s) => Ok(s),
            other => Err(wrong_kind(id.clone(), other)),
        }
    }

    /// Refuses states that no device of this VM took.
    pub fn finish(self) -> Result<(), DeviceError> {
        match self.taken.iter().position(|taken| !taken) {
            Some(i) => Err(DeviceError::UnknownDevice(self.states.0[i].0.clone())),
            None => Ok(()),
        }
    }
}

fn wrong_kind(id: DeviceId, found: &DeviceState) -> DeviceError {
    DeviceError::WrongKind {
        id,
        found: found.kind(),
    }
}

/// A virtio device whose [`Persist`] state is one case of [`VirtioDeviceState`].
pub(super) trait VirtioPersist: Persist + VirtioDevice + Sized {
    fn wrap(state: Self::State) -> VirtioDeviceState;
    fn unwrap(state: &VirtioDeviceState) -> Option<&Self::State>;
}

macro_rules! virtio_persist {
    ($device:ty, $case:ident) => {
        impl VirtioPersist for $device {
            fn wrap(state: Self::State) -> VirtioDeviceState {
                VirtioDeviceState::$case(state)
            }
            fn unwrap(state: &VirtioDeviceState) -> Option<&Self::State> {
                match state {
                    VirtioDeviceState::$case(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}

virtio_persist!(Block, Block);

impl VirtioPersist for Net {
    fn wrap(state: NetState) -> VirtioDeviceState {
        VirtioDeviceState::Net(Box::new(state))
    }
    fn unwrap(state: &VirtioDeviceState) -> Option<&NetState> {
        match state {
            VirtioDeviceState::Net(s) => Some(s),
            _ => None,
        }
    }
}
virtio_persist!(Rng, Rng);
virtio_persist!(Vsock, Vsock);
virtio_persist!(Balloon, Balloon);
virtio_persist!(VirtioMem, Mem);

impl VirtioDeviceState {
    fn kind(&self) -> &'static str {
        match self {
            Self::Block(_) => "virtio-blk",
            Self::Net(_) => "virtio-net",
            Self::Rng(_) => "virtio-rng",
            Self::Vsock(_) => "virtio-vsock",
            Self::Balloon(_) => "virtio-balloon",
            Self::Mem(_) => "virtio-mem",
        }
    }
}

/// The device's own state, if `device` is a `D`.
fn saved<D: VirtioPersist>(device: &dyn VirtioDevice) -> Option<VirtioDeviceState> {
    let any: &dyn Any = device;
    any.downcast_ref::<D>().map(|d| D::wrap(d.save()))
}

/// The state of a quiesced virtio device and its transport.
pub(super) fn save_virtio(
    id: &DeviceId,
    slot: usize,
    transport: &MmioTransport,
) -> Result<VirtioState, DeviceError> {
    let device = transport.device();
    let state = match transport.device_type() {
        device_type::BLOCK => saved::<Block>(device),
        device_type::NET => saved::<Net>(device),
        device_type::RNG => saved::<Rng>(device),
        device_type::VSOCK => saved::<Vsock>(device),
        device_type::BALLOON => saved::<Balloon>(device),
        device_type::MEM => saved::<VirtioMem>(device),
        _ => None,
    };
    Ok(VirtioState {
        slot: u32::try_from(slot).unwrap_or(u32::MAX),
        transport: Persist::save(transport),
        device: state.ok_or_else(|| DeviceError::Restore {
            id: id.clone(),
            detail: format!(
                "virtio device type {} has no snapshot state",
                transport.device_type()
            ),
        })?,
    })
}

/// A virtio device made fresh (`saved` is `None`, a boot) or rebuilt from
/// its saved state through [`Persist::restore`].
pub(super) fn make_virtio<D: VirtioPersist>(
    id: &DeviceId,
    saved: Option<&VirtioState>,
    args: D::Args,
    fresh: impl FnOnce(D::Args) -> Result<D, DeviceError>,
) -> Result<D, DeviceError>
where
    D::Error: fmt::Display,
{
    match saved {
        None => fresh(args),
        Some(s) => {
            let state = D::unwrap(&s.device).ok_or(DeviceError::WrongKind {
                id: id.clone(),
                found: s.device.kind(),
            })?;
            restore_device::<D>(id, args, state)
        }
    }
}

/// Rebuilds a device from its state through its [`Persist`] implementation.
pub(super) fn restore_device<D: Persist>(
    id: &DeviceId,
    args: D::Args,
    state: &D::State,
) -> Result<D, DeviceError>
where
    D::Error: fmt::Display,
{
    D::restore(args, state).map_err(|e| DeviceError::Restore {
        id: id.clone(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> DeviceStates {
        let mut s = DeviceStates::default();
        s.push(DeviceId::serial(), DeviceState::Serial(Default::default()));
        s.push(DeviceId::tmem(), DeviceState::Tmem(Default::default()));
        s
    }

    #[test]
    fn states_are_found_by_id_in_any_order() {
        let s = states();
        let mut lookup = StateLookup::new(&s);
        assert!(lookup.tmem().is_ok());
        assert!(lookup.serial().is_ok());
        assert!(lookup.finish().is_ok());
    }

    #[test]
    fn a_device_without_state_is_named() {
        let s = states();
        let mut lookup = StateLookup::new(&s);
        let e = lookup.i8042().err().unwrap();
        assert!(matches!(&e, DeviceError::MissingState(id) if *id == DeviceId::i8042()));
        assert!(e.to_string().contains("i8042"), "{e}");
        // A state is taken once: a second device with the same id has none.
        assert!(lookup.serial().is_ok());
        assert!(matches!(lookup.serial(), Err(DeviceError::MissingState(_))));
    }

    #[test]
    fn a_state_for_a_device_the_vm_lacks_is_named() {
        let mut s = states();
        s.push(
            DeviceId::drive("scratch"),
            DeviceState::Tmem(Default::default()),
        );
        let mut lookup = StateLookup::new(&s);
        lookup.serial().unwrap();
        lookup.tmem().unwrap();
        let e = lookup.finish().err().unwrap();
        assert!(matches!(&e, DeviceError::UnknownDevice(id) if id.as_str() == "drive:scratch"));
        assert!(e.to_string().contains("drive:scratch"), "{e}");
    }

    #[test]
    fn a_state_of_another_kind_is_refused() {
        let mut s = DeviceStates::default();
        s.push(DeviceId::serial(), DeviceState::Tmem(Default::default()));
        let e = StateLookup::new(&s).serial().err().unwrap();
        assert!(
            matches!(e, DeviceError::WrongKind { found: "tmem", .. }),
            "{e}"
        );
    }
}
