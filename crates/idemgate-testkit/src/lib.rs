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
//! - [`kafka`]: a private Kafka-compatible broker, [`LocalKafka`](kafka::LocalKafka) (tansu, in
//!   memory), and a reader of a topic from its start.
//! - [`rabbitmq`]: the machine's RabbitMQ: its URL, what a dead-letter queue holds, and the
//!   removal of a test's queues and exchanges.
//! - [`plan`]: what the database will do with a statement, read through `EXPLAIN`.
//! - [`fault_proxy`]: a TCP proxy in front of PostgreSQL or MariaDB that makes a COMMIT
//!   ambiguous (forwarded, its answer dropped, the connection cut), cuts a statement in half, or
//!   delays answers, and records every fault with its time.
//! - [`network`]: hosts in network namespaces joined by veth pairs, and partitions between them
//!   made of nftables rules, each recorded with its time.
//! - [`history`]: a history checker: the producer's manifest, the attempts, the business
//!   effects, the claims and the log, held to the gate's promises, with a summary of counts.
//! - [`http`]: the tests' one HTTP/1.1 client, on a bare socket.
//!
//! This crate depends on the service's public API only; the service never depends on it.

pub mod app;
pub mod broker;
pub mod fault_proxy;
pub mod galera;
pub mod history;
pub mod http;
pub mod kafka;
pub mod kafka_hog;
pub mod network;
pub mod plan;
pub mod rabbitmq;
pub mod scratch;
