//! Host-KVM tier: device state across a snapshot, with the `kvserver`
//! unikernel (RESP over vsock, values on its heap or in the VMM's tmem pool).
//!
//! - tmem: objects put before the snapshot come back from a VM restored in a
//!   new VMM process, with the pool's quota and counters;
//! - vsock: connections are reset on restore and the guest is told
//!   (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET): with a single connection slot, the
//!   one open at the snapshot must be gone, and the first connection after
//!   the restore must be served.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;

/// A RESP client over a vsock connection to guest port 6379.
struct Client(BufReader<UnixStream>);

impl Client {
    /// One attempt: `None` if the VMM or the guest refused it.
    fn connect(uds: &Path) -> Option<Client> {
        let mut s = UnixStream::connect(uds).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"CONNECT 6379\n").ok()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        line.starts_with("OK ").then_some(Client(r))
    }

    fn call(&mut self, args: &[&[u8]]) -> Option<Vec<u8>> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.0.get_mut().write_all(&buf).unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let line = line.trim_end();
        match line.as_bytes().first() {
            Some(b'+') | Some(b':') => Some(line.as_bytes()[1..].to_vec()),
            Some(b'$') => {
                let n: i64 = line[1..].parse().unwrap();
                if n < 0 {
                    return None;
                }
                let n = usize::try_from(n).expect("a bulk length of a test value fits usize");
                let mut v = vec![0u8; n + 2];
                self.0.read_exact(&mut v).unwrap();
                v.truncate(n);
                Some(v)
            }
            _ => panic!("unexpected reply {line:?}"),
        }
    }
}

fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 256).expect("below 256").wrapping_mul(31) ^ seed)
        .collect()
}

fn tmem_objects(sock: &Path) -> serde_json::Value {
    let (code, body) = http(sock, "GET", "/tmem", None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn kvm_restored_kvserver_keeps_its_tmem_pool_and_resets_vsock() {
    require_kvm();
    // With other VMs starting beside it the first vsock connection after
    // the restore is now and then refused (a race not yet found): it runs
    // alone, as it did in a test binary of its own.
    host::alone();
    let s = Scratch::new("snap-devices");
    let (sock, uds) = (s.path("api.sock"), s.path("v.sock"));
    let (state, mem) = (s.path("vm.state"), s.path("vm.mem"));
    let vmm = VmmChild::new(
        spore()
            .args(["vmm", "--api-sock"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    wait_for_path(&sock, Duration::from_secs(10));
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "conns=1"}}"#,
        uk_image("kvserver").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    let mc = r#"{"vcpu_count": 1, "mem_size_mib": 64}"#;
    assert_eq!(http(&sock, "PUT", "/machine-config", Some(mc)).0, 204);
    let vsock = format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, uds.display());
    assert_eq!(http(&sock, "PUT", "/vsock", Some(&vsock)).0, 204);
    let (code, body) = http(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(code, 204, "{body}");

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        if let Some(c) = Client::connect(&uds) {
            break c;
        }
        assert!(Instant::now() < deadline, "kvserver never answered");
        std::thread::sleep(Duration::from_millis(20));
    };
    let big = value(64 * 1024, 7);
    assert_eq!(c.call(&[b"SET", b"heap", b"on-the-heap"]).unwrap(), b"OK");
    assert_eq!(c.call(&[b"TMEMPUT", b"t:big", &big]).unwrap(), b"OK");
    assert_eq!(c.call(&[b"TMEMPUT", b"t:small", b"tiny"]).unwrap(), b"OK");
    assert_eq!(c.call(&[b"TMEMPUT", b"t:gone", b"x"]).unwrap(), b"OK");
    assert_eq!(c.call(&[b"TMEMINVAL", b"t:gone"]).unwrap(), b"1");
    let before = tmem_objects(&sock);
    assert_eq!(before["objects"], 2, "{before}");

    // `c` stays open through the snapshot: it holds the guest's only slot.
    snapshot_create(&sock, &state, &mem, false, true);
    drop(vmm);
    drop(c);

    for round in 0..2 {
        let sock2 = s.path(&format!("api-{round}.sock"));
        let _restored = VmmChild::new(
            spore()
                .args(["snapshot", "restore", "--state"])
                .arg(&state)
                .arg("--mem")
                .arg(&mem)
                .arg("--api-sock")
                .arg(&sock2)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        wait_for_path(&sock2, Duration::from_secs(10));
        // The vsock socket appears once the restored VM is built; the
        // first connection made then must be served.
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&uds).is_err() {
            assert!(Instant::now() < deadline, "no vsock socket after restore");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut c = Client::connect(&uds).unwrap_or_else(|| {
            panic!("round {round}: the first connection after the restore was refused")
        });
        assert_eq!(c.call(&[b"GET", b"heap"]).unwrap(), b"on-the-heap");
        assert_eq!(c.call(&[b"TMEMGET", b"t:big"]).unwrap(), big);
        assert_eq!(c.call(&[b"TMEMGET", b"t:small"]).unwrap(), b"tiny");
        assert_eq!(c.call(&[b"TMEMGET", b"t:gone"]), None);
        let after = tmem_objects(&sock2);
        for field in [
            "objects",
            "bytes_used",
            "bytes_stored",
            "quota_bytes",
            "puts",
            "invalidates",
        ] {
            assert_eq!(after[field], before[field], "{field}: {after} vs {before}");
        }
        assert_eq!(c.call(&[b"TMEMPUT", b"t:new", b"after"]).unwrap(), b"OK");
        assert_eq!(tmem_objects(&sock2)["objects"], 3);
    }
}
