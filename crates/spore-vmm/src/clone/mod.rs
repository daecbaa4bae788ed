//! Templates and clones: copy-on-write copies of a running microVM, each
//! in a VMM process of its own.
//!
//! A clone request pauses the source VM at an instruction boundary, captures
//! its state in memory ([`crate::snapshot::capture_state`]) and turns its RAM
//! into a **template**: a stack of frozen memfds ([`crate::memory::template`]).
//! Each clone is a new `spore vmm` process that receives the memfds and the
//! state over a Unix socket (SCM_RIGHTS, [`handoff`]), maps the template
//! privately, restores the state and resumes: nothing is copied and nothing
//! is written to disk, so the cost does not grow with memory size.
//!
//! - **zygote** mode: the source stays frozen as the template (its devices
//!   stay stopped, a resume is refused) and serves later clone requests.
//! - **continue** mode: the source resumes with a private (copy-on-write)
//!   view of the template; each later request makes a new template from its
//!   current memory (an overlay of the pages it wrote since).
//!
//! A clone can itself be cloned: its template is its parent's layers plus an
//! overlay of the pages it wrote. Templates are reference-counted by the
//! kernel: the source holds the layer fds, every clone holds its own fds and
//! mappings, and a layer's memory is freed when the last of them is gone
//! (killing the source does not disturb its clones).
//!
//! A booted VM's whole clone tree counts at most [`CloneConfig::max_clones`]
//! clones (HyperFork's mitigation against ASLR brute force across clones),
//! split between the clones through the handoff; a host may cap its clone
//! processes too ([`limits`]). A guest's `FORK` is served only when
//! [`CloneConfig::guest_fork`] is on, clones get it only when their source
//! grants it, and clones end with their source unless
//! [`CloneConfig::clones_outlive_source`].
//!
//! Clone processes make their KVM VM, vCPUs, vCPU threads and memory slots
//! (over a placeholder mapping) while the template is on its way; standby
//! processes, started ahead, do it before the request, and for a zygote
//! even restore a clone paused, so that a request only numbers and starts it.
//!
//! Module map: [`source`] (the source side), [`spawn`] (starting clone
//! processes), [`handoff`] (the wire format between them), [`args`] (a
//! clone process's command line; what the process does is
//! `crate::vmm::clone_process`), [`child`] (the clone
//! side's restore and start), [`identity`] (a clone's generation, vsock CID
//! and disks), [`limits`] (the tree's budget, the host's limit). The VMM
//! keeps [`SourceState`] and [`ChildState`] apart.

pub mod args;
pub mod child;
pub mod factory;
pub mod handoff;
pub mod identity;
pub mod limits;
pub mod network;
pub mod source;
pub mod spawn;
mod sys;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::memory::template::MemoryLayer;

/// Default [`CloneConfig::max_clones`].
pub const DEFAULT_MAX_CLONES: u64 = 1000;
/// The most clones one request may ask for (more is a typo, not a plan).
pub const MAX_PER_REQUEST: u32 = 4096;
/// How long a clone process may take to restore and report back.
pub const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// What happens to the source VM once it is a template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloneMode {
    /// The source stays frozen as the template.
    #[default]
    Zygote,
    /// The source resumes with its own copy-on-write view.
    Continue,
}

/// `PUT /clone/config`: settings for clone requests that do not say, and
/// for guest-triggered forks. Clones inherit them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloneConfig {
    pub mode: CloneMode,
    /// Clones a guest `FORK` with argument 0 asks for; 0 turns the VM into
    /// a template without starting any (clones are then asked for with
    /// `PUT /clone`).
    pub fork_count: u32,
    /// The most clones this VM serves as a source, over all its templates.
    pub max_clones: u64,
    /// Where clones' API sockets and logs go (default: beside this VM's
    /// API socket, else the temporary directory).
    pub socket_dir: Option<String>,
    /// Clone processes kept started ahead of time (KVM VM, vCPUs and
    /// memory slots made), waiting for a template; for a zygote they
    /// restore a clone ahead, paused, and a request only starts it.
    pub standby: u32,
    /// Clones write their signal-port marks to `<name>.marks.json`.
    pub marks: bool,
    /// The guest may clone this VM with the signal port's `FORK` (off by
    /// default: a guest `FORK` then fails at once; `PUT /clone`, the
    /// host's choice, is always allowed).
    pub guest_fork: bool,
    /// Clones of this VM get `guest_fork` on (else they start with it off
    /// whatever this VM's is).
    pub clones_may_fork: bool,
    /// Clones each clone of this VM may make in turn (its whole subtree),
    /// drawn from this VM's budget; default: half of what is left when
    /// `clones_may_fork`, else none. See [`limits::share`].
    pub clone_budget: Option<u64>,
    /// The most `spore vmm --clone-handoff` processes (clones and standby
    /// processes) that may run on this host; `SPORE_MAX_CLONES_HOST` in the
    /// environment sets one too (the lower wins).
    pub host_max_clones: Option<u64>,
    /// Clones go on running when this VMM ends (else they end with it,
    /// the default: a clone watches its handoff socket to the source).
    pub clones_outlive_source: bool,
}

