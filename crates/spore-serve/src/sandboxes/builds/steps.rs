//! A build's steps, run in its VM through envd: `RUN`, `COPY`, `ENV`,
//! `WORKDIR`, `USER`, each keeping what it sets for the next.

use std::path::PathBuf;

use super::layers::StepState;
use super::{Step, OUTPUT_TAIL};
use crate::sandboxes::envd;

/// A step's arguments as its log shows them (a long command cut).
pub(super) fn shown_args(step: &Step) -> String {
    let all = step.args.join(" ");
    if all.len() > 200 {
        let mut end = 200;
        while !all.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &all[..end])
    } else {
        all
    }
}

/// Runs steps in the build VM, keeping what they set for the next ones.
pub(super) struct StepRunner {
    pub(super) vsock: PathBuf,
    /// What the steps so far set ([`StepState`]): kept with a cached layer.
    pub(super) state: StepState,
    pub(super) files: PathBuf,
}

/// The file the steps' `ENV` goes to in the image (read by login shells:
/// envd runs commands with `bash -l`).
const ENV_FILE: &str = "/etc/profile.d/zz-spore-template-env.sh";

impl StepRunner {
    /// One step; its output's end.
    pub(super) async fn run(&mut self, index: usize, step: &Step) -> anyhow::Result<String> {
        let arg = |i: usize| step.args.get(i).map(String::as_str).unwrap_or("");
        match step.kind.as_str() {
            "RUN" => {
                let user = if arg(1).is_empty() {
                    self.state.user.clone()
                } else {
                    arg(1).to_string()
                };
                self.shell(&user, arg(0), &[]).await
            }
            "ENV" => {
                for pair in step.args.chunks(2) {
                    let (k, v) = (&pair[0], &pair[1]);
                    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                        anyhow::bail!("{k:?} is not a variable name");
                    }
                    self.state.env.retain(|(name, _)| name != k);
                    self.state.env.push((k.clone(), v.clone()));
                    self.root(
                        "printf 'export %s=%q\\n' \"$SPORE_K\" \"$SPORE_V\" >> \"$SPORE_FILE\"",
                        &[("SPORE_K", k), ("SPORE_V", v), ("SPORE_FILE", ENV_FILE)],
                    )
                    .await?;
                }
                Ok(String::new())
            }
            "WORKDIR" => {
                self.root("mkdir -p -- \"$SPORE_DIR\"", &[("SPORE_DIR", arg(0))])
                    .await?;
                self.state.workdir = Some(arg(0).to_string());
                Ok(String::new())
            }
            "USER" => {
                self.root(
                    "id -u -- \"$SPORE_USER\" >/dev/null 2>&1 || useradd -m -s /bin/bash -- \"$SPORE_USER\"",
                    &[("SPORE_USER", arg(0))],
                )
                .await?;
                self.state.user = arg(0).to_string();
                self.state.template_user = arg(0).to_string();
                Ok(String::new())
            }
            "COPY" => self.copy(index, step).await,
            other => anyhow::bail!("{other} is not a step spore runs"),
        }
    }

    /// `cmd` as `user` through `bash -l`, with the `ENV` so far, in the
    /// `WORKDIR`; its output kept in a file, its end answered, so that a
    /// loud command never overflows the answer.
    async fn shell(&self, user: &str, cmd: &str, extra: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut env: Vec<(&str, &str)> = self
            .state
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.extend_from_slice(extra);
        env.push(("SPORE_STEP_CMD", cmd));
        let wd = self.state.workdir.clone().unwrap_or_default();
        env.push(("SPORE_WORKDIR", &wd));
        let tail = OUTPUT_TAIL.to_string();
        env.push(("SPORE_TAIL", &tail));
        // The command in a subshell: its `exit` ends it, not the wrapper
        // that answers its output.
        let wrapper = "out=$(mktemp); ( if [ -n \"$SPORE_WORKDIR\" ]; then cd -- \"$SPORE_WORKDIR\" || exit 1; fi; \
                       eval \"$SPORE_STEP_CMD\" ) >\"$out\" 2>&1 </dev/null; rc=$?; tail -c \"$SPORE_TAIL\" \"$out\"; rm -f \"$out\"; exit $rc";
        let ran = envd::run(&self.vsock, user, wrapper, &env).await?;
        let output = String::from_utf8_lossy(&ran.stdout).into_owned();
        if ran.exit_code != 0 {
            let end: String = output
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            anyhow::bail!("exit code {}: {end}", ran.exit_code);
        }
        Ok(output)
    }

    async fn root(&self, cmd: &str, env: &[(&str, &str)]) -> anyhow::Result<()> {
        let ran = envd::run(&self.vsock, "root", cmd, env).await?;
        if ran.exit_code != 0 {
            anyhow::bail!("exit code {}: {}", ran.exit_code, ran.output.trim());
        }
        Ok(())
    }

    /// `COPY src dest [user] [mode]`: the uploaded tar unpacked in the
    /// guest, what `src` names of it copied to `dest`, owned by `user`.
    async fn copy(&self, index: usize, step: &Step) -> anyhow::Result<String> {
        let hash = step.files_hash.as_deref().unwrap_or_default();
        let file = self.files.join(hash);
        let tar = tokio::task::spawn_blocking(move || std::fs::read(file)).await??;
        let in_guest = format!("/tmp/spore-copy-{index}.tar");
        envd::upload(&self.vsock, &in_guest, &tar).await?;
        let arg = |i: usize| step.args.get(i).map(String::as_str).unwrap_or("");
        let owner = if arg(2).is_empty() {
            self.state.user.as_str()
        } else {
            arg(2)
        };
        // Owner and mode are set in the unpacked copy, so that only what
        // is copied gets them (`cp -a` keeps them); a destination directory
        // the copy makes is the owner's too.
        let script = "set -e; t=$(mktemp -d); tar -xf \"$SPORE_TAR\" -C \"$t\"; rm -f \"$SPORE_TAR\"; \
            d=\"$SPORE_DEST\"; case \"$d\" in /*) ;; *) d=\"${SPORE_WORKDIR:-/}/$d\" ;; esac; \
            cd \"$t\"; shopt -s nullglob dotglob globstar; m=( $SPORE_SRC ); \
            [ ${#m[@]} -gt 0 ] || { echo \"no files match $SPORE_SRC\"; exit 1; }; \
            chown -R -- \"$SPORE_OWNER\": \"$t\"; \
            if [ -n \"$SPORE_MODE\" ]; then find \"$t\" -type f -exec chmod -- \"$SPORE_MODE\" {} +; fi; \
            new_dir() { if [ ! -e \"$1\" ]; then mkdir -p -- \"$1\"; chown -- \"$SPORE_OWNER\": \"$1\"; fi; }; \
            if [ ${#m[@]} -eq 1 ] && [ -d \"${m[0]}\" ]; then new_dir \"$d\"; cp -a -- \"${m[0]}\"/. \"$d\"/; \
            elif [ ${#m[@]} -eq 1 ] && [ \"${d%/}\" = \"$d\" ] && [ ! -d \"$d\" ]; then mkdir -p -- \"$(dirname -- \"$d\")\"; cp -a -- \"${m[0]}\" \"$d\"; \
            else new_dir \"${d%/}\"; cp -a -- \"${m[@]}\" \"$d\"/; fi; \
            cd /; rm -rf \"$t\"";
        let wd = self.state.workdir.clone().unwrap_or_default();
        self.root(
            script,
            &[
                ("SPORE_TAR", &in_guest),
                ("SPORE_SRC", arg(0)),
                ("SPORE_DEST", arg(1)),
                ("SPORE_OWNER", owner),
                ("SPORE_MODE", arg(3)),
                ("SPORE_WORKDIR", &wd),
            ],
        )
        .await?;
        Ok(String::new())
    }
}
