//! firecracker-go-sdk v1.0.0's own `JailerCfg` starts spore under spore's
//! jailer on host KVM, with cgroup v1 (Firecracker's default): the SDK
//! execs `jailer` (a symlink to spore) with `--cgroup cpuset.mems=0
//! --cgroup cpuset.cpus=<node 0's cpus> --cgroup-version 1`, uid 123, gid
//! 100, and the exec file `firecracker` (spore). The SDK program
//! (tests/fc-sdk, its `jailer` mode) starts the `snaptest` unikernel,
//! pauses, resumes and stops it; between start and pause this test checks
//! that the VMM runs as 123/100, rooted in the chroot, in the v1 cpuset
//! cgroup `firecracker/<id>` holding the SDK's values.
//!
//! Go builds the program (tests/fc-sdk/build.sh, cached by content): without
//! Go this test fails, it does not skip.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::common::fc::repo_root;
use crate::common::*;
use crate::kvm_jailer::{put_libraries, require_root};

const UID: u32 = 123;
const GID: u32 = 100;

/// Builds (or finds cached) the firecracker-go-sdk program; panics with the
/// script's reason (Go missing, a failed build).
fn fc_sdk_program() -> PathBuf {
    let o = Command::new(repo_root().join("tests/fc-sdk/build.sh"))
        .stderr(Stdio::piped())
        .output()
        .expect("run tests/fc-sdk/build.sh");
    assert!(
        o.status.success(),
        "tests/fc-sdk/build.sh failed (this test needs Go to build its firecracker-go-sdk \
         program): {}",
        stderr_of(&o)
    );
    let path = stdout_of(&o).lines().last().unwrap_or_default().to_string();
    assert!(Path::new(&path).is_file(), "build.sh printed {path:?}");
    PathBuf::from(path)
}

/// The v1 mount of the cpuset controller, from /proc/mounts.
fn cpuset_v1_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let m = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let cpuset = f
            .get(3)
            .is_some_and(|o| o.split(',').any(|x| x == "cpuset"));
        (f.get(2) == Some(&"cgroup") && cpuset).then(|| PathBuf::from(f[1]))
    });
    m.expect("no cgroup v1 cpuset hierarchy is mounted: the SDK's cgroup v1 jail cannot be tested")
}

/// What the test made on the host, undone on drop: the SDK program, the
/// VMM, the cgroup leaf (and its parent, if this test made it).
struct Made {
    program: Option<Child>,
    vmm: Option<i32>,
    leaf: PathBuf,
    parent_was_there: bool,
}

