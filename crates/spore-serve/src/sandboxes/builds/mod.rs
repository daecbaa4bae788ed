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
//! and `<name>/` per template: `template.json` (its spec and ids, written
//! when a build succeeds), `build-<id>.json` (each build's status and log)
//! and `rootfs-<build>.ext4` (the image of each build that succeeded);
//! `.layers/` holds the build cache ([`layers`]). A build the daemon was
//! running when it stopped is marked failed when it starts again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::events::Level;
use super::{template, SandboxError, Sandboxes, TemplateSpec};
use crate::mutex::lock;

mod layers;
mod run;
mod steps;

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
    pub tags: Vec<String>,
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
                if let Some(t) = read_json::<Built>(&dir.join("template.json")) {
                    lock(&builds.ids).insert(
                        t.template_id.clone(),
                        (t.account.clone(), t.spec.name.clone()),
                    );
                    built.push(t);
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

/// A files hash as the SDK makes them: lowercase hex SHA-256.
fn valid_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// E2B's template name (`name`, `name:tag`, `team/name`) as spore's.
fn template_name(asked: &str) -> Result<String, SandboxError> {
    let plain = asked.rsplit('/').next().unwrap_or(asked);
    let plain = plain.split(':').next().unwrap_or(plain);
    if !template::valid_name(plain) {
        return Err(SandboxError::BadRequest(format!(
            "template name {asked:?}: 1 to 24 lower-case letters, digits, '-' or '_' (a tag after ':' is ignored)"
        )));
    }
    Ok(plain.to_string())
}

/// The template a build starts from: `fromTemplate`, or `fromImage`
/// naming E2B's base image (spore's `base` template).
fn parent_name(start: &BuildStart) -> Result<String, SandboxError> {
    if start.from_image_registry.is_some() {
        return Err(SandboxError::BadRequest(
            "fromImageRegistry: spore builds from its templates, not from container registries"
                .into(),
        ));
    }
    match (&start.from_template, &start.from_image) {
        (Some(t), _) => template_name(t),
        (None, Some(image)) => {
            let repo = image.split([':', '@']).next().unwrap_or(image);
            if matches!(repo, "e2bdev/base" | "docker.io/e2bdev/base") {
                Ok("base".into())
            } else {
                Err(SandboxError::BadRequest(format!(
                    "fromImage {image:?}: spore builds from its templates (fromTemplate, or \
                     e2bdev/base for its base template); a container image is not pulled"
                )))
            }
        }
        (None, None) => Err(SandboxError::BadRequest(
            "a build needs fromTemplate (or fromImage \"e2bdev/base\")".into(),
        )),
    }
}

/// Refuses steps spore cannot run, before the build starts.
fn check_steps(steps: &[Step], files: &Path) -> Result<(), SandboxError> {
    if steps.len() > MAX_STEPS {
        return Err(SandboxError::BadRequest(format!(
            "{} steps: at most {MAX_STEPS}",
            steps.len()
        )));
    }
    for (i, s) in steps.iter().enumerate() {
        let n = i + 1;
        let bad = |what: &str| {
            Err(SandboxError::BadRequest(format!(
                "step {n} ({}): {what}",
                s.kind
            )))
        };
        match s.kind.as_str() {
            "RUN" if s.args.first().is_none_or(|c| c.trim().is_empty()) => {
                return bad("no command")
            }
            "COPY" => {
                if s.args.len() < 2 || s.args[0].is_empty() || s.args[1].is_empty() {
                    return bad("COPY takes a source and a destination");
                }
                let Some(hash) = s.files_hash.as_deref().filter(|h| valid_hash(h)) else {
                    return bad("no filesHash (lowercase hex SHA-256)");
                };
                if !files.join(hash).is_file() {
                    return bad("its files were not uploaded");
                }
                if let Some(mode) = s.args.get(3).filter(|m| !m.is_empty()) {
                    if u32::from_str_radix(mode, 8).is_err() {
                        return bad("mode is not octal");
                    }
                }
            }
            "ENV" if s.args.is_empty() || s.args.len() % 2 != 0 => {
                return bad("ENV takes name and value pairs")
            }
            "WORKDIR" | "USER" if s.args.first().is_none_or(String::is_empty) => {
                return bad("no argument")
            }
            "RUN" | "ENV" | "WORKDIR" | "USER" => {}
            _ => return bad("not a step spore runs (RUN, COPY, ENV, WORKDIR, USER)"),
        }
    }
    Ok(())
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
        if self.templates.contains_key(&name) {
            return Err(SandboxError::Conflict(format!(
                "template {name:?} is the daemon's (--sandbox-template); build under another name"
            )));
        }
        if let Some(c) = req.cpu_count.filter(|c| !(1..=32).contains(c)) {
            return Err(SandboxError::BadRequest(format!("cpuCount {c}: 1 to 32")));
        }
        if let Some(m) = req.memory_mb.filter(|m| !(128..=65_536).contains(m)) {
            return Err(SandboxError::BadRequest(format!(
                "memoryMB {m}: 128 to 65536"
            )));
        }
        let template_id = {
            let ids = lock(&self.builds.ids);
            ids.iter()
                .find(|(_, (a, n))| a == account && *n == name)
                .map(|(id, _)| id.clone())
        };
        let template_id = match template_id {
            Some(id) => id,
            None => super::new_id()?,
        };
        let build = Build {
            template_id: template_id.clone(),
            build_id: super::new_token()?,
            account: account.to_string(),
            name: name.clone(),
            status: Status::Waiting,
            log: Vec::new(),
            reason: None,
            cpu_count: req.cpu_count,
            memory_mib: req.memory_mb,
            tags: req.tags,
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
        let own = lock(&self.builds.ids)
            .iter()
            .find(|(_, (a, n))| a == account && *n == name)
            .map(|(id, _)| id.clone());
        match own {
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

    fn step(kind: &str, args: &[&str]) -> Step {
        Step {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            files_hash: None,
            force: false,
        }
    }

    #[test]
    fn names_parents_and_hashes_are_checked() {
        assert_eq!(template_name("my-tpl:v2").unwrap(), "my-tpl");
        assert_eq!(template_name("team/my_tpl").unwrap(), "my_tpl");
        assert!(template_name("My Template").is_err());
        let from = |t: Option<&str>, i: Option<&str>| {
            parent_name(&BuildStart {
                from_template: t.map(String::from),
                from_image: i.map(String::from),
                ..Default::default()
            })
        };
        assert_eq!(from(Some("web"), None).unwrap(), "web");
        assert_eq!(from(None, Some("e2bdev/base")).unwrap(), "base");
        assert_eq!(from(None, Some("e2bdev/base:latest")).unwrap(), "base");
        assert!(from(None, Some("python:3.12")).is_err());
        assert!(from(None, None).is_err());
        assert!(valid_hash(&"a".repeat(64)));
        assert!(!valid_hash(&"A".repeat(64)));
        assert!(!valid_hash("../etc"));
    }

    #[test]
    fn steps_spore_cannot_run_are_refused_before_the_build() {
        let files = std::env::temp_dir().join(format!("spore-build-files-{}", std::process::id()));
        std::fs::create_dir_all(&files).unwrap();
        let hash = "b".repeat(64);
        std::fs::write(files.join(&hash), b"tar").unwrap();
        let ok = vec![
            step("RUN", &["apt-get update", "root"]),
            step("ENV", &["A", "1", "B", "2"]),
            step("WORKDIR", &["/app"]),
            step("USER", &["user"]),
            Step {
                files_hash: Some(hash.clone()),
                ..step("COPY", &["app.py", "/app/app.py", "user", "0755"])
            },
        ];
        check_steps(&ok, &files).unwrap();
        for bad in [
            step("RUN", &[""]),
            step("ENV", &["A"]),
            step("FROM", &["x"]),
            step("USER", &[]),
            step("COPY", &["a", "/b"]),
            Step {
                files_hash: Some("c".repeat(64)),
                ..step("COPY", &["a", "/b"])
            },
            Step {
                files_hash: Some(hash.clone()),
                ..step("COPY", &["a", "/b", "", "rwx"])
            },
        ] {
            assert!(
                check_steps(std::slice::from_ref(&bad), &files).is_err(),
                "{bad:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&files);
    }

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
