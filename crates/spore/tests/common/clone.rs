//! Helpers for the clone tests: a source VMM running `clonetest`, a reaper
//! for every VMM a test started, and readers of the clones' logs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::{http, peer_pid, spore, uk_image, wait_for_path};

/// Kills (by pid) every VMM a test started, even when it fails: the pids
/// it collected, and every clone still serving a socket in its directory.
pub struct Reaper {
    pub source: Option<Child>,
    pub pids: Vec<i32>,
    pub dir: PathBuf,
}

impl Reaper {
    pub fn source_pid(&self) -> i32 {
        self.source.as_ref().map_or(0, |c| c.id() as i32)
    }
    pub fn add_from(&mut self, report: &serde_json::Value) {
        for c in report["clones"].as_array().into_iter().flatten() {
            if let Some(pid) = c["pid"].as_i64() {
                self.pids.push(i32::try_from(pid).expect("a pid fits i32"));
            }
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let src = self.source_pid();
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "sock") {
                if let Some(pid) = peer_pid(&p).filter(|&pid| pid != src) {
                    self.pids.push(pid);
                }
            }
        }
        for &pid in &self.pids {
            // SAFETY: kill by pid of a clone VMM this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if let Some(mut c) = self.source.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a source VMM running clonetest with `args`; clone settings first.
pub fn start_source(
    dir: &Path,
    mem_mib: u32,
    args: &str,
    clone_config: Option<&str>,
) -> (PathBuf, Reaper) {
    start_source_with(dir, mem_mib, args, clone_config, None)
}

pub fn start_source_with(
    dir: &Path,
    mem_mib: u32,
    args: &str,
    clone_config: Option<&str>,
    drive: Option<&str>,
) -> (PathBuf, Reaper) {
    let calls: Vec<(&str, &str)> = drive.map(|d| ("/drives/data", d)).into_iter().collect();
    start_source_calls(dir, mem_mib, args, clone_config, &calls)
}

/// As [`start_source_with`], with any pre-boot `PUT`s (path, body).
pub fn start_source_calls(
    dir: &Path,
    mem_mib: u32,
    args: &str,
    clone_config: Option<&str>,
    calls: &[(&str, &str)],
) -> (PathBuf, Reaper) {
    let sock = dir.join("src.sock");
    let log = std::fs::File::create(dir.join("src.log")).unwrap();
    let child = spore()
        .args(["vmm", "--api-sock"])
        .arg(&sock)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for_path(&sock, Duration::from_secs(10));
    let reaper = Reaper {
        source: Some(child),
        pids: Vec::new(),
        dir: dir.to_path_buf(),
    };
    if let Some(c) = clone_config {
        let (code, body) = http(&sock, "PUT", "/clone/config", Some(c));
        assert_eq!(code, 204, "{body}");
    }
    let body = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{args}"}}"#,
        uk_image("clonetest").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&body)).0, 204);
    for (path, body) in calls {
        let (code, reply) = http(&sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path}: {reply}");
    }
    let mc = format!(r#"{{"vcpu_count": 1, "mem_size_mib": {mem_mib}}}"#);
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(&mc)).0, 204);
    let (code, reply) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{reply}");
    (sock, reaper)
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Waits until `f` holds, showing every log of `dir` on timeout.
pub fn wait_until(dir: &Path, secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > Duration::from_secs(secs) {
            let mut logs = String::new();
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    logs += &format!("== {}\n{}\n", p.display(), read(&p));
                }
            }
            panic!("timed out waiting for {what}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every `clone ID ok` line in the logs of `dir`, and any FAILED line.
pub fn oks(dir: &Path) -> (BTreeSet<u64>, Vec<String>) {
    let mut ok = BTreeSet::new();
    let mut failed = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "log") {
            continue;
        }
        for l in read(&p).lines() {
            if l.contains("FAILED") {
                failed.push(format!("{}: {l}", p.display()));
            }
            if let Some(rest) = l.strip_prefix("clone ") {
                if let Some(id) = rest
                    .strip_suffix(" ok depth 1")
                    .or(rest.strip_suffix(" ok depth 2"))
                {
                    ok.insert(id.parse().unwrap());
                }
            }
        }
    }
    (ok, failed)
}

/// Pids of the clones the source's guest forks started (from its log).
pub fn forked_pids(log: &str) -> Vec<i32> {
    log.split(" pid ")
        .skip(1)
        .filter_map(|s| s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}

/// A 64 MiB `clonetest` source that turns itself into a template at once
/// (a guest `FORK` of count 0, `mode=bench after=stay`) under
/// `clone_config` (which must turn `guest_fork` on and set `fork_count` 0);
/// returns once `GET /clone` shows the template.
pub fn start_template_source(
    dir: &Path,
    clone_config: &str,
    drive: Option<&str>,
) -> (PathBuf, Reaper) {
    let (sock, reaper) =
        start_source_with(dir, 64, "mode=bench after=stay", Some(clone_config), drive);
    wait_until(dir, 20, "the guest to make its template", || {
        http(&sock, "GET", "/clone", None)
            .1
            .contains("\"template\":\"")
    });
    (sock, reaper)
}

pub fn put_clone(sock: &Path, body: &str) -> (u16, serde_json::Value) {
    let (code, reply) = http(sock, "PUT", "/clone", Some(body));
    (
        code,
        serde_json::from_str(&reply).unwrap_or(serde_json::Value::Null),
    )
}
