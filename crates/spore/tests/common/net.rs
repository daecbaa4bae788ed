//! Host networking for the virtio-net tests: tap devices and network
//! namespaces made with iproute2 (as root) and removed on drop, and `curl`
//! against a guest.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `ip ARGS` (in network namespace `ns` if given); panics with its
/// stderr when it fails.
pub fn ip(ns: Option<&str>, args: &[&str]) {
    let o = ip_output(ns, args);
    assert!(
        o.status.success(),
        "ip {}{}: {}",
        ns.map(|n| format!("-n {n} ")).unwrap_or_default(),
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn ip_output(ns: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new("ip");
    if let Some(n) = ns {
        c.args(["-n", n]);
    }
    c.args(args).output().expect("run ip (iproute2)")
}

/// A network namespace `ip netns add NAME`, deleted on drop.
pub struct Netns(pub String);

/// Namespaces `spn<k>-<pid>-…` of test processes that are gone (a killed
/// run cannot drop its own): deleted.
fn sweep_dead_namespaces() {
    let o = ip_output(None, &["netns", "list"]);
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let pid = name
            .strip_prefix("spn")
            .and_then(|rest| rest.split('-').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = ip_output(None, &["netns", "del", name]);
        }
    }
}

/// Test taps (`spn…`) other than `name` that hold `host_cidr`'s address: left
/// by a killed earlier run (each test owns its /24), they would keep the
/// route to the guest's subnet, so they are deleted.
fn remove_stale_holders(ns: Option<&str>, name: &str, host_cidr: &str) {
    let addr = host_cidr.split('/').next().unwrap_or(host_cidr);
    let o = ip_output(ns, &["-o", "addr", "show", "to", addr]);
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        // "7: spn13x9833    inet 10.77.13.1/24 …"
        let holder = line.split_whitespace().nth(1).unwrap_or("");
        if holder != name && holder.starts_with("spn") {
            let _ = ip_output(ns, &["link", "del", holder]);
        }
    }
}

impl Netns {
    pub fn new(name: &str) -> Netns {
        sweep_dead_namespaces();
        // A namespace of a killed earlier run with the same name goes first.
        let _ = ip_output(None, &["netns", "del", name]);
        ip(None, &["netns", "add", name]);
        ip(Some(name), &["link", "set", "lo", "up"]);
        Netns(name.to_string())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip_output(None, &["netns", "del", &self.0]);
    }
}

/// A persistent tap device with host address `host_cidr` (in namespace `ns`
/// if given), up, deleted on drop.
pub struct Tap {
    pub name: String,
    ns: Option<String>,
}

impl Tap {
    pub fn new(ns: Option<&str>, name: &str, host_cidr: &str) -> Tap {
        let _ = ip_output(ns, &["link", "del", name]);
        remove_stale_holders(ns, name, host_cidr);
        ip(ns, &["tuntap", "add", "dev", name, "mode", "tap"]);
        let tap = Tap {
            name: name.to_string(),
            ns: ns.map(str::to_string),
        };
        ip(ns, &["addr", "add", host_cidr, "dev", name]);
        ip(ns, &["link", "set", name, "up"]);
        tap
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = ip_output(self.ns.as_deref(), &["link", "del", &self.name]);
    }
}

/// `curl -sS --max-time SECS URL...` (inside `ns` if given): its output,
/// or the error it printed.
pub fn curl(ns: Option<&str>, secs: u64, args: &[&str]) -> Result<Vec<u8>, String> {
    let mut c = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", n, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let o = c
        .args(["-sS", "--noproxy", "*", "--max-time", &secs.to_string()])
        .args(args)
        .output()
        .expect("run curl");
    if o.status.success() {
        Ok(o.stdout)
    } else {
        Err(format!(
            "curl {}: {} {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

/// Retries `GET url` until it answers (the guest's stack and the host's ARP
/// settle) or `timeout` passes; returns the body.
pub fn curl_until_up(ns: Option<&str>, url: &str, timeout: Duration) -> String {
    let t = Instant::now();
    loop {
        match curl(ns, 2, &[url]) {
            Ok(b) => return String::from_utf8_lossy(&b).into_owned(),
            Err(e) if t.elapsed() > timeout => panic!("{url} never answered: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Whether this host can make tap devices (root, /dev/net/tun, iproute2).
pub fn require_tap() {
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "the virtio-net tests need /dev/net/tun"
    );
}
