//! `spore jailer` end to end, as root on host KVM: spore's Firecracker mode
//! jailed as uid/gid 1000 boots the `snaptest` unikernel through the API
//! (its kernel placed in the jail, as a Firecracker user does), snapshots
//! it inside the jail, restores the snapshot in a second jail (pid 1 of a
//! new PID namespace) and clones the first VM with `PUT /clone`. Each VMM,
//! clones included, is checked to be jailed: its root is the chroot, its
//! uids and gids are 1000, its cgroup is the jail's leaf, seccomp is on.
//! Bad command lines fail with one line and leave nothing behind.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::common::*;

const UID: u32 = 1000;

/// The cgroup v2 mount, from /proc/mounts; the test fails (it does not
/// skip) on a host without one: the jailer's cgroup leaf is part of what
/// it must show.
fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let m = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
    });
    m.expect("no cgroup v2 hierarchy is mounted: the jailer's cgroup leaf cannot be tested")
}

/// A `--cgroup` value this host's cgroup v2 root can take (its controller
/// is available there), and the value it must read back.
fn cgroup_value(mount: &Path) -> (String, String) {
    let have = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap();
    let candidates = [
        ("pids", "pids.max", "4096"),
        ("memory", "memory.max", "2147483648"),
        ("cpu", "cpu.weight", "50"),
        ("hugetlb", "hugetlb.2MB.max", "2097152"),
    ];
    let (_, file, value) = candidates
        .iter()
        .find(|(c, _, _)| have.split_whitespace().any(|h| h == *c))
        .unwrap_or_else(|| {
            panic!("the cgroup v2 root has no controller this test can set (it has: {have:?})")
        });
    (file.to_string(), value.to_string())
}

pub(crate) fn require_root() {
    // SAFETY: geteuid takes nothing.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the jailer tests run as root (mknod, mount namespaces, cgroups, setuid)"
    );
}

/// The shared libraries of a dynamically linked `spore` (none for a static
/// build), copied into the jail where its loader looks for them: a
/// Firecracker user runs a static binary; the test binary is the
/// workspace's own build.
pub(crate) fn put_libraries(root: &Path, binary: &Path) {
    let o = Command::new("ldd").arg(binary).output().expect("run ldd");
    let text = String::from_utf8_lossy(&o.stdout);
    for lib in text.split_whitespace().filter(|w| w.starts_with('/')) {
        let dst = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(lib, &dst).unwrap();
    }
}

/// Copies a file into a jail, owned by the jail's user (what a Firecracker
/// user does for kernels and snapshot files).
fn place(src: &Path, root: &Path, name: &str) {
    let dst = root.join(name);
    std::fs::copy(src, &dst).unwrap();
    std::os::unix::fs::chown(&dst, Some(UID), Some(UID)).unwrap();
}

/// One jailed VMM: its jail, its cgroup, its pids; killed and removed on
/// drop (chroot directory and cgroup leaf included).
struct Jail {
    base: PathBuf,
    /// The exec file's name: the jail's directory and the binary in it.
    exec: String,
    root: PathBuf,
    leaf: PathBuf,
    cgroup_rel: String,
    jailer: Child,
    pid: i32,
    extra_pids: Vec<i32>,
    out: Receiver<String>,
}

