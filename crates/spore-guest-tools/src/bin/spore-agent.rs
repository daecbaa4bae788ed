//! spore-agent: PID 1 of Linux function guests (see `spore_guest_tools::agent`
//! and guest/README.md). Relays invocations from the host (vsock, the
//! framed protocol of `spore_abi::function`) to a language runtime speaking
//! the AWS Lambda Runtime API on 127.0.0.1:9001.
//!
//! In a guest: `spore-agent` as the kernel's `init=`, the runtime chosen by
//! `spore.runtime=python3|provided` on the kernel command line. On a host
//! (tests): `spore-agent --no-pid1 --host-link unix:PATH --runtime python3
//! --runtime-api 127.0.0.1:0`.

fn main() -> std::process::ExitCode {
    spore_guest_tools::agent::main()
}
