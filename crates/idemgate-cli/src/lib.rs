//! The idemgate command line: parsing with clap and one function per subcommand. The binaries
//! `idemgate` and `idemgate-shop` only call [`parse`] (or [`parse_as`]) and [`run`] (or
//! [`run_with`]); everything here is testable as a library, and a program that embeds the
//! service with handlers of its own embeds its command line the same way. Every exit status is
//! an [`Exit`].
//!
//! `demo` and `produce` run the example shop (`idemgate-shop`); every other subcommand knows
//! only the configured business and the program's own handlers.

mod archive;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use idemgate::app::{Application, ByHand, Feed};
use idemgate::config::Settings;
use idemgate::handler::Handlers;
use idemgate::inspect::trace::SearchBy;
use idemgate::store::redact_url;
use idemgate_shop::demo::{self, DemoOptions};
use idemgate_shop::traffic::Mix;

/// Every exit status of `idemgate`, each with one meaning whatever the subcommand
/// (docs/commands.md lists them). 2 is clap's for a command line it cannot read, so no
/// answer of a command is 2: a mistyped flag in a cron job never reads as anomalies found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done: a story printed, no anomaly, every key sent (or, dry, would be).
    Success = 0,
    /// An error: the configuration, the database, the broker; the message on standard error.
    Failure = 1,
    /// The command line is wrong: an unknown flag, a missing or malformed value.
    Usage = 2,
    /// `trace`: nothing matches.
    NothingFound = 3,
    /// `archive`: another instance holds the lease; nothing was done.
    LeaseHeld = 4,
    /// `trace`: several keys match; narrow with `--biz-type`, `--execute-time` or `--group`.
    SeveralMatches = 5,
    /// `reconcile`: anomalies found.
    AnomaliesFound = 6,
    /// `replay`: a key was refused or could not be sent.
    Refused = 7,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// The command line of this process, or, when clap cannot read it (or was asked for `--help`
/// or `--version`), the exit status after clap has printed why.
pub fn parse() -> Result<Cli, Exit> {
    parse_as("idemgate")
}

/// [`parse`] for a program named `name` that embeds this command line with handlers of its
/// own ([`run_with`]): its usage lines and errors name it.
pub fn parse_as(name: &'static str) -> Result<Cli, Exit> {
    use clap::{CommandFactory, FromArgMatches};
    Cli::command()
        .name(name)
        .bin_name(name)
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .map_err(|e| {
            let _ = e.print();
            if e.use_stderr() { Exit::Usage } else { Exit::Success }
        })
}

