//! `spore bench`: benchmarks printing JSON.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {}

pub fn run(cmd: BenchCommand) -> anyhow::Result<u8> {
    match cmd {}
}
