//! Every helper the scenarios share: the `spore` binary and the unikernel
//! images, scratch directories, VMM processes and their output, and the
//! modules below (the API client, fixtures, processes, the host, and the
//! helpers of the clone, network and `spore serve` scenarios).

pub mod api;
pub mod bench;
pub mod clone;
pub mod cluster;
pub mod etcd;
pub mod fc;
pub mod fixture;
pub mod host;
pub mod net;
pub mod proc;
pub mod serve;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub use api::{api_ok, call, http, http_by_length, put, status_and_body};
pub use fixture::sparse_file;
pub use proc::{alive, peer_pid, pss_bytes, rss_bytes};

pub fn spore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spore"))
}

/// A unikernel example image built by `make uk` (or `SPORE_UK_DIR`).
pub fn uk_image(name: &str) -> PathBuf {
    let dir = std::env::var_os("SPORE_UK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../spore-uk/target/x86_64-unknown-none/release")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "unikernel image {} is missing: run `make uk` first",
        p.display()
    );
    p
}

/// Asserts the host has /dev/kvm, and shares the host with the other VM
/// tests until this test ends ([`host::shared`]).
pub fn require_kvm() {
    assert!(
        Path::new("/dev/kvm").exists(),
        "host-KVM tests need /dev/kvm (make test skips this tier when it is absent)"
    );
    host::shared();
}

/// A unique scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "spore-test-{tag}-{}-{:x}",
            std::process::id(),
            rand_u64()
        ));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    u64::from_le_bytes(b)
}

pub fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A `spore vmm` child process (or any child a test must not leave behind:
/// a forwarder, a reference Firecracker) that is killed and reaped when
/// dropped, so that a test failing half-way leaves no process behind.
pub struct VmmChild(Option<std::process::Child>);

impl VmmChild {
    pub fn new(child: std::process::Child) -> Self {
        VmmChild(Some(child))
    }

    /// The process, no longer killed on drop (to wait for its own exit).
    pub fn into_child(mut self) -> std::process::Child {
        self.0
            .take()
            .expect("the child is present until into_child")
    }

    pub fn wait_with_output(self) -> std::io::Result<Output> {
        self.into_child().wait_with_output()
    }
}

impl std::ops::Deref for VmmChild {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("the child is present until into_child")
    }
}

impl std::ops::DerefMut for VmmChild {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0
            .as_mut()
            .expect("the child is present until into_child")
    }
}

impl Drop for VmmChild {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `spore vmm --api-sock SOCK` with stdout and stderr piped, and
/// waits until the API socket exists (it is only renamed into place once it
/// accepts connections).
pub fn spawn_vmm(sock: &Path) -> VmmChild {
    let child = spore()
        .args(["vmm", "--api-sock"])
        .arg(sock)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn spore vmm");
    let child = VmmChild(Some(child));
    wait_for_path(sock, Duration::from_secs(10));
    child
}

/// Starts `spore vmm --api-sock SOCK` with its stdout on a line channel
/// (stderr goes to the test's), once the API socket exists.
pub fn spawn_vmm_lines(sock: &Path) -> (VmmChild, Receiver<String>) {
    spawn_vmm_lines_args(sock, &[])
}

/// [`spawn_vmm_lines`] with extra `spore vmm` arguments.
pub fn spawn_vmm_lines_args(
    sock: &Path,
    args: &[&std::ffi::OsStr],
) -> (VmmChild, Receiver<String>) {
    let mut child = VmmChild(Some(
        spore()
            .args(["vmm", "--api-sock"])
            .arg(sock)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn spore vmm"),
    ));
    let rx = lines_of(&mut child);
    wait_for_path(sock, Duration::from_secs(10));
    (child, rx)
}

/// Waits for a path to appear.
pub fn wait_for_path(p: &Path, timeout: Duration) {
    let t = Instant::now();
    while !p.exists() {
        assert!(t.elapsed() < timeout, "{} did not appear", p.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The child's stdout, line by line, on a channel (a thread reads it).
pub fn lines_of(child: &mut Child) -> Receiver<String> {
    let out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Lines up to and including the first that starts with `prefix` (60 s at most).
pub fn read_until(rx: &Receiver<String>, prefix: &str) -> Vec<String> {
    read_until_within(rx, prefix, Duration::from_secs(60))
}

/// [`read_until`] waiting at most `limit` for each line.
pub fn read_until_within(rx: &Receiver<String>, prefix: &str, limit: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no line starting with {prefix:?}; got {seen:?}"));
        let done = line.starts_with(prefix);
        seen.push(line);
        if done {
            return seen;
        }
    }
}

/// Whatever lines arrive until the channel is quiet for 300 ms.
pub fn drain(rx: &Receiver<String>) -> Vec<String> {
    let mut tail = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(300)) {
        tail.push(l);
    }
    tail
}

/// The numbers of snaptest's `count N` lines.
pub fn counts(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("count ")?.trim().parse().ok())
        .collect()
}

/// Starts `spore vmm` and boots the `snaptest` guest (dirty-page tracking as
/// asked, then any `extra` PUTs before `InstanceStart`); returns the VMM and
/// its stdout lines.
pub fn boot_snaptest(
    sock: &Path,
    mem_mib: u32,
    track_dirty_pages: bool,
    cmdline: &str,
    extra: &[(&str, &str)],
) -> (VmmChild, Receiver<String>) {
    boot_snaptest_args(sock, &[], mem_mib, track_dirty_pages, cmdline, extra)
}

/// [`boot_snaptest`] with extra `spore vmm` arguments.
pub fn boot_snaptest_args(
    sock: &Path,
    vmm_args: &[&std::ffi::OsStr],
    mem_mib: u32,
    track_dirty_pages: bool,
    cmdline: &str,
    extra: &[(&str, &str)],
) -> (VmmChild, Receiver<String>) {
    let (child, rx) = spawn_vmm_lines_args(sock, vmm_args);
    let body = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{cmdline}"}}"#,
        uk_image("snaptest").display()
    );
    assert_eq!(http(sock, "PUT", "/boot-source", Some(&body)).0, 204);
    let mc = format!(
        r#"{{"vcpu_count": 1, "mem_size_mib": {mem_mib}, "track_dirty_pages": {track_dirty_pages}}}"#
    );
    assert_eq!(http(sock, "PUT", "/machine-config", Some(&mc)).0, 204);
    for (path, body) in extra {
        let (code, reply) = http(sock, "PUT", path, Some(body));
        assert_eq!(code, 204, "PUT {path}: {reply}");
    }
    let (code, reply) = http(
        sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{reply}");
    (child, rx)
}

/// `spore snapshot create SOCK --state STATE --mem MEM [--diff] [--stop]`:
/// pause, snapshot, then resume (or stop the VMM). Asserts it succeeded;
/// returns how long it took.
pub fn snapshot_create(sock: &Path, state: &Path, mem: &Path, diff: bool, stop: bool) -> Duration {
    let mut cmd = spore();
    cmd.args(["snapshot", "create"]).arg(sock);
    cmd.arg("--state").arg(state).arg("--mem").arg(mem);
    if diff {
        cmd.arg("--diff");
    }
    if stop {
        cmd.arg("--stop");
    }
    let t0 = Instant::now();
    let o = cmd.output().unwrap();
    let took = t0.elapsed();
    assert!(o.status.success(), "snapshot create: {}", stderr_of(&o));
    took
}