/// Idempotent RocketMQ consumption: every duplicate harmless and visible.
#[derive(Debug, Parser)]
#[command(
    name = "idemgate",
    version = idemgate::VERSION,
    about = "Idempotent RocketMQ consumption: a dedup claim in the business transaction, with the duplicates made visible."
)]
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
    /// delivery log and the dedup table; store and print the run. Exits 6 when anything is found.
    Reconcile(ReconcileArgs),
    /// Re-publish dead-lettered messages to their topic with the same business key, refusing
    /// keys that are already claimed. Exits 7 when any key was refused or failed.
    Replay(ReplayArgs),
    /// Apply the database migrations and exit.
    Migrate,
    /// Print the effective configuration (password hidden) after validating it.
    Config,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Messages sent per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Stop after this many seconds (default: run until Ctrl-C or SIGTERM).
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
    /// The bizId (or, with --by, a msgId, UNIQ_KEY or trace id) to trace.
    pub text: String,
    /// What TEXT is.
    #[arg(long, value_enum, default_value_t = By::Any)]
    pub by: By,
    /// Narrow to one biz_type when the bizId exists under several.
    #[arg(long)]
    pub biz_type: Option<String>,
    /// Narrow to one execute_time of a delayed message: epoch milliseconds or RFC 3339.
    #[arg(long, value_name = "TIME", value_parser = idemgate::route::parse_execute_time)]
    pub execute_time: Option<i64>,
    /// Narrow to one consumer group.
    #[arg(long)]
    pub group: Option<String>,
    /// The timeline's page after this cursor (a page's "later deliveries" line).
    #[arg(long, conflicts_with = "before")]
    pub after: Option<String>,
    /// The timeline's page before this cursor (a page's "earlier deliveries" line).
    #[arg(long)]
    pub before: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("which").required(true).args(["biz_id", "msg_id", "dead_lettered_since", "invalid_since"])
))]
pub struct ReplayArgs {
    /// The key whose latest dead letter or invalid delivery to replay.
    #[arg(long)]
    pub biz_id: Option<String>,
    /// The message whose latest dead-lettered or invalid delivery to replay, by its msgId: for
    /// a message refused before a bizId could be read from it, or whose bizId the log holds
    /// only as an escaped or cut excerpt.
    #[arg(long)]
    pub msg_id: Option<String>,
    /// With --biz-id: only this biz_type.
    #[arg(long, requires = "biz_id")]
    pub biz_type: Option<String>,
    /// With --biz-id: only this execute_time: epoch milliseconds or RFC 3339.
    #[arg(long, requires = "biz_id", value_name = "TIME", value_parser = idemgate::route::parse_execute_time)]
    pub execute_time: Option<i64>,
    /// Every key dead-lettered within this age (24h, 90m, 7d), each once.
    #[arg(long, value_parser = idemgate::archive::parse_age)]
    pub dead_lettered_since: Option<i64>,
    /// Every delivery refused as invalid within this age (24h, 90m, 7d), once the rule or the
    /// route that refused it is fixed: each key the routes now read, once; those they still
    /// refuse are listed as refused and not sent.
    #[arg(long, value_parser = idemgate::archive::parse_age)]
    pub invalid_since: Option<i64>,
    /// List what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// How far back to look (24h, 90m, 7d); default: reconcile.window_hours.
    #[arg(long, value_parser = idemgate::archive::parse_age)]
    pub since: Option<i64>,
    /// Only this biz_type.
    #[arg(long)]
    pub biz_type: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

/// `trace --by`: what the text is, as [`SearchBy`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum By {
    /// A bizId, else a msgId, else a UNIQ_KEY, else (32 hex digits) a trace id.
    Any,
    /// A bizId.
    BizId,
    /// A msgId.
    MsgId,
    /// A UNIQ_KEY.
    UniqKey,
    /// A W3C trace id: 32 hex digits, from the message's traceparent.
    TraceId,
}

impl From<By> for SearchBy {
    fn from(by: By) -> Self {
        match by {
            By::Any => Self::Any,
            By::BizId => Self::BizId,
            By::MsgId => Self::MsgId,
            By::UniqKey => Self::UniqKey,
            By::TraceId => Self::TraceId,
        }
    }
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
    #[arg(long, value_parser = idemgate::archive::parse_age)]
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
    #[arg(long, default_value = idemgate_shop::TOPIC)]
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

/// Runs the parsed command line, with the configured handlers only.
pub async fn run(cli: Cli) -> anyhow::Result<Exit> {
    run_with(cli, Handlers::new(), |_| {}).await
}

/// Runs the parsed command line for a program that brings handlers of its own: `serve` runs
/// them besides the configured ones, `trace` shows the business state they describe, and
/// `reconcile` runs their checks. `defaults` fills in what the loaded settings leave unset
/// (the program's own routes and consumer group, say). The demo always runs the example shop.
pub async fn run_with(cli: Cli, own: Handlers, defaults: impl FnOnce(&mut Settings)) -> anyhow::Result<Exit> {
    let mut settings = Settings::load(cli.config.as_deref())?;
    defaults(&mut settings);
    settings.validate()?;
    match &cli.command {
        Command::Demo(args) if args.log_file != "-" => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&args.log_file)
                .with_context(|| format!("--log-file {}: cannot open it for appending", args.log_file))?;
            idemgate::telemetry::init_to(&settings.log, Some(file));
        }
        _ => idemgate::telemetry::init(&settings.log),
    }
    for deprecated in &settings.deprecated {
        tracing::warn!("{deprecated}");
    }
    match cli.command {
        Command::Serve => {
            serve::run(&settings, settings.handlers_with(own)?).await?;
            Ok(Exit::Success)
        }
        Command::Produce(args) => produce_command(&settings, args).await,
        Command::Demo(args) => demo_command(settings, args).await,
        Command::Archive(args) => archive_command(ByHand::open(&settings, own).await?, args).await,
        Command::Trace(args) => trace_command(&settings, own, args).await,
        Command::Reconcile(args) => reconcile_command(&settings, own, args).await,
        Command::Replay(args) => replay_command(&settings, own, args).await,
        Command::Migrate => {
            ByHand::open(&settings, own).await?.close().await;
            println!("migrations applied to {}", redact_url(&settings.database.url));
            Ok(Exit::Success)
        }
        Command::Config => {
            let mut shown = settings.clone();
            shown.database.url = redact_url(&shown.database.url);
            shown.http = shown.http.redacted();
            shown.redis = shown.redis.redacted();
            shown.rocketmq = shown.rocketmq.redacted();
            shown.rabbitmq = shown.rabbitmq.redacted();
            print!("{}", toml::to_string_pretty(&shown).context("rendering the configuration")?);
            Ok(Exit::Success)
        }
    }
}

