//! The contract every snapshotted component follows: it owns a plain serde
//! state type, produces it with `save`, and is rebuilt from it with
//! `restore` given whatever host resources it needs (fds, devices, memory).

use serde::de::DeserializeOwned;
use serde::Serialize;

pub trait Persist: Sized {
    /// The component's snapshot state: plain data, no host handles.
    type State: Serialize + DeserializeOwned;
    /// Host resources a restore needs (eventfds, sinks, guest memory).
    type Args;
    type Error;

    fn save(&self) -> Self::State;
    fn restore(args: Self::Args, state: &Self::State) -> Result<Self, Self::Error>;
}
