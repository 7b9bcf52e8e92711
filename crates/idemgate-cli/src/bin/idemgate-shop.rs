//! `idemgate-shop`: idemgate with the example shop's handlers (orders, payments, stock), built
//! as a program that embeds idemgate with Rust handlers of its own builds it. Its command line
//! is idemgate's; `serve` runs the shop's handlers besides the configured ones (they create the
//! shop's tables), `trace` shows the orders and ledger rows behind a key, and `reconcile` runs
//! the shop's ledger check. Where the configuration names no routes and no consumer group, it
//! consumes the shop's topic (`idemgate_shop`, the default of `idemgate produce`) under the
//! shop's group; `idemgate serve` has no such defaults.

use std::process::ExitCode;

use idemgate_cli::{self as cli, Exit};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match cli::parse_as("idemgate-shop") {
        Ok(cli) => cli,
        Err(exit) => return exit.into(),
    };
    let shop_defaults =
        |settings: &mut idemgate::Settings| idemgate_shop::configure(settings, idemgate_shop::TOPIC);
    match cli::run_with(cli, idemgate_shop::handlers(), shop_defaults).await {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("idemgate-shop: {e:#}");
            Exit::Failure.into()
        }
    }
}
