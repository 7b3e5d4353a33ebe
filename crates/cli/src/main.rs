//! The `lobster` command.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod order;
mod pack;
mod replay;

use lobster_cli::{gen, run};

#[derive(Debug, Parser)]
#[command(
    name = "lobster",
    version,
    about = "Load balance-aware sample loading for distributed DNN training",
    long_about = "Load balance-aware sample loading for distributed DNN training.\n\n\
                  Without a subcommand, runs the main job (`lobster run`) with its options.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: run::RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: simulated synchronous training, Lobster against its baselines.
    Run(Box<run::RunArgs>),
    /// Generate a synthetic ImageFolder of real JPEG files.
    Gen(gen::GenArgs),
    /// Print one rank's sample indices for an epoch as a JSON list.
    Order(order::OrderArgs),
    /// Replay an access trace through a cache policy and count hits.
    Replay(replay::ReplayArgs),
    /// Write an ImageFolder as WebDataset tar shards.
    Pack(pack::PackArgs),
    /// Print a dataset's sample table: id, file, offset, length, label, key.
    Ls(pack::LsArgs),
    /// Build an ImageFolder's sample table on disk, so later opens neither list nor stat
    /// its files; reports the scan and a reopen from the table.
    Index(pack::IndexArgs),
}

fn main() -> anyhow::Result<()> {
    lobster_cli::hold_heap_unless_set();
    let cli = Cli::parse();
    match cli.command {
        None => run::run(&cli.run),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Gen(args)) => gen::run(&args),
        Some(Command::Order(args)) => order::run(&args),
        Some(Command::Replay(args)) => replay::run(&args),
        Some(Command::Pack(args)) => pack::run(&args),
        Some(Command::Ls(args)) => pack::ls(&args),
        Some(Command::Index(args)) => pack::index(&args),
    }
}
