//! The `uswap` command.

mod bench;
mod meminfo;
mod report;
mod run;
mod size;
mod stat;
mod tree_files;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "uswap", version, about = "User-space swap: benchmarks and tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a workload over uswap and the kernel's swap, side by side; report throughput,
    /// latency, counters and ratios.
    Bench(Box<bench::BenchArgs>),
    /// Run the standard suite (every workload, every engine) and rewrite the generated parts
    /// of BENCHMARKS.md: machine, commands, tables, plots. Needs root for the kernel engines.
    Report(report::ReportArgs),
    /// Run an unmodified program with its anonymous memory (heap and large mmaps) paged by
    /// uswap under a resident limit shared by every process it starts.
    Run(run::RunArgs),
    /// Print the live counters of the uswap pagers of a running process (its user or root
    /// only): once, or every --interval; as a table, --json or --prometheus.
    Stat(stat::StatArgs),
    /// A workload process of `uswap bench` (internal).
    #[command(name = "__workload", hide = true)]
    Workload {
        /// The workload, as JSON.
        #[arg(long)]
        spec: String,
    },
}

fn main() -> ExitCode {
    // The engine's clock, which `uswap run` compares with its tree's, is the C library's own
    // even when a fake clock is preloaded into uswap itself (`faketime ... uswap run`).
    uswap::use_the_c_librarys_clock();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::main(&args),
        Command::Report(args) => report::main(&args),
        Command::Run(args) => run::main(&args),
        Command::Stat(args) => stat::main(&args),
        Command::Workload { spec } => bench::worker::child_main(&spec),
    }
}
