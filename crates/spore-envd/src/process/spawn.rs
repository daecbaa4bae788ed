//! Starting the child of a `Start`: its command run directly (no shell of
//! envd's own), its environment, working directory and user, and its stdio
//! (pipes, or a new terminal that becomes its controlling one).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::pty::{self, PtyMaster};
use crate::connect::{Code, RpcError, RpcResult};
use crate::proto::process::{ProcessConfig, StartRequest};
use crate::state::{State, User};

/// Where a child finds its programs (envd's own `PATH` is no concern of its).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// A terminal's size when the request gives none.
const DEFAULT_ROWS: u16 = 24;
const DEFAULT_COLS: u16 = 80;
/// The child's OOM score: the kernel picks a user's process before envd
/// (which may be exempt; children inherit that otherwise).
const CHILD_OOM_SCORE_ADJ: &[u8] = b"100";

/// A started child, with envd's ends of its stdio.
pub struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub io: Io,
}

/// envd's ends of the child's stdio.
pub enum Io {
    Pipes {
        stdout: ChildStdout,
        stderr: ChildStderr,
        stdin: Option<ChildStdin>,
    },
    Pty(PtyMaster),
}

/// Starts what `req` asks for, as `user`.
pub async fn spawn(state: &State, user: &User, req: &StartRequest) -> RpcResult<Spawned> {
    let config = req
        .process
        .as_ref()
        .ok_or_else(|| RpcError::invalid_argument("a process config is required"))?;
    check_config(config)?;
    let (global_env, default_workdir) = {
        let settings = state.settings();
        (settings.env_vars.clone(), settings.default_workdir.clone())
    };
    let cwd = working_dir(user, config.cwd.as_deref(), default_workdir.as_deref()).await?;
    let setup = ChildSetup {
        session: req.pty.is_some(),
        credentials: credentials(user)?,
        cwd: CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| RpcError::invalid_argument("a path may not contain NUL"))?,
    };
    let mut command = Command::new(&config.cmd);
    command
        .args(&config.args)
        .env_clear()
        .envs(environment(user, &global_env, &config.envs));
    let master = match &req.pty {
        Some(terminal) => {
            let size = terminal.size.unwrap_or_default();
            let rows = if size.rows == 0 {
                DEFAULT_ROWS
            } else {
                dimension(size.rows, "rows")?
            };
            let cols = if size.cols == 0 {
                DEFAULT_COLS
            } else {
                dimension(size.cols, "cols")?
            };
            let (master, slave) = pty::open(rows, cols)
                .map_err(|e| RpcError::internal(format!("opening a terminal: {e}")))?;
            let stdio = || {
                slave
                    .try_clone()
                    .map(Stdio::from)
                    .map_err(|e| RpcError::internal(format!("opening a terminal: {e}")))
            };
            command.stdin(stdio()?).stdout(stdio()?).stderr(stdio()?);
            Some(master)
        }
        None => {
            // E2B's envd gives a stdin pipe unless the request turns it off.
            let stdin = if req.stdin == Some(false) {
                Stdio::null()
            } else {
                Stdio::piped()
            };
            command
                .stdin(stdin)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // Its own group, so a signal reaches what it started too.
            command.process_group(0);
            None
        }
    };
    // SAFETY: the hook runs in the forked child before exec and makes only
    // async-signal-safe calls, on data prepared before the fork.
    unsafe {
        command.pre_exec(move || setup.apply());
    }
    let mut child = command.spawn().map_err(|e| {
        RpcError::invalid_argument(format!(
            "error starting process '{}': {e}",
            command_line(config)
        ))
    })?;
    // Our copies of the terminal's slave go with the command: the master
    // then reads EIO once the child's side has all closed.
    drop(command);
    let pid = child
        .id()
        .ok_or_else(|| RpcError::internal("the new process has no pid"))?;
    let io = match master {
        Some(master) => Io::Pty(master),
        None => match (child.stdout.take(), child.stderr.take()) {
            (Some(stdout), Some(stderr)) => Io::Pipes {
                stdout,
                stderr,
                stdin: child.stdin.take(),
            },
            _ => return Err(RpcError::internal("the new process has no output pipes")),
        },
    };
    Ok(Spawned { child, pid, io })
}

