//! Host-KVM tier: the virtio-net device on real tap devices, with seccomp
//! on (the default). There is no unikernel net driver yet, so these check
//! the VMM side: a VM with a network interface boots, a tap that cannot be
//! opened fails InstanceStart clearly, and a snapshot restore reopens the
//! tap by name (or by `network_overrides`), so the restored VMM holds it.
//!
//! Clones of a VM with an interface each enter their own network namespace
//! (`PUT /clone`'s `network.netns_template`) and reopen the same tap name
//! there, with a new MAC per clone.
//!
//! Taps are made with `ip tuntap` (needs root/CAP_NET_ADMIN: the tests say
//! so and skip without it) under unique names, and removed by a drop guard.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::clone::{put_clone, Reaper};
use crate::common::*;

const START: &str = r#"{"action_type": "InstanceStart"}"#;

/// A tap device made for one test, deleted when dropped.
struct TapGuard(String);

impl TapGuard {
    /// `spt<pid><tag>`, at most 15 bytes; `None` (and a note) when the
    /// host does not let us make taps.
    fn new(tag: &str) -> Option<TapGuard> {
        let name = format!("spt{}{tag}", std::process::id() % 100_000);
        assert!(name.len() <= 15, "{name}");
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let _ = ok(&["link", "del", "dev", &name]);
        if !ok(&["tuntap", "add", "dev", &name, "mode", "tap"]) {
            eprintln!("skipping: `ip tuntap add dev {name} mode tap` failed (needs CAP_NET_ADMIN)");
            return None;
        }
        let tap = TapGuard(name);
        assert!(ok(&["link", "set", "dev", &tap.0, "up"]));
        Some(tap)
    }
}

impl Drop for TapGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", "dev", &self.0])
            .output();
    }
}

/// Whether process `pid` has tap `name` open (tun fds name their
/// interface in fdinfo as `iff:\t<name>`).
fn holds_tap(pid: u32, name: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    let want = format!("iff:\t{name}\n");
    fds.flatten()
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|info| info.contains(&want)))
}

fn iface(id: &str, tap: &str, mac: &str) -> String {
    format!(
        r#"{{"iface_id": "{id}", "host_dev_name": "{tap}", "guest_mac": "{mac}",
            "rx_rate_limiter": {{"bandwidth": {{"size": 1048576, "refill_time": 100}}}},
            "tx_rate_limiter": null}}"#
    )
}

#[test]
fn kvm_hello_boots_with_a_network_interface_on_a_tap() {
    require_kvm();
    let Some(tap) = TapGuard::new("h") else {
        return;
    };
    let s = Scratch::new("net-hello");
    let sock = s.path("api.sock");
    let vmm = spawn_vmm(&sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}"}}"#,
        uk_image("hello").display()
    );
    put(&sock, "/boot-source", &boot);
    put(
        &sock,
        "/network-interfaces/eth0",
        &iface("eth0", &tap.0, "06:00:AC:10:00:02"),
    );
    // Firecracker's refusals before boot.
    let (code, reply) = http(
        &sock,
        "PUT",
        "/network-interfaces/eth1",
        Some(&iface("eth1", &tap.0, "06:00:AC:10:00:03")),
    );
    assert_eq!(code, 400, "{reply}");
    let (code, reply) = http(
        &sock,
        "PATCH",
        "/network-interfaces/eth0",
        Some(r#"{"iface_id": "eth0"}"#),
    );
    assert_eq!(code, 400, "{reply}");
    put(&sock, "/actions", START);
    let pid = vmm.id();
    // The VMM holds the tap while the guest runs (or until it exits).
    let held = holds_tap(pid, &tap.0);
    let out = vmm.wait_with_output().unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("hello from spore-uk"),
        "stdout: {stdout}\nstderr: {}",
        stderr_of(&out)
    );
    assert!(out.status.success(), "stderr: {}", stderr_of(&out));
    eprintln!("tap held while running: {held}");
}

#[test]
fn kvm_a_tap_that_cannot_be_opened_fails_instance_start() {
    require_kvm();
    let s = Scratch::new("net-badtap");
    let sock = s.path("api.sock");
    let _vmm = spawn_vmm(&sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}"}}"#,
        uk_image("hello").display()
    );
    put(&sock, "/boot-source", &boot);
    // "lo" exists and is no tap: TUNSETIFF refuses it.
    put(
        &sock,
        "/network-interfaces/eth0",
        r#"{"iface_id": "eth0", "host_dev_name": "lo"}"#,
    );
    let (code, reply) = http(&sock, "PUT", "/actions", Some(START));
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("network interface eth0") && reply.contains("lo"),
        "{reply}"
    );
}

