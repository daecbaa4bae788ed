//! What envd knows across requests: the settings `/init` gave it (environment,
//! access token, default user and working directory), and who a request acts as.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use hyper::HeaderMap;

use crate::connect::{Code, RpcError, RpcResult};
use crate::filesystem::watchers::Watchers;
use crate::process::table::Processes;

/// A user of the guest, from its passwd entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl User {
    /// Looks `name` up in the guest's user database.
    pub fn by_name(name: &str) -> RpcResult<User> {
        let c_name = CString::new(name)
            .map_err(|_| RpcError::invalid_argument(format!("invalid user name {name:?}")))?;
        Self::lookup(|pwd, buf, result| {
            // SAFETY: every pointer is valid for the call; getpwnam_r writes
            // only into `pwd` and `buf` (of the length given).
            unsafe { libc::getpwnam_r(c_name.as_ptr(), pwd, buf.as_mut_ptr(), buf.len(), result) }
        })?
        .ok_or_else(|| RpcError::new(Code::Unauthenticated, format!("invalid username: '{name}'")))
    }

    /// The user envd itself runs as.
    pub fn current() -> RpcResult<User> {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        Self::lookup(|pwd, buf, result| {
            // SAFETY: as in `by_name`.
            unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
        })?
        .ok_or_else(|| RpcError::internal(format!("uid {uid} has no passwd entry")))
    }

    fn lookup(
        call: impl Fn(*mut libc::passwd, &mut [libc::c_char], *mut *mut libc::passwd) -> libc::c_int,
    ) -> RpcResult<Option<User>> {
        let mut buf = vec![0 as libc::c_char; 4096];
        // SAFETY: passwd is plain data; all-zero is a valid value to overwrite.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, &mut buf, &mut result);
        if rc != 0 {
            return Err(RpcError::internal(format!(
                "reading the user database: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        if result.is_null() {
            return Ok(None);
        }
        // SAFETY: on success pw_name and pw_dir point at NUL-terminated
        // strings inside `buf`, alive for this scope.
        let (name, home) = unsafe {
            (
                CStr::from_ptr(pwd.pw_name).to_string_lossy().into_owned(),
                CStr::from_ptr(pwd.pw_dir).to_string_lossy().into_owned(),
            )
        };
        Ok(Some(User {
            name,
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            home: PathBuf::from(home),
        }))
    }

    /// Resolves a path a client gave: `~` and relative paths from the user's home.
    pub fn resolve(&self, path: &str) -> RpcResult<PathBuf> {
        if path.contains('\0') {
            return Err(RpcError::invalid_argument("a path may not contain NUL"));
        }
        let resolved = if path == "~" {
            self.home.clone()
        } else if let Some(rest) = path.strip_prefix("~/") {
            self.home.join(rest)
        } else if path.is_empty() {
            self.home.clone()
        } else {
            self.home.join(path)
        };
        Ok(normalize(&resolved))
    }
}

/// `a/./b/../c` → `a/c`, without touching the filesystem (symlinks are the
/// kernel's business when the path is used).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(name) => out.push(name),
            _ => {}
        }
    }
    out
}

/// What `/init` sets.
#[derive(Debug, Default, Clone)]
pub struct Settings {
    pub env_vars: HashMap<String, String>,
    pub access_token: Option<String>,
    pub default_user: Option<String>,
    pub default_workdir: Option<String>,
    /// Every user's home directory, replaced (envd on a host, for tests: the
    /// paths a test uses stay inside its own directory).
    pub home_override: Option<PathBuf>,
}

/// envd's state, shared by every connection.
pub struct State {
    settings: Mutex<Settings>,
    pub processes: Processes,
    pub watchers: Watchers,
    /// The version envd reports (the e2b SDK gates features on it).
    pub version: &'static str,
}

/// envd's version on the wire: the e2b SDK enables what this version of
/// E2B's envd had (default user, stdin, close-stdin, octet-stream uploads).
pub const ENVD_VERSION: &str = "0.5.7";

impl State {
    pub fn new(settings: Settings) -> Arc<State> {
        Arc::new(State {
            settings: Mutex::new(settings),
            processes: Processes::default(),
            watchers: Watchers::default(),
            version: ENVD_VERSION,
        })
    }

    pub fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a request's headers carry the access token (when one is set).
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        let settings = self.settings();
        let Some(token) = settings.access_token.as_deref() else {
            return true;
        };
        headers
            .get("x-access-token")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
    }

    /// The user a request acts as: its `Authorization: Basic user:` header,
    /// else the `username` query parameter, else the default user, else
    /// the user envd runs as.
    pub fn user_of(&self, headers: &HeaderMap, query_user: Option<&str>) -> RpcResult<User> {
        let from_header = headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|raw| String::from_utf8(raw).ok())
            .map(|pair| pair.split(':').next().unwrap_or_default().to_owned())
            .filter(|name| !name.is_empty());
        let name = from_header
            .or_else(|| query_user.filter(|u| !u.is_empty()).map(str::to_owned))
            .or_else(|| self.settings().default_user.clone());
        let mut user = match name {
            Some(name) => User::by_name(&name)?,
            None => User::current()?,
        };
        if let Some(home) = &self.settings().home_override {
            user.home.clone_from(home);
        }
        Ok(user)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who a request acts as, and envd's state.
#[derive(Clone)]
pub struct Ctx {
    pub state: Arc<State>,
    pub user: User,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_from_the_users_home() {
        let user = User {
            name: "u".into(),
            uid: 1,
            gid: 1,
            home: "/home/u".into(),
        };
        assert_eq!(user.resolve("a/b").unwrap(), PathBuf::from("/home/u/a/b"));
        assert_eq!(user.resolve("~/x").unwrap(), PathBuf::from("/home/u/x"));
        assert_eq!(
            user.resolve("/etc/../tmp/./f").unwrap(),
            PathBuf::from("/tmp/f")
        );
        assert_eq!(user.resolve("").unwrap(), PathBuf::from("/home/u"));
        assert!(user.resolve("a\0b").is_err());
    }

    #[test]
    fn the_access_token_is_checked_when_set() {
        let state = State::new(Settings {
            access_token: Some("t0k".into()),
            ..Settings::default()
        });
        let mut headers = HeaderMap::new();
        assert!(!state.authorized(&headers));
        headers.insert("x-access-token", "nope".parse().unwrap());
        assert!(!state.authorized(&headers));
        headers.insert("x-access-token", "t0k".parse().unwrap());
        assert!(state.authorized(&headers));
    }
}
