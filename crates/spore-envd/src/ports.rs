//! The guest's TCP servers, reachable from the host over vsock: a sandbox
//! has no network, and the sandbox proxy reaches guest port N as vsock port
//! N. Every second envd reads `/proc/net/tcp` and `/proc/net/tcp6` for
//! listening sockets and, for each port it finds, listens on the same vsock
//! port and joins each connection to the TCP port on loopback; when the
//! server stops listening, so does its vsock port. (E2B's envd forwards
//! ports the same way, from the sandbox's network address to loopback.)

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_vsock::{VsockAddr, VsockListener, VMADDR_CID_ANY};

/// How often the listening sockets are read.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// TCP's LISTEN state in `/proc/net/tcp`'s `st` column.
const LISTEN: &str = "0A";

/// Forwards every listening TCP port but `skip` (envd's own) until the
/// process ends.
pub async fn forward_listening_ports(skip: u16) {
    let mut active: HashMap<u16, JoinHandle<()>> = HashMap::new();
    let mut refused = BTreeSet::new();
    loop {
        let listening = listening_ports();
        active.retain(|port, task| {
            let keep = listening.contains(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for &port in listening.difference(&refused.clone()) {
            if port == skip || active.contains_key(&port) {
                continue;
            }
            match VsockListener::bind(VsockAddr::new(VMADDR_CID_ANY, u32::from(port))) {
                Ok(l) => {
                    active.insert(port, tokio::spawn(accept(l, port)));
                }
                Err(e) => {
                    // Said once per port (a vsock port another program holds).
                    eprintln!("spore-envd: cannot forward port {port} over vsock: {e}");
                    refused.insert(port);
                }
            }
        }
        refused.retain(|p| listening.contains(p));
        tokio::time::sleep(SCAN_EVERY).await;
    }
}

async fn accept(listener: VsockListener, port: u16) {
    loop {
        let Ok((mut from_host, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tokio::spawn(async move {
            // A server on 0.0.0.0 or 127.0.0.1 answers the first, one on
            // [::1] only the second.
            let server = match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(s) => s,
                Err(_) => match TcpStream::connect(("::1", port)).await {
                    Ok(s) => s,
                    Err(_) => return,
                },
            };
            let _ = server.set_nodelay(true);
            let mut server = server;
            let _ = tokio::io::copy_bidirectional(&mut from_host, &mut server).await;
        });
    }
}

/// The ports of listening TCP sockets, IPv4 and IPv6.
fn listening_ports() -> BTreeSet<u16> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| parse_listening(&text))
        .collect()
}

/// The listening ports of one `/proc/net/tcp`-format table (`local_address`
/// is `HEXADDR:HEXPORT`, `st` the state).
fn parse_listening(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let local = cols.nth(1)?;
            let state = cols.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let (_, port) = local.rsplit_once(':')?;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_read_from_the_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:C383 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n\
   2: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1\n";
        assert_eq!(parse_listening(table), vec![8000, 50051]);
        let v6 = "  sl  local_address                         remote_address                        st\n\
   0: 00000000000000000000000001000000:0BB8 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(parse_listening(v6), vec![3000]);
        assert!(parse_listening("header only\n").is_empty());
        assert!(parse_listening("h\n garbage\n 0: x:zz y 0A\n").is_empty());
    }

    #[tokio::test]
    async fn this_hosts_listeners_are_found() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening_ports().contains(&port));
        drop(l);
        assert!(!listening_ports().contains(&port));
    }
}