impl Drop for Made {
    fn drop(&mut self) {
        if let Some(pid) = self.vmm {
            // SAFETY: kill by pid of the VMM this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let t = Instant::now();
            while alive(pid) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(mut p) = self.program.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        // A cgroup goes once its last process is reaped.
        let t = Instant::now();
        while self.leaf.exists() && std::fs::remove_dir(&self.leaf).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                eprintln!("could not remove cgroup {}", self.leaf.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.parent_was_there {
            if let Some(parent) = self.leaf.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Lines until one starting with `prefix` (the program's steps before it
/// included); fails on a FAIL line or the program's end.
fn lines_until(rx: &Receiver<String>, prefix: &str, limit: Duration) -> Vec<String> {
    let t = Instant::now();
    let mut seen = Vec::new();
    while t.elapsed() < limit {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                assert!(!l.contains(" FAIL"), "{l} (after {seen:?})");
                let hit = l.starts_with(prefix);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => panic!("the SDK program ended before {prefix:?}: {seen:?}"),
        }
    }
    panic!("no {prefix:?} line within {limit:?}: {seen:?}");
}

/// Checks that `pid` is the jailed VMM: uid/gid, root, v1 cpuset cgroup.
fn assert_jailed(pid: i32, root: &Path, cgroup_rel: &str) {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let status = std::fs::read_to_string(proc.join("status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(field("Uid:"), vec![UID.to_string(); 4], "{status}");
    assert_eq!(field("Gid:"), vec![GID.to_string(); 4], "{status}");
    // Its root is the chroot directory: the same inode (the path it reads
    // as is that of its own mount namespace).
    let r = std::fs::metadata(proc.join("root/.")).unwrap();
    let c = std::fs::metadata(root).unwrap();
    assert_eq!(
        (r.dev(), r.ino()),
        (c.dev(), c.ino()),
        "root is not the jail"
    );
    let cg = std::fs::read_to_string(proc.join("cgroup")).unwrap();
    let cpuset = cg.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, list, path) = (f.next()?, f.next()?, f.next()?);
        list.split(',').any(|c| c == "cpuset").then_some(path)
    });
    assert_eq!(cpuset, Some(cgroup_rel), "the VMM's cpuset cgroup: {cg}");
}

#[test]
fn kvm_jailer_sdk_jailercfg_cgroup_v1_starts_pauses_resumes_and_stops() {
    require_kvm();
    require_root();
    let program = fc_sdk_program();
    let cpuset = cpuset_v1_mount();
    // The SDK passes the cpuset flags only when the node's cpu list exists.
    let cpus = std::fs::read_to_string("/sys/devices/system/node/node0/cpulist")
        .expect("no NUMA node 0 cpu list: the SDK would pass no --cgroup")
        .trim()
        .to_string();
    let s = Scratch::new("jailer-sdk");
    let id = format!("sdk-v1-{}", std::process::id());

    // bin/jailer runs spore as the jailer (its argv[0]); bin/firecracker is
    // the exec file. The jail is named after the exec file's own name, with
    // symlinks resolved (as Firecracker's), and the SDK expects
    // <base>/firecracker/<id>/root: so a hard link (a copy across devices).
    let spore_bin = PathBuf::from(env!("CARGO_BIN_EXE_spore"));
    let bin = s.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(&spore_bin, bin.join("jailer")).unwrap();
    if std::fs::hard_link(&spore_bin, bin.join("firecracker")).is_err() {
        std::fs::copy(&spore_bin, bin.join("firecracker")).unwrap();
    }
    let base = s.path("jail");
    let root = base.join("firecracker").join(&id).join("root");
    // The libraries of a dynamically linked test build go in first: the
    // jailer leaves an existing jail directory's other contents alone.
    std::fs::create_dir_all(&root).unwrap();
    put_libraries(&root, &spore_bin);
    // The SDK hard-links the kernel and the drive into the jail: they must be
    // on its filesystem and readable by the VMM's user.
    let kernel = s.path("snaptest");
    std::fs::copy(uk_image("snaptest"), &kernel).unwrap();
    let drive = s.path("root.img");
    std::fs::write(&drive, vec![0u8; 1 << 20]).unwrap();
    for f in [&kernel, &drive] {
        std::os::unix::fs::chown(f, Some(UID), Some(GID)).unwrap();
    }

    let parent = cpuset.join("firecracker");
    let mut made = Made {
        program: None,
        vmm: None,
        leaf: parent.join(&id),
        parent_was_there: parent.exists(),
    };
    let t0 = Instant::now();
    let mut child = Command::new(&program)
        .arg("jailer")
        .arg("-jailer")
        .arg(bin.join("jailer"))
        .arg("-exec-file")
        .arg(bin.join("firecracker"))
        .arg("-kernel")
        .arg(&kernel)
        .arg("-drive")
        .arg(&drive)
        .arg("-base")
        .arg(&base)
        .args([
            "-id",
            &id,
            "-uid",
            &UID.to_string(),
            "-gid",
            &GID.to_string(),
        ])
        .args(["-numa-node", "0", "-cgroup-version", "1"])
        .args(["-boot-args", "mib=4 rounds=100000000 sleep_ms=20"])
        .arg("-out")
        .arg(s.path("vmm.out"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let rx = lines_of(&mut child);
    let mut stdin = child.stdin.take().unwrap();
    made.program = Some(child);

    let seen = lines_until(&rx, "SPORE-JAILED pid=", Duration::from_secs(60));
    let started = t0.elapsed();
    let pid: i32 = seen
        .last()
        .and_then(|l| l.strip_prefix("SPORE-JAILED pid="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap();
    made.vmm = Some(pid);
    assert_jailed(pid, &root, &format!("/firecracker/{id}"));
    let read = |f: &str| std::fs::read_to_string(made.leaf.join(f)).unwrap();
    assert_eq!(read("cpuset.mems").trim(), "0");
    assert_eq!(read("cpuset.cpus").trim(), cpus);
    // The parent level made on the way holds the inherited cpus/mems.
    assert!(!std::fs::read_to_string(parent.join("cpuset.cpus"))
        .unwrap()
        .trim()
        .is_empty());

    writeln!(stdin, "checked").unwrap();
    let rest = lines_until(&rx, "SPORE-TEST stop ", Duration::from_secs(90));
    let mut child = made.program.take().unwrap();
    let st = child.wait().unwrap();
    let all: Vec<&String> = seen.iter().chain(&rest).collect();
    assert!(st.success(), "the SDK program exited {st}: {all:?}");
    for step in ["sdk-jailer-start", "guest-runs", "pause", "resume", "stop"] {
        let want = format!("SPORE-TEST {step} PASS");
        assert!(
            all.iter().any(|l| l.starts_with(&want)),
            "no {want:?} in {all:?}"
        );
    }
    // The VMM is gone (SIGTERM from the SDK): its cgroup can go too.
    assert!(!alive(pid), "the VMM outlived StopVMM");
    made.vmm = None;
    eprintln!("SDK jailer: VMM jailed and the guest counting {started:?} after the program started; {all:?}");
}

/// A v1 value the kernel refuses, after the cpuset cgroups
/// `<parent>/deeper/<id>` were made (three levels): one error line, and
/// the cgroups (and the jail directory) are gone again.
#[test]
fn jailer_cgroup_v1_failure_removes_the_cgroups_it_made() {
    require_root();
    let cpuset = cpuset_v1_mount();
    let s = Scratch::new("jailer-v1-undo");
    let base = s.path("jail");
    std::fs::create_dir_all(&base).unwrap();
    let parent = format!("spore-v1-undo-{}", std::process::id());
    let o = spore()
        .args([
            "jailer",
            "--id",
            "undo",
            "--exec-file",
            env!("CARGO_BIN_EXE_spore"),
        ])
        .args(["--uid", "123", "--gid", "100", "--chroot-base-dir"])
        .arg(&base)
        .args(["--parent-cgroup", &format!("{parent}/deeper")])
        .args(["--cgroup", "cpuset.mems=0", "--cgroup", "cpuset.cpus=99999"])
        .output()
        .unwrap();
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("jailer: error: ") && err.contains("cpuset.cpus"),
        "{err}"
    );
    let left = cpuset.join(&parent);
    let was_left = left.exists();
    // Whatever a failure left must not outlive the test.
    let _ = std::fs::remove_dir(left.join("deeper/undo"));
    let _ = std::fs::remove_dir(left.join("deeper"));
    let _ = std::fs::remove_dir(&left);
    assert!(!was_left, "the jailer left the cgroup {}", left.display());
    let jail: Vec<_> = std::fs::read_dir(&base).unwrap().flatten().collect();
    assert!(jail.is_empty(), "the jailer left {jail:?}");
}
