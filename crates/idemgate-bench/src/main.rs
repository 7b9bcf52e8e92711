//! `idemgate-bench`: the benchmarks behind docs/benchmarks.md, one subcommand each.

use std::process::ExitCode;

use clap::Parser;
use idemgate_bench::command::BenchCommand;

/// Measure idemgate beside the naive way on the same database in the same run; prints
/// Markdown tables.
#[derive(Debug, Parser)]
#[command(name = "idemgate-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    benchmark: BenchCommand,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    idemgate::telemetry::init(&idemgate::telemetry::LogSettings::default());
    match cli.benchmark.run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idemgate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
