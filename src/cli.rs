//! The command line: parsing with clap and one function per subcommand. `main` only calls
//! [`run`]; everything here is testable as a library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::app::{Application, Feed};
use crate::bench;
use crate::config::Settings;
use crate::demo::{self, DemoOptions};
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
    /// Consume from RocketMQ through the gate, with the HTTP server, until SIGTERM/SIGINT.
    Serve,
    /// Send the example traffic (orders, payments, stock deductions with duplicates) to a
    /// real topic and print what was sent as JSON.
    Produce(ProduceArgs),
    /// Run the gate on embedded defaults (SQLite, built-in traffic); no services needed.
    Demo(DemoArgs),
    /// Move claims older than the dedup retention to the archive and delete log rows older
    /// than the log retention, now (the job `serve` runs on archive.schedule).
    Archive(ArchiveArgs),
    /// Print a business key's story: its dedup record, every delivery (msgId, outcome, cause,
    /// retries, dead letters) and its business state, as the web UI's trace page shows it.
    Trace(TraceArgs),
    /// Find lost, stuck, double-applied, orphaned, colliding and late keys in a window of the
    /// delivery log and the dedup table; store and print the run. Exits 2 when anything is found.
    Reconcile(ReconcileArgs),
    /// Re-publish dead-lettered messages to their topic with the same business key, refusing
    /// keys that are already claimed. Exits 2 when any key was refused or failed.
    Replay(ReplayArgs),
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
    /// Where the demo's log goes, so that the terminal keeps the status lines; `-` writes it
    /// to the terminal (standard error) instead.
    #[arg(long, default_value = "idemgate-demo.log")]
    pub log_file: String,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The bizId (or, with --by, a msgId or UNIQ_KEY) to trace.
    pub text: String,
    /// What TEXT is: any (a bizId, else a msgId, else a UNIQ_KEY), biz_id, msg_id, uniq_key.
    #[arg(long, default_value = "any")]
    pub by: String,
    /// Narrow to one biz_type when the bizId exists under several.
    #[arg(long)]
    pub biz_type: Option<String>,
    /// Narrow to one execute_time (epoch ms) of a delayed message.
    #[arg(long)]
    pub execute_time: Option<String>,
    /// Narrow to one consumer group.
    #[arg(long)]
    pub group: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["biz_id", "dead_lettered_since"])))]
pub struct ReplayArgs {
    /// The key whose latest dead letter to replay.
    #[arg(long)]
    pub biz_id: Option<String>,
    /// With --biz-id: only this biz_type.
    #[arg(long, requires = "biz_id")]
    pub biz_type: Option<String>,
    /// With --biz-id: only this execute_time (epoch ms).
    #[arg(long, requires = "biz_id")]
    pub execute_time: Option<i64>,
    /// Every key dead-lettered within this age (24h, 90m, 7d), each once.
    #[arg(long, value_parser = crate::archive::parse_age)]
    pub dead_lettered_since: Option<i64>,
    /// List what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// How far back to look (24h, 90m, 7d); default: reconcile.window_hours.
    #[arg(long, value_parser = crate::archive::parse_age)]
    pub since: Option<i64>,
    /// Only this biz_type.
    #[arg(long)]
    pub biz_type: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// Report what would move and the SQL plan of each statement; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Archive claims older than this (90d, 36h, 30m, 45s); default: archive.dedup_retention_days.
    #[arg(long, value_parser = crate::archive::parse_age)]
    pub older_than: Option<i64>,
    /// Rows per batch, each batch one transaction; default: archive.batch_size.
    #[arg(long)]
    pub batch_size: Option<u32>,
}