impl Default for CloneConfig {
    fn default() -> Self {
        Self {
            mode: CloneMode::Zygote,
            fork_count: 1,
            max_clones: DEFAULT_MAX_CLONES,
            socket_dir: None,
            standby: 0,
            marks: false,
            guest_fork: false,
            clones_may_fork: false,
            clone_budget: None,
            host_max_clones: None,
            clones_outlive_source: false,
        }
    }
}

impl CloneConfig {
    pub fn validate(&self) -> Result<(), CloneError> {
        if self.max_clones == 0 {
            return Err(CloneError::BadRequest(
                "max_clones must be at least 1".into(),
            ));
        }
        if self.fork_count > MAX_PER_REQUEST {
            return Err(CloneError::BadRequest(format!(
                "fork_count {} is more than {MAX_PER_REQUEST} clones",
                self.fork_count
            )));
        }
        if self.host_max_clones == Some(0) {
            return Err(CloneError::BadRequest(
                "host_max_clones must be at least 1 (or absent: no host limit)".into(),
            ));
        }
        if self.standby > 64 {
            return Err(CloneError::BadRequest(format!(
                "standby {} is more than 64 waiting processes",
                self.standby
            )));
        }
        Ok(())
    }
}

/// `PUT /clone`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub count: u32,
    #[serde(default)]
    pub mode: Option<CloneMode>,
    #[serde(default)]
    pub socket_dir: Option<String>,
    /// Each clone's network namespace and new addresses (see [`network`]);
    /// required when the VM has network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<network::CloneNetwork>,
}

/// One started clone, as the response lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CloneInfo {
    /// The clone number its `FORK` returns (1, 2, ... per source VM).
    pub index: u64,
    pub name: String,
    pub socket: String,
    pub pid: u32,
    /// Its serial console and log.
    pub log: String,
    /// Host CLOCK_MONOTONIC (ns) when its vCPUs were started.
    pub start_ns: u64,
    /// Whether it was a process started ahead of time (standby).
    pub standby: bool,
}

/// The response to `PUT /clone`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CloneReport {
    pub template: String,
    pub mode: CloneMode,
    /// Host CLOCK_MONOTONIC (ns) when the request arrived.
    pub request_ns: u64,
    /// Time spent pausing the source and making the template (0 when a
    /// zygote's existing template served).
    pub template_us: u64,
    /// Clones this VM has served so far, and its cap.
    pub served: u64,
    pub max_clones: u64,
    pub clones: Vec<CloneInfo>,
    /// The standby processes left once this request took its own (before
    /// the pool is refilled): a host may set each up (`spore serve` moves
    /// each into its own cgroup) before a later request hands it out.
    #[serde(default)]
    pub standby_processes: Vec<StandbyProcess>,
}

/// A standby process (a clone process started ahead) by name and pid.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StandbyProcess {
    pub name: String,
    pub pid: u32,
}

