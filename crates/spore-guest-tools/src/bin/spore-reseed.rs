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
use std::process::ExitCode;

use spore_guest_tools::netid;
use spore_guest_tools::reseed::{apply_net, handle_notice, reseed_once, watch_notices};

const USAGE: &str = "usage: spore-reseed [now | apply FILE]";

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
        [] => watch_notices(handle_notice),
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
