//! What a template build is asked, checked before it starts: its name,
//! its parent, its steps and the hashes of the files they copy.

use std::path::Path;

use super::{BuildStart, Step, MAX_STEPS};
use crate::sandboxes::{template, SandboxError};

/// A files hash as the SDK makes them: lowercase hex SHA-256.
pub(super) fn valid_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// E2B's template name (`name`, `name:tag`, `team/name`) as spore's.
pub(super) fn template_name(asked: &str) -> Result<String, SandboxError> {
    let plain = asked.rsplit('/').next().unwrap_or(asked);
    let plain = plain.split(':').next().unwrap_or(plain);
    if !template::valid_name(plain) {
        return Err(SandboxError::BadRequest(format!(
            "template name {asked:?}: 1 to 24 lower-case letters, digits, '-' or '_' (then ':' and a tag, if any)"
        )));
    }
    Ok(plain.to_string())
}

/// The template a build starts from: `fromTemplate` (`name` or
/// `name:tag`), or `fromImage` naming E2B's base image (spore's `base`
/// template).
pub(super) fn parent_name(start: &BuildStart) -> Result<String, SandboxError> {
    if start.from_image_registry.is_some() {
        return Err(SandboxError::BadRequest(
            "fromImageRegistry: spore builds from its templates, not from container registries"
                .into(),
        ));
    }
    match (&start.from_template, &start.from_image) {
        // With its tag, if any: the build it names is the parent.
        (Some(t), _) => template_name(t).map(|_| t.clone()),
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
pub(super) fn check_steps(steps: &[Step], files: &Path) -> Result<(), SandboxError> {
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
}
