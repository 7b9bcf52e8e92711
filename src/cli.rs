//! The command line: parsing with clap and one function per subcommand. `main` only calls
//! [`run`]; everything here is testable as a library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::bench;
use crate::config::Settings;
use crate::demo::{self, DemoOptions};
use crate::gate::{Gate, Policy};
use crate::shop;
use crate::store::{Backend, Store, redact_url};
use crate::traffic::Mix;

/// Idempotent RocketMQ consumption: every duplicate harmless and visible.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about)]
pub struct Cli {
    /// A TOML configuration file; environment variables IDEMGATE_SECTION__KEY override it.
    #[arg(long, short, env = "IDEMGATE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gate on embedded defaults (SQLite, built-in traffic); no services needed.
    Demo(DemoArgs),
    /// Apply the database migrations and exit.
    Migrate,
    /// Print the effective configuration (password hidden) after validating it.
    Config,
    /// Measure; prints Markdown tables.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Messages sent per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Share of duplicates in the traffic, 0 to 1.
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Retry budget before a message is dead-lettered (the broker's default is 16; lower here
    /// so dead letters appear within seconds).
    #[arg(long, default_value_t = 3)]
    pub max_reconsume_times: i32,
    /// Seconds between status lines.
    #[arg(long, default_value_t = 5)]
    pub status_every: u64,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The gate against the naive select-then-insert pattern, stock.deduct at a share of
    /// duplicates, per backend.
    Gate(BenchGateArgs),
}

#[derive(Debug, Args)]
pub struct BenchGateArgs {
    /// Backends to measure (sqlite, postgres, mysql); the servers' admin URLs come from
    /// IDEMGATE_TEST_POSTGRES_URL and IDEMGATE_TEST_MYSQL_URL or the local defaults.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,mysql")]
    pub backends: Vec<Backend>,
    #[arg(long, default_value_t = 4000)]
    pub messages: usize,
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Deliveries in flight; one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub concurrency: Vec<usize>,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    crate::telemetry::init(&settings.log);
    match cli.command {
        Command::Demo(args) => demo_command(settings, args).await,
        Command::Migrate => {
            let store = Store::open(&settings.database.url, &settings.store_options()).await?;
            println!(
                "migrations applied to {}",
                redact_url(&settings.database.url)
            );
            store.close().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config => {
            let mut shown = settings.clone();
            shown.database.url = redact_url(&shown.database.url);
            print!(
                "{}",
                toml::to_string_pretty(&shown).context("rendering the configuration")?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Gate(args)) => bench_gate(args).await,
    }
}

async fn demo_command(settings: Settings, args: DemoArgs) -> anyhow::Result<ExitCode> {
    if !(0.0..=0.9).contains(&args.duplicates) {
        anyhow::bail!("--duplicates must be between 0 and 0.9");
    }
    let store = Store::open(&settings.database.url, &settings.store_options())
        .await
        .with_context(|| format!("opening {}", redact_url(&settings.database.url)))?;
    let policy = Policy {
        max_reconsume_times: args.max_reconsume_times,
        ..settings.policy()
    };
    let gate = Arc::new(Gate::new(
        store.clone(),
        settings.routes(),
        shop::handlers(),
        settings.identity(),
        policy,
    )?);
    println!(
        "idemgate demo: {} deliveries/s with {:.0}% duplicates into {} (instance {}). Ctrl-C stops.",
        args.rate,
        args.duplicates * 100.0,
        redact_url(&settings.database.url),
        gate.identity().instance_id
    );
    let options = DemoOptions {
        rate: args.rate,
        duration: args.seconds.map(Duration::from_secs),
        status_every: Duration::from_secs(args.status_every.max(1)),
        mix: Mix {
            duplicates: args.duplicates,
            ..Mix::default()
        },
        seed: rand::random(),
        ..DemoOptions::default()
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    demo::run(gate, options, shutdown, |line| println!("{line}")).await?;
    store.close().await;
    Ok(ExitCode::SUCCESS)
}

async fn bench_gate(args: BenchGateArgs) -> anyhow::Result<ExitCode> {
    let options = bench::gate::Options {
        backends: args.backends,
        messages: args.messages,
        duplicates: args.duplicates,
        concurrency: args.concurrency,
    };
    println!(
        "bench gate: {} stock.deduct messages, {:.0}% duplicates, {} cores",
        options.messages,
        options.duplicates * 100.0,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let reports = bench::gate::run(&options, |r| {
        eprintln!(
            "  {} {} x{}: {:.0} msg/s",
            r.backend,
            r.pattern,
            r.concurrency,
            r.rate()
        );
    })
    .await?;
    println!("\n{}", bench::gate::table(&reports));
    println!(
        "Where the gate's time goes (mean per message):\n\n{}",
        bench::gate::phase_table(&reports)
    );
    Ok(ExitCode::SUCCESS)
}
