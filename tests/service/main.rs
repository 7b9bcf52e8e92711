//! The service library's integration tests, one binary: each module drives the service through
//! its public API on real SQLite, PostgreSQL and MariaDB (and Redis, and `promtool` for the
//! dashboards), each test on a scratch database of its own.
//!
//! - `conformance`: the gate's guarantees, case by case, on every backend and claim path;
//! - `archive`, `reconcile`, `layers`: the jobs and the defence layers;
//! - `web`: the pages and the JSON API;
//! - `app`: the assembled service as `serve` and the demo run it, and the settings table;
//! - `dashboards`: the Grafana dashboards and the alert rules;
//! - `ambiguous`: lost connections at chosen points (ambiguous commits, statements cut in half,
//!   delayed answers) through the test kit's fault proxy, each run held to the history checker.
//!
//! The command line and the broker are tested in `idemgate-cli`'s own tests.

// First: its `support` macros are in scope in every module declared after it.
#[macro_use]
mod conformance;
mod ambiguous;
mod app;
mod archive;
mod dashboards;
mod layers;
mod reconcile;
mod web;