fn command_line(config: &ProcessConfig) -> String {
    std::iter::once(config.cmd.as_str())
        .chain(config.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

fn dimension(value: u32, what: &str) -> RpcResult<u16> {
    u16::try_from(value)
        .map_err(|_| RpcError::invalid_argument(format!("a terminal's {what} must be below 65536")))
}

/// Refuses what exec could not take (NULs) or an environment could not hold.
fn check_config(config: &ProcessConfig) -> RpcResult<()> {
    if config.cmd.is_empty() {
        return Err(RpcError::invalid_argument("cmd is empty"));
    }
    if config.cmd.contains('\0') || config.args.iter().any(|a| a.contains('\0')) {
        return Err(RpcError::invalid_argument(
            "cmd and args may not contain NUL",
        ));
    }
    for (key, value) in &config.envs {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(RpcError::invalid_argument(format!(
                "invalid environment variable {key:?}"
            )));
        }
    }
    Ok(())
}

/// The child's environment: a small base for `user`, then `/init`'s
/// variables, then the request's (later ones win).
fn environment(
    user: &User,
    global: &HashMap<String, String>,
    request: &HashMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
    env.insert("HOME".to_owned(), user.home.to_string_lossy().into_owned());
    env.insert("USER".to_owned(), user.name.clone());
    env.insert("LOGNAME".to_owned(), user.name.clone());
    // `/init` may have stored a variable no exec could take.
    let valid = |(k, v): &(&String, &String)| {
        !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0')
    };
    env.extend(
        global
            .iter()
            .filter(valid)
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The request's directory, else the default one, else the user's home;
/// it must exist.
async fn working_dir(
    user: &User,
    requested: Option<&str>,
    default: Option<&str>,
) -> RpcResult<PathBuf> {
    let chosen = requested
        .filter(|p| !p.is_empty())
        .or(default.filter(|p| !p.is_empty()));
    let dir = match chosen {
        Some(path) => user.resolve(path)?,
        None => user.home.clone(),
    };
    match tokio::fs::metadata(&dir).await {
        Ok(meta) if meta.is_dir() => Ok(dir),
        Ok(_) => Err(RpcError::invalid_argument(format!(
            "cwd '{}' is not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RpcError::invalid_argument(format!(
            "cwd '{}' does not exist",
            dir.display()
        ))),
        Err(e) => Err(RpcError::invalid_argument(format!(
            "cwd '{}': {e}",
            dir.display()
        ))),
    }
}

/// Who the child becomes, when that is not who envd is.
struct Credentials {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

fn credentials(user: &User) -> RpcResult<Option<Credentials>> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if user.uid == euid {
        return Ok(None);
    }
    if euid != 0 {
        return Err(RpcError::new(
            Code::PermissionDenied,
            format!(
                "envd runs as uid {euid} and cannot start processes as {}",
                user.name
            ),
        ));
    }
    Ok(Some(Credentials {
        uid: user.uid,
        gid: user.gid,
        groups: supplementary_groups(&user.name, user.gid),
    }))
}

/// The groups `name` belongs to (its primary `gid` included).
fn supplementary_groups(name: &str, gid: libc::gid_t) -> Vec<libc::gid_t> {
    let Ok(c_name) = CString::new(name) else {
        return vec![gid];
    };
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    // A few rounds: the list may grow between the calls.
    for _ in 0..4 {
        let mut count = libc::c_int::try_from(groups.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `groups` has room for `count` entries; getgrouplist writes
        // at most that many and stores the total in `count`.
        let rc = unsafe {
            libc::getgrouplist(c_name.as_ptr(), gid, groups.as_mut_ptr(), &raw mut count)
        };
        let count = usize::try_from(count).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(count);
            return groups;
        }
        if count <= groups.len() || count > 1 << 16 {
            break;
        }
        groups.resize(count, 0);
    }
    vec![gid]
}

/// What the child does between fork and exec, all prepared beforehand: no
/// allocation or locking may happen there.
struct ChildSetup {
    /// A new session whose controlling terminal is stdin (a PTY's slave).
    session: bool,
    credentials: Option<Credentials>,
    cwd: CString,
}

impl ChildSetup {
    fn apply(&self) -> io::Result<()> {
        // A command starts with no signal blocked, whatever envd inherited
        // (PID 1 blocks its stop signals, and a mask survives exec).
        // SAFETY: sigemptyset and sigprocmask are async-signal-safe and
        // touch only this forked process.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if self.session {
            // SAFETY: setsid and ioctl have no memory preconditions; fd 0 is
            // the terminal's slave (std set up stdio before this hook).
            if unsafe { libc::setsid() } < 0 || unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Before dropping privileges: a non-root process may not write it.
        set_oom_score_adj(c"/proc/self/oom_score_adj", CHILD_OOM_SCORE_ADJ);
        if let Some(c) = &self.credentials {
            // SAFETY: `groups` is valid for its length; the others take
            // plain integers. Group first: after setuid it is not allowed.
            let failed = unsafe {
                libc::setgroups(c.groups.len(), c.groups.as_ptr()) < 0
                    || libc::setgid(c.gid) < 0
                    || libc::setuid(c.uid) < 0
            };
            if failed {
                return Err(io::Error::last_os_error());
            }
        }
        // After the user switch, so the directory is entered as the user.
        // SAFETY: `cwd` is a NUL-terminated string that outlives the call.
        if unsafe { libc::chdir(self.cwd.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Best effort: a kernel without the file, or a refusal, leaves it as is.
fn set_oom_score_adj(path: &CStr, value: &[u8]) {
    // SAFETY: `path` is NUL-terminated and `value` readable for its length;
    // the descriptor is closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let _ = libc::write(fd, value.as_ptr().cast(), value.len());
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "u".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/u".into(),
        }
    }

    #[test]
    fn the_environment_layers_base_init_and_request() {
        let global = HashMap::from([
            ("A".to_owned(), "g".to_owned()),
            ("B".to_owned(), "g".to_owned()),
        ]);
        let request = HashMap::from([
            ("B".to_owned(), "r".to_owned()),
            ("HOME".to_owned(), "/x".to_owned()),
        ]);
        let env = environment(&user(), &global, &request);
        assert_eq!(env["PATH"], DEFAULT_PATH);
        assert_eq!(env["USER"], "u");
        assert_eq!(env["LOGNAME"], "u");
        assert_eq!(env["A"], "g");
        assert_eq!(env["B"], "r");
        assert_eq!(env["HOME"], "/x");
    }

    #[test]
    fn configs_exec_cannot_take_are_refused() {
        let ok = ProcessConfig {
            cmd: "/bin/true".into(),
            ..ProcessConfig::default()
        };
        assert!(check_config(&ok).is_ok());
        let empty = ProcessConfig::default();
        assert_eq!(
            check_config(&empty).unwrap_err().code,
            Code::InvalidArgument
        );
        let nul = ProcessConfig {
            args: vec!["a\0b".into()],
            ..ok.clone()
        };
        assert_eq!(check_config(&nul).unwrap_err().code, Code::InvalidArgument);
        let bad_env = ProcessConfig {
            envs: HashMap::from([("A=B".into(), "c".into())]),
            ..ok.clone()
        };
        assert_eq!(
            check_config(&bad_env).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn a_missing_working_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let u = User {
            home: dir.path().to_owned(),
            ..user()
        };
        assert_eq!(working_dir(&u, None, None).await.unwrap(), dir.path());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(
            working_dir(&u, Some("sub"), None).await.unwrap(),
            dir.path().join("sub")
        );
        assert_eq!(
            working_dir(&u, None, Some("/")).await.unwrap(),
            PathBuf::from("/")
        );
        let missing = working_dir(&u, Some("nope"), None).await.unwrap_err();
        assert_eq!(missing.code, Code::InvalidArgument);
        assert!(
            missing.message.contains("does not exist"),
            "{}",
            missing.message
        );
    }

    #[test]
    fn the_current_user_needs_no_switch() {
        let me = User::current().unwrap();
        assert!(credentials(&me).unwrap().is_none());
    }
}
