//! spore-reseed: reseeds the kernel's random pool from /dev/hwrng whenever
//! the VMM says this VM is a (new) clone.
//!
//! `spore-reseed` listens on vsock port 21328 (`GENERATION_VSOCK_PORT`) and,
//! for each notice (`generation N`), adds 64 bytes from /dev/hwrng to the pool
//! with RNDADDENTROPY and rekeys the CRNG at once (RNDRESEEDCRNG), logging
//! `spore-reseed: generation N: added 64 bytes (512 bits) from /dev/hwrng,
//! CRNG reseeded` and writing N to /run/spore-generation.
//! A clone given a new network identity also gets `mac IFACE_ID MAC` and
//! `ipv4 IFACE_ID A.B.C.D/P GATEWAY` lines after the generation: they are
//! applied with busybox `ip` (`spore_guest_tools::netid`), each logged as
//! `spore-reseed: eth0 (eth0): mac 02:.. ipv4 10.0.0.3/24 via 10.0.0.1 applied`
//! (or the error); then the notice is written to /run/spore-net.
//! `spore-reseed now` reseeds once and exits; `spore-reseed apply FILE` applies
//! the `mac`/`ipv4` lines of a notice in FILE (`-`: stdin) without reseeding
//! (a test of the network half without a VMM). Run as root.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use spore_guest_tools::netid;
use spore_guest_tools::reseed::{reseed, GENERATION_VSOCK_PORT, RESEED_BYTES};
use spore_guest_tools::vsock::VsockListener;

const HWRNG: &str = "/dev/hwrng";
const POOL: &str = "/dev/urandom";
const USAGE: &str = "usage: spore-reseed [now | apply FILE]";
/// A notice is a generation line and two lines per interface.
const MAX_NOTICE: u64 = 16 * 1024;

fn reseed_once(generation: Option<u64>) -> Result<(), String> {
    let r = reseed(Path::new(HWRNG), Path::new(POOL), RESEED_BYTES).map_err(|e| e.to_string())?;
    let which = generation.map_or_else(|| "now".to_string(), |g| format!("generation {g}"));
    println!(
        "spore-reseed: {which}: added {} bytes ({} bits) from {HWRNG}, {}",
        r.bytes,
        r.bytes * 8,
        if r.crng_reseeded {
            "CRNG reseeded"
        } else {
            "CRNG NOT reseeded (RNDRESEEDCRNG failed; it rekeys within a minute)"
        }
    );
    if let Some(g) = generation {
        let _ = std::fs::create_dir_all("/run");
        let _ = std::fs::write("/run/spore-generation", format!("{g}\n"));
    }
    Ok(())
}

fn serve() -> Result<(), String> {
    let listener = VsockListener::bind(GENERATION_VSOCK_PORT)
        .map_err(|e| format!("vsock port {GENERATION_VSOCK_PORT}: {e}"))?;
    loop {
        let mut conn = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("accept: {e}")),
        };
        // The VMM sends a few short lines and closes. A connection reset by a
        // racing transport reset still means "cloned": reseed anyway.
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut msg = Vec::new();
        let _ = (&mut conn).take(MAX_NOTICE).read_to_end(&mut msg);
        drop(conn);
        let notice = netid::parse(&msg).unwrap_or_else(|e| {
            eprintln!(
                "spore-reseed: notice {:?}: {e}; reseeding only",
                String::from_utf8_lossy(&msg)
            );
            netid::Notice::default()
        });
        if let Err(e) = reseed_once(notice.generation) {
            eprintln!("spore-reseed: {e}");
        }
        for line in &notice.unknown {
            eprintln!("spore-reseed: ignored notice line '{line}'");
        }
        if !notice.interfaces.is_empty() {
            let _ = apply_net(&msg, &notice);
        }
    }
}

/// Applies a notice's interface lines; logs each; fails if any failed.
fn apply_net(msg: &[u8], notice: &netid::Notice) -> Result<(), String> {
    let mut failed = 0;
    for r in netid::apply(notice) {
        match r {
            Ok(s) => println!("spore-reseed: {s}"),
            Err(e) => {
                eprintln!("spore-reseed: {e}");
                failed += 1;
            }
        }
    }
    // Written after the changes: its presence says they were applied.
    let _ = std::fs::create_dir_all("/run");
    let _ = std::fs::write("/run/spore-net", msg);
    if failed > 0 {
        return Err(format!("{failed} interface(s) not configured"));
    }
    Ok(())
}

fn apply_file(path: &str) -> Result<(), String> {
    let msg = if path == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .map_err(|e| e.to_string())?;
        v
    } else {
        std::fs::read(path).map_err(|e| format!("{path}: {e}"))?
    };
    let notice = netid::parse(&msg)?;
    apply_net(&msg, &notice)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [] => serve(),
        [cmd] if cmd == "now" => reseed_once(None),
        [cmd, file] if cmd == "apply" => apply_file(file),
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spore-reseed: {e}");
            ExitCode::FAILURE
        }
    }
}
