//! E2B's template-build API (`Template.build` in the e2b SDK) on spore's
//! templates: a build runs its steps in a VM booted from a copy of its
//! parent template's image, and that image, once the steps ran, is the new
//! template's: booted by its zygote on the account's first create, its
//! start and ready commands run there, as any template's are.
//!
//! The calls, as the SDK makes them:
//! 1. `POST /v3/templates` (`name`, `cpuCount`, `memoryMB`): a template of
//!    the account's (a new build of it if it exists), answered with its id
//!    and a build id; the build waits for its steps.
//! 2. For each `COPY`: `GET /templates/{id}/files/{hash}` (whether its files
//!    are here, and where to upload them), then a `PUT` of the tar there
//!    (a URL with a token of its own: the SDK sends it without its key).
//! 3. `POST /v2/templates/{id}/builds/{build}`: the parent (`fromTemplate`,
//!    or `fromImage: "e2bdev/base"`, E2B's base image, which is spore's
//!    `base` template), the steps (`RUN`, `COPY`, `ENV`, `WORKDIR`,
//!    `USER`), the start and ready commands. Answered at once; the build
//!    runs in the background.
//! 4. `GET /templates/{id}/builds/{build}/status?logsOffset=N` until
//!    `ready` or `error`, with the build's log.
//!
//! On disk, `<state>/sbx-templates/<account>/`: `files/<hash>` (uploads)
//! and `<name>/` per template: `built-<build>.json` (what a sandbox of
//! each build that succeeded runs), `template.json` (that of the build its
//! `default` tag names), `tags.json` ([`tags`]), `build-<id>.json` (each
//! build's status and log) and `rootfs-<build>.ext4` (each image);
//! `.layers/` holds the build cache ([`layers`]). A build the daemon was
//! running when it stopped is marked failed when it starts again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checks::{check_steps, parent_name, template_name, valid_hash};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::events::Level;
use super::{SandboxError, Sandboxes, TemplateSpec};
use crate::mutex::lock;

mod checks;
mod free_space;
mod layers;
mod run;
mod steps;
pub mod tags;

/// How long one step may run.
const STEP_LIMIT: Duration = Duration::from_secs(1800);
/// The largest file upload (a `COPY`'s tar, handed to the build VM whole).
pub const MAX_UPLOAD: u64 = 256 << 20;
/// The most steps one build may have.
const MAX_STEPS: usize = 500;
/// How much of a step's output its log keeps.
const OUTPUT_TAIL: usize = 64 << 10;
/// The entries one status call answers at most (E2B's).
const STATUS_LIMIT: usize = 100;

/// `POST /v3/templates`' body (E2B's `TemplateBuildRequestV3`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequest {
    name: Option<String>,
    /// E2B's older name for `name`.
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    cpu_count: Option<u8>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u32>,
    /// Free space the image keeps after the steps ([`free_space`]).
    min_free_disk_mb: Option<u32>,
}

/// `POST /v2/templates/{id}/builds/{build}`' body (`TemplateBuildStartV2`).
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    steps: Vec<Step>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    /// Run every step, whatever the build cache holds ([`layers`]).
    #[serde(default)]
    force: bool,
}

/// One step (`TemplateStep`).
#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    /// Run this step and the ones after it, whatever the build cache
    /// holds (the SDK's `skip_cache()`).
    #[serde(default)]
    force: bool,
}

/// A build's status (`TemplateBuildStatus`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

/// One line of a build's log (`BuildLogEntry`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub at_ms: u64,
    pub level: Level,
    pub message: String,
    /// `base`, a step's number (from 1, as the SDK counts) or `finalize`.
    pub step: Option<String>,
}

/// Why a build failed (`BuildStatusReason`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    pub message: String,
    pub step: Option<String>,
}

/// A build, as kept in `build-<id>.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Build {
    pub template_id: String,
    pub build_id: String,
    pub account: String,
    pub name: String,
    pub status: Status,
    pub log: Vec<LogLine>,
    pub reason: Option<Reason>,
    pub cpu_count: Option<u8>,
    pub memory_mib: Option<u32>,
    /// What it is tagged with when it succeeds ([`tags`]).
    pub tags: Vec<String>,
    /// `minFreeDiskMb`: the image grown to keep this much free.
    #[serde(default)]
    pub min_free_disk_mib: Option<u32>,
}