impl Jail {
    /// Jails `bin` (spore, under any name) with `--id id`.
    fn start(
        base: &Path,
        bin: &Path,
        id: &str,
        parent_cg: &str,
        cg: &(String, String),
        pid_ns: bool,
    ) -> Jail {
        let exec = bin.file_name().unwrap().to_str().unwrap().to_string();
        let root = base.join(&exec).join(id).join("root");
        // The libraries go in first: the jailer leaves an existing jail
        // directory's other contents alone.
        std::fs::create_dir_all(&root).unwrap();
        put_libraries(&root, bin);
        let mut cmd = spore();
        cmd.args(["jailer", "--id", id, "--exec-file"])
            .arg(bin)
            .args(["--uid", "1000", "--gid", "1000", "--chroot-base-dir"])
            .arg(base)
            .args(["--cgroup-version", "2", "--parent-cgroup", parent_cg])
            .arg("--cgroup")
            .arg(format!("{}={}", cg.0, cg.1))
            .args(["--resource-limit", "no-file=1024"]);
        if pid_ns {
            cmd.arg("--new-pid-ns");
        }
        cmd.args(["--", "--api-sock", "/run/api.sock"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut jailer = cmd.spawn().unwrap();
        let out = lines_of(&mut jailer);
        let sock = root.join("run/api.sock");
        let t = Instant::now();
        while !sock.exists() {
            if let Ok(Some(st)) = jailer.try_wait() {
                assert!(pid_ns && st.success(), "the jailer exited: {st}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no API socket in the jail"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // With --new-pid-ns the jailer's parent writes it after its fork.
        let pid_file = root.join(format!("{exec}.pid"));
        wait_for_path(&pid_file, Duration::from_secs(10));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mount = cgroup2_mount();
        Jail {
            base: base.to_path_buf(),
            exec,
            leaf: mount.join(parent_cg).join(id),
            cgroup_rel: format!("/{parent_cg}/{id}"),
            root,
            jailer,
            pid,
            extra_pids: Vec::new(),
            out,
        }
    }

    fn id(&self) -> &std::ffi::OsStr {
        self.leaf.file_name().unwrap_or_default()
    }

    fn sock(&self) -> PathBuf {
        self.root.join("run/api.sock")
    }

    fn put(&self, path: &str, body: &str) {
        let (code, reply) = http(&self.sock(), "PUT", path, Some(body));
        assert!(code == 204 || code == 200, "PUT {path}: {code} {reply}");
    }

    /// Checks that `pid` runs in this jail.
    fn assert_jailed(&self, pid: i32, what: &str) {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        // Its root is the chroot directory (the same inode; the path it
        // reads as is that of its own mount namespace).
        let r = std::fs::metadata(proc.join("root/.")).unwrap();
        let c = std::fs::metadata(&self.root).unwrap();
        assert_eq!(
            (r.dev(), r.ino()),
            (c.dev(), c.ino()),
            "{what}: root is not the jail"
        );
        assert!(
            proc.join("root").join(&self.exec).is_file(),
            "{what}: no /spore in its root"
        );
        assert!(
            !proc.join("root/etc").exists(),
            "{what}: sees the host's /etc"
        );
        assert_ne!(
            std::fs::read_link(proc.join("ns/mnt")).unwrap(),
            std::fs::read_link("/proc/self/ns/mnt").unwrap(),
            "{what}: shares the host's mount namespace"
        );
        let status = std::fs::read_to_string(proc.join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(field("Uid:"), vec!["1000"; 4], "{what}: {status}");
        assert_eq!(field("Gid:"), vec!["1000"; 4], "{what}: {status}");
        assert!(field("Groups:").is_empty(), "{what}: supplementary groups");
        assert_eq!(
            field("Seccomp:"),
            vec!["2"],
            "{what}: seccomp is not filtering"
        );
        assert_eq!(
            field("CapEff:"),
            vec!["0000000000000000"],
            "{what}: capabilities"
        );
        let cg = std::fs::read_to_string(proc.join("cgroup")).unwrap();
        assert!(
            cg.lines().any(|l| l == format!("0::{}", self.cgroup_rel)),
            "{what}: not in the cgroup leaf {}: {cg}",
            self.cgroup_rel
        );
    }

    /// The pid of the clone serving a socket in the jail's /run.
    fn clone_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for e in std::fs::read_dir(self.root.join("run")).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "sock") && !p.ends_with("api.sock") {
                if let Some(pid) = peer_pid(&p) {
                    pids.push(pid);
                }
            }
        }
        pids
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        let mut pids = self.clone_pids();
        pids.push(self.pid);
        pids.extend(&self.extra_pids);
        for &p in &pids {
            // SAFETY: kill by pid of a VMM this test started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        let _ = self.jailer.kill();
        let _ = self.jailer.wait();
        let t = Instant::now();
        while pids.iter().any(|&p| alive(p)) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A cgroup goes once its last process is reaped.
        let t = Instant::now();
        while std::fs::remove_dir(&self.leaf).is_err() && self.leaf.exists() {
            if t.elapsed() > Duration::from_secs(10) {
                eprintln!("could not remove cgroup {}", self.leaf.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(self.base.join(&self.exec).join(self.id()));
    }
}

/// Lines until one starting `count ` with a number over `after`; returns it.
fn count_over(rx: &Receiver<String>, after: u64) -> u64 {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
            if let Some(n) = l.strip_prefix("count ").and_then(|n| n.trim().parse().ok()) {
                if n > after {
                    return n;
                }
            }
        }
    }
    panic!("no count over {after} within 60 s");
}

/// How many `count` lines a clone's log holds.
fn counts_in(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("count "))
        .count()
}

/// Removes the test's parent cgroup (its leaves are gone by then).
struct ParentCgroup(PathBuf);
impl Drop for ParentCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn kvm_jailer_boot_snapshot_restore_and_clone_stay_jailed() {
    require_kvm();
    require_root();
    let mount = cgroup2_mount();
    let cg = cgroup_value(&mount);
    let s = Scratch::new("jailer");
    let parent_cg = format!("spore-jailer-test-{}", std::process::id());
    let _parent = ParentCgroup(mount.join(&parent_cg));
    let base = s.path("jail");
    std::fs::create_dir_all(&base).unwrap();

    // Boot: the kernel is put into the jail, then named by its jailed path.
    // The first jail runs spore as a Firecracker user does: a binary named
    // `firecracker` (a copy of spore), jailed; its clones must still start.
    let fc = s.path("firecracker");
    std::fs::copy(env!("CARGO_BIN_EXE_spore"), &fc).unwrap();
    let a = Jail::start(&base, &fc, "vm-a", &parent_cg, &cg, false);
    assert_eq!(
        a.pid as u32,
        a.jailer.id(),
        "without --new-pid-ns the jailer execs itself"
    );
    place(&uk_image("snaptest"), &a.root, "snaptest");
    a.put(
        "/boot-source",
        r#"{"kernel_image_path": "/snaptest", "boot_args": "mib=4 rounds=100000000 sleep_ms=20"}"#,
    );
    a.put(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    // Its clone may be cloned once more (a clone's budget comes from its source).
    a.put("/clone/config", r#"{"clone_budget": 1}"#);
    a.put("/actions", r#"{"action_type": "InstanceStart"}"#);
    let before = count_over(&a.out, 2);
    a.assert_jailed(a.pid, "the VMM");
    assert_eq!(
        std::fs::read_to_string(a.leaf.join(&cg.0)).unwrap().trim(),
        cg.1,
        "the --cgroup value in the leaf"
    );
    let dev = std::fs::metadata(a.root.join("dev/kvm")).unwrap();
    assert_eq!(
        (dev.uid(), dev.gid(), dev.mode() & 0o777),
        (UID, UID, 0o600)
    );

    // Snapshot inside the jail (paths relative to its root).
    let (code, reply) = http(&a.sock(), "PATCH", "/vm", Some(r#"{"state": "Paused"}"#));
    assert_eq!(code, 204, "{reply}");
    let (code, reply) = http(
        &a.sock(),
        "PUT",
        "/snapshot/create",
        Some(
            r#"{"snapshot_type": "Full", "snapshot_path": "/snap.state", "mem_file_path": "/snap.mem"}"#,
        ),
    );
    assert!(
        code == 204 || code == 200,
        "snapshot create: {code} {reply}"
    );
    for f in ["snap.state", "snap.mem"] {
        let m = std::fs::metadata(a.root.join(f)).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (UID, 0o600), "{f}");
    }
    let (code, reply) = http(&a.sock(), "PATCH", "/vm", Some(r#"{"state": "Resumed"}"#));
    assert_eq!(code, 204, "{reply}");

    // Restore in a second jail, its VMM pid 1 of a new PID namespace.
    let spore_bin = PathBuf::from(env!("CARGO_BIN_EXE_spore"));
    let mut b = Jail::start(&base, &spore_bin, "vm-b", &parent_cg, &cg, true);
    let st = b.jailer.wait().unwrap();
    assert!(st.success(), "the --new-pid-ns jailer's own exit: {st}");
    place(&a.root.join("snap.state"), &b.root, "snap.state");
    place(&a.root.join("snap.mem"), &b.root, "snap.mem");
    b.put(
        "/snapshot/load",
        r#"{"snapshot_path": "/snap.state", "mem_backend": {"backend_type": "File", "backend_path": "/snap.mem"}, "resume_vm": true}"#,
    );
    let restored = count_over(&b.out, 0);
    assert!(
        restored > before,
        "the restored guest counts on: {restored} after {before}"
    );
    b.assert_jailed(b.pid, "the restored VMM");
    let status = std::fs::read_to_string(format!("/proc/{}/status", b.pid)).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.trim_end().ends_with("\t1"),
        "not pid 1 of its namespace: {nspid}"
    );

    // Clone the first VM: the clone process is spawned from /spore inside
    // the jail and stays there.
    let (code, reply) = http(&a.sock(), "PUT", "/clone", Some(r#"{"count": 1}"#));
    assert_eq!(code, 200, "PUT /clone: {reply}");
    let pids = a.clone_pids();
    assert_eq!(
        pids.len(),
        1,
        "one clone socket in the jail's /run: {reply}"
    );
    a.assert_jailed(pids[0], "the clone");
    let log = std::fs::read_dir(a.root.join("run"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .expect("the clone's log in the jail");
    let t = Instant::now();
    while counts_in(&log) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the clone's guest does not run"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // And clone the clone: its RAM is a private mapping of the template's
    // layers, and without /proc in the jail (no pagemap) all of it becomes
    // the new layer.
    let csock = std::fs::read_dir(a.root.join("run"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "sock") && !p.ends_with("api.sock"))
        .unwrap();
    let (code, reply) = http(&csock, "PUT", "/clone", Some(r#"{"count": 1}"#));
    assert_eq!(code, 200, "PUT /clone on the clone: {reply}");
    let pids2 = a.clone_pids();
    assert_eq!(pids2.len(), 2, "{reply}");
    for p in &pids2 {
        a.assert_jailed(*p, "a clone of the clone");
    }
    let logs: Vec<PathBuf> = std::fs::read_dir(a.root.join("run"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    let t = Instant::now();
    for log in &logs {
        // The clone of the clone counts on from where its source was.
        while counts_in(log) < 2 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{} shows no run",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(b);
    drop(a);
    assert!(!base.join("firecracker/vm-a").exists() && !base.join("spore/vm-b").exists());
}

/// Runs `spore jailer ARGS`; returns (exit code, stderr).
fn jailer(args: &[&str]) -> (i32, String) {
    let o = spore().arg("jailer").args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), stderr_of(&o))
}

/// The spore binary under test, as the jailer's `--exec-file`.
const SPORE_BIN: &str = env!("CARGO_BIN_EXE_spore");

#[test]
fn jailer_bad_command_lines_fail_with_one_line_and_leave_nothing() {
    require_root();
    let s = Scratch::new("jailer-bad");
    let base = s.path("jail");
    std::fs::create_dir_all(&base).unwrap();
    // 'static for the argument vectors below (a test process, leaked once).
    let b: &'static str = Box::leak(base.to_str().unwrap().to_string().into_boxed_str());
    for (args, want) in bad_command_lines(b) {
        assert_fails_in_one_line_leaving_nothing(&args, want, &base);
    }
    assert_nodev_base_is_refused(&s);
    assert_symlink_named_jailer_takes_the_same_command_line(&s, b);
}

/// A valid command line jailing `id` under `base`.
fn jail_args(id: &'static str, base: &'static str) -> Vec<&'static str> {
    vec![
        "--id",
        id,
        "--exec-file",
        SPORE_BIN,
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--chroot-base-dir",
        base,
    ]
}

fn with_args(mut v: Vec<&'static str>, extra: &[&'static str]) -> Vec<&'static str> {
    v.extend_from_slice(extra);
    v
}

/// Bad command lines for a jail under `base`, each with a part of the one
/// error line it must print.
fn bad_command_lines(base: &'static str) -> Vec<(Vec<&'static str>, &'static str)> {
    vec![
        (vec![], "required arguments were not provided: --id"),
        (
            with_args(jail_args("x", base), &["--bogus"]),
            "unexpected argument '--bogus'",
        ),
        (jail_args("bad id", base), "invalid id"),
        (jail_args("a/b", base), "invalid id"),
        (
            vec![
                "--id",
                "x",
                "--exec-file",
                "/no/such",
                "--uid",
                "1",
                "--gid",
                "1",
                "--chroot-base-dir",
                base,
            ],
            "exec file /no/such",
        ),
        (
            vec![
                "--id",
                "x",
                "--exec-file",
                "/tmp",
                "--uid",
                "1",
                "--gid",
                "1",
                "--chroot-base-dir",
                base,
            ],
            "not a regular file",
        ),
        (
            vec![
                "--id",
                "x",
                "--exec-file",
                SPORE_BIN,
                "--uid",
                "me",
                "--gid",
                "1",
                "--chroot-base-dir",
                base,
            ],
            "invalid --uid",
        ),
        (
            vec![
                "--id",
                "x",
                "--exec-file",
                SPORE_BIN,
                "--uid",
                "1",
                "--gid",
                "1",
                "--chroot-base-dir",
                "/no/base",
            ],
            "chroot base dir",
        ),
        (
            with_args(
                jail_args("x", base),
                &["--cgroup-version", "2", "--cgroup", "pids.max"],
            ),
            "<file>=<value>",
        ),
        (
            with_args(jail_args("x", base), &["--parent-cgroup", "../x"]),
            "parent-cgroup",
        ),
        (
            with_args(jail_args("x", base), &["--resource-limit", "stack=1"]),
            "fsize and no-file",
        ),
        // These fail after the jail directory was made: it is removed.
        (
            with_args(jail_args("late-1", base), &["--netns", "/dev/null"]),
            "network namespace",
        ),
        (
            with_args(
                jail_args("late-2", base),
                &["--cgroup-version", "2", "--cgroup", "nosuchctl.max=1"],
            ),
            "not in the cgroup v2 hierarchy",
        ),
        (
            with_args(jail_args("late-4", base), &["--cgroup", "nosuchctl.max=1"]),
            "not a cgroup controller of this kernel",
        ),
        (
            with_args(
                jail_args("late-3", base),
                &["--resource-limit", "no-file=99999999999"],
            ),
            "open file limit",
        ),
    ]
}

/// `spore jailer ARGS` exits 1 with one `jailer: ` line containing `want`,
/// and leaves nothing under `base`.
fn assert_fails_in_one_line_leaving_nothing(args: &[&str], want: &str, base: &Path) {
    let (code, err) = jailer(args);
    assert_eq!(code, 1, "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("jailer: "), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
    let left: Vec<_> = std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{args:?} left {left:?}");
}

fn assert_nodev_base_is_refused(s: &Scratch) {
    // A base on a nodev mount is refused (its device nodes would not open).
    let nodev = s.path("nodev");
    std::fs::create_dir_all(&nodev).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "nodev", "tmpfs"])
        .arg(&nodev)
        .status()
        .unwrap();
    assert!(st.success(), "mount a nodev tmpfs");
    let (code, err) = jailer(&[
        "--id",
        "x",
        "--exec-file",
        SPORE_BIN,
        "--uid",
        "1",
        "--gid",
        "1",
        "--chroot-base-dir",
        nodev.to_str().unwrap(),
    ]);
    let left = std::fs::read_dir(&nodev).unwrap().count();
    let _ = Command::new("umount").arg(&nodev).status();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nodev mount"), "{err}");
    assert_eq!(left, 0, "the nodev base kept what the jailer made");
}

fn assert_symlink_named_jailer_takes_the_same_command_line(s: &Scratch, base: &'static str) {
    // Called as `jailer` (a symlink): the same command line.
    let link = s.path("jailer");
    std::os::unix::fs::symlink(SPORE_BIN, &link).unwrap();
    let o = Command::new(&link)
        .args(jail_args("bad id", base))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("invalid id"), "{}", stderr_of(&o));
    let o = Command::new(&link).arg("--help").output().unwrap();
    assert!(o.status.success());
    assert!(
        stdout_of(&o).contains("--chroot-base-dir"),
        "{}",
        stdout_of(&o)
    );
}

/// A network namespace handle: `/proc/PID/ns/net` of a process that
/// unshared one (killed on drop).
struct NetNs(Child);
impl NetNs {
    fn new() -> NetNs {
        let c = Command::new("unshare")
            .args(["--net", "sleep", "120"])
            .spawn()
            .expect("run unshare --net");
        let me = std::fs::read_link("/proc/self/ns/net").unwrap();
        let path = format!("/proc/{}/ns/net", c.id());
        let t = Instant::now();
        while std::fs::read_link(&path).map_or(true, |l| l == me) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "unshare made no namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        NetNs(c)
    }
    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.0.id())
    }
}
impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn jailer_daemonize_and_netns_detach_the_vmm_into_the_namespace() {
    require_root();
    let mount = cgroup2_mount();
    let cg = cgroup_value(&mount);
    let s = Scratch::new("jailer-daemon");
    let parent_cg = format!("spore-jailer-test-d{}", std::process::id());
    let _parent = ParentCgroup(mount.join(&parent_cg));
    let base = s.path("jail");
    std::fs::create_dir_all(&base).unwrap();
    let ns = NetNs::new();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_spore"));
    let root = base.join("spore/vm-d/root");
    std::fs::create_dir_all(&root).unwrap();
    put_libraries(&root, &bin);
    // A descriptor without close-on-exec: the jailer inherits it and must
    // not pass it on. Its close-on-exec flag is cleared in the jailer's
    // process only, between fork and exec: cleared here, in the process all
    // the tests share, it would leak into the children the others start.
    let leak_path = s.path("inherited");
    let leak = std::fs::File::create(&leak_path).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&leak);
    let mut jailer = spore();
    // SAFETY: the closure only calls fcntl (async-signal-safe) on the
    // child's copy of a descriptor this test owns.
    unsafe {
        jailer.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        })
    };
    let mut jailer = jailer
        .args(["jailer", "--id", "vm-d", "--exec-file"])
        .arg(&bin)
        .args(["--uid", "1000", "--gid", "1000", "--chroot-base-dir"])
        .arg(&base)
        .args(["--cgroup-version", "2", "--parent-cgroup", &parent_cg])
        .arg("--cgroup")
        .arg(format!("{}={}", cg.0, cg.1))
        .args(["--netns", &ns.path(), "--daemonize"])
        .args(["--", "--api-sock", "/run/api.sock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The jailer returns at once; the VMM goes on detached.
    let st = jailer.wait().unwrap();
    assert!(st.success(), "{st}");
    let sock = root.join("run/api.sock");
    wait_for_path(&sock, Duration::from_secs(20));
    let jail = Jail {
        base: base.clone(),
        exec: "spore".into(),
        leaf: mount.join(&parent_cg).join("vm-d"),
        cgroup_rel: format!("/{parent_cg}/vm-d"),
        pid: std::fs::read_to_string(root.join("spore.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap(),
        root,
        jailer,
        extra_pids: Vec::new(),
        out: std::sync::mpsc::channel().1,
    };
    assert_eq!(
        peer_pid(&sock),
        Some(jail.pid),
        "the pid file names the VMM"
    );
    jail.assert_jailed(jail.pid, "the daemonized VMM");
    let (code, body) = http(&sock, "GET", "/", None);
    assert_eq!(code, 200, "{body}");
    let proc = PathBuf::from(format!("/proc/{}", jail.pid));
    assert_eq!(
        std::fs::read_link(proc.join("ns/net")).unwrap(),
        std::fs::read_link(ns.path()).unwrap(),
        "the VMM is not in the --netns namespace"
    );
    for fd in 0..3 {
        assert_eq!(
            std::fs::read_link(proc.join(format!("fd/{fd}"))).unwrap(),
            PathBuf::from("/dev/null"),
            "fd {fd}"
        );
    }
    // Its own session (setsid), not the test's.
    let sid = |pid: &str| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split_whitespace().nth(3).unwrap().to_string()
    };
    assert_ne!(sid(&jail.pid.to_string()), sid("self"));
    // The descriptor the jailer inherited was closed: not in the VMM.
    for e in std::fs::read_dir(proc.join("fd")).unwrap().flatten() {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        assert_ne!(
            target,
            leak_path,
            "fd {:?} leaked into the jail",
            e.file_name()
        );
    }
    drop(leak);
    drop(jail);
    assert!(!base.join("spore/vm-d").exists());
}
