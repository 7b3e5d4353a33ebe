//! The `lobster` command.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod gen;
mod image_bench;
mod order;
mod pack;
mod plan_bench;
mod process;
mod read_bench;
mod replay;
mod run;
mod soak;

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
    /// Random aligned reads through the io_uring reader: MB/s, IOPS, p50/p99 latency.
    ReadBench(read_bench::ReadBenchArgs),
    /// Many epochs with faults injected: nothing lost, memory levels off, descriptors and
    /// threads return after the loader is dropped.
    Soak(soak::SoakArgs),
    /// Write an ImageFolder as WebDataset tar shards.
    Pack(pack::PackArgs),
    /// Print a dataset's sample table: id, file, offset, length, label, key.
    Ls(pack::LsArgs),
    /// Build an ImageFolder's sample table on disk, so later opens neither list nor stat
    /// its files; reports the scan and a reopen from the table.
    Index(pack::IndexArgs),
    /// Decode alone against decode + transform + collate, per image, on a dataset's files
    /// held in memory.
    ImageBench(image_bench::ImageBenchArgs),
    /// What planning remote hits costs a node at start-up: every peer's cache plan
    /// replayed (default: ImageNet-22k on 64 nodes with a 10% cache), or with `--plan
    /// cluster` the job's cluster plan and its storage reads against the floor (`--sweep`:
    /// 4, 16 and 64 nodes at ImageNet-1k and -22k sizes).
    PlanBench(plan_bench::PlanBenchArgs),
}

fn main() -> anyhow::Result<()> {
    // Before any thread: left to glibc, resident memory creeps up epoch after epoch. Where
    // the environment sets any of these, the environment decides.
    let set = |name| std::env::var_os(name).is_some();
    if ![
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
    ]
    .into_iter()
    .any(set)
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        lobster_io::hold_heap(lobster_io::HeapLimits::for_loader(cores));
    }
    let cli = Cli::parse();
    match cli.command {
        None => run::run(&cli.run),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Gen(args)) => gen::run(&args),
        Some(Command::Order(args)) => order::run(&args),
        Some(Command::Replay(args)) => replay::run(&args),
        Some(Command::ReadBench(args)) => read_bench::run(&args),
        Some(Command::Soak(args)) => soak::run(&args),
        Some(Command::Pack(args)) => pack::run(&args),
        Some(Command::Ls(args)) => pack::ls(&args),
        Some(Command::Index(args)) => pack::index(&args),
        Some(Command::ImageBench(args)) => image_bench::run(&args),
        Some(Command::PlanBench(args)) => plan_bench::run(&args),
    }
}
