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