async fn demo_command(mut settings: Settings, args: DemoArgs) -> anyhow::Result<Exit> {
    let duplicates = share("duplicates", args.duplicates, 0.9)?;
    settings.consumer.max_reconsume_times = args.max_reconsume_times;
    // The demo brings the example shop: its handlers (which make its tables) beside any
    // configured ones, and its routes and group where none are configured.
    idemgate_shop::configure(&mut settings, idemgate_shop::TOPIC);
    let handlers = settings.handlers_with(idemgate_shop::handlers())?;
    let mut running = Application::build_with(&settings, handlers, Feed::Caller).await?.start().await?;
    let log = if args.log_file == "-" { "the terminal".to_owned() } else { args.log_file.clone() };
    println!(
        "idemgate demo: {} deliveries/s with {:.0}% duplicates into {} (instance {}).\n\
         Web UI at {url}/  (trace any bizId, msgId or UNIQ_KEY; dead letters at {url}/dead-letters)\n\
         Metrics at {url}/metrics  (Ctrl-C or SIGTERM stops)\n\
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
    // SIGTERM as well as Ctrl-C: `docker stop` sends SIGTERM, which a container's first process
    // would not even receive without a handler.
    let shutdown = async {
        serve::shutdown_signal().await;
    };
    let gate = running.gate().clone();
    let fault = tokio::select! {
        ran = demo::run(gate, options, shutdown, |line| println!("{line}")) => { ran?; None }
        (part, ended) = running.failed() => Some(anyhow::anyhow!("the {part} ended on its own ({ended})")),
    };
    let stopped = running.stop().await;
    match fault {
        Some(e) => Err(e),
        None => stopped.map(|()| Exit::Success),
    }
}

/// `idemgate replay`: [`Exit::Success`] when every key was sent (or, dry, would be),
/// [`Exit::Refused`] when any was refused or failed.
async fn replay_command(settings: &Settings, own: Handlers, args: ReplayArgs) -> anyhow::Result<Exit> {
    use idemgate::replay::{self, Selection};
    let selection = match (args.biz_id, args.msg_id, args.dead_lettered_since, args.invalid_since) {
        (Some(biz_id), ..) => {
            idemgate::route::check_key_text(&biz_id, idemgate::route::MAX_BIZ_ID_CHARS)
                .map_err(|m| anyhow::anyhow!("--biz-id {m}"))?;
            Selection::Key { biz_id, biz_type: args.biz_type, execute_time: args.execute_time }
        }
        (None, Some(msg_id), ..) => {
            let msg_id = idemgate::inspect::checked_text("--msg-id", &msg_id, idemgate::route::MAX_ID_CHARS)?;
            Selection::Message { msg_id }
        }
        (None, None, Some(age), _) => Selection::Since(idemgate::clock::now_ms() - age),
        (None, None, None, Some(age)) => Selection::InvalidSince(idemgate::clock::now_ms() - age),
        (None, None, None, None) => {
            anyhow::bail!("give --biz-id, --msg-id, --dead-lettered-since or --invalid-since")
        }
    };
    settings.require_group()?;
    let service = ByHand::open(settings, own).await?;
    let producer = if args.dry_run { None } else { Some(settings.brokers().publisher().await?) };
    let group = service.identity().consumer_group;
    let lines =
        replay::replay(service.store(), service.routes(), &group, &selection, producer.as_deref()).await;
    if let Some(p) = producer {
        p.shutdown().await;
    }
    service.close().await;
    let lines = lines?;
    match args.format {
        OutputFormat::Text => print!("{}", replay::render_text(&lines, args.dry_run)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&lines)?),
    }
    Ok(if lines.iter().any(|l| l.action.is_refusal()) { Exit::Refused } else { Exit::Success })
}

