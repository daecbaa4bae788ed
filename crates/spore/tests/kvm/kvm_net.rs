//! virtio-net end to end on host KVM: the `httpd` unikernel (spore-uk's
//! virtio-net driver and smoltcp) on a tap device answers `curl` from the
//! host; a snapshot of it restored in a new process answers again; clones
//! keep the guest's address, each in a network namespace of its own; a
//! PATCHed rate limiter holds the interface to 10 MiB/s; an MMDS store
//! and its configuration survive a snapshot restored in a new process.
//!
//! Each test uses its own tap name and /24, so the tests of this file run
//! in parallel. They need root (taps, namespaces) like the rest of the
//! host tier's KVM tests.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::common::net::*;
use crate::common::*;

/// The tap name for test `k` (unique per test process; at most 15 bytes).
fn tap_name(k: u32) -> String {
    format!("spn{k}x{}", std::process::id() % 1_000_000)
}

/// The guest's address on the /24 of test `k`.
fn guest_ip(k: u32) -> String {
    format!("10.77.{k}.2")
}

/// Boots `httpd` on a VMM at `sock` with `eth0` on tap `tap`; returns once
/// the guest listens.
fn boot_httpd(sock: &Path, tap: &str, k: u32, extra_args: &str) -> (VmmChild, Receiver<String>) {
    let (vmm, rx) = spawn_vmm_lines(sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "ip={}/24 gw=10.77.{k}.1 {extra_args}"}}"#,
        uk_image("httpd").display(),
        guest_ip(k)
    );
    put(sock, "/boot-source", &boot);
    put(
        sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    let iface = format!(
        r#"{{"iface_id": "eth0", "host_dev_name": "{tap}", "guest_mac": "06:00:0a:4d:{k:02x}:02"}}"#
    );
    put(sock, "/network-interfaces/eth0", &iface);
    put(sock, "/actions", r#"{"action_type": "InstanceStart"}"#);
    read_until(&rx, "httpd: listening");
    (vmm, rx)
}

/// A new VMM at `sock` running the snapshot `state` + `mem`.
fn restore_in_new_process(sock: &Path, state: &Path, mem: &Path) -> (VmmChild, Receiver<String>) {
    let (vmm, rx) = spawn_vmm_lines(sock);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        mem.display()
    );
    put(sock, "/snapshot/load", &body);
    (vmm, rx)
}

/// A booted `httpd` on its own tap (test `k`), answering at `base`.
struct Httpd {
    s: Scratch,
    _tap: Tap,
    sock: PathBuf,
    vmm: VmmChild,
    _rx: Receiver<String>,
    base: String,
}

impl Httpd {
    fn start(k: u32, tag: &str) -> Httpd {
        require_kvm();
        require_tap();
        let s = Scratch::new(tag);
        let tap = Tap::new(None, &tap_name(k), &format!("10.77.{k}.1/24"));
        let sock = s.path("api.sock");
        let (vmm, rx) = boot_httpd(&sock, &tap.name, k, "");
        let base = format!("http://{}", guest_ip(k));
        curl_until_up(None, &format!("{base}/"), Duration::from_secs(10));
        Httpd {
            s,
            _tap: tap,
            sock,
            vmm,
            _rx: rx,
            base,
        }
    }
}

#[test]
fn kvm_net_httpd_answers_a_thousand_requests_from_curl() {
    let vm = Httpd::start(11, "net-httpd");
    let (s, base) = (&vm.s, &vm.base);
    let hello = curl(None, 5, &[&format!("{base}/")]).unwrap();
    assert_eq!(hello, b"hello from spore-httpd generation=0 clone=0\n");

    // 1,000 requests on keep-alive connections (curl's URL globbing), each
    // body checked in order.
    let out = curl(None, 60, &[&format!("{base}/req/[0-999]")]).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1000, "{} answers", lines.len());
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(*l, format!("req {i} generation=0 clone=0"), "answer {i}");
    }

    // A bigger body, checked byte by byte against the guest's pattern.
    let n = 3 << 20;
    let body = curl(None, 60, &[&format!("{base}/bytes/{n}")]).unwrap();
    assert_eq!(body.len(), n);
    assert!(
        body.iter()
            .enumerate()
            .all(|(i, &b)| b == u8::try_from(i % 251).expect("below 251")),
        "the pattern differs"
    );
    // And one the other way.
    let upload: Vec<u8> = (0..(1u32 << 20))
        .map(|i| u8::try_from(i * 7 % 256).expect("below 256"))
        .collect();
    let file = s.path("upload.bin");
    std::fs::write(&file, &upload).unwrap();
    let sum: u32 = upload.iter().map(|&b| b as u32).fold(0, u32::wrapping_add);
    let reply = curl(
        None,
        60,
        &[
            "--data-binary",
            &format!("@{}", file.display()),
            "-H",
            "Content-Type: application/octet-stream",
            "-H",
            "Expect:",
            &format!("{base}/sink"),
        ],
    )
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!("received {} sum {sum}\n", upload.len())
    );
    // The guest answers ARP and ping too.
    let ping = std::process::Command::new("ping")
        .args(["-c", "1", "-W", "2", &guest_ip(11)])
        .output()
        .expect("run ping (iputils-ping, installed by scripts/ensure-deps.sh)");
    assert!(ping.status.success(), "ping: {}", stdout_of(&ping));
}

