//! spore-vsock: a vsock pipe for Linux guests.
//!
//! `spore-vsock listen PORT` accepts one connection on PORT;
//! `spore-vsock connect CID PORT` connects (the host is CID 2). Either way,
//! stdin goes to the peer (then the write side is shut down) and what the
//! peer sends goes to stdout, until the peer closes.

use std::io::{Read, Write};
use std::process::ExitCode;

use spore_guest_tools::vsock::VsockStream;

const USAGE: &str = "usage: spore-vsock listen PORT | spore-vsock connect CID PORT";

fn parse(s: &str, what: &str) -> Result<u32, String> {
    s.parse().map_err(|_| format!("bad {what} {s:?}\n{USAGE}"))
}

fn run(args: &[String]) -> Result<(), String> {
    let stream = match args {
        [cmd, port] if cmd == "listen" => {
            VsockStream::accept_one(parse(port, "port")?).map_err(|e| format!("listen: {e}"))?
        }
        [cmd, cid, port] if cmd == "connect" => {
            VsockStream::connect(parse(cid, "CID")?, parse(port, "port")?)
                .map_err(|e| format!("connect: {e}"))?
        }
        _ => return Err(USAGE.to_string()),
    };
    let mut to_peer = stream.try_clone().map_err(|e| e.to_string())?;
    let sender = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_peer);
        let _ = to_peer.shutdown_write();
    });
    let mut from_peer = stream;
    let mut out = std::io::stdout().lock();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from_peer.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .map_err(|e| format!("stdout: {e}"))?;
        out.flush().map_err(|e| format!("stdout: {e}"))?;
    }
    // Finish sending what stdin holds (a pipe or file ends), but do not wait
    // on a terminal, which may never close.
    // SAFETY: isatty only inspects the descriptor.
    if unsafe { libc::isatty(libc::STDIN_FILENO) } == 0 {
        let _ = sender.join();
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spore-vsock: {e}");
            ExitCode::from(2)
        }
    }
}
