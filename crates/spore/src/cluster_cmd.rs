//! `spore cluster`: a look at a spore serve cluster through its etcd.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ClusterCommand {
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
        ClusterCommand::Status { cluster } => {
            // The node id only names writers; a status reads.
            let cfg = spore_serve::catalog::ClusterConfig::parse(&cluster, "status")?;
            let status = spore_serve::cluster::status_blocking(&cfg)?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(0)
        }
    }
}
