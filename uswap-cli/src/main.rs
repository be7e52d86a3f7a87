//! The `uswap` command.

mod bench;
mod size;

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
    /// Run a workload over a managed region and report throughput, latency and counters.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => match bench::run(&args) {
            Ok(r) => {
                bench::print_summary(&r);
                if r.verify_errors > 0 {
                    eprintln!("uswap bench: {} accesses read wrong data", r.verify_errors);
                    return ExitCode::from(3);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uswap bench: {e}");
                ExitCode::from(2)
            }
        },
    }
}
