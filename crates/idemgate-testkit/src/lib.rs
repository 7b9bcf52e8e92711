//! What idemgate's tests and benchmarks run against, and nothing a deployment runs:
//!
//! - [`app`]: the assembled service in a test, [`TestApp`](app::TestApp), on a scratch database
//!   and a free port, fed by the test.
//! - [`scratch`]: throwaway databases on SQLite, PostgreSQL and MySQL/MariaDB, each with the
//!   service's tables and, where asked, the example shop's; dropped when done.
//! - [`galera`]: a private three-node MariaDB Galera cluster with HAProxy in front.
//! - [`broker`]: private RocketMQ servers: [`LocalBroker`](broker::LocalBroker), one name
//!   server and one broker, and [`LocalCluster`](broker::LocalCluster), two masters; every
//!   server and store has a watchdog that stops or removes it once the process that started it
//!   is gone.
//! - [`plan`]: what the database will do with a statement, read through `EXPLAIN`.
//! - [`http`]: the tests' one HTTP/1.1 client, on a bare socket.
//!
//! This crate depends on the service's public API only; the service never depends on it.

pub mod app;
pub mod broker;
pub mod galera;
pub mod http;
pub mod plan;
pub mod scratch;
