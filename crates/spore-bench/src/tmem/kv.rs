//! `spore bench tmem`, key/value server: commands/s of `SET` (guest heap) vs
//! `TMEMPUT` (VMM pool) against the `kvserver` unikernel, reached through
//! `spore vsock forward` on a local TCP port, as the seed's Table 4.2.
//!
//! The load client is a small pipelined RESP writer: it sends `pipeline`
//! commands, then reads their replies, until all values are stored, and
//! checks every reply. Between runs the store is emptied (`DEL` of every key
//! after `SET`, `TMEMINVAL` after `TMEMPUT`), outside the timed part.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};

use crate::stats::{median, summary};

/// Value sizes (bytes) measured.
pub const SIZES: [usize; 5] = [512, 1024, 4096, 16384, 65536];

/// The alphabet bench values are spelled from.
const LETTERS: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";

/// The seed's Table 4.2 (commands/s, i5-8250U), where it has the size.
fn seed(size: usize) -> Value {
    match size {
        512 => json!({ "set": 5062.7, "tmemput": 3676.2 }),
        1024 => json!({ "set": 4480.9, "tmemput": 2148.3 }),
        4096 => json!({ "set": 2768.2, "tmemput": 1678.6 }),
        16384 => json!({ "set": 1288.5, "tmemput": 938.6 }),
        _ => Value::Null,
    }
}

/// Kills and reaps a child when dropped, however the bench ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads lines from a child's pipe until one contains `want`; then drains
/// the rest in a thread so the child never blocks on a full pipe.
fn wait_for_line<R: std::io::Read + Send + 'static>(pipe: R, want: &str) -> anyhow::Result<()> {
    let mut r = BufReader::new(pipe);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            bail!("the process ended before saying {want:?}");
        }
        if line.contains(want) {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    Ok(())
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut c = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        c.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        c.extend_from_slice(a);
        c.extend_from_slice(b"\r\n");
    }
    c
}

struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
    pipeline: usize,
}

impl Client {
    /// Sends `n` commands (`make(i)`), `pipeline` at a time, and checks that
    /// every reply is the line `expect`; returns the elapsed time.
    fn run(
        &mut self,
        n: usize,
        make: impl Fn(usize) -> Vec<u8>,
        expect: &str,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut buf = Vec::new();
        let mut line = String::new();
        let mut i = 0;
        while i < n {
            let count = self.pipeline.min(n - i);
            buf.clear();
            for j in i..i + count {
                buf.extend_from_slice(&make(j));
            }
            self.w.write_all(&buf)?;
            for j in i..i + count {
                line.clear();
                if self.r.read_line(&mut line)? == 0 {
                    bail!("kvserver closed the connection");
                }
                ensure!(
                    line.trim_end() == expect,
                    "command {j}: kvserver answered {:?}, expected {expect:?}",
                    line.trim_end()
                );
            }
            i += count;
        }
        Ok(start.elapsed())
    }
}

/// A kvserver VM with its port forwarded to loopback TCP, and a client.
struct KvServer {
    vm: Reaped,
    _fwd: Reaped,
    client: Client,
}

/// Boots kvserver (with or without seccomp filters) and forwards its port.
fn start(
    spore: &Path,
    image: &Path,
    pipeline: usize,
    scratch: &Path,
    no_seccomp: bool,
) -> anyhow::Result<KvServer> {
    let uds = scratch.join("kv.sock");
    let _ = std::fs::remove_file(&uds);
    let mut vm = Reaped(
        Command::new(spore)
            .args(["run", "--mem", "256M", "--tmem-quota", "1G", "--vsock"])
            .arg(format!("3:{}", uds.display()))
            .args(no_seccomp.then_some("--no-seccomp"))
            .arg("--kernel")
            .arg(image)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the kvserver VM")?,
    );
    let out = vm.0.stdout.take().context("kvserver stdout")?;
    wait_for_line(out, "kvserver: listening").context("starting kvserver")?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut fwd = Reaped(
        Command::new(spore)
            .args(["vsock", "forward", "--uds"])
            .arg(&uds)
            .args(["--port", "6379", "--listen"])
            .arg(format!("tcp:127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning spore vsock forward")?,
    );
    let err = fwd.0.stderr.take().context("forwarder stderr")?;
    wait_for_line(err, "-> guest port 6379").context("starting the forwarder")?;
    let s = TcpStream::connect(("127.0.0.1", port)).context("connecting to the forwarder")?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    Ok(KvServer {
        vm,
        _fwd: fwd,
        client: Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
            pipeline,
        },
    })
}

