//! The `lobster-bench` command: the bench drivers of lobster-io, apart from the product's
//! `lobster` command. They run the CLI's own main-job code (`lobster_cli::run`), so what
//! they measure is what `lobster run` runs.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod decoders;
mod image_bench;
mod plan_bench;
mod read_bench;
mod s3_proxy;
mod s3_server;
mod soak;

#[derive(Debug, Parser)]
#[command(
    name = "lobster-bench",
    version,
    about = "Bench commands of lobster-io: the reader, the image stage, planning, soak, an S3 proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Random aligned reads through the io_uring reader: MB/s, IOPS, p50/p99 latency.
    ReadBench(read_bench::ReadBenchArgs),
    /// Many epochs with faults injected: nothing lost, memory levels off, descriptors and
    /// threads return after the loader is dropped.
    Soak(soak::SoakArgs),
    /// Decode alone against decode + transform + collate, per image, on a dataset's files
    /// held in memory.
    ImageBench(image_bench::ImageBenchArgs),
    /// CPU per image of the JPEG decode paths on one thread: zune-jpeg's whole decode,
    /// lobster-image's, its region decoder at 1/2 and 1/4, and training crops by region
    /// against whole.
    Decoders(decoders::DecodersArgs),
    /// What planning remote hits costs a node at start-up: every peer's cache plan
    /// replayed (default: ImageNet-22k on 64 nodes with a 10% cache), or with `--plan
    /// cluster` the job's cluster plan and its storage reads against the floor (`--sweep`:
    /// 4, 16 and 64 nodes at ImageNet-1k and -22k sizes).
    PlanBench(plan_bench::PlanBenchArgs),
    /// A delaying proxy in front of an S3 server on loopback: one port per emulated node,
    /// latency per request, bandwidth per node, counts per node; runs until SIGINT/SIGTERM.
    S3Proxy(s3_proxy::S3ProxyArgs),
    /// A real S3 server (s3s-fs) on 127.0.0.1 for benchmarks, with uploads by PUT.
    S3Server(s3_server::S3ServerArgs),
}

fn main() -> anyhow::Result<()> {
    // As `lobster` does, so the soak's memory is the main job's.
    lobster_cli::hold_heap_unless_set();
    match Cli::parse().command {
        Command::ReadBench(args) => read_bench::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::ImageBench(args) => image_bench::run(&args),
        Command::Decoders(args) => decoders::run(&args),
        Command::PlanBench(args) => plan_bench::run(&args),
        Command::S3Proxy(args) => s3_proxy::run(&args),
        Command::S3Server(args) => s3_server::run(&args),
    }
}