impl StandbyProcess {
    /// The standby pool of `st` as it is now.
    pub fn pool(st: &SourceState) -> Vec<StandbyProcess> {
        st.standby
            .iter()
            .map(|p| StandbyProcess {
                name: p.name.clone(),
                pid: p.child.pid(),
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error("{0}")]
    BadRequest(String),
    #[error("this VM has served {served} clones and may serve {cap} (max_clones, shared by its clone tree): it refuses more; boot a fresh VM as the template (or raise the cap with PUT /clone/config)")]
    CapReached { served: u64, cap: u64 },
    #[error("{count} clones asked for, but this VM may serve only {left} more (max_clones {cap}, shared by its clone tree; {served} served or given to its clones)")]
    OverCap {
        count: u32,
        left: u64,
        served: u64,
        cap: u64,
    },
    #[error("{running} clone processes run on this host and the host limit is {limit} ({source_of}): {count} more refused")]
    HostLimit {
        running: u64,
        count: u64,
        limit: u64,
        source_of: &'static str,
    },
    #[error(
        "guest fork is off for this VM (PUT /clone/config {{\"guest_fork\": true}} turns it on)"
    )]
    GuestForkOff,
    #[error(transparent)]
    NotStarted(#[from] crate::vm::NotStarted),
    #[error("the microVM is {0}; clone a running (or paused) microVM")]
    NotRunning(&'static str),
    #[error("this microVM {0} and cannot be cloned (its memory lives outside the template)")]
    Unsupported(String),
    #[error("cannot capture the VM state: {0}")]
    Capture(String),
    #[error("cannot make the template: {0}")]
    Template(#[from] crate::memory::template::TemplateError),
    #[error("cannot start a clone process: {0}")]
    Spawn(String),
    #[error("clone {name} failed: {detail} (see {log})")]
    Child {
        name: String,
        detail: String,
        log: String,
    },
    #[error("cannot {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl CloneError {
    /// Whether the client asked for something wrong (4xx) rather than the
    /// host failing (500).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            CloneError::BadRequest(_)
                | CloneError::CapReached { .. }
                | CloneError::OverCap { .. }
                | CloneError::HostLimit { .. }
                | CloneError::GuestForkOff
                | CloneError::NotStarted(_)
                | CloneError::NotRunning(_)
                | CloneError::Unsupported(_)
        )
    }
}

/// A frozen image of a VM that clones start from.
pub struct Template {
    pub id: String,
    pub layers: Vec<MemoryLayer>,
    /// bincode of [`crate::snapshot::MicrovmState`].
    pub state: Arc<Vec<u8>>,
    pub mem_size: u64,
    /// The vCPU that signalled `FORK`, if a guest made this template: its
    /// clones read their clone number there.
    pub fork_vcpu: Option<u8>,
    /// The snapshot its memory is a diff on, and the pages changed since:
    /// a clone's Diff snapshots apply to its source's last snapshot.
    pub chain: crate::snapshot::ChainState,
    /// The vsock device's guest CID when the template was made. A clone's
    /// configuration keeps its source's CID while its device has its own:
    /// the clones of a clone take the device's, which its state carries.
    pub vsock_cid: Option<u32>,
}

/// The source side: what this VM is and has done as a clone source. A
/// clone starts with its own (its parent's settings, its memory layers and
/// generation); nothing of a clone process's start-up lives here.
#[derive(Default)]
pub struct SourceState {
    pub config: CloneConfig,
    /// The layers this VM's RAM is mapped privately from (a clone, or a
    /// source that went on in continue mode); empty while RAM is its own.
    pub ram_layers: Vec<MemoryLayer>,
    /// The last template made; a zygote serves all requests from it.
    pub template: Option<Arc<Template>>,
    pub zygote: bool,
    /// Clones served as a source (numbered 1, 2, ...).
    pub served: u64,
    /// Budget handed to those clones for their own clones (the cap counts
    /// these with `served`).
    pub granted: u64,
    /// A clone's share of its tree's budget (what its source gave it);
    /// `None` for a VM that is no clone (its `max_clones` is the tree's).
    pub tree_budget: Option<u64>,
    /// Clone generation: 0 for a booted VM, parent's + 1 for a clone.
    pub generation: u64,
    /// This VMM's API socket (clones go beside it).
    pub api_socket: Option<PathBuf>,
    /// Processes started ahead of time, waiting for a template.
    pub standby: Vec<spawn::CloneProcess>,
    /// Names handed out so far (clone and standby processes).
    pub names: u64,
}

impl SourceState {
    /// The most clones this VM and its clones' subtrees may still count:
    /// `max_clones`, or less for a clone (its share of the tree's budget).
    pub fn cap(&self) -> u64 {
        self.tree_budget
            .map_or(self.config.max_clones, |b| b.min(self.config.max_clones))
    }

    /// What this VM has used of [`Self::cap`].
    pub fn spent(&self) -> u64 {
        self.served.saturating_add(self.granted)
    }
}

/// The clone side: a clone process on its way to running (`spore vmm
/// --clone-handoff`); empty in every other VMM.
#[derive(Default)]
pub struct ChildState {
    /// KVM objects made ahead of the template.
    pub prepared: Option<child::Prepared>,
    /// A clone restored ahead (a zygote's standby), waiting for its number.
    pub awaiting_go: Option<AwaitingGo>,
}

/// What a clone restored ahead still needs when its number comes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitingGo {
    /// The vCPU that signalled the template's `FORK`, if a guest made it.
    pub fork_vcpu: Option<u8>,
    pub generation: u64,
    /// The clone's network settings (a new MAC/IPv4 given at the go).
    pub network: Option<network::CloneNetwork>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_config_defaults_and_limits() {
        let c = CloneConfig::default();
        assert_eq!(
            (c.mode, c.fork_count, c.max_clones),
            (CloneMode::Zygote, 1, 1000)
        );
        assert!(c.validate().is_ok());
        for bad in [
            CloneConfig {
                max_clones: 0,
                ..Default::default()
            },
            CloneConfig {
                fork_count: MAX_PER_REQUEST + 1,
                ..Default::default()
            },
            CloneConfig {
                standby: 65,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().unwrap_err().is_client_error());
        }
        let cap = CloneError::CapReached { served: 3, cap: 3 };
        assert!(cap.to_string().contains("max_clones"));
        assert!(cap.is_client_error());
    }
}