#[test]
fn kvm_net_a_snapshot_restored_in_a_new_process_answers_again() {
    let mut vm = Httpd::start(12, "net-snap");
    let (s, sock, base) = (&vm.s, &vm.sock, vm.base.clone());
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    snapshot_create(sock, &state, &mem, false, true);
    let _ = vm.vmm.wait();
    // Nobody answers while the VM is gone.
    assert!(curl(None, 1, &[&format!("{base}/")]).is_err());

    let sock2 = s.path("api2.sock");
    let (_vmm2, _rx2) = restore_in_new_process(&sock2, &state, &mem);
    // A new TCP connection works right after the restore: the tap was
    // reopened by its name and the guest's stack goes on.
    let t = Instant::now();
    let reply = curl_until_up(None, &format!("{base}/req/7"), Duration::from_secs(10));
    assert_eq!(reply, "req 7 generation=0 clone=0\n");
    eprintln!("restored VM answered after {:?}", t.elapsed());
}

#[test]
fn kvm_net_a_rate_limited_interface_holds_10_mib_per_s() {
    let vm = Httpd::start(13, "net-rate");
    let (s, sock, base) = (&vm.s, &vm.sock, &vm.base);
    // 10 MiB/s as a 1 MiB bucket refilled every 100 ms (a small bucket, so
    // that its first burst does not skew a 5 s measurement).
    let limiter = r#"{"bandwidth": {"size": 1048576, "refill_time": 100}}"#;
    let patch = format!(
        r#"{{"iface_id": "eth0", "rx_rate_limiter": {limiter}, "tx_rate_limiter": {limiter}}}"#
    );
    let (code, reply) = http(sock, "PATCH", "/network-interfaces/eth0", Some(&patch));
    assert_eq!(code, 204, "{reply}");
    let rate = |what: &str, f: &dyn Fn() -> usize| {
        let t = Instant::now();
        let n = f();
        let secs = t.elapsed().as_secs_f64();
        let mib_s = n as f64 / secs / (1 << 20) as f64;
        eprintln!("{what}: {n} bytes in {secs:.2} s = {mib_s:.2} MiB/s");
        assert!(
            (9.0..=11.0).contains(&mib_s),
            "{what}: {mib_s:.2} MiB/s is not within 10 % of 10 MiB/s"
        );
    };
    // Guest → host (the guest's tx): 50 MiB, about 5 s.
    let n = 50 << 20;
    rate("guest to host", &|| {
        curl(None, 30, &[&format!("{base}/bytes/{n}")])
            .unwrap()
            .len()
    });
    // Host → guest (the guest's rx).
    let file = s.path("up.bin");
    std::fs::write(&file, vec![1u8; n]).unwrap();
    rate("host to guest", &|| {
        let r = curl(
            None,
            30,
            &[
                // No `Expect: 100-continue` (curl would wait a second for
                // an answer httpd does not send).
                "-H",
                "Expect:",
                "--data-binary",
                &format!("@{}", file.display()),
                &format!("{base}/sink"),
            ],
        )
        .unwrap();
        assert!(
            String::from_utf8_lossy(&r).starts_with(&format!("received {n} ")),
            "{}",
            String::from_utf8_lossy(&r)
        );
        n
    });
}

#[test]
fn kvm_net_four_clones_keep_the_address_each_in_its_own_namespace() {
    require_kvm();
    require_tap();
    let k = 14;
    let s = Scratch::new("net-clones");
    let name = tap_name(k);
    let host = format!("10.77.{k}.1/24");
    let tap = Tap::new(None, &name, &host);
    // Each clone's namespace holds a tap of the same name and address: the
    // clone opens it there and keeps the guest's IP and MAC.
    let ns_prefix = format!("spn{k}-{}", std::process::id());
    let namespaces: Vec<Netns> = (1..=4)
        .map(|n| Netns::new(&format!("{ns_prefix}-{n}")))
        .collect();
    let taps: Vec<Tap> = namespaces
        .iter()
        .map(|ns| Tap::new(Some(&ns.0), &name, &host))
        .collect();
    let sock = s.path("src.sock");
    let (_vmm, _rx) = boot_httpd(&sock, &tap.name, k, "");
    let url = format!("http://{}/", guest_ip(k));
    curl_until_up(None, &url, Duration::from_secs(10));

    let body = format!(
        r#"{{"count": 4, "mode": "continue", "network": {{"netns_template": "/run/netns/{ns_prefix}-{{n}}"}}}}"#
    );
    let (code, report) = clone::put_clone(&sock, &body);
    assert_eq!(code, 200, "PUT /clone: {report}");
    let mut reaper = clone::Reaper {
        source: None,
        pids: Vec::new(),
        dir: s.0.clone(),
    };
    reaper.add_from(&report);
    // Namespace n holds clone number n: each answers with its own number,
    // from the same address.
    for (n, ns) in (1..).zip(&namespaces) {
        let hello = curl_until_up(Some(&ns.0), &url, Duration::from_secs(10));
        assert_eq!(
            hello,
            format!("hello from spore-httpd generation=1 clone={n}\n"),
            "in {}",
            ns.0
        );
    }
    // The source, in the host's namespace, goes on answering as itself.
    assert_eq!(
        curl(None, 5, &[&url]).map(|b| String::from_utf8_lossy(&b).into_owned()),
        Ok("hello from spore-httpd generation=0 clone=0\n".to_string())
    );
    drop(reaper);
    drop(taps);
}

