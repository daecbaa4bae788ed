//! What the daemon keeps of a sandbox, on disk in its directory
//! (`<state>/sbx/<id>/sandbox.json`, written atomically, mode 0600): enough
//! to list it and to resume it after a daemon restart once it is paused. A
//! running sandbox's VMM does not outlive the daemon, so only paused ones are
//! found again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::network::egress::Egress;

/// Where a sandbox is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Running,
    Paused,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Paused => "paused",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// The account it belongs to (12 digits).
    pub account: String,
    pub template: String,
    /// The build of an account's template it was made of (its resume and
    /// forks run that build, whatever the template's tags name since).
    #[serde(default)]
    pub build: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// envd's access token (the SDK sends it as `X-Access-Token`).
    pub access_token: String,
    pub started_at_ms: u64,
    /// When its timeout ends it (or pauses it, with `auto_pause`).
    pub end_at_ms: u64,
    pub auto_pause: bool,
    pub state: State,
    pub cpu_count: u32,
    pub memory_mib: u32,
    pub disk_mib: u64,
    /// The newest pause's snapshot (`pause-<n>.state`, `pause-<n>.mem`).
    pub pause_generation: u32,
    /// A fork's: the directory (under `<state>/sbx/`) its VMM files and
    /// disk overlay are in, shared with the forks made beside it; `None`:
    /// its own directory.
    #[serde(default)]
    pub vm_dir: Option<String>,
    /// The snapshot chain its memory continues, which its next pause is a
    /// diff on: the template base it was cloned from (its state file), then
    /// its own pauses since (`layers`, oldest first). A full pause starts
    /// the chain again: no base, and itself the only layer.
    #[serde(default)]
    pub base: Option<PathBuf>,
    #[serde(default)]
    pub layers: Vec<u32>,
    /// Whether its VMM's last snapshot is the top of that chain (a fork of
    /// a sandbox that was paused continues the other sandbox's chain, which
    /// it does not own: its first pause is full).
    #[serde(default)]
    pub diff_ready: bool,
    /// E2B's `autoResume`: a request through the proxy for it while it is
    /// paused resumes it first.
    #[serde(default)]
    pub auto_resume: bool,
    /// The timeout it was created with (seconds; 0 in records older than
    /// this field): what an automatic resume gives it again.
    #[serde(default)]
    pub timeout_s: u64,
    /// Its VM has `eth0` (its template's `network`): each of its VMMs runs
    /// in a network namespace of its own (`super::net`).
    #[serde(default)]
    pub networked: bool,
    /// E2B's `allow_internet_access` as this sandbox has it (`egress`
    /// denies no `0.0.0.0/0`); the whole rule when `egress` is absent (a
    /// record older than it).
    #[serde(default)]
    pub internet: bool,
    /// Its egress rules (`network.allowOut`/`denyOut`).
    #[serde(default)]
    pub egress: Option<Egress>,
}

/// The most diffs a sandbox's chain grows to before a pause is full again
/// (every resume reads the whole chain).
pub const MAX_DIFF_LAYERS: usize = 4;

/// The file a sandbox's record is in.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("sandbox.json")
}

impl Record {
    /// What its guest may reach beyond its namespace.
    pub fn egress(&self) -> Egress {
        match &self.egress {
            Some(e) => e.clone(),
            None if self.internet => Egress::default(),
            None => Egress::closed(),
        }
    }

    /// Sets its egress rules (and `internet`, which older daemons read).
    pub fn set_egress(&mut self, egress: Egress) {
        self.internet = egress.internet();
        self.egress = Some(egress);
    }

    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::fs::write_private(&path(dir), &json)
    }

    pub fn load(dir: &Path) -> anyhow::Result<Record> {
        let bytes = std::fs::read(path(dir))?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// The snapshot files of pause `generation`.
    pub fn snapshot_files(dir: &Path, generation: u32) -> (PathBuf, PathBuf) {
        (
            dir.join(format!("pause-{generation}.state")),
            dir.join(format!("pause-{generation}.mem")),
        )
    }

    /// Whether its next pause may be a diff on its chain.
    pub fn pause_is_diff(&self) -> bool {
        self.diff_ready
            && (self.base.is_some() || !self.layers.is_empty())
            && self.layers.len() < MAX_DIFF_LAYERS
    }

    /// Every snapshot file its paused memory needs (base, then layers).
    pub fn chain_files(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        if let Some(b) = &self.base {
            files.push(b.clone());
            files.push(b.with_extension("mem"));
        }
        for g in &self.layers {
            let (s, m) = Record::snapshot_files(dir, *g);
            files.push(s);
            files.push(m);
        }
        files
    }

    /// Whether its metadata has every `(key, value)` of `wanted`.
    pub fn matches(&self, wanted: &[(String, String)]) -> bool {
        wanted
            .iter()
            .all(|(k, v)| self.metadata.get(k).is_some_and(|m| m == v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_matches_metadata() {
        let dir = std::env::temp_dir().join(format!("spore-sbx-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rec = Record {
            id: "abc".into(),
            account: "000000000000".into(),
            template: "base".into(),
            build: None,
            metadata: [("a".to_string(), "1".to_string())].into(),
            access_token: "t".into(),
            started_at_ms: 1,
            end_at_ms: 2,
            auto_pause: true,
            state: State::Paused,
            cpu_count: 1,
            memory_mib: 512,
            disk_mib: 2048,
            pause_generation: 3,
            vm_dir: Some("f-x".into()),
            base: None,
            layers: Vec::new(),
            diff_ready: false,
            auto_resume: false,
            timeout_s: 300,
            networked: true,
            internet: false,
            egress: None,
        };
        rec.save(&dir).unwrap();
        let back = Record::load(&dir).unwrap();
        assert_eq!(back.state, State::Paused);
        assert_eq!(back.pause_generation, 3);
        assert!(back.matches(&[("a".into(), "1".into())]));
        assert!(!back.matches(&[("a".into(), "2".into())]));
        assert!(back.matches(&[]));
        // A record written before diff pauses: its next pause is full.
        let mut old: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path(&dir)).unwrap()).unwrap();
        for k in ["base", "layers", "diff_ready"] {
            old.as_object_mut().unwrap().remove(k);
        }
        let old: Record = serde_json::from_value(old).unwrap();
        assert!(!old.pause_is_diff());
        let chained = Record {
            base: Some("/s/bases/base-x.state".into()),
            layers: vec![1, 2],
            diff_ready: true,
            ..old.clone()
        };
        assert!(chained.pause_is_diff());
        assert_eq!(chained.chain_files(&dir).len(), 6);
        assert_eq!(
            chained.chain_files(&dir)[1],
            PathBuf::from("/s/bases/base-x.mem")
        );
        let long = Record {
            layers: (1..=4).collect(),
            ..chained
        };
        assert!(!long.pause_is_diff());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