#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Messages to send.
    #[arg(long, default_value_t = 2000)]
    pub count: u64,
    /// Messages per second; 0 sends as fast as the broker takes them.
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Share of duplicates (redeliveries, producer resends, late duplicates), 0 to 0.9.
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Share of poison payments (for orders that never exist; they end dead-lettered).
    #[arg(long, default_value_t = 0.01)]
    pub poison: f64,
    /// Share of malformed messages (no key, a hostile key, a truncated body).
    #[arg(long, default_value_t = 0.005)]
    pub malformed: f64,
    /// Share of payments sent before their order (they fail and are retried).
    #[arg(long, default_value_t = 0.05)]
    pub early_payments: f64,
    /// The topic (default: the example shop's).
    #[arg(long, default_value = shop::TOPIC)]
    pub topic: String,
    /// Prefix of every business key (default: R and the current UTC time).
    #[arg(long)]
    pub run: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write every accepted send to this file as JSON lines (kind, UNIQ_KEY, tags, KEYS).
    #[arg(long)]
    pub sends: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The gate against the naive select-then-insert pattern, stock.deduct at a share of
    /// duplicates, per backend.
    Gate(BenchGateArgs),
    /// End to end from a real RocketMQ broker into PostgreSQL: ack-only ceiling, the naive
    /// pattern and idemgate (with its sized client runtime and with the client's defaults).
    Broker(BenchBrokerArgs),
    /// Archive throughput on expired claims, the consumers' latency beside a run, and the
    /// late-duplicate guard's cost, per backend.
    Archive(BenchArchiveArgs),
    /// Trace lookup latency on 1,000,000 claims and 3,000,000 delivery-log rows, against the
    /// naive bizId query on the same data without the trace indexes, per backend.
    Trace(BenchTraceArgs),
    /// Each statement of a reconcile run and of the overview on 24 hours of 1,000,000
    /// deliveries the planner has no statistics about, before and after an ANALYZE, against
    /// the same statements written with NOT EXISTS and open time ranges, per backend.
    Reconcile(BenchReconcileArgs),
    /// The defence layers side by side: database only, Redis + database, sharded tables and
    /// the naive Redis pattern, at each share of duplicates, per backend.
    Layers(BenchLayersArgs),
    /// State moves per second with the state-machine helper's conditional update against the
    /// naive SELECT, check, UPDATE, for fresh and already-made moves, and two movers racing.
    StateMachine(BenchStateMachineArgs),
    /// The consumer's msg/s and p99 while 200 loops flood the overview API and the collisions
    /// page, for the shipped UI limits, wide limits and the pages on the consumer's own pool.
    UiFlood(bench::ui_flood::Options),
    /// What the metrics cost: one observe call, the gate with and without metrics, one scrape
    /// of 10 biz_types × 5 outcomes × 4 causes.
    Metrics {
        /// Messages for the with/without comparison on SQLite.
        #[arg(long, default_value_t = 4000)]
        messages: usize,
    },
}

#[derive(Debug, Args)]
pub struct BenchReconcileArgs {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Deliveries to load, about (1,000 to 3,000,000).
    #[arg(long, default_value_t = 1_000_000)]
    pub deliveries: usize,
    /// Hours the deliveries are spread over (24 to 2160); the run reconciles the last 24.
    #[arg(long, default_value_t = 24)]
    pub span_hours: u32,
    /// Seconds a statement may run before it is cancelled and reported as such.
    #[arg(long, default_value_t = 120)]
    pub statement_timeout: u64,
}

