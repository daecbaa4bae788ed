//! spore's benchmarks: `spore bench <name>` runs one and prints its JSON
//! on stdout (and a human summary on stderr). The `spore` binary embeds
//! [`BenchCommand`] in its command line and calls [`run`].
//!
//! Each bench drives real VMM processes (the `spore` binary that called it,
//! `spore vmm` / `spore run` / `spore serve`) and reads the host's clock and
//! `/proc`; `tmem` also drives the device in process. [`stats`] is the one
//! summary every bench reports (and the integration tests use).

use clap::Subcommand;

mod boot;
mod clone;
mod cluster_failover;
mod cluster_forwarding;
mod cluster_live;
mod cluster_shipping;
mod cluster_sim;
mod host;
pub mod lambda_client;
mod net;
mod procfs;
mod reclaim;
mod report;
mod sandbox;
mod serve;
mod snapshot;
pub mod stats;
mod tmem;
mod vmm;
mod vmm_api;

pub use boot::BootArgs;
pub use clone::CloneBenchArgs;
pub use cluster_sim::{ClusterBenchArgs, Policy as ClusterPolicy};
pub use net::NetBenchArgs;
pub use reclaim::ReclaimArgs;
pub use report::ReportArgs;
pub use sandbox::SandboxBenchArgs;
pub use serve::ServeBenchArgs;
pub use snapshot::SnapshotBenchArgs;
pub use tmem::TmemArgs;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// VMM start to the guest's first mark, and the VMM's own RSS.
    Boot(BootArgs),
    /// tmem calls: 1 MiB put/get latency (guest and VMM side), single vs batched
    /// 4 KiB puts, kvserver SET vs TMEMPUT commands/s.
    Tmem(TmemArgs),
    /// Snapshot creation time and size, and restore latency per restore path.
    Snapshot(SnapshotBenchArgs),
    /// Clones: latency from the request to the clone's first guest
    /// instruction (p50, p99) per memory size, with and without standby
    /// processes; clones/s with a --keep pool; PSS per clone.
    Clone(CloneBenchArgs),
    /// Reclaim (the virtio-mem seed's two-hog experiment): time to give a
    /// size back and host memory released, virtio-mem and balloon on Linux
    /// (`--linux-kernel`, nested harness) or virtio-mem on the unikernel (`--uk`).
    Reclaim(ReclaimArgs),
    /// `spore serve`: invoke latency per start path (warm, clone, cold),
    /// invocations/s with clones against cold boots, idle instances held;
    /// with --linux, SnapFaaS's experiment on Python functions (cold boot,
    /// merged full snapshot, layered base + diff, layered + working set,
    /// clone; cold and lukewarm page cache).
    Serve(ServeBenchArgs),
    /// Sandboxes (E2B's API on `spore serve --sandbox-listen`): create (a
    /// clone of the template's zygote), a command's round trip, pause,
    /// resume, fork xN beside the snapshot + restore E2B forks with, host
    /// memory per running and per paused sandbox.
    Sandbox(SandboxBenchArgs),
    /// virtio-net on a tap against the `httpd` unikernel: TCP throughput
    /// both ways, 1-byte ping-pong latency, HTTP keep-alive requests/s
    /// (root: it makes its own tap).
    Net(NetBenchArgs),
    /// Function placement on a cluster of `spore serve` nodes, simulated
    /// (`--simulate`): rendezvous hashing per function against random and
    /// best-of-two-random placement; warm, clone, restore and cold start
    /// rates, start latency, memory per host, hosts per function.
    Cluster(ClusterBenchArgs),
    /// One HTML page with plots from the bench JSON saved in a directory.
    Report(ReportArgs),
}

/// Runs one bench; its JSON goes to stdout. The exit code on success.
pub fn run(cmd: BenchCommand) -> anyhow::Result<u8> {
    match cmd {
        BenchCommand::Boot(a) => boot::run(a),
        BenchCommand::Tmem(a) => tmem::run(a),
        BenchCommand::Snapshot(a) => snapshot::run(a),
        BenchCommand::Clone(a) => clone::run(a),
        BenchCommand::Reclaim(a) => reclaim::run(a),
        BenchCommand::Serve(a) => serve::run(a),
        BenchCommand::Sandbox(a) => sandbox::run(a),
        BenchCommand::Net(a) => net::run(a),
        BenchCommand::Cluster(a) => cluster_sim::run(a),
        BenchCommand::Report(a) => report::run(a),
    }
}
