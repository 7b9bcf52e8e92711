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
//! The modules below are public where the example shop (`idemgate-shop`), the test kit
//! (`idemgate-testkit`), the benchmarks (`idemgate-bench`) and the command line
//! (`idemgate-cli`) build on them: the stores and their statements, the gate's parts, the jobs
//! run by hand, the readers of the story, the broker client. What no other crate needs is the
//! crate's own (`pub(crate)`).
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
//! - `broker`: the RocketMQ client: the push consumer that feeds the gate, and the producer.
//! - `app`: the service assembled from its settings, once for `serve`, the demo, embedding
//!   programs and the tests; its parts run as named tasks, watched.
//! - `cron`: the cron job the archive and reconcile schedules run on.
//! - `inspect`: reading the story back: a key's trace, the overview, the lists of trouble.
//! - `http`: the HTTP server: the web UI, the JSON API, health and `/metrics`.
//! - `metrics`: every Prometheus metric, declared once; `/metrics`.
//! - `config`: the typed, layered configuration.
//! - `telemetry`: the process's one `tracing` subscriber.
//! - `setting`: `Invalid`, a setting refused with its key named.

// The RocketMQ client's futures are deep: proving one Send behind the broker seam's boxed
// futures takes more than the default 128 steps.
#![recursion_limit = "256"]
// An item is `pub` only if the API names it.
#![warn(unreachable_pub)]

pub mod app;
pub mod archive;
pub mod broker;
pub mod clock;
pub mod config;
pub mod cron;
pub mod delivery;
pub mod delivery_log;
pub mod gate;
pub mod handler;
pub mod http;
pub mod inspect;
pub mod instances;
mod labelled;
pub mod layout;
pub mod metrics;
pub mod outcome;
pub mod prefilter;
pub mod reconcile;
pub mod replay;
pub mod route;
pub mod setting;
pub mod sql_handler;
pub mod state_machine;
pub mod store;
pub mod telemetry;
mod throttle;
mod version;

pub use app::{Application, Feed, Running};
pub use config::Settings;
pub use delivery::Delivery;
pub use gate::{Gate, Identity, Policy};
pub use handler::{Answers, Effect, Fact, Handler, HandlerError, Handlers, Work, handle_each};
pub use inspect::trace::{Answer as Trace, SearchBy, TraceQuery, render_text as render_trace, trace};
pub use outcome::{DuplicateCause, Layer, Outcome, Verdict};
pub use reconcile::{AnomalyKind, Check, CheckSql};
pub use route::{RouteConfig, Routes};
pub use setting::Invalid;
pub use store::{Backend, Conn, Sql, Store, StoreOptions, query};
pub use version::VERSION;
