//! `spore-signal`: the Linux guest's command-line access to the spore signal
//! port (see `spore_abi::signal`).
//!
//! ```text
//! spore-signal exit N      stop the VM; the VMM exits with code N (0..=255)
//! spore-signal mark N      record boot-time mark N in the VMM
//! spore-signal wait USEC   sleep in the VMM until a device has work or USEC pass;
//!                          prints "woken" or "timeout" ("restored" once after a snapshot restore)
//! spore-signal fork N      clone this VM N times (0: the VMM's fork_count); prints
//!                          the clone number in each clone, 0 in a source that
//!                          goes on; fails if no clone was made
//! spore-signal done        end this clone without a shutdown (the VMM exits 0)
//! spore-signal snapshot T  snapshot the whole VM here, tagged T, if the host
//!                          configured guest snapshots; prints "taken" (this VM,
//!                          exit 0), "restored" (a VM restored from it, exit 0),
//!                          "failed" or "not-configured" (exit 1)
//! ```
//!
//! Built as a static musl binary and put into guest initramfs images, so that
//! test scenarios (shell scripts) can talk to the VMM. Needs root: port I/O
//! from user space requires `ioperm`.

use std::process::ExitCode;

use spore_abi::signal::{self, SignalOp};
use spore_guest_tools::signal_cli::{self as cli, Command};
use spore_guest_tools::{console, port};

/// How long `exit` and `done` wait for the console to drain.
const CONSOLE_DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match cli::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spore-signal: {e}");
            eprintln!("{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spore-signal: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<ExitCode, port::PortError> {
    let port = port::SignalPort::open()?;
    match command {
        Command::Exit(code) => {
            // What the guest printed last must reach the host before the VM ends.
            console::drain(CONSOLE_DRAIN_LIMIT);
            port.write(signal::encode(SignalOp::Exit, u32::from(code)));
            // Under spore the VM is gone before this line runs; reaching it
            // means nothing listens on the port (another VMM, or plain QEMU).
            eprintln!(
                "spore-signal: exit signal sent but the VM is still running (not under spore?)"
            );
            Ok(ExitCode::FAILURE)
        }
        Command::Mark(n) => {
            port.write(signal::encode(SignalOp::Mark, n));
            Ok(ExitCode::SUCCESS)
        }
        Command::Fork(n) => {
            // The result is per vCPU: read it on the one that wrote.
            port.pin_to_current_cpu()?;
            port.write(signal::encode(SignalOp::Fork, n));
            match port.read() {
                signal::FORK_FAILED => {
                    eprintln!("spore-signal: the VMM made no clone (see its log)");
                    Ok(ExitCode::FAILURE)
                }
                k => {
                    println!("{k}");
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Done => {
            console::drain(CONSOLE_DRAIN_LIMIT);
            port.write(signal::encode(SignalOp::Done, 0));
            eprintln!("spore-signal: done sent but the VM is still running (not under spore?)");
            Ok(ExitCode::FAILURE)
        }
        Command::Wait(usec) => {
            port.pin_to_current_cpu()?;
            port.write(signal::encode(SignalOp::Wait, usec));
            match port.read() {
                signal::WAIT_WOKEN => println!("woken"),
                signal::WAIT_TIMED_OUT => println!("timeout"),
                // The first read after a snapshot restore says so, once.
                signal::RESTORED => println!("restored"),
                other => {
                    println!("unknown");
                    eprintln!("spore-signal: unexpected wait result {other:#x}");
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot(tag) => {
            // The result register is per vCPU: read it on the vCPU that wrote.
            port.pin_to_current_cpu()?;
            port.write(signal::encode(SignalOp::Snapshot, tag));
            let (word, ok) = match port.read() {
                signal::SNAPSHOT_TAKEN => ("taken", true),
                signal::SNAPSHOT_RESTORED => ("restored", true),
                signal::SNAPSHOT_NOT_CONFIGURED => ("not-configured", false),
                _ => ("failed", false),
            };
            println!("{word}");
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