#[test]
fn kvm_restore_reopens_the_tap_by_name_or_override() {
    require_kvm();
    let (Some(a), Some(b)) = (TapGuard::new("a"), TapGuard::new("b")) else {
        return;
    };
    let s = Scratch::new("net-restore");
    let sock = s.path("api.sock");
    let net = iface("eth0", &a.0, "06:00:AC:10:00:02");
    let (vmm, rx) = boot_snaptest(
        &sock,
        64,
        false,
        "mib=1 rounds=100000 sleep_ms=20",
        &[("/network-interfaces/eth0", &net)],
    );
    read_until(&rx, "count 2");
    assert!(
        holds_tap(vmm.id(), &a.0),
        "the booted VMM does not hold {}",
        a.0
    );
    // PATCH after boot: new limits, shown by GET /vm/config; an unknown
    // interface and PUT after boot are refused.
    let (code, reply) = http(
        &sock,
        "PATCH",
        "/network-interfaces/eth0",
        Some(
            r#"{"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 100, "refill_time": 1000}}}"#,
        ),
    );
    assert_eq!(code, 204, "{reply}");
    let (_, cfg) = http(&sock, "GET", "/vm/config", None);
    assert!(
        cfg.contains(r#""tx_rate_limiter":{"ops":{"refill_time":1000,"size":100}}"#),
        "{cfg}"
    );
    let (code, _) = http(
        &sock,
        "PATCH",
        "/network-interfaces/eth9",
        Some(r#"{"iface_id": "eth9"}"#),
    );
    assert_eq!(code, 400);
    let (code, reply) = http(&sock, "PUT", "/network-interfaces/eth0", Some(&net));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("after starting"), "{reply}");

    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    drop(vmm);
    drop(rx);

    let load = |extra: &str| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true{extra}}}"#,
            state.display(),
            mem.display()
        )
    };
    // By the saved name.
    let rsock = s.path("r1.sock");
    let (r1, _rx1) = spawn_vmm_lines(&rsock);
    let unknown = load(r#", "network_overrides": [{"iface_id": "eth9", "host_dev_name": "x"}]"#);
    let (code, reply) = http(&rsock, "PUT", "/snapshot/load", Some(&unknown));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("Unknown Network Device"), "{reply}");
    drop(r1);
    let rsock = s.path("r2.sock");
    let (r2, rx2) = spawn_vmm_lines(&rsock);
    put(&rsock, "/snapshot/load", &load(""));
    read_until(&rx2, "count");
    assert!(
        holds_tap(r2.id(), &a.0),
        "the restored VMM did not reopen {}",
        a.0
    );
    let (_, cfg) = http(&rsock, "GET", "/vm/config", None);
    assert!(cfg.contains(r#""tx_rate_limiter":{"ops""#), "{cfg}");
    drop(r2);
    drop(rx2);

    // By network_overrides: another tap.
    let rsock = s.path("r3.sock");
    let (r3, rx3) = spawn_vmm_lines(&rsock);
    let over = load(&format!(
        r#", "network_overrides": [{{"iface_id": "eth0", "host_dev_name": "{}"}}]"#,
        b.0
    ));
    put(&rsock, "/snapshot/load", &over);
    read_until(&rx3, "count");
    let t = Instant::now();
    while !holds_tap(r3.id(), &b.0) {
        assert!(t.elapsed() < Duration::from_secs(5), "{} not reopened", b.0);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!holds_tap(r3.id(), &a.0));
    let (_, cfg) = http(&rsock, "GET", "/vm/config", None);
    assert!(
        cfg.contains(&format!(r#""host_dev_name":"{}""#, b.0)),
        "{cfg}"
    );
    // Frames the host sends into the tap stay queued there (no driver
    // yet); the VMM keeps running, with seccomp on.
    let _ = Command::new("ip")
        .args(["addr", "add", "10.213.7.1/24", "dev", &b.0])
        .output();
    let _ = Command::new("ping")
        .args(["-c", "2", "-W", "1", "-i", "0.2", "10.213.7.2"])
        .output();
    read_until(&rx3, "count");
    drop(r3);
}

/// A network namespace (`ip netns add`) holding a tap named `tap`; deleted
/// (with the tap) when dropped.
struct NetnsGuard(String);

impl NetnsGuard {
    fn new(name: &str, tap: &str) -> Option<NetnsGuard> {
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let _ = run(&["netns", "del", name]);
        if !run(&["netns", "add", name]) {
            eprintln!("skipping: `ip netns add {name}` failed");
            return None;
        }
        let ns = NetnsGuard(name.into());
        assert!(run(&[
            "netns", "exec", name, "ip", "tuntap", "add", "dev", tap, "mode", "tap"
        ]));
        Some(ns)
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn kvm_clones_reopen_their_tap_in_their_own_namespace() {
    require_kvm();
    let Some(tap) = TapGuard::new("c") else {
        return;
    };
    // `spd`, not kvm_net.rs's `spn`: its tests sweep `spn<k>-<pid>-…`
    // namespaces whose pid is gone, and they run in this same process.
    let stem = format!("spd{}", std::process::id() % 100_000);
    let (Some(ns1), Some(ns2)) = (
        NetnsGuard::new(&format!("{stem}-1"), &tap.0),
        NetnsGuard::new(&format!("{stem}-2"), &tap.0),
    ) else {
        return;
    };
    let s = Scratch::new("net-clone");
    let sock = s.path("api.sock");
    let net = iface("eth0", &tap.0, "06:00:AC:10:00:02");
    let (vmm, rx) = boot_snaptest(
        &sock,
        64,
        false,
        "mib=1 rounds=100000 sleep_ms=20",
        &[("/network-interfaces/eth0", &net)],
    );
    let mut reaper = Reaper {
        source: None,
        pids: vec![vmm.id() as i32],
        dir: s.0.clone(),
    };
    read_until(&rx, "count 2");
    // Without namespaces every clone would fight its source for the tap.
    let (code, report) = put_clone(&sock, r#"{"count": 1, "mode": "continue"}"#);
    assert_eq!(code, 400, "{report}");
    let (code, reply) = http(
        &sock,
        "PUT",
        "/clone",
        Some(r#"{"count": 1, "mode": "continue"}"#),
    );
    assert!(code == 400 && reply.contains("netns_template"), "{reply}");
    // A namespace that does not exist: the clone fails, saying which.
    let missing = format!(
        r#"{{"count": 1, "mode": "continue", "network": {{"netns_template": "/run/netns/{stem}-missing-{{n}}"}}}}"#
    );
    let (code, reply) = http(&sock, "PUT", "/clone", Some(&missing));
    assert_ne!(code, 200, "{reply}");
    assert!(reply.contains("network namespace"), "{reply}");

    let body = format!(
        r#"{{"count": 2, "mode": "continue", "network": {{"netns_template": "/run/netns/{stem}-{{n}}",
             "interfaces": [{{"iface_id": "eth0", "guest_mac_template": "06:00:ac:10:{{n}}",
                              "ipv4": "10.0.0.{{n}}/24", "gateway": "10.0.0.254"}}]}}}}"#
    );
    let (code, report) = put_clone(&sock, &body);
    assert_eq!(code, 200, "{report}");
    reaper.add_from(&report);
    let clones = report["clones"].as_array().unwrap();
    // Clone numbers continue after the failed attempt's: find the
    // namespaces by what each clone process holds.
    for c in clones {
        let pid = u32::try_from(c["pid"].as_u64().unwrap()).expect("a pid fits u32");
        let n = c["index"].as_u64().unwrap();
        assert!(
            holds_tap(pid, &tap.0),
            "clone {n} (pid {pid}) holds no tap {}",
            tap.0
        );
        let csock = PathBuf::from(c["socket"].as_str().unwrap());
        let (code, cfg) = http(&csock, "GET", "/vm/config", None);
        assert_eq!(code, 200, "{cfg}");
        let want = format!(r#""guest_mac":"06:00:ac:10:00:{n:02x}""#);
        assert!(cfg.contains(&want), "clone {n}: {cfg}");
        // It runs in namespace n (the file's inode is the namespace's).
        let ns = [&ns1, &ns2][usize::try_from(n).expect("clone 1 or 2") - 1].path();
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        assert_eq!(
            ino(Path::new(&format!("/proc/{pid}/ns/net"))),
            ino(&ns),
            "clone {n} is not in {}",
            ns.display()
        );
    }
    // The source still holds its own tap, in the host's namespace.
    assert!(holds_tap(vmm.id(), &tap.0));
    drop(rx);
}