/// A built template, as kept in `template.json`.
#[derive(Serialize, Deserialize)]
pub struct Built {
    pub template_id: String,
    pub account: String,
    pub build_id: String,
    pub spec: TemplateSpec,
}

/// The builds the daemon knows, and where they are kept.
pub struct Builds {
    root: PathBuf,
    /// By build id.
    table: Mutex<HashMap<String, Build>>,
    /// Template id → (account, name).
    ids: Mutex<HashMap<String, (String, String)>>,
    /// Each (account, name)'s tags ([`tags`]).
    tags: Mutex<HashMap<(String, String), tags::TagMap>>,
    /// What upload URLs' tokens are made with (new at each start: an
    /// upload link is used right after it is asked for).
    secret: [u8; 32],
}

impl Builds {
    /// The builds and built templates under `root`
    /// (`<state>/sbx-templates`); builds that were running are marked
    /// failed. Returns them and the built templates to serve.
    pub fn load(root: &Path) -> anyhow::Result<(Builds, Vec<Built>)> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| anyhow::anyhow!("the OS random number generator: {e}"))?;
        let builds = Builds {
            root: root.to_path_buf(),
            table: Mutex::default(),
            ids: Mutex::default(),
            tags: Mutex::default(),
            secret,
        };
        let mut built = Vec::new();
        for account in entries(root, true) {
            for dir in entries(&account, true) {
                if dir
                    .file_name()
                    .is_some_and(|n| n == "files" || n == ".layers")
                {
                    continue;
                }
                let default = read_json::<Built>(&dir.join("template.json"));
                // Templates built before tags: their build is `default`.
                let tags = Builds::read_tags(&dir).or_else(|| {
                    default.as_ref().map(|t| {
                        let at = tags::Tagged {
                            build_id: t.build_id.clone(),
                            at_ms: 0,
                        };
                        [(tags::DEFAULT_TAG.to_string(), at)].into()
                    })
                });
                if let Some(t) = default {
                    lock(&builds.ids).insert(
                        t.template_id.clone(),
                        (t.account.clone(), t.spec.name.clone()),
                    );
                    if let Some(tags) = tags {
                        lock(&builds.tags).insert((t.account.clone(), t.spec.name.clone()), tags);
                    }
                    built.push(t);
                } else if let (Some(tags), Some(account), Some(name)) = (
                    tags,
                    account.file_name().and_then(|n| n.to_str()),
                    dir.file_name().and_then(|n| n.to_str()),
                ) {
                    lock(&builds.tags).insert((account.to_string(), name.to_string()), tags);
                }
                for file in entries(&dir, false) {
                    let is_build = file
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("build-") && n.ends_with(".json"));
                    let Some(mut b) = is_build.then(|| read_json::<Build>(&file)).flatten() else {
                        continue;
                    };
                    if matches!(b.status, Status::Waiting | Status::Building) {
                        let why = "the daemon stopped during the build; build it again";
                        b.status = Status::Error;
                        b.reason = Some(Reason {
                            message: why.into(),
                            step: None,
                        });
                        b.log.push(line(Level::Error, why, None));
                        let _ = builds.save(&b);
                    }
                    lock(&builds.ids)
                        .entry(b.template_id.clone())
                        .or_insert_with(|| (b.account.clone(), b.name.clone()));
                    lock(&builds.table).insert(b.build_id.clone(), b);
                }
            }
        }
        Ok((builds, built))
    }

    /// The id of `account`'s template `name`, if a build registered it.
    fn template_id_of(&self, account: &str, name: &str) -> Option<String> {
        lock(&self.ids)
            .iter()
            .find(|(_, (a, n))| a == account && n == name)
            .map(|(id, _)| id.clone())
    }

    fn template_dir(&self, account: &str, name: &str) -> PathBuf {
        self.root.join(account).join(name)
    }

    fn files_dir(&self, account: &str) -> PathBuf {
        self.root.join(account).join("files")
    }

    fn save(&self, b: &Build) -> std::io::Result<()> {
        let dir = self.template_dir(&b.account, &b.name);
        crate::fs::create_private_dir(&dir)?;
        let json = serde_json::to_vec_pretty(b).map_err(std::io::Error::other)?;
        crate::fs::write_private(&dir.join(format!("build-{}.json", b.build_id)), &json)
    }

    /// The token of an upload URL for `hash` of template `template_id`.
    fn upload_token(&self, template_id: &str, hash: &str) -> String {
        let mut h = sha2::Sha256::new();
        h.update(self.secret);
        h.update(template_id.as_bytes());
        h.update(b"/");
        h.update(hash.as_bytes());
        hex(&h.finalize())
    }

    /// Appends to a build's log (and saves it at a step's end).
    fn log(&self, build_id: &str, level: Level, message: &str, step: Option<&str>) {
        if let Some(b) = lock(&self.table).get_mut(build_id) {
            b.log.push(line(level, message, step));
        }
    }

    fn update(&self, build_id: &str, f: impl FnOnce(&mut Build)) -> Option<Build> {
        let mut table = lock(&self.table);
        let b = table.get_mut(build_id)?;
        f(b);
        let copy = b.clone();
        drop(table);
        if let Err(e) = self.save(&copy) {
            tracing::warn!(build = %build_id, "template build: saving its record: {e}");
        }
        Some(copy)
    }
}

