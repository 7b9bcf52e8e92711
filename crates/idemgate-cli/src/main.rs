//! The `idemgate` binary: parse the command line and hand over to the library.

use std::process::ExitCode;

use idemgate_cli::{self as cli, Exit};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(exit) => return exit.into(),
    };
    match cli::run(cli).await {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("idemgate: {e:#}");
            Exit::Failure.into()
        }
    }
}