/// Seccomp's cost on a vsock round trip: one 64-byte SET at a time (host
/// TCP → forwarder → the VMM's vsock device → kvserver and back), `n` per
/// VM, VMs with filters on and off alternating `vms` times each. Medians of
/// the per-VM medians, in µs per round trip.
pub fn seccomp_round_trips(
    spore: &Path,
    image: &Path,
    n: usize,
    vms: usize,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let value = [b'v'; 64];
    for _ in 0..vms.max(1) {
        for no_seccomp in [false, true] {
            let mut kv = start(spore, image, 1, scratch, no_seccomp)?;
            let mut each = Vec::with_capacity(n);
            for i in 0..n {
                let key = format!("rt:{i}").into_bytes();
                let t = kv
                    .client
                    .run(1, |_| command(&[b"SET", &key, &value]), "+OK")?;
                each.push(t.as_secs_f64() * 1e6);
            }
            if no_seccomp { &mut off } else { &mut on }.push(median(&each));
        }
    }
    let (m_on, m_off) = (median(&on), median(&off));
    Ok(json!({
        "what": "one 64-byte SET per round trip, host TCP -> spore vsock forward -> VMM vsock -> kvserver",
        "round_trips_per_vm": n,
        "vms_each": vms.max(1),
        "seccomp_on_us": summary(&on),
        "seccomp_off_us": summary(&off),
        "on_over_off": m_on / m_off,
    }))
}

/// Boots kvserver, forwards its port, and measures every size.
pub fn run(
    spore: &Path,
    image: &Path,
    values: usize,
    runs: usize,
    pipeline: usize,
    scratch: &Path,
) -> anyhow::Result<Value> {
    let mut kv = start(spore, image, pipeline, scratch, false)?;
    let c = &mut kv.client;
    let keys: Vec<Vec<u8>> = (0..values)
        .map(|i| format!("bench:{i:08}").into_bytes())
        .collect();
    let mut rows = Vec::new();
    for size in SIZES {
        let value: Vec<u8> = (0..size).map(|i| LETTERS[i * 7 % 26]).collect();
        let (mut set, mut tput) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = c.run(values, |i| command(&[b"SET", &keys[i], &value]), "+OK")?;
            set.push(values as f64 / t.as_secs_f64());
            c.run(values, |i| command(&[b"DEL", &keys[i]]), ":1")?;
            let t = c.run(values, |i| command(&[b"TMEMPUT", &keys[i], &value]), "+OK")?;
            tput.push(values as f64 / t.as_secs_f64());
            c.run(values, |i| command(&[b"TMEMINVAL", &keys[i]]), ":1")?;
        }
        let (ms, mt) = (median(&set), median(&tput));
        rows.push(json!({
            "value_bytes": size,
            "set_cmds_per_s": summary(&set),
            "tmemput_cmds_per_s": summary(&tput),
            "tmemput_over_set": mt / ms,
            "seed_i5_8250u": seed(size),
        }));
    }
    ensure!(
        kv.vm.0.try_wait()?.is_none(),
        "the kvserver VM exited during the bench"
    );
    Ok(json!({
        "values_per_run": values,
        "runs": runs,
        "pipeline": pipeline,
        "sizes": rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_resp_arrays() {
        assert_eq!(
            command(&[b"SET", b"k", b"v1"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n".to_vec()
        );
    }
}
