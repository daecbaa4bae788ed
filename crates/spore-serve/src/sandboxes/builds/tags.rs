//! Template tags (E2B's template versioning): `name:tag` names one build of
//! an account's template, `name` alone is `name:default`, and
//! `name:<build id>` names a build directly. A build that succeeds gets the
//! tag its name carried (`default` when none) and the `tags` it was asked
//! with; `POST /templates/tags` gives an existing build more,
//! `DELETE /templates/tags` takes tags away, `GET /templates/{id}/tags`
//! lists them. A tag moved to another build changes what new sandboxes
//! start from; running and paused sandboxes keep their build.
//!
//! Kept per template in `tags.json` beside its builds (written whole:
//! temporary file, fsync, rename); each build that succeeded has
//! `built-<build>.json`, what a sandbox of that build runs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{read_json, template_name, Builds, Built};
use crate::mutex::lock;
use crate::sandboxes::{SandboxError, Sandboxes};

/// The tag a name without one means.
pub const DEFAULT_TAG: &str = "default";
/// The most tags one request may name.
const MAX_TAGS_PER_CALL: usize = 32;
/// The most tags one template may carry.
const MAX_TAGS: usize = 256;

/// Where one tag points.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Tagged {
    pub build_id: String,
    pub at_ms: u64,
}

/// A template's tags, by tag.
pub type TagMap = BTreeMap<String, Tagged>;

