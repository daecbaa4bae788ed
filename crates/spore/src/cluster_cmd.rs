//! `spore cluster`: a look at a spore serve cluster through its etcd.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Stop placing functions on a node: from the next second the other
    /// nodes forward its functions' invocations elsewhere and it forwards
    /// its own; its warm instances finish and end when idle. For a restart
    /// without failed requests: drain, restart, undrain.
    Drain {
        #[arg(long, value_name = "etcd://HOST:PORT,...")]
        cluster: String,
        /// The node's --node-id.
        node: String,
    },
    /// Place functions on a drained node again.
    Undrain {
        #[arg(long, value_name = "etcd://HOST:PORT,...")]
        cluster: String,
        node: String,
    },
    /// Print the cluster's live nodes (address, capacity, seconds left on
    /// each lease) and the length of its catalogue's log, as JSON.
    Status {
        /// The cluster, as its nodes' --cluster gives it.
        #[arg(long, value_name = "etcd://HOST:PORT,...")]
        cluster: String,
    },
}

pub fn run(c: ClusterCommand) -> anyhow::Result<u8> {
    match c {
        ClusterCommand::Drain { cluster, node } => mark(&cluster, &node, true),
        ClusterCommand::Undrain { cluster, node } => mark(&cluster, &node, false),
        ClusterCommand::Status { cluster } => {
            // The node id only names writers; a status reads.
            let cfg = spore_serve::catalog::ClusterConfig::parse(&cluster, "status")?;
            let status = spore_serve::cluster::status_blocking(&cfg)?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(0)
        }
    }
}

fn mark(cluster: &str, node: &str, draining: bool) -> anyhow::Result<u8> {
    let cfg = spore_serve::catalog::ClusterConfig::parse(cluster, node)?;
    spore_serve::cluster::set_draining_blocking(&cfg, node, draining)?;
    let what = if draining { "drained" } else { "undrained" };
    println!("{}", serde_json::json!({ "node": node, "state": what }));
    Ok(0)
}