fn line(level: Level, message: &str, step: Option<&str>) -> LogLine {
    LogLine {
        at_ms: crate::clock::unix_ms(),
        level,
        message: message.to_string(),
        step: step.map(str::to_string),
    }
}

/// The directories (`dirs`) or the files in `dir`; none if it cannot be
/// read.
fn entries(dir: &Path, dirs: bool) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| if dirs { p.is_dir() } else { p.is_file() })
        .collect()
}

fn read_json<T: serde::de::DeserializeOwned>(file: &Path) -> Option<T> {
    let bytes = std::fs::read(file).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!("{}: {e}; skipped", file.display());
            None
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sandboxes {
    /// `POST /v3/templates`: a new build of `account`'s template.
    pub fn request_build(
        &self,
        account: &str,
        req: BuildRequest,
    ) -> Result<serde_json::Value, SandboxError> {
        let asked = req
            .name
            .or(req.alias)
            .ok_or_else(|| SandboxError::BadRequest("a template build needs a name".into()))?;
        let name = template_name(&asked)?;
        let tags = tags::build_tags(&asked, &req.tags)?;
        if self.templates.contains_key(&name) {
            return Err(SandboxError::Conflict(format!(
                "template {name:?} is the daemon's (--sandbox-template); build under another name"
            )));
        }
        if let Some(c) = req.cpu_count.filter(|c| !(1..=32).contains(c)) {
            return Err(SandboxError::BadRequest(format!("cpuCount {c}: 1 to 32")));
        }
        if let Some(m) = req
            .min_free_disk_mb
            .filter(|m| *m > free_space::MAX_MIN_FREE_MIB)
        {
            return Err(SandboxError::BadRequest(format!(
                "minFreeDiskMb {m}: at most {}",
                free_space::MAX_MIN_FREE_MIB
            )));
        }
        if let Some(m) = req.memory_mb.filter(|m| !(128..=65_536).contains(m)) {
            return Err(SandboxError::BadRequest(format!(
                "memoryMB {m}: 128 to 65536"
            )));
        }
        let template_id = match self.builds.template_id_of(account, &name) {
            Some(id) => id,
            None => super::new_id()?,
        };
        let build = Build {
            template_id: template_id.clone(),
            build_id: super::new_uuid()?,
            account: account.to_string(),
            name: name.clone(),
            status: Status::Waiting,
            log: Vec::new(),
            reason: None,
            cpu_count: req.cpu_count,
            memory_mib: req.memory_mb,
            tags,
            min_free_disk_mib: req.min_free_disk_mb.filter(|m| *m > 0),
        };
        self.builds
            .save(&build)
            .map_err(|e| SandboxError::Internal(format!("template {name}: {e}")))?;
        lock(&self.builds.ids).insert(template_id.clone(), (account.to_string(), name.clone()));
        let answer = serde_json::json!({
            "templateID": template_id,
            "buildID": build.build_id,
            "public": false,
            "names": [name],
            "aliases": [name],
            "tags": build.tags,
        });
        lock(&self.builds.table).insert(build.build_id.clone(), build);
        Ok(answer)
    }

    /// `GET /templates/aliases/{alias}`: the template `alias` names for
    /// `account` (one it registered with a build, finished or not, or one of
    /// the daemon's); 404 otherwise.
    pub fn template_alias(
        &self,
        account: &str,
        alias: &str,
    ) -> Result<serde_json::Value, SandboxError> {
        let not_found = || SandboxError::NotFound(format!("template alias {alias:?} not found"));
        let name = template_name(alias).map_err(|_| not_found())?;
        match self.builds.template_id_of(account, &name) {
            Some(id) => Ok(serde_json::json!({ "templateID": id, "public": false })),
            None if self.templates.contains_key(&name) => {
                Ok(serde_json::json!({ "templateID": name, "public": true }))
            }
            None => Err(not_found()),
        }
    }

    /// The (account, name) of `account`'s template `template_id`.
    fn built_name(&self, account: &str, template_id: &str) -> Result<String, SandboxError> {
        match lock(&self.builds.ids).get(template_id) {
            Some((a, n)) if a == account => Ok(n.clone()),
            _ => Err(SandboxError::NotFound(format!(
                "template \"{template_id}\" not found"
            ))),
        }
    }

    /// `GET /templates/{id}/files/{hash}`: whether the files are here, and
    /// where to `PUT` them (`base_url`: how the client reached this API).
    pub fn file_upload_link(
        &self,
        account: &str,
        template_id: &str,
        hash: &str,
        base_url: &str,
    ) -> Result<serde_json::Value, SandboxError> {
        self.built_name(account, template_id)?;
        if !valid_hash(hash) {
            return Err(SandboxError::BadRequest(format!(
                "files hash {hash:?}: lowercase hex SHA-256"
            )));
        }
        let present = self.builds.files_dir(account).join(hash).is_file();
        let token = self.builds.upload_token(template_id, hash);
        Ok(serde_json::json!({
            "present": present,
            "url": format!("{base_url}/templates/{template_id}/files/{hash}?token={token}"),
        }))
    }

    /// Where the upload of `hash` for template `template_id` goes, if
    /// `token` is that upload's (the upload carries no API key).
    pub fn upload_destination(
        &self,
        template_id: &str,
        hash: &str,
        token: &str,
    ) -> Result<PathBuf, SandboxError> {
        let expected = self.builds.upload_token(template_id, hash);
        let account = lock(&self.builds.ids)
            .get(template_id)
            .map(|(a, _)| a.clone());
        match account {
            Some(a)
                if valid_hash(hash) && constant_time_eq(token.as_bytes(), expected.as_bytes()) =>
            {
                let dir = self.builds.files_dir(&a);
                crate::fs::create_private_dir(&dir)
                    .map_err(|e| SandboxError::Internal(e.to_string()))?;
                Ok(dir.join(hash))
            }
            _ => Err(SandboxError::NotFound(
                "no such upload (its link may be from before a restart: ask for it again)".into(),
            )),
        }
    }

    /// `POST /v2/templates/{id}/builds/{build}`: checks the build and runs
    /// it in the background.
    pub fn start_build(
        self: &Arc<Self>,
        account: &str,
        template_id: &str,
        build_id: &str,
        start: BuildStart,
    ) -> Result<(), SandboxError> {
        let name = self.built_name(account, template_id)?;
        let parent = parent_name(&start)?;
        let parent = self.template_for(account, &parent)?;
        check_steps(&start.steps, &self.builds.files_dir(account))?;
        for (what, c) in [
            ("startCmd", &start.start_cmd),
            ("readyCmd", &start.ready_cmd),
        ] {
            if c.as_ref()
                .is_some_and(|c| c.trim().is_empty() || c.len() > 4096)
            {
                return Err(SandboxError::BadRequest(format!(
                    "{what}: a command of 1 to 4096 bytes"
                )));
            }
        }
        {
            let mut table = lock(&self.builds.table);
            let b = table
                .get_mut(build_id)
                .filter(|b| b.template_id == template_id)
                .ok_or_else(|| SandboxError::NotFound(format!("build \"{build_id}\" not found")))?;
            if b.status != Status::Waiting {
                return Err(SandboxError::Conflict(format!(
                    "build {build_id} was started already"
                )));
            }
            b.status = Status::Building;
        }
        self.builds.log(
            build_id,
            Level::Info,
            &format!("building template {name} from {}", parent.spec.name),
            Some("base"),
        );
        self.builds.update(build_id, |_| {});
        let (me, build_id) = (self.clone(), build_id.to_string());
        tokio::spawn(async move {
            let started = Instant::now();
            let result = me.run_build(&build_id, &parent, &start).await;
            match result {
                Ok(()) => {
                    let msg = format!("template ready ({} s)", started.elapsed().as_secs());
                    me.builds
                        .log(&build_id, Level::Info, &msg, Some("finalize"));
                    me.builds.update(&build_id, |b| b.status = Status::Ready);
                }
                Err((message, step)) => {
                    tracing::warn!(build = %build_id, "template build failed: {message}");
                    me.builds
                        .log(&build_id, Level::Error, &message, step.as_deref());
                    me.builds.update(&build_id, |b| {
                        b.status = Status::Error;
                        b.reason = Some(Reason { message, step });
                    });
                }
            }
        });
        Ok(())
    }

    /// `GET /templates/{id}/builds/{build}/status`: the build's status and
    /// its log from `offset` (at most 100 entries a call).
    pub fn build_status(
        &self,
        account: &str,
        template_id: &str,
        build_id: &str,
        offset: usize,
        level: Option<Level>,
    ) -> Result<serde_json::Value, SandboxError> {
        self.built_name(account, template_id)?;
        let b = lock(&self.builds.table)
            .get(build_id)
            .filter(|b| b.template_id == template_id)
            .cloned()
            .ok_or_else(|| SandboxError::NotFound(format!("build \"{build_id}\" not found")))?;
        let entry = |l: &LogLine| {
            let mut v = serde_json::json!({
                "timestamp": crate::clock::iso_ms(l.at_ms),
                "level": l.level,
                "message": l.message,
            });
            if let Some(s) = &l.step {
                v["step"] = s.clone().into();
            }
            v
        };
        let entries: Vec<_> = b
            .log
            .iter()
            .skip(offset)
            .filter(|l| level.is_none_or(|min| l.level >= min))
            .take(STATUS_LIMIT)
            .map(entry)
            .collect();
        let mut v = serde_json::json!({
            "templateID": b.template_id,
            "buildID": b.build_id,
            "status": b.status,
            "logs": [],
            "logEntries": entries,
        });
        if let Some(r) = &b.reason {
            let mut reason = serde_json::json!({ "message": r.message });
            if let Some(s) = &r.step {
                reason["step"] = s.clone().into();
            }
            v["reason"] = reason;
        }
        Ok(v)
    }
}

/// Compares two tokens in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_are_kept_and_a_running_one_fails_after_a_restart() {
        let root = std::env::temp_dir().join(format!("spore-builds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (builds, built) = Builds::load(&root).unwrap();
        assert!(built.is_empty());
        let b = Build {
            template_id: "t1".into(),
            build_id: "b1".into(),
            account: "111111111111".into(),
            name: "mine".into(),
            status: Status::Building,
            log: vec![line(Level::Info, "building", Some("base"))],
            reason: None,
            cpu_count: None,
            memory_mib: None,
            tags: Vec::new(),
            min_free_disk_mib: None,
        };
        builds.save(&b).unwrap();
        let (again, _) = Builds::load(&root).unwrap();
        let b = lock(&again.table).get("b1").cloned().unwrap();
        assert_eq!(b.status, Status::Error);
        assert!(b.reason.unwrap().message.contains("daemon stopped"));
        assert_eq!(
            lock(&again.ids).get("t1"),
            Some(&("111111111111".to_string(), "mine".to_string()))
        );
        // Upload tokens are per template and hash.
        let t = again.upload_token("t1", &"a".repeat(64));
        assert_ne!(t, again.upload_token("t2", &"a".repeat(64)));
        assert!(constant_time_eq(
            t.as_bytes(),
            again.upload_token("t1", &"a".repeat(64)).as_bytes()
        ));
        let _ = std::fs::remove_dir_all(&root);
    }
}
