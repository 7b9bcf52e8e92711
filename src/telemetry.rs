//! Logging setup: one `tracing` subscriber for the process, text or JSON, filtered by
//! `RUST_LOG` or the configured filter. Libraries that bring a subscriber of their own must
//! not replace this one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::subscriber::Interest;
use tracing_subscriber::filter::DynFilterFn;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use serde::{Deserialize, Serialize};

/// `[log]`: how the process logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `IDEMGATE_LOG__FILTER`: a `tracing` filter such as `info` or `idemgate=debug,sqlx=warn`.
    /// `RUST_LOG`, when set, wins.
    pub filter: String,
    /// `IDEMGATE_LOG__FORMAT`: `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { filter: DEFAULT_LOG_FILTER.to_owned(), format: LogFormat::Text }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// idemgate at INFO; the RocketMQ client (chatty at INFO: every rebalance and offset
/// commit) and the cron scheduler (a line per job it creates) at WARN.
pub(crate) const DEFAULT_LOG_FILTER: &str = "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,\
     rocketmq_remoting=warn,tokio_cron_scheduler=warn";

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// Starts or stops counting the SQL statements this process runs (for the benchmarks'
/// statements-per-message figures). sqlx reports each statement it has run as a `sqlx::query`
/// event (all but `BEGIN`, which [`crate::store::Store::begin`] reports the same way); while
/// counting is off, those events are not even built.
pub fn count_statements(on: bool) {
    COUNTING.store(on, Ordering::Release);
}

/// The statements counted so far.
pub fn statements_counted() -> u64 {
    STATEMENTS.load(Ordering::Acquire)
}

struct StatementCounter;

impl<S: tracing::Subscriber> Layer<S> for StatementCounter {
    fn on_event(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        STATEMENTS.fetch_add(1, Ordering::AcqRel);
    }
}

/// Installs the global subscriber, writing to standard error. Safe to call twice (the second
/// call does nothing), so tests and the CLI can both call it.
pub fn init(settings: &LogSettings) {
    init_to(settings, None);
}

/// Installs the global subscriber, writing to `file` when given (the demo keeps its terminal
/// for status lines), else to standard error.
pub fn init_to(settings: &LogSettings, file: Option<std::fs::File>) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let (writer, ansi) = match file {
        Some(file) => (BoxMakeWriter::new(std::sync::Mutex::new(file)), false),
        None => (BoxMakeWriter::new(std::io::stderr), std::io::stderr().is_terminal()),
    };
    let text = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    let output = match settings.format {
        LogFormat::Text => text.boxed(),
        LogFormat::Json => text.json().boxed(),
    };
    // Asked at every event, not cached per call site: counting is switched on and off.
    let counter = StatementCounter.with_filter(
        DynFilterFn::new(|meta, _| meta.target() == "sqlx::query" && COUNTING.load(Ordering::Acquire))
            // sqlx reports statements at DEBUG: nothing below it needs to reach this filter.
            .with_max_level_hint(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with_callsite_filter(|meta| {
                if meta.target() == "sqlx::query" { Interest::sometimes() } else { Interest::never() }
            }),
    );
    let _ = tracing_subscriber::registry().with(output.with_filter(filter)).with(counter).try_init();
}