#[test]
fn kvm_net_a_clone_given_a_new_mac_and_address_readdresses_itself() {
    require_kvm();
    require_tap();
    let k = 15;
    let s = Scratch::new("net-readdress");
    let name = tap_name(k);
    let tap = Tap::new(None, &name, &format!("10.77.{k}.1/24"));
    // The clone's namespace is on another /24: it only answers there if it
    // took the address it was given.
    let ns = Netns::new(&format!("spn{k}-{}-1", std::process::id()));
    let _ns_tap = Tap::new(Some(&ns.0), &name, "10.78.15.1/24");
    let sock = s.path("src.sock");
    let (_vmm, _rx) = boot_httpd(&sock, &tap.name, k, "");
    curl_until_up(
        None,
        &format!("http://{}/", guest_ip(k)),
        Duration::from_secs(10),
    );

    let ns_template = format!("/run/netns/spn{k}-{}-{{n}}", std::process::id());
    let body = format!(
        r#"{{"count": 1, "mode": "continue", "network": {{"netns_template": "{ns_template}",
            "interfaces": [{{"iface_id": "eth0", "guest_mac_template": "06:00:0a:4e:{{n}}",
                             "ipv4": "10.78.15.{{n}}0/24", "gateway": "10.78.15.1"}}]}}}}"#
    );
    let (code, report) = clone::put_clone(&sock, &body);
    assert_eq!(code, 200, "PUT /clone: {report}");
    let mut reaper = clone::Reaper {
        source: None,
        pids: Vec::new(),
        dir: s.0.clone(),
    };
    reaper.add_from(&report);
    let hello = curl_until_up(Some(&ns.0), "http://10.78.15.10/", Duration::from_secs(10));
    assert_eq!(hello, "hello from spore-httpd generation=1 clone=1\n");
    let log = report["clones"][0]["log"].as_str().unwrap().to_string();
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        console.contains("httpd: readdressed generation=1 ip 10.78.15.10/24 mac 06:00:0a:4e:00:01"),
        "{console}"
    );
    // The old address is not the clone's any more.
    assert!(curl(Some(&ns.0), 1, &[&format!("http://{}/", guest_ip(k))]).is_err());
    drop(reaper);
}

#[test]
fn kvm_net_the_mmds_store_and_config_survive_a_snapshot() {
    require_kvm();
    require_tap();
    let k = 16;
    let s = Scratch::new("net-mmds");
    let tap = Tap::new(None, &tap_name(k), &format!("10.77.{k}.1/24"));
    let sock = s.path("api.sock");
    let (mut vmm, _rx) = spawn_vmm_lines(&sock);
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "ip={}/24 gw=10.77.{k}.1"}}"#,
        uk_image("httpd").display(),
        guest_ip(k)
    );
    put(&sock, "/boot-source", &boot);
    put(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    let iface = format!(r#"{{"iface_id": "eth0", "host_dev_name": "{}"}}"#, tap.name);
    put(&sock, "/network-interfaces/eth0", &iface);
    put(
        &sock,
        "/mmds/config",
        r#"{"version": "V2", "network_interfaces": ["eth0"], "ipv4_address": "169.254.170.2"}"#,
    );
    let data = r#"{"latest":{"meta-data":{"instance-id":"i-7"}}}"#;
    put(&sock, "/mmds", data);
    put(&sock, "/actions", r#"{"action_type": "InstanceStart"}"#);
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    snapshot_create(&sock, &state, &mem, false, true);
    let _ = vmm.wait();

    let sock2 = s.path("api2.sock");
    let (_vmm2, _rx2) = restore_in_new_process(&sock2, &state, &mem);
    assert_eq!(http(&sock2, "GET", "/mmds", None), (200, data.to_string()));
    let (code, config) = http(&sock2, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(
        config["mmds-config"],
        serde_json::json!({"version": "V2", "network_interfaces": ["eth0"], "ipv4_address": "169.254.170.2", "imds_compat": false})
    );
    // The restored store takes PATCHes as the first one did.
    let (code, _) = http(&sock2, "PATCH", "/mmds", Some(r#"{"latest": {"x": "y"}}"#));
    assert_eq!(code, 204);
}
