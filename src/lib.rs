//! idemgate makes every duplicate RocketMQ delivery harmless and visible.
//!
//! RocketMQ delivers at least once: producer retries, broker redeliveries and crashes between
//! the business commit and the ack all bring a message back. idemgate claims each message's
//! business key in a dedup table with a unique index, inside the same transaction as the
//! business change, and logs every delivery so that duplicates can be counted, traced and
//! reconciled.
//!
//! # The API
//! A program that embeds the service builds it from its [`Settings`] with
//! [`Application::build`], or [`Application::build_with`] to add [`Handlers`] of its own, and
//! feeds it from the broker or itself ([`Feed`]). A handler implements [`Handler`]: it gets the
//! [`Work`] (the [`Delivery`] and its claimed key) and the gate's [`Conn`], inside the claim's
//! transaction, and answers an [`Effect`] or a [`HandlerError`]; under group commit its batch
//! form ([`Handler::handle_batch`]) takes a group's deliveries at once, through [`handle_each`]
//! unless it has a form of its own. Its statements are [`Sql`], run with [`query`] on the
//! connection's [`Backend`]. [`state_machine`] moves a row from one state to another in one
//! conditional update. A [`Gate`] can also be driven without the service, with [`Routes`] built
//! from [`RouteConfig`]s. [`trace()`] reads a key's story back, and [`render_trace`] prints it.
//!
//! Everything else is the crate's own (`pub(crate)`); the integration tests reach what they
//! need through `testing`, built with the `tools` feature and not part of the API.
//!
//! # Layout
//! - `store`: the database pool (SQLite, PostgreSQL, MySQL/MariaDB) and the migrations.
//! - `delivery`: one message as delivered, broker-neutral; where a value comes from in it
//!   (`keys`, `property:NAME`, `json:/pointer`), for routes and configured handlers alike.
//! - `route`: which business key a delivery claims, per topic and tag; the key rules.
//! - `gate`: claim, handler and log row in one transaction; duplicate causes.
//! - `layout`: the claim tables: one, or N shards by a stable hash; the readers' view.
//! - `prefilter`: the optional Redis `SET NX EX` in front of the claim, with fallback.
//! - `handler`: the trait business code implements, and the registry.
//! - `state_machine`: "move a row from state A to B" as one conditional update; duplicates
//!   told from illegal moves; the configured `[[state_machines]]` handlers.
//! - `sql_handler`: the configured `[[sql_handlers]]`: business written as SQL statements,
//!   their parameters bound from the message, their row counts held to expectations.
//! - `delivery_log`: one row per delivery attempt.
//! - `reconcile`: lost, stuck, double-applied, orphan, colliding and late keys in a window; the runs.
//! - `replay`: guarded re-publication of dead letters whose keys are not claimed.
//! - `archive`: old claims to the archive table and old log rows out, in batches, on a schedule.
//! - `scratch`: throwaway databases for benchmarks and tests.
//! - `shop`: the built-in example business (orders, payments, stock).
//! - `broker`: the RocketMQ client: the push consumer that feeds the gate, and the producer.
//! - `app`: the service assembled from its settings, once for `serve`, the demo, embedding
//!   programs and the tests; its parts run as named tasks, watched.
//! - `cron`: the cron job the archive and reconcile schedules run on.
//! - `serve`: `idemgate serve`: the service fed by the broker, until a signal.
//! - `produce`: `idemgate produce`, the example traffic sent to a real topic.
//! - `inspect`: reading the story back: a key's trace, the overview, the lists of trouble.
//! - `http`: the HTTP server: the web UI, the JSON API, health and `/metrics`.
//! - `metrics`: every Prometheus metric, declared once; `/metrics`.
//! - `traffic`: the example traffic, and the books of what was sent.
//! - `demo`: the one-command demo on embedded defaults.
//! - `bench`: the measurements behind the figures in docs/benchmarks.md.
//! - `cli`: the command line.
//! - `config`: the typed, layered configuration.
//!
//! # Features
//! `tools` (on by default) adds what the `idemgate` binary and the tests need besides the
//! service: the command line ([`cli`]), the benchmarks (`bench`), throwaway databases
//! (`scratch`) and the tests' view of the inside (`testing`). A program that embeds the service
//! with handlers of its own ([`Application::build_with`]) can leave it out:
//! `default-features = false`.

// An item is `pub` only if the API or the tests' view (`testing`) names it.
#![cfg_attr(feature = "tools", warn(unreachable_pub))]
// Without the `tools` feature the command line, the benchmarks and the tests' view are not
// built, so what only they use (the demo, `produce`, the local broker, plan reading, the
// by-hand archive run, …) is unused there: not dead, only not in that build.
#![cfg_attr(not(feature = "tools"), allow(dead_code, unused_imports))]

mod app;
mod archive;
#[cfg(feature = "tools")]
mod bench;
mod broker;
#[cfg(feature = "tools")]
pub mod cli;
mod clock;
mod config;
mod cron;
mod delivery;
mod delivery_log;
mod demo;
mod gate;
mod handler;
mod http;
mod inspect;
mod labelled;
mod layout;
mod metrics;
mod outcome;
mod prefilter;
mod produce;
mod reconcile;
mod replay;
mod route;
#[cfg(feature = "tools")]
mod scratch;
#[cfg(feature = "tools")]
mod serve;
mod setting;
pub mod shop;
mod sql_handler;
pub mod state_machine;
mod store;
mod telemetry;
#[cfg(feature = "tools")]
#[doc(hidden)]
pub mod testing;
mod throttle;
mod traffic;

pub use app::{Application, Feed, Running};
pub use config::Settings;
pub use delivery::Delivery;
pub use gate::{Gate, Identity, Policy};
pub use handler::{Answers, Effect, Fact, Handler, HandlerError, Handlers, Work, handle_each};
pub use inspect::trace::{Answer as Trace, SearchBy, TraceQuery, render_text as render_trace, trace};
pub use outcome::{DuplicateCause, Layer, Outcome, Verdict};
pub use route::{RouteConfig, Routes};
pub use setting::Invalid;
pub use store::{Backend, Conn, Sql, Store, StoreOptions, query};