/// `idemgate reconcile`: [`Exit::Success`] without anomalies, [`Exit::AnomaliesFound`] with.
async fn reconcile_command(settings: &Settings, own: Handlers, args: ReconcileArgs) -> anyhow::Result<Exit> {
    use idemgate::reconcile::settings::Runner;
    let biz_type = match args.biz_type {
        Some(t) => {
            idemgate::route::check_key_text(&t, idemgate::route::MAX_BIZ_TYPE_CHARS)
                .map_err(|m| anyhow::anyhow!("--biz-type {m}"))?;
            Some(t)
        }
        None => None,
    };
    let window = match args.since {
        Some(ms) => Duration::from_millis(u64::try_from(ms).context("--since must be positive")?),
        None => settings.reconcile.window(),
    };
    settings.require_group()?;
    let service = ByHand::open(settings, own).await?;
    let identity = service.identity();
    let who = Runner {
        consumer_group: &identity.consumer_group,
        instance_id: &identity.instance_id,
        started_by: "command",
        log_retention_days: settings.archive.log_retention_days,
    };
    let now = idemgate::clock::now_ms();
    let options = settings.reconcile.options(&who, biz_type, window, now);
    let report = idemgate::reconcile::reconcile_once(service.store(), &options, &service.checks(), now).await;
    service.close().await;
    let report = report?;
    match args.format {
        OutputFormat::Text => print!("{}", idemgate::reconcile::render_text(&report)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.is_clean() { Exit::Success } else { Exit::AnomaliesFound })
}

/// `idemgate trace`: [`Exit::Success`] with a story, [`Exit::SeveralMatches`] with keys to
/// choose from, [`Exit::NothingFound`].
async fn trace_command(settings: &Settings, own: Handlers, args: TraceArgs) -> anyhow::Result<Exit> {
    use idemgate::inspect::trace::{self, Answer, TraceQuery};
    let query = TraceQuery::new(
        &args.text,
        args.by.into(),
        args.biz_type.as_deref(),
        args.execute_time,
        args.group.as_deref(),
    )?
    .paged(args.after.as_deref(), args.before.as_deref())?;
    let service = ByHand::open(settings, own).await?;
    let answer = trace::trace(service.store(), &service.trace_context(), &query).await;
    service.close().await;
    let answer = answer?;
    match args.format {
        OutputFormat::Text => print!("{}", trace::render_text(&answer)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
    }
    Ok(match answer {
        Answer::Story { .. } => Exit::Success,
        Answer::Choice { .. } => Exit::SeveralMatches,
        Answer::Nothing { .. } => Exit::NothingFound,
    })
}

fn share(name: &str, value: f64, max: f64) -> anyhow::Result<f64> {
    if !(0.0..=max).contains(&value) {
        anyhow::bail!("--{name} must be between 0 and {max}, not {value}");
    }
    Ok(value)
}

async fn produce_command(settings: &Settings, args: ProduceArgs) -> anyhow::Result<Exit> {
    let mix = Mix {
        duplicates: share("duplicates", args.duplicates, 0.9)?,
        poison: share("poison", args.poison, 1.0)?,
        malformed: share("malformed", args.malformed, 1.0)?,
        early_payments: share("early-payments", args.early_payments, 1.0)?,
    };
    let options = idemgate_shop::produce::ProduceOptions {
        brokers: settings.brokers(),
        topic: args.topic,
        count: args.count,
        rate: args.rate,
        mix,
        seed: args.seed,
        run: args.run.unwrap_or_else(idemgate_shop::traffic::run_id),
    };
    let mut sends = match &args.sends {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut write_error = None;
    let report = idemgate_shop::produce::run(&options, |record| {
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
    Ok(Exit::Success)
}

async fn archive_command(service: ByHand, args: ArchiveArgs) -> anyhow::Result<Exit> {
    let settings = service.settings();
    let request = archive::Request {
        dry_run: args.dry_run,
        older_than_ms: args.older_than,
        batch_size: args.batch_size,
    };
    let report = archive::command(
        service.store(),
        &settings.archive,
        &service.identity().instance_id,
        settings.brokers().limits().redelivery_horizon_ms(settings.consumer.max_reconsume_times),
        &request,
        &mut std::io::stdout(),
    )
    .await;
    service.close().await;
    match report? {
        Some(r) if matches!(r.outcome, idemgate::archive::ArchiveOutcome::Skipped { .. }) => {
            Ok(Exit::LeaseHeld)
        }
        _ => Ok(Exit::Success),
    }
}