#[derive(Debug, Args)]
pub struct BenchLayersArgs {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Shares of duplicates; one run of every mode per value.
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.9")]
    pub duplicates: Vec<f64>,
    /// Deliveries in flight.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Claim tables of the sharded mode.
    #[arg(long, default_value_t = 16)]
    pub shards: u16,
    #[arg(long, env = "IDEMGATE_TEST_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

#[derive(Debug, Args)]
pub struct BenchStateMachineArgs {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Rows each pattern moves, then moves again (at most 1,000,000).
    #[arg(long, default_value_t = 20_000)]
    pub rows: usize,
    /// Rows each pattern races two movers on.
    #[arg(long, default_value_t = 2_000)]
    pub race_rows: usize,
}

#[derive(Debug, Args)]
pub struct BenchTraceArgs {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Claims to load (at most 1,000,000); the delivery log gets three rows per claim.
    #[arg(long, default_value_t = 1_000_000)]
    pub claims: usize,
    /// Timed trace lookups per kind (by bizId, by msgId).
    #[arg(long, default_value_t = 2_000)]
    pub lookups: usize,
    /// Timed naive lookups (each one scans the log).
    #[arg(long, default_value_t = 10)]
    pub naive_lookups: usize,
}

#[derive(Debug, Args)]
pub struct BenchArchiveArgs {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Expired claims to load and archive (at most 1,000,000).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: usize,
    #[arg(long, default_value_t = 5_000)]
    pub batch_size: u32,
    /// Pause between batches of the run beside the consumers.
    #[arg(long, default_value_t = 50)]
    pub pause_ms: u64,
    /// Deliveries in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Fresh deliveries per consumer measurement.
    #[arg(long, default_value_t = 4_000)]
    pub messages: usize,
}

#[derive(Debug, Args)]
pub struct BenchBrokerArgs {
    /// A running name server; without it a private broker is started (scripts/install-rocketmq.sh
    /// installs the binaries).
    #[arg(long)]
    pub name_server: Option<String>,
    #[arg(long, default_value_t = 10000)]
    pub messages: usize,
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    #[arg(long, default_value_t = 8)]
    pub consume_threads: u32,
    /// The database: postgres or mysql.
    #[arg(long, default_value = "postgres")]
    pub backend: String,
    /// Consume threads of the group-commit run.
    #[arg(long, default_value_t = 4)]
    pub group_threads: u32,
    /// Messages per listener call in the group-commit run (1 to 32), handed to the gate at once.
    #[arg(long, default_value_t = 32)]
    pub group_listener_batch: u32,
    /// Deliveries per group transaction (1 to 64).
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    #[arg(long, default_value_t = 2)]
    pub linger_ms: u64,
    /// Groups committing at once.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
    /// Also run idemgate on the client's default runtime.
    #[arg(long)]
    pub client_defaults: bool,
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
    /// Deliveries per transaction of the group-commit pattern (1 to 64).
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Groups committing at once in the group-commit pattern.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    match &cli.command {
        Command::Demo(args) if args.log_file != "-" => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&args.log_file)
                .with_context(|| format!("--log-file {}: cannot open it for appending", args.log_file))?;
            crate::telemetry::init_to(&settings.log, Some(file));
        }
        _ => crate::telemetry::init(&settings.log),
    }
    match cli.command {
        Command::Serve => {
            crate::serve::run(&settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Produce(args) => produce_command(&settings, args).await,
        Command::Demo(args) => demo_command(settings, args).await,
        Command::Archive(args) => archive_command(&settings, args).await,
        Command::Trace(args) => trace_command(&settings, args).await,
        Command::Reconcile(args) => reconcile_command(&settings, args).await,
        Command::Replay(args) => replay_command(&settings, args).await,
        Command::Migrate => {
            let store = open_store(&settings).await?;
            println!("migrations applied to {}", redact_url(&settings.database.url));
            store.close().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config => {
            let mut shown = settings.clone();
            shown.database.url = redact_url(&shown.database.url);
            shown.http = shown.http.redacted();
            shown.redis = shown.redis.redacted();
            print!("{}", toml::to_string_pretty(&shown).context("rendering the configuration")?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Gate(args)) => bench_gate(args).await,
        Command::Bench(BenchCommand::Broker(args)) => bench_broker(args).await,
        Command::Bench(BenchCommand::Archive(args)) => bench_archive(args).await,
        Command::Bench(BenchCommand::Reconcile(args)) => {
            let options = bench::reconcile::Options {
                backends: args.backends,
                deliveries: args.deliveries,
                span_hours: args.span_hours,
                statement_timeout: Duration::from_secs(args.statement_timeout),
            };
            println!(
                "bench reconcile: about {} deliveries over {} hours per backend, the last 24 reconciled, \
                 statistics never gathered; statements cancelled after {} s",
                options.deliveries, options.span_hours, args.statement_timeout
            );
            let reports = bench::reconcile::run(&options, |line| eprintln!("  {line}")).await?;
            println!("\n{}", bench::reconcile::table(&reports));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Trace(args)) => {
            let options = bench::trace::Options {
                backends: args.backends,
                claims: args.claims,
                lookups: args.lookups,
                naive_lookups: args.naive_lookups,
            };
            println!(
                "bench trace: {} claims and {} delivery-log rows per backend; {} lookups by bizId and by msgId",
                options.claims,
                3 * options.claims,
                options.lookups
            );
            let reports = bench::trace::run(&options).await?;
            println!("\n{}", bench::trace::table(&reports));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Layers(args)) => {
            let options = bench::layers::Options {
                backends: args.backends,
                messages: args.messages,
                duplicates: args.duplicates,
                concurrency: args.concurrency,
                shards: args.shards,
                redis_url: args.redis_url,
            };
            println!(
                "bench layers: {} stock.deduct messages, {} in flight, {} shards, Redis at {}, {} cores",
                options.messages,
                options.concurrency,
                options.shards,
                redact_url(&options.redis_url),
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            );
            let reports = bench::layers::run(&options, |r| {
                eprintln!(
                    "  {} {:.0}% {}: {:.0} msg/s",
                    r.backend,
                    r.duplicates * 100.0,
                    r.mode.name(),
                    r.rate()
                )
            })
            .await?;
            println!("\n{}", bench::layers::table(&reports));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::StateMachine(args)) => {
            let options = bench::state_machine::Options {
                backends: args.backends,
                rows: args.rows,
                race_rows: args.race_rows,
            };
            println!(
                "bench state-machine: PAID to SHIPPED on {} rows per pattern, then again (already done), \
                 one transaction a move; {} rows raced by two movers",
                options.rows, options.race_rows
            );
            let report = bench::state_machine::run(&options, |line| eprintln!("  {line}")).await?;
            println!("\n{}", bench::state_machine::table(&report));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::UiFlood(mut options)) => {
            options.duplicates = share("duplicates", options.duplicates, 0.9)?;
            anyhow::ensure!(
                options.messages > 0 && options.clients > 0,
                "bench ui-flood: --messages and --clients must be at least 1"
            );
            println!(
                "bench ui-flood: {} stock.deduct messages, {:.0}% duplicates, RocketMQ -> {}, {} request loops, {} history rows, {} cores",
                options.messages,
                options.duplicates * 100.0,
                options.backend,
                options.clients,
                options.history,
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            );
            let report = bench::ui_flood::run(&options, |line| eprintln!("  {line}")).await?;
            println!("\n{}", bench::ui_flood::table(&report));
            report.check()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Metrics { messages }) => {
            println!("bench metrics: {messages} stock.deduct messages on SQLite with and without metrics");
            let report = bench::metrics::run(messages).await?;
            println!("\n{}", bench::metrics::table(&report));
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn demo_command(mut settings: Settings, args: DemoArgs) -> anyhow::Result<ExitCode> {
    let duplicates = share("duplicates", args.duplicates, 0.9)?;
    settings.consumer.max_reconsume_times = args.max_reconsume_times;
    let mut running = Application::build(&settings, Feed::Caller).await?.start().await?;
    let log = if args.log_file == "-" { "the terminal".to_owned() } else { args.log_file.clone() };
    println!(
        "idemgate demo: {} deliveries/s with {:.0}% duplicates into {} (instance {}).\n\
         Web UI at {url}/  (trace any bizId, msgId or UNIQ_KEY; dead letters at {url}/dead-letters)\n\
         Metrics at {url}/metrics  (Ctrl-C stops)\n\
         Log in {log}",
        args.rate,
        duplicates * 100.0,
        redact_url(&settings.database.url),
        running.gate().identity().instance_id,
        url = running.url()
    );
    let options = DemoOptions {
        rate: args.rate,
        duration: args.seconds.map(Duration::from_secs),
        status_every: Duration::from_secs(args.status_every.max(1)),
        mix: Mix { duplicates, ..Mix::default() },
        seed: rand::random(),
        ..DemoOptions::default()
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let gate = running.gate().clone();
    let fault = tokio::select! {
        ran = demo::run(gate, options, shutdown, |line| println!("{line}")) => { ran?; None }
        (part, ended) = running.failed() => Some(anyhow::anyhow!("the {part} ended on its own ({ended})")),
    };
    let stopped = running.stop().await;
    match fault {
        Some(e) => Err(e),
        None => stopped.map(|()| ExitCode::SUCCESS),
    }
}

/// Exit codes of `idemgate replay`: 0 every key sent (or, dry, would be), 2 any refused or
/// failed, 1 an error.
async fn replay_command(settings: &Settings, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    use crate::replay::{self, Selection};
    let selection = match (args.biz_id, args.dead_lettered_since) {
        (Some(biz_id), _) => {
            crate::route::check_key_text(&biz_id, crate::route::MAX_BIZ_ID_CHARS)
                .map_err(|m| anyhow::anyhow!("--biz-id {m}"))?;
            Selection::Key { biz_id, biz_type: args.biz_type, execute_time: args.execute_time }
        }
        (None, Some(age)) => Selection::Since(crate::clock::now_ms() - age),
        (None, None) => anyhow::bail!("give --biz-id or --dead-lettered-since"),
    };
    let store = open_store(settings).await?;
    let producer = if args.dry_run {
        None
    } else {
        Some(
            crate::broker::Producer::start(&settings.broker.name_server, &settings.broker.producer_group)
                .await?,
        )
    };
    let group = settings.consumer.group.clone();
    let lines = replay::replay(&store, &settings.routes(), &group, &selection, producer.as_ref()).await;
    if let Some(p) = producer {
        p.shutdown().await;
    }
    store.close().await;
    let lines = lines?;
    match args.format {
        OutputFormat::Text => print!("{}", replay::render_text(&lines, args.dry_run)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&lines)?),
    }
    Ok(ExitCode::from(if lines.iter().any(|l| l.action.is_refusal()) { 2 } else { 0 }))
}

/// Exit codes of `idemgate reconcile`: 0 no anomalies, 2 anomalies found, 1 an error.
async fn reconcile_command(settings: &Settings, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    use crate::reconcile::settings::Runner;
    let biz_type = match args.biz_type {
        Some(t) => {
            crate::route::check_key_text(&t, crate::route::MAX_BIZ_TYPE_CHARS)
                .map_err(|m| anyhow::anyhow!("--biz-type {m}"))?;
            Some(t)
        }
        None => None,
    };
    let window = match args.since {
        Some(ms) => Duration::from_millis(u64::try_from(ms).context("--since must be positive")?),
        None => settings.reconcile.window(),
    };
    let store = open_store(settings).await?;
    let identity = settings.identity();
    let who = Runner {
        consumer_group: &identity.consumer_group,
        instance_id: &identity.instance_id,
        started_by: "command",
        log_retention_days: settings.archive.log_retention_days,
    };
    let now = crate::clock::now_ms();
    let options = settings.reconcile.options(&who, biz_type, window, now);
    let checks = settings.handlers()?.checks(&settings.routes());
    let report = crate::reconcile::reconcile_once(&store, &options, &checks, now).await;
    store.close().await;
    let report = report?;
    match args.format {
        OutputFormat::Text => print!("{}", crate::reconcile::render_text(&report)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::from(if report.is_clean() { 0 } else { 2 }))
}

/// Exit codes of `idemgate trace`: 0 a story, 1 an error, 2 several keys to choose from,
/// 3 nothing found.
async fn trace_command(settings: &Settings, args: TraceArgs) -> anyhow::Result<ExitCode> {
    use crate::inspect::trace::{self, Answer, SearchBy, TraceQuery};
    let by = SearchBy::parse(&args.by)?;
    let query = TraceQuery::new(
        &args.text,
        by,
        args.biz_type.as_deref(),
        args.execute_time.as_deref(),
        args.group.as_deref(),
    )?;
    let store = open_store(settings).await?;
    let web = crate::http::Web::new(
        &settings.http,
        &settings.archive,
        settings.handlers()?.by_biz_type(&settings.routes()),
    );
    let answer = trace::trace(&store, &web.trace, &query).await;
    store.close().await;
    let answer = answer?;
    match args.format {
        OutputFormat::Text => print!("{}", trace::render_text(&answer)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
    }
    Ok(ExitCode::from(match answer {
        Answer::Story { .. } => 0,
        Answer::Choice { .. } => 2,
        Answer::Nothing { .. } => 3,
    }))
}

async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    Store::open(&settings.database.url, &settings.store_options())
        .await
        .with_context(|| format!("opening {}", redact_url(&settings.database.url)))
}

fn share(name: &str, value: f64, max: f64) -> anyhow::Result<f64> {
    if !(0.0..=max).contains(&value) {
        anyhow::bail!("--{name} must be between 0 and {max}, not {value}");
    }
    Ok(value)
}

async fn produce_command(settings: &Settings, args: ProduceArgs) -> anyhow::Result<ExitCode> {
    let mix = Mix {
        duplicates: share("duplicates", args.duplicates, 0.9)?,
        poison: share("poison", args.poison, 1.0)?,
        malformed: share("malformed", args.malformed, 1.0)?,
        early_payments: share("early-payments", args.early_payments, 1.0)?,
    };
    let options = crate::produce::ProduceOptions {
        name_server: settings.broker.name_server.clone(),
        producer_group: settings.broker.producer_group.clone(),
        topic: args.topic,
        count: args.count,
        rate: args.rate,
        mix,
        seed: args.seed,
        run: args.run.unwrap_or_else(crate::traffic::run_id),
    };
    let mut sends = match &args.sends {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut write_error = None;
    let report = crate::produce::run(&options, |record| {
        if let (Some(out), None) = (sends.as_mut(), write_error.as_ref()) {
            use std::io::Write;
            let line = serde_json::to_string(record).map_err(std::io::Error::other);
            if let Err(e) = line.and_then(|l| writeln!(out, "{l}")) {
                write_error = Some(e);
            }
        }
    })
    .await?;
    if let Some(e) = write_error {
        return Err(e).context("writing --sends");
    }
    if let Some(mut out) = sends {
        use std::io::Write;
        out.flush().context("writing --sends")?;
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

async fn archive_command(settings: &Settings, args: ArchiveArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(settings).await?;
    let request = crate::archive::manual::Request {
        dry_run: args.dry_run,
        older_than_ms: args.older_than,
        batch_size: args.batch_size,
    };
    let report = crate::archive::manual::command(
        &store,
        &settings.archive,
        &settings.identity().instance_id,
        settings.consumer.max_reconsume_times,
        &request,
        &mut std::io::stdout(),
    )
    .await;
    store.close().await;
    // Exit 3 when another instance held the lease and nothing was done.
    match report? {
        Some(r) if matches!(r.outcome, crate::archive::ArchiveOutcome::Skipped { .. }) => {
            Ok(ExitCode::from(3))
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

async fn bench_archive(args: BenchArchiveArgs) -> anyhow::Result<ExitCode> {
    let options = bench::archive::Options {
        backends: args.backends,
        rows: args.rows,
        batch_size: args.batch_size,
        pause: Duration::from_millis(args.pause_ms),
        concurrency: args.concurrency,
        messages: args.messages,
    };
    println!(
        "bench archive: {} expired claims, batches of {}, pause {} ms beside {} deliveries in flight, {} cores",
        options.rows,
        options.batch_size,
        args.pause_ms,
        options.concurrency,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let reports = bench::archive::run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}\n{}", bench::archive::table(&reports), bench::archive::guard_table(&reports));
    Ok(ExitCode::SUCCESS)
}

async fn bench_broker(args: BenchBrokerArgs) -> anyhow::Result<ExitCode> {
    let backend: Backend = args.backend.parse()?;
    anyhow::ensure!(backend != Backend::Sqlite, "bench broker: --backend is postgres or mysql");
    anyhow::ensure!(
        (1..=crate::gate::MAX_BATCH).contains(&args.max_batch),
        "bench broker: --max-batch is 1 to {}",
        crate::gate::MAX_BATCH
    );
    let options = bench::broker::Options {
        name_server: args.name_server,
        backend,
        messages: args.messages,
        duplicates: share("duplicates", args.duplicates, 0.9)?,
        consume_threads: args.consume_threads,
        group_threads: args.group_threads,
        group_listener_batch: args.group_listener_batch.clamp(1, 32),
        group: crate::gate::GroupSettings {
            enabled: true,
            max_batch: args.max_batch,
            linger_ms: args.linger_ms,
            in_flight: args.in_flight.max(1),
            queue: 4 * (args.group_threads * args.group_listener_batch.clamp(1, 32)) as usize,
        },
        client_defaults: args.client_defaults,
    };
    println!(
        "bench broker: {} stock.deduct messages, {:.0}% duplicates, RocketMQ -> {backend}, {} cores; group commit: {} threads × {} messages per call, max_batch {}, linger {} ms, {} in flight",
        options.messages,
        options.duplicates * 100.0,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        options.group_threads,
        options.group_listener_batch,
        options.group.max_batch,
        args.linger_ms,
        options.group.in_flight,
    );
    let runs = bench::broker::run(&options, |r| eprintln!("  {}: {:.0} msg/s", r.mode, r.rate())).await?;
    println!("\n{}", bench::broker::table(&runs));
    Ok(ExitCode::SUCCESS)
}

async fn bench_gate(args: BenchGateArgs) -> anyhow::Result<ExitCode> {
    let options = bench::gate::Options {
        backends: args.backends,
        messages: args.messages,
        duplicates: args.duplicates,
        concurrency: args.concurrency,
        group: crate::gate::GroupSettings {
            max_batch: args.max_batch.clamp(1, crate::gate::MAX_BATCH),
            in_flight: args.in_flight.max(1),
            ..Default::default()
        },
    };
    println!(
        "bench gate: {} stock.deduct messages, {:.0}% duplicates, {} cores",
        options.messages,
        options.duplicates * 100.0,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let reports = bench::gate::run(&options, |r| {
        eprintln!("  {} {} x{}: {:.0} msg/s", r.backend, r.pattern, r.concurrency, r.rate());
    })
    .await?;
    println!("\n{}", bench::gate::table(&reports));
    println!("Where the gate's time goes (mean per message):\n\n{}", bench::gate::phase_table(&reports));
    Ok(ExitCode::SUCCESS)
}
