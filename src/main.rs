//! The `idemgate` binary: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = idemgate::cli::Cli::parse();
    match idemgate::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idemgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
