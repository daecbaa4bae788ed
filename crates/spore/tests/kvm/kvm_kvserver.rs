//! Host-KVM tier: the `kvserver` unikernel (RESP over vsock) reached through
//! `spore vsock forward`, driven by redis-cli and by a small RESP client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A kvserver VM plus a forwarder exposing its port 6379.
struct KvServer {
    _dir: Scratch,
    vm: VmmChild,
    forward: VmmChild,
    tcp_port: u16,
}

fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl KvServer {
    fn start(tag: &str, mem: &str) -> KvServer {
        Self::start_with(tag, mem, "")
    }

    fn start_with(tag: &str, mem: &str, cmdline: &str) -> KvServer {
        require_kvm();
        let dir = Scratch::new(tag);
        let uds = dir.path("v.sock");
        let vm = spore()
            .args(["run", "--mem", mem, "--cmdline", cmdline, "--vsock"])
            .arg(format!("3:{}", uds.display()))
            .arg("--kernel")
            .arg(uk_image("kvserver"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut vm = VmmChild::new(vm);
        // The guest prints this once its driver listens.
        let mut out = BufReader::new(vm.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.contains("kvserver: listening"), "guest said {line:?}");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let tcp_port = free_tcp_port();
        let mut forward = VmmChild::new(
            spore()
                .args(["vsock", "forward", "--uds"])
                .arg(&uds)
                .args(["--port", "6379", "--listen"])
                .arg(format!("tcp:127.0.0.1:{tcp_port}"))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // It says so once it listens (a probe connection would take a
        // guest connection slot).
        let mut err = BufReader::new(forward.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(
            line.contains("-> guest port 6379"),
            "forwarder said {line:?}"
        );
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        KvServer {
            _dir: dir,
            vm,
            forward,
            tcp_port,
        }
    }

    fn client(&self) -> Resp<TcpStream> {
        let s = TcpStream::connect(("127.0.0.1", self.tcp_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        Resp::new(s)
    }

    fn redis_cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.tcp_port.to_string()])
            .args(args)
            .output()
            .expect(
                "redis-cli is missing: run scripts/ensure-deps.sh (Debian package redis-tools)",
            );
        assert!(
            out.status.success(),
            "redis-cli {args:?}: {}",
            stderr_of(&out)
        );
        stdout_of(&out).trim_end().to_string()
    }

    /// The VM is still running (not exited or crashed).
    fn assert_alive(&mut self) {
        assert!(
            self.vm.try_wait().unwrap().is_none(),
            "the kvserver VM exited"
        );
        assert!(
            self.forward.try_wait().unwrap().is_none(),
            "the forwarder exited"
        );
    }
}

/// One RESP reply.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A minimal RESP client: commands as arrays of bulk strings, pipelining.
struct Resp<S: Read + Write> {
    r: BufReader<S>,
}

impl<S: Read + Write> Resp<S> {
    fn new(s: S) -> Self {
        Resp {
            r: BufReader::with_capacity(256 * 1024, s),
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.r.get_mut().write_all(&buf).unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        assert!(l.ends_with("\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn read(&mut self) -> Reply {
        let l = self.line();
        let (kind, rest) = l.split_at(1);
        match kind {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Reply::Bulk(None);
                }
                let n = usize::try_from(n).expect("a bulk length of a test value fits usize");
                let mut v = vec![0u8; n + 2];
                self.r.read_exact(&mut v).unwrap();
                assert_eq!(&v[n..], b"\r\n");
                v.truncate(n);
                Reply::Bulk(Some(v))
            }
            "*" => {
                let n: usize = rest.parse().unwrap();
                Reply::Array((0..n).map(|_| self.read()).collect())
            }
            _ => panic!("not a RESP reply: {l:?}"),
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.send(args);
        self.read()
    }
}

fn value_for(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| u8::try_from((i.wrapping_mul(131) + j * 7 + (j >> 8)) % 256).expect("below 256"))
        .collect()
}

#[test]
fn kvm_kvserver_answers_redis_cli() {
    let mut kv = KvServer::start("kv-cli", "64M");
    assert_eq!(kv.redis_cli(&["PING"]), "PONG");
    assert_eq!(kv.redis_cli(&["SET", "greeting", "hello spore"]), "OK");
    assert_eq!(kv.redis_cli(&["GET", "greeting"]), "hello spore");
    assert_eq!(kv.redis_cli(&["SET", "greeting", "replaced"]), "OK");
    assert_eq!(kv.redis_cli(&["GET", "greeting"]), "replaced");
    assert_eq!(kv.redis_cli(&["DEL", "greeting", "nothing"]), "1");
    assert_eq!(kv.redis_cli(&["GET", "greeting"]), "");
    assert!(kv.redis_cli(&["NOSUCHCOMMAND"]).contains("ERR"));
    // Values bigger than one vsock packet and than the reply buffer.
    let mut c = kv.client();
    let big = value_for(7, 1 << 20);
    assert_eq!(c.call(&[b"SET", b"big", &big]), Reply::Simple("OK".into()));
    assert_eq!(c.call(&[b"GET", b"big"]), Reply::Bulk(Some(big)));
    // What redis-benchmark asks before it starts.
    assert!(matches!(
        c.call(&[b"CONFIG", b"GET", b"save"]),
        Reply::Array(a) if a.len() == 2
    ));
    // Several connections at once, interleaved.
    let mut others: Vec<_> = (0..5).map(|_| kv.client()).collect();
    for (i, o) in others.iter_mut().enumerate() {
        o.send(&[
            b"SET",
            format!("k{i}").as_bytes(),
            format!("v{i}").as_bytes(),
        ]);
    }
    for o in others.iter_mut() {
        assert_eq!(o.read(), Reply::Simple("OK".into()));
    }
    for (i, o) in others.iter_mut().enumerate().rev() {
        assert_eq!(
            o.call(&[b"GET", format!("k{i}").as_bytes()]),
            Reply::Bulk(Some(format!("v{i}").into_bytes()))
        );
    }
    kv.assert_alive();
}

#[test]
fn kvm_kvserver_forwards_a_unix_socket() {
    let kv = KvServer::start("kv-unix", "64M");
    let sock = kv._dir.path("kv.sock");
    let mut fwd = VmmChild::new(
        spore()
            .args(["vsock", "forward", "--uds"])
            .arg(kv._dir.path("v.sock"))
            .args(["--port", "6379", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // bind() creates the file a moment before listen(): retry refusals.
    let t = Instant::now();
    let s = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(10), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut c = Resp::new(s);
    assert_eq!(c.call(&[b"PING"]), Reply::Simple("PONG".into()));
    // SIGTERM stops the forwarder cleanly and removes its socket.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(fwd.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = fwd.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "forwarder ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!Path::new(&sock).exists(), "unix socket left behind");
}

#[test]
fn kvm_kvserver_serves_redis_benchmark() {
    let mut kv = KvServer::start("kv-bench", "64M");
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &kv.tcp_port.to_string()])
        .args(["-n", "2000", "-c", "20", "-t", "ping,set,get", "-q"])
        .stdin(Stdio::null())
        .output()
        .expect("redis-benchmark is missing: run scripts/ensure-deps.sh (redis-tools)");
    let text = stdout_of(&out).replace('\r', "\n");
    eprintln!("{text}");
    assert!(out.status.success(), "{text} {}", stderr_of(&out));
    for t in ["PING_INLINE", "PING_MBULK", "SET", "GET"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{t}: ")) && l.contains("requests per second")),
            "no result for {t}: {text}"
        );
    }
    assert_eq!(
        kv.redis_cli(&["DBSIZE"]),
        "1",
        "redis-benchmark SETs key:__rand_int__"
    );
    kv.assert_alive();
}

#[test]
fn kvm_kvserver_refuses_connections_beyond_its_slots_and_reuses_them() {
    let mut kv = KvServer::start_with("kv-slots", "64M", "conns=2");
    let mut a = kv.client();
    let mut b = kv.client();
    assert_eq!(a.call(&[b"PING"]), Reply::Simple("PONG".into()));
    assert_eq!(b.call(&[b"PING"]), Reply::Simple("PONG".into()));
    // A third connection is refused: the forwarder closes it.
    let mut third = TcpStream::connect(("127.0.0.1", kv.tcp_port)).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = third.write_all(b"PING\r\n");
    let mut buf = [0u8; 16];
    assert!(
        matches!(third.read(&mut buf), Ok(0) | Err(_)),
        "a third connection was served"
    );
    // Closing one frees its slot for a new client, repeatedly.
    drop(b);
    for round in 0..5 {
        let t = Instant::now();
        loop {
            let s = TcpStream::connect(("127.0.0.1", kv.tcp_port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut c = Resp::new(s);
            c.send(&[b"PING"]);
            let mut l = String::new();
            if c.r.read_line(&mut l).is_ok() && l == "+PONG\r\n" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {round}: the freed slot was never reused"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(a.call(&[b"PING"]), Reply::Simple("PONG".into()));
    kv.assert_alive();
}

const VALUE: usize = 64 * 1024;
/// 200 MiB of 64 KiB values.
const COUNT: usize = 200 * 1024 * 1024 / VALUE;
const PIPELINE: usize = 16;

/// SETs 200 MiB of 64 KiB values; returns (OK count, OOM count).
fn set_until_oom(c: &mut Resp<TcpStream>) -> (usize, usize) {
    let (mut ok, mut oom) = (0, 0);
    for start in (0..COUNT).step_by(PIPELINE) {
        let end = (start + PIPELINE).min(COUNT);
        for i in start..end {
            c.send(&[b"SET", format!("key:{i}").as_bytes(), &value_for(i, VALUE)]);
        }
        for i in start..end {
            match c.read() {
                Reply::Simple(s) if s == "OK" => {
                    assert_eq!(oom, 0, "SET {i} succeeded after an OOM");
                    ok += 1;
                }
                Reply::Error(e) if e.starts_with("OOM") => oom += 1,
                r => panic!("SET {i}: unexpected reply {r:?}"),
            }
        }
    }
    (ok, oom)
}

#[test]
fn kvm_kvserver_set_beyond_the_heap_answers_oom_and_keeps_serving() {
    let mut kv = KvServer::start("kv-oom", "64M");
    let mut c = kv.client();
    let t = Instant::now();
    let (ok, oom) = set_until_oom(&mut c);
    eprintln!(
        "64 MiB kvserver: {ok} SETs of 64 KiB stored, {oom} refused with OOM, in {:?}",
        t.elapsed()
    );
    assert!(oom > 0, "200 MiB fit in a 64 MiB guest?");
    assert!(ok * VALUE > 32 << 20, "only {ok} values stored before OOM");
    // The server still answers, on this connection and on new ones.
    assert_eq!(c.call(&[b"PING"]), Reply::Simple("PONG".into()));
    assert_eq!(
        c.call(&[b"GET", b"key:0"]),
        Reply::Bulk(Some(value_for(0, VALUE)))
    );
    let last = format!("key:{}", ok - 1);
    assert_eq!(
        c.call(&[b"GET", last.as_bytes()]),
        Reply::Bulk(Some(value_for(ok - 1, VALUE)))
    );
    assert_eq!(kv.redis_cli(&["PING"]), "PONG");
    // Freeing memory makes SET work again.
    assert_eq!(c.call(&[b"DEL", b"key:0", b"key:1"]), Reply::Int(2));
    assert_eq!(
        c.call(&[b"SET", b"again", &value_for(1, VALUE)]),
        Reply::Simple("OK".into())
    );
    kv.assert_alive();
}

#[test]
fn kvm_kvserver_tmem_holds_what_the_heap_cannot() {
    let mut kv = KvServer::start("kv-tmem", "64M");
    let mut c = kv.client();
    let (_, oom) = set_until_oom(&mut c);
    assert!(oom > 0, "200 MiB fit in a 64 MiB guest?");
    assert_eq!(c.call(&[b"PING"]), Reply::Simple("PONG".into()));
    // The same 200 MiB through tmem, on the guest whose heap is full.
    let t = Instant::now();
    for start in (0..COUNT).step_by(PIPELINE) {
        let end = (start + PIPELINE).min(COUNT);
        for i in start..end {
            c.send(&[
                b"TMEMPUT",
                format!("t:{i}").as_bytes(),
                &value_for(i, VALUE),
            ]);
        }
        for i in start..end {
            assert_eq!(c.read(), Reply::Simple("OK".into()), "TMEMPUT {i}");
        }
    }
    let put = t.elapsed();
    let t = Instant::now();
    for start in (0..COUNT).step_by(PIPELINE) {
        let end = (start + PIPELINE).min(COUNT);
        for i in start..end {
            c.send(&[b"TMEMGET", format!("t:{i}").as_bytes()]);
        }
        for i in start..end {
            match c.read() {
                Reply::Bulk(Some(v)) => assert!(v == value_for(i, VALUE), "TMEMGET {i} differs"),
                r => panic!("TMEMGET {i}: {r:?}"),
            }
        }
    }
    eprintln!(
        "tmem: {COUNT} x 64 KiB: TMEMPUT {put:?}, TMEMGET {:?}",
        t.elapsed()
    );
    assert_eq!(c.call(&[b"TMEMINVAL", b"t:0"]), Reply::Int(1));
    assert_eq!(c.call(&[b"TMEMGET", b"t:0"]), Reply::Bulk(None));
    assert_eq!(c.call(&[b"TMEMINVAL", b"t:0"]), Reply::Int(0));
    kv.assert_alive();
}
