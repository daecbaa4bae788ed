//! Seccomp on host KVM: every thread of a running VMM, of a restored VM and
//! of a clone runs under a filter once the VM started; `--no-seccomp` turns
//! them off; a bad `--seccomp-filter` file is one clear error line. (That a
//! syscall outside the vCPU list kills the process is a unit test of
//! `spore_vmm::seccomp`; that the lists allow what the VMM does is every
//! other host test, which runs with seccomp on.)

use std::path::Path;
use std::time::Duration;

use crate::common::clone::*;
use crate::common::*;

/// Each thread of `pid`: (name, the `Seccomp:` mode from its status).
fn seccomp_modes(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let dir = format!("/proc/{pid}/task");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let comm = read(&e.path().join("comm")).trim().to_string();
        let status = read(&e.path().join("status"));
        let Some(mode) = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .and_then(|v| v.trim().parse().ok())
        else {
            continue; // the thread ended meanwhile
        };
        out.push((comm, mode));
    }
    out
}

fn assert_all(pid: u32, want: u32, must_have: &[&str]) {
    let modes = seccomp_modes(pid);
    for name in must_have {
        assert!(
            modes.iter().any(|(n, _)| n.starts_with(name)),
            "no {name} thread in {modes:?}"
        );
    }
    assert!(
        modes.iter().all(|(_, m)| *m == want),
        "want Seccomp: {want} on every thread: {modes:?}"
    );
}

#[test]
fn kvm_every_thread_of_a_running_and_a_restored_vm_is_filtered() {
    require_kvm();
    let s = Scratch::new("seccomp-run");
    let sock = s.path("api.sock");
    let (vmm, rx) = boot_snaptest(&sock, 64, false, "mib=1 rounds=100000 sleep_ms=20", &[]);
    read_until(&rx, "count 2");
    assert_all(
        vmm.id(),
        2,
        &["spore", "spore-api", "vcpu0", "host-signals"],
    );

    // Snapshot it and restore it in a new VMM: that one is filtered too.
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    let sock2 = s.path("restored.sock");
    let (restored, rx2) = spawn_vmm_lines(&sock2);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        mem.display()
    );
    let (code, reply) = http(&sock2, "PUT", "/snapshot/load", Some(&body));
    assert_eq!(code, 204, "{reply}");
    read_until(&rx2, "count");
    assert_all(restored.id(), 2, &["spore-api", "vcpu0"]);
}

#[test]
fn kvm_every_thread_of_a_clone_is_filtered() {
    require_kvm();
    let s = Scratch::new("seccomp-clone");
    let (sock, mut reaper) = start_template_source(
        &s.0,
        r#"{"fork_count": 0, "max_clones": 3, "guest_fork": true}"#,
        None,
    );
    let (code, report) = put_clone(&sock, r#"{"count": 1}"#);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    let pid =
        u32::try_from(report["clones"][0]["pid"].as_i64().unwrap_or(0)).expect("a pid fits u32");
    assert!(pid > 0, "{report}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(pid as i32),
        "the clone died: {}",
        read(&s.path("src.log"))
    );
    assert_all(pid, 2, &["spore-clone", "spore-api", "vcpu"]);
    assert_all(reaper.source_pid() as u32, 2, &["spore-api"]);
    // The clone factory that forked it runs filtered too.
    let factory = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")?
                .1
                .split(' ')
                .nth(1)?
                .parse::<u32>()
                .ok()
        })
        .expect("the clone's parent");
    let cmdline = read(Path::new(&format!("/proc/{factory}/cmdline")));
    assert!(cmdline.contains("--clone-factory"), "{cmdline:?}");
    assert_all(factory, 2, &[]);
}

