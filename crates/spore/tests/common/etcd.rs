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
        };
        etcd.restart();
        etcd
    }

    /// `host:port` of its client API.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Starts it (again), on its ports and data, and waits until it listens.
    pub fn restart(&mut self) {
        assert!(
            Path::new("/usr/bin/etcd").exists(),
            "etcd not found: `make deps` installs Debian's etcd-server"
        );
        let (client, peer) = (self.client_port, self.peer_port);
        let child = Command::new("/usr/bin/etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=t=http://127.0.0.1:{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
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
