//! idemgate makes every duplicate RocketMQ delivery harmless and visible.
//!
//! RocketMQ delivers at least once: producer retries, broker redeliveries and crashes between
//! the business commit and the ack all bring a message back. idemgate claims each message's
//! business key in a dedup table with a unique index, inside the same transaction as the
//! business change, and logs every delivery so that duplicates can be counted, traced and
//! reconciled.
//!
//! # Layout
//! - [`store`]: the database pool (SQLite, PostgreSQL, MySQL/MariaDB) and the migrations.
//! - [`delivery`]: one message as delivered, broker-neutral.
//! - [`route`]: which business key a delivery claims, per topic and tag; the key rules.
//! - [`gate`]: claim, handler and log row in one transaction; duplicate causes.
//! - [`layout`]: the claim tables: one, or N shards by a stable hash; the readers' view.
//! - [`prefilter`]: the optional Redis `SET NX EX` in front of the claim, with fallback.
//! - [`handler`]: the trait business code implements, and the registry.
//! - [`state_machine`]: "move a row from state A to B" as one conditional update; duplicates
//!   told from illegal moves; the configured `[[state_machines]]` handlers.
//! - [`sql_handler`]: the configured `[[sql_handlers]]`: business written as SQL statements,
//!   their parameters bound from the message, their row counts held to expectations.
//! - [`delivery_log`]: one row per delivery attempt.
//! - [`reconcile`]: lost, stuck, double-applied, orphan, colliding and late keys in a window; the runs.
//! - [`replay`]: guarded re-publication of dead letters whose keys are not claimed.
//! - [`archive`]: old claims to the archive table and old log rows out, in batches, on a schedule.
//! - [`scratch`]: throwaway databases for benchmarks and tests.
//! - [`shop`]: the built-in example business (orders, payments, stock).
//! - [`broker`]: the RocketMQ client: the push consumer that feeds the gate, and the producer.
//! - [`app`]: the service assembled from its settings, once for `serve`, the demo, embedding
//!   programs and the tests; its parts run as named tasks, watched.
//! - [`cron`]: the cron job the archive and reconcile schedules run on.
//! - [`serve`]: `idemgate serve`: the service fed by the broker, until a signal.
//! - [`produce`]: `idemgate produce`, the example traffic sent to a real topic.
//! - [`inspect`]: reading the story back: a key's trace, the overview, the lists of trouble.
//! - [`http`]: the HTTP server: the web UI, the JSON API, health and `/metrics`.
//! - [`metrics`]: every Prometheus metric, declared once; `/metrics`.
//! - [`traffic`]: the example traffic, and the books of what was sent.
//! - [`demo`]: the one-command demo on embedded defaults.
//! - [`bench`]: the measurements behind the figures in docs/benchmarks.md.
//! - [`cli`]: the command line.
//! - [`config`]: the typed, layered configuration.
//!
//! # Features
//! `tools` (on by default) adds what the `idemgate` binary and the tests need besides the
//! service: the command line ([`cli`]), the benchmarks ([`bench`]) and throwaway databases
//! ([`scratch`]). A program that embeds the service with handlers of its own
//! ([`app::Application::build_with`]) can leave it out: `default-features = false`.

pub mod app;
pub mod archive;
#[cfg(feature = "tools")]
pub mod bench;
pub mod broker;
#[cfg(feature = "tools")]
pub mod cli;
pub mod clock;
pub mod config;
pub mod cron;
pub mod delivery;
pub mod delivery_log;
pub mod demo;
pub mod gate;
pub mod handler;
pub mod http;
pub mod inspect;
mod labelled;
pub mod layout;
pub mod metrics;
pub mod outcome;
pub mod prefilter;
pub mod produce;
pub mod reconcile;
pub mod replay;
pub mod route;
#[cfg(feature = "tools")]
pub mod scratch;
#[cfg(feature = "tools")]
mod serve;
pub mod setting;
pub mod shop;
pub mod sql_handler;
pub mod state_machine;
pub mod store;
pub mod telemetry;
mod throttle;
pub mod traffic;