#[test]
fn kvm_no_seccomp_leaves_every_thread_unfiltered() {
    require_kvm();
    let s = Scratch::new("seccomp-off");
    let out = spore()
        .args(["run", "--no-seccomp", "--kernel"])
        .arg(uk_image("snaptest"))
        .args([
            "--mem",
            "64M",
            "--cmdline",
            "mib=1 rounds=100000 sleep_ms=20",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = out;
    let rx = lines_of(&mut child);
    read_until(&rx, "count 2");
    let modes = seccomp_modes(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        modes.iter().any(|(n, _)| n.starts_with("vcpu")),
        "{modes:?}"
    );
    assert!(modes.iter().all(|(_, m)| *m == 0), "{modes:?}");
    drop(s);
}

/// A filter file in Firecracker's compiled form (bitcode of category →
/// BPF instructions as little-endian u64), as its `seccompiler-bin` writes.
fn write_compiled(path: &Path, vcpu: Vec<u64>) {
    let map = std::collections::HashMap::from([
        ("vmm".to_string(), Vec::<u64>::new()),
        ("api".to_string(), Vec::new()),
        ("vcpu".to_string(), vcpu),
    ]);
    std::fs::write(path, bitcode::serialize(&map).unwrap()).unwrap();
}

#[test]
fn kvm_a_compiled_firecracker_filter_is_installed() {
    require_kvm();
    let s = Scratch::new("seccomp-compiled");
    let run = |filter: &Path| {
        spore()
            .args(["run", "--seccomp-filter"])
            .arg(filter)
            .arg("--kernel")
            .arg(uk_image("hello"))
            .args(["--mem", "128M", "--cmdline", "exit=0"])
            .output()
            .unwrap()
    };
    // Empty programs: no filter on any thread, the guest runs to its end.
    let empty = s.path("empty.bpf");
    write_compiled(&empty, Vec::new());
    let o = run(&empty);
    assert!(o.status.success(), "{}", stderr_of(&o));
    // A vCPU program of one instruction, `ret KILL_PROCESS`: the vCPU
    // thread's first syscall kills the VMM with SIGSYS.
    let kill = s.path("kill.bpf");
    const BPF_RET_K: u64 = 0x06;
    const SECCOMP_RET_KILL_PROCESS: u64 = 0x8000_0000;
    write_compiled(&kill, vec![BPF_RET_K | SECCOMP_RET_KILL_PROCESS << 32]);
    let o = run(&kill);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGSYS), "{:?}", o.status);
}

#[test]
fn a_bad_seccomp_filter_file_is_one_error_line() {
    let s = Scratch::new("seccomp-bad");
    let bad = s.path("filter.json");
    std::fs::write(&bad, "{ \"vmm\": [ not json").unwrap();
    let missing = s.path("missing.json");
    let one = r#"{"default_action":"kill_process","filter_action":"allow","filter":[{"syscall":"read"}]}"#;
    std::fs::write(&missing, format!(r#"{{"vmm":{one},"api":{one}}}"#)).unwrap();
    for (file, want) in [
        (bad.as_path(), "--seccomp-filter"),
        (missing.as_path(), "\"vcpu\""),
        (Path::new("/nonexistent/filter.json"), "--seccomp-filter"),
    ] {
        let o = spore()
            .args(["vmm", "--api-sock"])
            .arg(s.path("api.sock"))
            .arg("--seccomp-filter")
            .arg(file)
            .output()
            .unwrap();
        assert!(!o.status.success());
        let err = stderr_of(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.starts_with("spore: ") && err.contains(want), "{err}");
    }
    // Both flags at once are refused by the parser.
    let o = spore()
        .args([
            "vmm",
            "--api-sock",
            "x",
            "--no-seccomp",
            "--seccomp-filter",
            "f",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// A VMM stopped and continued (job control, a debugger attaching, a
/// cgroup freezer) goes on: a vCPU thread sleeping in the signal port's
/// WAIT resumes its poll through `restart_syscall`, which its filter must
/// allow (it once killed the VMM with SIGSYS).
#[test]
fn kvm_a_stopped_and_continued_vmm_goes_on_under_its_filters() {
    require_kvm();
    let s = Scratch::new("seccomp-stop");
    let sock = s.path("api.sock");
    let (mut vmm, rx) = boot_snaptest(&sock, 64, false, "mib=1 rounds=100000 sleep_ms=200", &[]);
    read_until(&rx, "count 1");
    let pid = vmm.id() as i32;
    for _ in 0..3 {
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    read_until(&rx, "count 4");
    assert!(
        vmm.try_wait().unwrap().is_none(),
        "the VMM ended after SIGSTOP/SIGCONT"
    );
    let (code, _) = http(&sock, "GET", "/", None);
    assert_eq!(code, 200);
}
