//! The `lobster` command.

use clap::{CommandFactory, Parser, Subcommand};

mod gen;
mod order;

#[derive(Debug, Parser)]
#[command(
    name = "lobster",
    version,
    about = "Load balance-aware sample loading for distributed DNN training"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a synthetic ImageFolder of real JPEG files.
    Gen(gen::GenArgs),
    /// Print one rank's sample indices for an epoch as a JSON list.
    Order(order::OrderArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => {
            Cli::command().print_help()?;
            Ok(())
        }
        Some(Command::Gen(args)) => gen::run(&args),
        Some(Command::Order(args)) => order::run(&args),
    }
}