/// `POST /templates/tags`' body (`AssignTemplateTagsRequest`).
#[derive(Deserialize)]
pub struct AssignRequest {
    target: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags`' body (`DeleteTemplateTagsRequest`).
#[derive(Deserialize)]
pub struct RemoveRequest {
    name: String,
    tags: Vec<String>,
}

/// `[team/]name[:tag]` as (name, tag); the name is not checked here.
pub fn split_ref(asked: &str) -> (&str, Option<&str>) {
    let last = asked.rsplit('/').next().unwrap_or(asked);
    match last.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (last, None),
    }
}

/// A tag: 1 to 64 letters, digits, `.`, `_` or `-`, starting with a letter
/// or digit.
pub fn valid_tag(tag: &str) -> bool {
    (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `tags` checked and without repeats, in their order.
pub fn checked_tags(tags: &[String]) -> Result<Vec<String>, SandboxError> {
    if tags.len() > MAX_TAGS_PER_CALL {
        return Err(SandboxError::BadRequest(format!(
            "{} tags: at most {MAX_TAGS_PER_CALL} a request",
            tags.len()
        )));
    }
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        if !valid_tag(t) {
            return Err(SandboxError::BadRequest(format!(
                "tag {t:?}: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )));
        }
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    Ok(out)
}

/// The tags a build asked as `asked` (`name` or `name:tag`) with `extra`
/// gets when it succeeds: the name's tag (`default` without one), then
/// `extra`.
pub fn build_tags(asked: &str, extra: &[String]) -> Result<Vec<String>, SandboxError> {
    let (_, tag) = split_ref(asked);
    let mut all = vec![tag.unwrap_or(DEFAULT_TAG).to_string()];
    all.extend(extra.iter().cloned());
    checked_tags(&all)
}

impl Builds {
    /// The tags of the template in `dir` (`None`: it has no tags file).
    pub(super) fn read_tags(dir: &Path) -> Option<TagMap> {
        read_json::<TagMap>(&dir.join("tags.json"))
    }

    /// The build tag `tag` (or, that failing, the build id `tag`) of
    /// `account`'s template `name` names.
    pub fn build_of(&self, account: &str, name: &str, tag: &str) -> Option<String> {
        let key = (account.to_string(), name.to_string());
        if let Some(t) = lock(&self.tags).get(&key).and_then(|m| m.get(tag)) {
            return Some(t.build_id.clone());
        }
        self.built_record(account, name, tag).map(|b| b.build_id)
    }

    /// What a sandbox of build `build_id` of `account`'s template `name`
    /// runs, if that build succeeded and is still here.
    pub fn built_record(&self, account: &str, name: &str, build_id: &str) -> Option<Built> {
        // Build ids are the daemon's own (hex and dashes): nothing else
        // reaches the file system.
        if build_id.is_empty() || !build_id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return None;
        }
        let dir = self.template_dir(account, name);
        let b = read_json::<Built>(&dir.join(format!("built-{build_id}.json")))
            .or_else(|| read_json::<Built>(&dir.join("template.json")))?;
        (b.build_id == build_id && b.account == account && b.spec.rootfs.is_file()).then_some(b)
    }

    pub fn tags_of(&self, account: &str, name: &str) -> TagMap {
        lock(&self.tags)
            .get(&(account.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Changes `account`'s template `name`'s tags with `change` and keeps
    /// them (nothing changes if they cannot be written).
    pub fn change_tags<T>(
        &self,
        account: &str,
        name: &str,
        change: impl FnOnce(&mut TagMap) -> Result<T, SandboxError>,
    ) -> Result<T, SandboxError> {
        let key = (account.to_string(), name.to_string());
        let mut all = lock(&self.tags);
        let mut tags = all.get(&key).cloned().unwrap_or_default();
        let out = change(&mut tags)?;
        if tags.len() > MAX_TAGS {
            return Err(SandboxError::BadRequest(format!(
                "template {name}: at most {MAX_TAGS} tags"
            )));
        }
        let dir = self.template_dir(account, name);
        let json = serde_json::to_vec_pretty(&tags)
            .map_err(|e| SandboxError::Internal(format!("template {name}'s tags: {e}")))?;
        crate::fs::create_private_dir(&dir)
            .and_then(|()| crate::fs::write_private(&dir.join("tags.json"), &json))
            .map_err(|e| SandboxError::Internal(format!("template {name}'s tags: {e}")))?;
        all.insert(key, tags);
        Ok(out)
    }
}

impl Sandboxes {
    /// A build that succeeded gets its tags; one given `default` becomes
    /// what `name` starts.
    pub(super) async fn tag_build(&self, built: Built, tags: &[String]) -> Result<(), String> {
        let now = crate::clock::unix_ms();
        self.builds
            .change_tags(&built.account, &built.spec.name, |map| {
                for t in tags {
                    map.insert(
                        t.clone(),
                        Tagged {
                            build_id: built.build_id.clone(),
                            at_ms: now,
                        },
                    );
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        if tags.iter().any(|t| t == DEFAULT_TAG) {
            self.make_default(built).await?;
        }
        Ok(())
    }

    /// `built` as its template's default: `template.json`, and served
    /// (the zygotes of the build it replaces end).
    async fn make_default(&self, built: Built) -> Result<(), String> {
        let served = lock(&self.built)
            .get(&(built.account.clone(), built.spec.name.clone()))
            .is_some_and(|t| t.build_id.as_deref() == Some(built.build_id.as_str()));
        if served {
            return Ok(());
        }
        let dir = self.builds.template_dir(&built.account, &built.spec.name);
        let json = serde_json::to_vec_pretty(&built).map_err(|e| e.to_string())?;
        crate::fs::write_private(&dir.join("template.json"), &json)
            .map_err(|e| format!("template.json: {e}"))?;
        self.serve_built(built).await;
        Ok(())
    }

    /// `POST /templates/tags`: more tags for the build `target`
    /// (`name:tag` or `name`, its default) names.
    pub async fn assign_tags(
        &self,
        account: &str,
        req: AssignRequest,
    ) -> Result<serde_json::Value, SandboxError> {
        let (_, tag) = split_ref(&req.target);
        let name = template_name(&req.target)?;
        let tags = checked_tags(&req.tags)?;
        if tags.is_empty() {
            return Err(SandboxError::BadRequest("no tags to assign".into()));
        }
        let build = self
            .builds
            .build_of(account, &name, tag.unwrap_or(DEFAULT_TAG))
            .ok_or_else(|| {
                SandboxError::NotFound(format!("template \"{}\" not found", req.target))
            })?;
        let built = self
            .builds
            .built_record(account, &name, &build)
            .ok_or_else(|| {
                SandboxError::NotFound(format!("template \"{}\": its build is gone", req.target))
            })?;
        self.tag_build(built, &tags)
            .await
            .map_err(SandboxError::Internal)?;
        Ok(serde_json::json!({ "buildID": build, "tags": tags }))
    }

    /// `DELETE /templates/tags`: every tag named goes, or none (one the
    /// template does not have is a 404). Without `default`, `name` alone
    /// starts nothing until a build or an assignment gives it again.
    pub async fn remove_tags(&self, account: &str, req: RemoveRequest) -> Result<(), SandboxError> {
        let name = template_name(&req.name)?;
        let tags = checked_tags(&req.tags)?;
        if self.builds.template_id_of(account, &name).is_none() {
            return Err(SandboxError::NotFound(format!(
                "template \"{}\" not found",
                req.name
            )));
        }
        self.builds.change_tags(account, &name, |map| {
            if let Some(t) = tags.iter().find(|t| !map.contains_key(*t)) {
                return Err(SandboxError::NotFound(format!(
                    "template {name} has no tag {t:?}"
                )));
            }
            for t in &tags {
                map.remove(t);
            }
            Ok(())
        })?;
        if tags.iter().any(|t| t == DEFAULT_TAG) {
            self.stop_serving(account, &name).await;
        }
        Ok(())
    }

    /// `GET /templates/{id}/tags`: `template` is an id or a name.
    pub fn list_tags(
        &self,
        account: &str,
        template: &str,
    ) -> Result<serde_json::Value, SandboxError> {
        let by_id = lock(&self.builds.ids)
            .get(template)
            .filter(|(a, _)| a == account)
            .map(|(_, n)| n.clone());
        let name = match by_id {
            Some(n) => n,
            None => {
                let n = template_name(template).map_err(|_| {
                    SandboxError::NotFound(format!("template \"{template}\" not found"))
                })?;
                if self.builds.template_id_of(account, &n).is_none() {
                    return Err(SandboxError::NotFound(format!(
                        "template \"{template}\" not found"
                    )));
                }
                n
            }
        };
        let list: Vec<_> = self
            .builds
            .tags_of(account, &name)
            .into_iter()
            .map(|(tag, t)| {
                serde_json::json!({
                    "tag": tag,
                    "buildID": t.build_id,
                    "createdAt": crate::clock::iso_ms(t.at_ms),
                })
            })
            .collect();
        Ok(serde_json::Value::Array(list))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_and_tags_are_checked() {
        assert_eq!(split_ref("my-tpl"), ("my-tpl", None));
        assert_eq!(split_ref("my-tpl:v1.0"), ("my-tpl", Some("v1.0")));
        assert_eq!(split_ref("team/my-tpl:prod"), ("my-tpl", Some("prod")));
        assert!(valid_tag("v1.2.0") && valid_tag("latest") && valid_tag("a_b-c"));
        assert!(!valid_tag("") && !valid_tag("-x") && !valid_tag("a b") && !valid_tag("a/b"));
        assert!(!valid_tag(&"x".repeat(65)));
        assert_eq!(
            build_tags("t", &["v1".into(), "default".into()]).unwrap(),
            vec!["default", "v1"]
        );
        assert_eq!(build_tags("t:v2", &["v2".into()]).unwrap(), vec!["v2"]);
        assert!(build_tags("t:bad tag", &[]).is_err());
        assert!(checked_tags(&vec!["a".to_string(); 40]).is_err());
    }

    /// A build that succeeded, as `run_build` leaves it.
    fn built(root: &Path, build_id: &str) -> Built {
        let dir = root.join("111111111111").join("mine");
        std::fs::create_dir_all(&dir).unwrap();
        let rootfs = dir.join(format!("rootfs-{build_id}.ext4"));
        std::fs::write(&rootfs, b"image").unwrap();
        let b = Built {
            template_id: "t1".into(),
            account: "111111111111".into(),
            build_id: build_id.into(),
            spec: crate::sandboxes::TemplateSpec {
                name: "mine".into(),
                kernel: "/k".into(),
                rootfs,
                vcpus: 1,
                memory_mib: 256,
                user: "user".into(),
                start_cmd: None,
                ready_cmd: None,
                network: false,
                dns: Vec::new(),
            },
        };
        let json = serde_json::to_vec(&b).unwrap();
        std::fs::write(dir.join(format!("built-{build_id}.json")), json).unwrap();
        b
    }

    #[test]
    fn tags_name_builds_and_are_kept_across_a_restart() {
        let root = std::env::temp_dir().join(format!("spore-tags-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (builds, _) = Builds::load(&root).unwrap();
        let (a, b) = (
            "0000aaaa-0000-4000-8000-000000000001",
            "0000bbbb-0000-4000-8000-000000000002",
        );
        built(&root, a);
        built(&root, b);
        let acct = "111111111111";
        let set = |tag: &str, build: &str| {
            builds
                .change_tags(acct, "mine", |m| {
                    let at = Tagged {
                        build_id: build.into(),
                        at_ms: 1,
                    };
                    m.insert(tag.into(), at);
                    Ok(())
                })
                .unwrap()
        };
        set(DEFAULT_TAG, a);
        set("v2", b);
        assert_eq!(
            builds.build_of(acct, "mine", DEFAULT_TAG).as_deref(),
            Some(a)
        );
        assert_eq!(builds.build_of(acct, "mine", "v2").as_deref(), Some(b));
        // A build id names its build; an unknown tag, another account's
        // template or a path names nothing.
        assert_eq!(builds.build_of(acct, "mine", b).as_deref(), Some(b));
        assert_eq!(builds.build_of(acct, "mine", "v3"), None);
        assert_eq!(builds.build_of("222222222222", "mine", "v2"), None);
        assert!(builds.built_record(acct, "mine", "../../x").is_none());
        // A refused change changes nothing.
        let refused = builds.change_tags(acct, "mine", |m| {
            m.clear();
            Err::<(), _>(SandboxError::BadRequest("no".into()))
        });
        assert!(refused.is_err());
        assert_eq!(builds.tags_of(acct, "mine").len(), 2);
        // Kept: a restarted daemon has them.
        let (again, _) = Builds::load(&root).unwrap();
        assert_eq!(again.build_of(acct, "mine", "v2").as_deref(), Some(b));
        assert_eq!(again.tags_of(acct, "mine"), builds.tags_of(acct, "mine"));
        // A build whose image is gone is no longer named.
        std::fs::remove_file(
            root.join(acct)
                .join("mine")
                .join(format!("rootfs-{b}.ext4")),
        )
        .unwrap();
        assert!(again.built_record(acct, "mine", b).is_none());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_template_built_before_tags_is_its_default() {
        let root = std::env::temp_dir().join(format!("spore-tags-old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let id = "0123456789abcdef0123456789abcdef01234567";
        let b = built(&root, id);
        let dir = root.join("111111111111").join("mine");
        std::fs::write(dir.join("template.json"), serde_json::to_vec(&b).unwrap()).unwrap();
        std::fs::remove_file(dir.join(format!("built-{id}.json"))).unwrap();
        let (builds, served) = Builds::load(&root).unwrap();
        assert_eq!(served.len(), 1);
        assert_eq!(
            builds
                .build_of("111111111111", "mine", DEFAULT_TAG)
                .as_deref(),
            Some(id)
        );
        assert!(builds.built_record("111111111111", "mine", id).is_some());
        let _ = std::fs::remove_dir_all(&root);
    }
}
