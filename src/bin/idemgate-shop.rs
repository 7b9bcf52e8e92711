//! `idemgate-shop`: idemgate with the example shop's handlers (orders, payments, stock), built
//! as a program that embeds idemgate with Rust handlers of its own builds it. Its command line
//! is idemgate's; `serve` runs the shop's handlers besides the configured ones (they create the
//! shop's tables), `trace` shows the orders and ledger rows behind a key, and `reconcile` runs
//! the shop's ledger check. The routes and the consumer group come from the configuration, as
//! for `idemgate serve`; `idemgate demo` needs none of it.

use std::process::ExitCode;

use idemgate::cli::{self, Exit};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match cli::parse_as("idemgate-shop") {
        Ok(cli) => cli,
        Err(exit) => return exit.into(),
    };
    match cli::run_with(cli, idemgate::shop::handlers()).await {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("idemgate-shop: {e:#}");
            Exit::Failure.into()
        }
    }
}
