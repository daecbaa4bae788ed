//! A real etcd server for cluster tests (Debian's `etcd-server`, which
//! `make`'s dependency step installs): one member on free loopback ports
//! with its data under the test's scratch directory; killed on drop, and
//! restartable on the same ports and data (an etcd outage in a test).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    child: Option<Child>,
    pub client_port: u16,
    peer_port: u16,
    data: PathBuf,
    /// This member's name and the whole cluster's `--initial-cluster`.
    name: String,
    initial_cluster: Option<String>,
    /// The address it listens on, and the network namespace it runs in.
    host: String,
    netns: Option<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Etcd {
    pub fn start(data: &Path) -> Etcd {
        let mut etcd = Etcd {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            data: data.to_path_buf(),
            name: "t".into(),
            initial_cluster: None,
            host: "127.0.0.1".into(),
            netns: None,
        };
        etcd.restart();
        etcd
    }

    /// `n` members forming one etcd cluster, each with its data under
    /// `dir/mI`.
    pub fn start_cluster(dir: &Path, n: usize) -> Vec<Etcd> {
        let members: Vec<Etcd> = (0..n)
            .map(|i| Etcd {
                child: None,
                client_port: free_port(),
                peer_port: free_port(),
                data: dir.join(format!("m{i}")),
                name: format!("m{i}"),
                initial_cluster: None,
                host: "127.0.0.1".into(),
                netns: None,
            })
            .collect();
        Self::form(members)
    }

    /// One member in each network namespace `(netns, address)`, on etcd's
    /// usual ports there.
    pub fn start_cluster_in(dir: &Path, hosts: &[(&str, &str)]) -> Vec<Etcd> {
        let members: Vec<Etcd> = hosts
            .iter()
            .enumerate()
            .map(|(i, (ns, addr))| Etcd {
                child: None,
                client_port: 2379,
                peer_port: 2380,
                data: dir.join(format!("m{i}")),
                name: format!("m{i}"),
                initial_cluster: None,
                host: (*addr).to_string(),
                netns: Some((*ns).to_string()),
            })
            .collect();
        Self::form(members)
    }

    fn form(mut members: Vec<Etcd>) -> Vec<Etcd> {
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, m.host, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        // All start before any is waited for: a member listens for clients
        // only once a quorum formed.
        for m in &mut members {
            m.initial_cluster = Some(initial.clone());
            m.spawn();
        }
        for m in &members {
            m.wait_listening();
        }
        members
    }

    /// Whether this member is its cluster's leader now (etcd's JSON gateway).
    pub fn is_leader(&self) -> bool {
        let r = super::serve::http(
            &self.endpoint(),
            "POST",
            "/v3/maintenance/status",
            b"{}",
            &[],
        );
        let v = r.json();
        let member = v["header"]["member_id"].as_str().unwrap_or("-");
        v["leader"].as_str() == Some(member)
    }

    /// `host:port` of its client API.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.client_port)
    }

    /// Starts it (again), on its ports and data, and waits until it listens.
    pub fn restart(&mut self) {
        self.spawn();
        self.wait_listening();
    }

    fn spawn(&mut self) {
        assert!(
            Path::new("/usr/bin/etcd").exists(),
            "etcd not found: `make deps` installs Debian's etcd-server"
        );
        let (client, peer, host) = (self.client_port, self.peer_port, &self.host);
        let initial = self
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{}=http://{host}:{peer}", self.name));
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/var/run/netns/{ns}"))
                    .arg("/usr/bin/etcd");
                c
            }
            None => Command::new("/usr/bin/etcd"),
        };
        let child = cmd
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data)
            .arg(format!("--listen-client-urls=http://{host}:{client}"))
            .arg(format!("--advertise-client-urls=http://{host}:{client}"))
            .arg(format!("--listen-peer-urls=http://{host}:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://{host}:{peer}"
            ))
            .arg(format!("--initial-cluster={initial}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(self.endpoint()).is_err() {
            assert!(Instant::now() < deadline, "etcd did not listen within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP forwarder to `upstream` that a test can cut (a network partition
/// between whoever connects through it and etcd) and mend.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    pub fn start(upstream: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").expect("a proxy port");
        let port = listener.local_addr().expect("its address").port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if c.load(Ordering::Acquire) {
                    continue; // dropped: refused while cut
                }
                let Ok(up) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                for s in [&conn, &up] {
                    if let Ok(s) = s.try_clone() {
                        o.lock().unwrap().push(s);
                    }
                }
                // A cut between the check above and the push: this one too
                // (checked after the push, so that `cut` either sees it in
                // the list or is seen here).
                if c.load(Ordering::Acquire) {
                    let _ = conn.shutdown(std::net::Shutdown::Both);
                    let _ = up.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                for (mut from, mut to) in [
                    (conn.try_clone(), up.try_clone()),
                    (up.try_clone(), conn.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, open }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Closes every connection through it and refuses new ones.
    pub fn cut(&self) {
        // Under the list's lock: a connection being set up is either in the
        // list now or sees the flag after adding itself.
        let mut open = self.open.lock().unwrap();
        self.cut.store(true, std::sync::atomic::Ordering::Release);
        for s in open.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn mend(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Release);
    }
}
