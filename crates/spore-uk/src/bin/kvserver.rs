//! kvserver: a key/value server speaking enough of the Redis protocol
//! (RESP) over vsock for `redis-cli` and `redis-benchmark`.
//!
//! `SET`/`GET`/`DEL` keep values on the guest heap; `TMEMPUT`/`TMEMGET`/
//! `TMEMINVAL` keep them in the VMM's tmem pool. Every allocation a client
//! can cause is fallible: when the heap is full, `SET` answers `-OOM` and
//! the server keeps serving. Sessions (parser arena, reply buffer, transfer
//! buffer) are allocated at start, before clients can fill the heap.
//!
//! Command line: `port=N` (default 6379), `conns=N` simultaneous connections
//! (default 50, about 112 KiB of preallocated buffers each).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;

use spore_uk::kvmap::KvMap;
use spore_uk::resp::{Event, Parser, Reply};
use spore_uk::tmem::{self, TmemError};
use spore_uk::virtio::vsock::{ConnId, Vsock, VsockConfig, VsockError};
use spore_uk::{arg, println};

spore_uk::entry!(main);

/// Arguments up to this size (a 64 KiB value with its key and command) are
/// parsed into the session's own arena, so `TMEMPUT` works on a full heap.
const ARENA: usize = 72 * 1024;
const OUT: usize = 8 * 1024;
/// redis-benchmark opens 50 connections by default.
const DEFAULT_CONNS: u32 = 50;
/// Preallocated buffer for `TMEMGET` values.
const XFER: usize = 1024 * 1024;

struct Session {
    conn: Option<ConnId>,
    parser: Parser,
    out: Vec<u8>,
}

struct Server {
    vsock: Vsock,
    store: KvMap,
    xfer: Vec<u8>,
    oom_replies: u64,
}

fn try_vec(cap: usize) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(cap).ok()?;
    Some(v)
}

fn parse_arg(name: &str, default: u32) -> u32 {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main(info: &spore_uk::BootInfo) -> i32 {
    let port = parse_arg("port", 6379);
    let conns = parse_arg("conns", DEFAULT_CONNS).clamp(1, 256) as usize;
    let mut vsock = match Vsock::new(
        info,
        VsockConfig {
            max_connections: conns,
            conn_buffer: 32 * 1024,
        },
    ) {
        Ok(v) => v,
        Err(e) => {
            println!("kvserver: {e}");
            return 1;
        }
    };
    if let Err(e) = vsock.listen(port) {
        println!("kvserver: {e}");
        return 1;
    }
    let mut sessions = Vec::new();
    if sessions.try_reserve_exact(conns).is_err() {
        println!("kvserver: heap too small for {conns} sessions");
        return 1;
    }
    for _ in 0..conns {
        let (Some(parser), Some(out)) = (Parser::new(ARENA), try_vec(OUT)) else {
            println!("kvserver: heap too small for {conns} sessions");
            return 1;
        };
        sessions.push(Session {
            conn: None,
            parser,
            out,
        });
    }
    let Some(mut xfer) = try_vec(XFER) else {
        println!("kvserver: heap too small for the transfer buffer");
        return 1;
    };
    xfer.resize(XFER, 0);
    let mut server = Server {
        vsock,
        store: KvMap::new(),
        xfer,
        oom_replies: 0,
    };
    println!(
        "kvserver: listening on vsock port {port} (cid {}, heap {} MiB, {conns} connections)",
        server.vsock.guest_cid(),
        spore_uk::heap::heap_size() >> 20
    );
    let mut input = [0u8; 16 * 1024];
    loop {
        let mut progress = false;
        // Serve (and end) sessions before accepting: after a transport reset
        // (a snapshot restore) the driver frees every connection at once,
        // and a new one may arrive in the same poll; its session is the one
        // whose connection just went.
        for s in sessions.iter_mut() {
            let Some(c) = s.conn else { continue };
            match server.serve(s, c, &mut input) {
                Ok(p) => progress |= p,
                Err(_) => {
                    server.vsock.close(c);
                    s.conn = None;
                    s.out.clear();
                    progress = true;
                }
            }
        }
        while let Some(c) = server.vsock.accept() {
            progress = true;
            match sessions.iter_mut().find(|s| s.conn.is_none()) {
                Some(s) => s.conn = Some(c),
                // The driver has as many slots as there are sessions.
                None => server.vsock.close(c),
            }
        }
        if !progress {
            server.vsock.wait_for_work(1_000_000);
        }
    }
}

/// Why a session ends.
enum End {
    Closed,
}

impl From<VsockError> for End {
    fn from(_: VsockError) -> Self {
        End::Closed
    }
}

impl Server {
    /// Handles what one connection has sent; Ok(true) if it did anything.
    fn serve(&mut self, s: &mut Session, c: ConnId, input: &mut [u8]) -> Result<bool, End> {
        let mut progress = false;
        loop {
            let n = match self.vsock.recv(c, input) {
                Ok(0) => {
                    self.flush(s, c)?;
                    return Err(End::Closed);
                }
                Ok(n) => n,
                Err(VsockError::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            };
            progress = true;
            let mut rest = &input[..n];
            while !rest.is_empty() {
                let (used, ev) = s.parser.feed(rest);
                rest = &rest[used..];
                match ev {
                    Some(Event::Command) => self.command(s, c)?,
                    Some(Event::OutOfMemory) => {
                        self.oom_replies += 1;
                        self.reply(s, c, |r| {
                            r.error("OOM out of guest heap memory (use TMEMPUT)")
                        })?
                    }
                    Some(Event::Protocol(what)) => {
                        self.error_fmt(s, c, format_args!("ERR Protocol error: {what}"))?;
                        self.flush(s, c)?;
                        return Err(End::Closed);
                    }
                    None => {}
                }
            }
        }
        self.flush(s, c)?;
        Ok(progress)
    }

    fn flush(&mut self, s: &mut Session, c: ConnId) -> Result<(), End> {
        if !s.out.is_empty() {
            self.vsock.write_all(c, &s.out)?;
            s.out.clear();
        }
        Ok(())
    }

    /// Appends a reply, flushing first if the buffer is full. A reply
    /// larger than the whole buffer must be written another way.
    fn reply(
        &mut self,
        s: &mut Session,
        c: ConnId,
        f: impl Fn(&mut Reply) -> bool,
    ) -> Result<(), End> {
        if f(&mut Reply { buf: &mut s.out }) {
            return Ok(());
        }
        self.flush(s, c)?;
        if f(&mut Reply { buf: &mut s.out }) {
            Ok(())
        } else {
            Err(End::Closed)
        }
    }

    fn command(&mut self, s: &mut Session, c: ConnId) -> Result<(), End> {
        let p = &s.parser;
        let argc = p.argc();
        let mut name = [0u8; 16];
        let raw = p.arg(0);
        let len = raw.len().min(name.len());
        name[..len].copy_from_slice(&raw[..len]);
        name[..len].make_ascii_uppercase();
        let name = if raw.len() > 16 {
            &b"?"[..]
        } else {
            &name[..len]
        };
        match (name, argc) {
            (b"PING", 1) => self.reply(s, c, |r| r.simple("PONG")),
            (b"PING", 2) | (b"ECHO", 2) => {
                let msg = s.parser.arg(1);
                let mut tmp = [0u8; 512];
                let n = msg.len().min(tmp.len());
                tmp[..n].copy_from_slice(&msg[..n]);
                self.reply(s, c, |r| r.bulk(&tmp[..n]))
            }
            (b"SET", 3..) => {
                let (Some(key), Some(value)) = (s.parser.take_arg(1), s.parser.take_arg(2)) else {
                    return self.oom(s, c);
                };
                match self.store.insert(key, value) {
                    Ok(_) => self.reply(s, c, |r| r.simple("OK")),
                    Err(_) => self.oom(s, c),
                }
            }
            (b"GET", 2) => {
                // Split borrows: the value lives in the store while the
                // reply goes through the session and the driver.
                let Server { vsock, store, .. } = self;
                match store.get(s.parser.arg(1)) {
                    Some(v) => {
                        let mut tmp_server = Sender { vsock };
                        tmp_server.bulk(s, c, v)
                    }
                    None => self.reply(s, c, |r| r.nil()),
                }
            }
            (b"DEL", 2..) | (b"UNLINK", 2..) => {
                let mut n = 0;
                for i in 1..argc {
                    n += self.store.remove(s.parser.arg(i)).is_some() as i64;
                }
                self.reply(s, c, |r| r.int(n))
            }
            (b"EXISTS", 2..) => {
                let mut n = 0;
                for i in 1..argc {
                    n += self.store.get(s.parser.arg(i)).is_some() as i64;
                }
                self.reply(s, c, |r| r.int(n))
            }
            (b"DBSIZE", 1) => {
                let n = self.store.len() as i64;
                self.reply(s, c, |r| r.int(n))
            }
            (b"FLUSHALL", _) | (b"FLUSHDB", _) => {
                self.store = KvMap::new();
                self.reply(s, c, |r| r.simple("OK"))
            }
            (b"TMEMPUT", 3) => match tmem::put(s.parser.arg(1), s.parser.arg(2)) {
                Ok(()) => self.reply(s, c, |r| r.simple("OK")),
                Err(e) => self.tmem_error(s, c, e),
            },
            (b"TMEMGET", 2) => self.tmem_get(s, c),
            (b"TMEMINVAL", 2) => match tmem::invalidate(s.parser.arg(1)) {
                Ok(()) => self.reply(s, c, |r| r.int(1)),
                Err(TmemError::NotFound) => self.reply(s, c, |r| r.int(0)),
                Err(e) => self.tmem_error(s, c, e),
            },
            (b"CONFIG", 3) => {
                // redis-benchmark asks for `save` and `appendonly`: answer
                // the name with an empty value.
                let mut tmp = [0u8; 64];
                let key = s.parser.arg(2);
                let n = key.len().min(tmp.len());
                tmp[..n].copy_from_slice(&key[..n]);
                self.reply(s, c, |r| {
                    r.array_header(2) && r.bulk(&tmp[..n]) && r.bulk(b"")
                })
            }
            (b"COMMAND", _) => self.reply(s, c, |r| r.array_header(0)),
            (b"INFO", _) => self.reply(s, c, |r| {
                r.bulk(b"# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n")
            }),
            (b"CLIENT", _) | (b"SELECT", _) => self.reply(s, c, |r| r.simple("OK")),
            (b"QUIT", _) => {
                self.reply(s, c, |r| r.simple("OK"))?;
                self.flush(s, c)?;
                Err(End::Closed)
            }
            _ => self.reply(s, c, |r| {
                r.error("ERR unknown command or wrong number of arguments")
            }),
        }
    }

    fn oom(&mut self, s: &mut Session, c: ConnId) -> Result<(), End> {
        self.oom_replies += 1;
        self.reply(s, c, |r| {
            r.error("OOM out of guest heap memory (use TMEMPUT)")
        })
    }

    fn tmem_error(&mut self, s: &mut Session, c: ConnId, e: TmemError) -> Result<(), End> {
        self.error_fmt(s, c, format_args!("ERR {e}"))
    }

    /// An error reply formatted on the stack (no heap: it may be full).
    fn error_fmt(
        &mut self,
        s: &mut Session,
        c: ConnId,
        args: core::fmt::Arguments,
    ) -> Result<(), End> {
        let mut msg = [0u8; 160];
        let mut w = SliceWriter {
            buf: &mut msg,
            len: 0,
        };
        let _ = core::fmt::write(&mut w, args);
        let n = w.len;
        let text = core::str::from_utf8(&msg[..n]).unwrap_or("ERR");
        self.reply(s, c, |r| r.error(text))
    }

    fn tmem_get(&mut self, s: &mut Session, c: ConnId) -> Result<(), End> {
        let Server { vsock, xfer, .. } = self;
        match tmem::get(s.parser.arg(1), xfer) {
            Ok(n) => Sender { vsock }.bulk(s, c, &xfer[..n]),
            Err(TmemError::NotFound) => self.reply(s, c, |r| r.nil()),
            Err(TmemError::BufferTooSmall { needed }) => {
                let Some(mut v) = try_vec(needed) else {
                    return self.oom(s, c);
                };
                v.resize(needed, 0);
                match tmem::get(s.parser.arg(1), &mut v) {
                    Ok(n) => Sender {
                        vsock: &mut self.vsock,
                    }
                    .bulk(s, c, &v[..n]),
                    Err(TmemError::NotFound) => self.reply(s, c, |r| r.nil()),
                    Err(e) => self.tmem_error(s, c, e),
                }
            }
            Err(e) => self.tmem_error(s, c, e),
        }
    }
}

/// Writes replies when the server's other fields are borrowed.
struct Sender<'a> {
    vsock: &'a mut Vsock,
}

impl Sender<'_> {
    fn bulk(&mut self, s: &mut Session, c: ConnId, data: &[u8]) -> Result<(), End> {
        if (Reply { buf: &mut s.out }).bulk(data) {
            return Ok(());
        }
        if !s.out.is_empty() {
            self.vsock.write_all(c, &s.out)?;
            s.out.clear();
        }
        if (Reply { buf: &mut s.out }).bulk(data) {
            return Ok(());
        }
        (Reply { buf: &mut s.out }).bulk_header(data.len());
        self.vsock.write_all(c, &s.out)?;
        s.out.clear();
        self.vsock.write_all(c, data)?;
        self.vsock.write_all(c, b"\r\n")?;
        Ok(())
    }
}

struct SliceWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl core::fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}
