//! `idemgate-bench <benchmark>`: the subcommands, one per benchmark module, each carrying that
//! module's `Options` as its flags, and the dispatch to the module's `command`.

use super::{
    archive, broker, driver, galera, gate, layers, metrics, reconcile, soak, sql_handler, state_machine,
    trace, ui_flood, volume,
};

/// `idemgate-bench <benchmark>`.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The gate against the naive select-then-insert pattern, stock.deduct at a share of
    /// duplicates, per backend.
    Gate(gate::Options),
    /// End to end from a real RocketMQ broker into PostgreSQL: ack-only ceiling, the naive
    /// pattern and idemgate (with its sized client runtime and with the client's defaults).
    Broker(broker::Options),
    /// Archive throughput on expired claims, the consumers' latency beside a run, and the
    /// late-duplicate guard's cost, per backend.
    Archive(archive::Options),
    /// Trace lookup latency on 1,000,000 claims and 3,000,000 delivery-log rows, against the
    /// naive bizId query on the same data without the trace indexes, per backend.
    Trace(trace::Options),
    /// Each statement of a reconcile run and of the overview on 24 hours of 1,000,000
    /// deliveries the planner has no statistics about, before and after an ANALYZE, against
    /// the same statements written with NOT EXISTS and open time ranges, per backend.
    Reconcile(reconcile::Options),
    /// The defence layers side by side: database only, Redis + database, sharded tables and
    /// the naive Redis pattern, at each share of duplicates, per backend.
    Layers(layers::Options),
    /// State moves per second with the state-machine helper's conditional update against the
    /// naive SELECT, check, UPDATE, for fresh and already-made moves, and two movers racing.
    StateMachine(state_machine::Options),
    /// A wallet credit as a configured [[sql_handlers]] entry against the same logic as a Rust
    /// handler, through the same gate: msg/s and p99, per backend.
    SqlHandler(sql_handler::Options),
    /// The consumer's msg/s and p99 while 200 loops flood the overview API and the collisions
    /// page, for the shipped UI limits, wide limits and the pages on the consumer's own pool.
    UiFlood(ui_flood::Options),
    /// The group path's multi-row statements on PostgreSQL through sqlx's Any driver and the
    /// native driver, one text per group size against padded texts and arrays.
    Driver(driver::Options),
    /// `serve` under a steady stream for minutes with the archive and the reconciler on short
    /// schedules: resident memory, open files and database connections once a minute.
    Soak(soak::Options),
    /// One consumer on one node of a three-node MariaDB Galera cluster, three on one node, and
    /// one on each node: msg/s, p99 and certification retries per node, at each share of
    /// duplicates.
    Galera(galera::Options),
    /// What the metrics cost: one observe call, the gate with and without metrics, one scrape
    /// of 10 biz_types × 5 outcomes × 4 causes.
    Metrics(metrics::Options),
    /// The gate, the trace lookup, a reconcile pass, archiving and the log's retention as
    /// the tables fill to production size (1M, 10M, 50M claims with two log rows each), with
    /// the bytes of every table part, per backend.
    Volume(volume::Options),
}

impl BenchCommand {
    /// Runs the chosen benchmark: checks its flags, prints its setting, measures and prints
    /// its tables.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Gate(options) => gate::command(options).await,
            Self::Broker(options) => broker::command(options).await,
            Self::Archive(options) => archive::command(options).await,
            Self::Trace(options) => trace::command(options).await,
            Self::Reconcile(options) => reconcile::command(options).await,
            Self::Layers(options) => layers::command(options).await,
            Self::StateMachine(options) => state_machine::command(options).await,
            Self::SqlHandler(options) => sql_handler::command(options).await,
            Self::UiFlood(options) => ui_flood::command(options).await,
            Self::Metrics(options) => metrics::command(options).await,
            Self::Driver(options) => driver::command(options).await,
            Self::Soak(options) => soak::command(options).await,
            Self::Galera(options) => galera::command(options).await,
            Self::Volume(options) => volume::command(options).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(args: &[&str]) -> BenchCommand {
        use clap::{FromArgMatches, Subcommand};
        let command = BenchCommand::augment_subcommands(clap::Command::new("bench"));
        let matches = command.try_get_matches_from(std::iter::once("bench").chain(args.iter().copied()));
        BenchCommand::from_arg_matches(&matches.expect("the flags parse")).expect("a benchmark")
    }

    #[test]
    fn the_flags_are_consistent() {
        use clap::Subcommand;
        BenchCommand::augment_subcommands(clap::Command::new("bench")).debug_assert();
    }

    #[test]
    fn the_flags_default_to_the_options_defaults() {
        let BenchCommand::Archive(a) = parse(&["archive"]) else { panic!("archive") };
        let d = archive::Options::default();
        assert_eq!(
            (a.backends, a.rows, a.batch_size, a.pause, a.concurrency, a.messages),
            (d.backends, d.rows, d.batch_size, d.pause, d.concurrency, d.messages)
        );
        let BenchCommand::Trace(t) = parse(&["trace"]) else { panic!("trace") };
        let d = trace::Options::default();
        assert_eq!(
            (
                t.backends,
                t.claims,
                t.lookups,
                t.naive_lookups,
                t.hot_key_rows,
                t.hot_lookups,
                t.old_lookups,
                t.target_p99_ms,
                t.keep_database
            ),
            (
                d.backends,
                d.claims,
                d.lookups,
                d.naive_lookups,
                d.hot_key_rows,
                d.hot_lookups,
                d.old_lookups,
                d.target_p99_ms,
                d.keep_database
            )
        );
        let BenchCommand::Reconcile(r) = parse(&["reconcile"]) else { panic!("reconcile") };
        let d = reconcile::Options::default();
        assert_eq!(
            (r.backends, r.deliveries, r.span_hours, r.statement_timeout),
            (d.backends, d.deliveries, d.span_hours, d.statement_timeout)
        );
    }

    #[test]
    fn durations_are_read_in_the_flags_units() {
        let BenchCommand::Archive(a) = parse(&["archive", "--pause-ms", "7"]) else { panic!("archive") };
        assert_eq!(a.pause, Duration::from_millis(7));
        let BenchCommand::Reconcile(r) = parse(&["reconcile", "--statement-timeout", "3"]) else {
            panic!("reconcile")
        };
        assert_eq!(r.statement_timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_group_commit_is_derived_from_the_flags() {
        let BenchCommand::Gate(g) = parse(&["gate", "--max-batch", "500", "--in-flight", "0"]) else {
            panic!("gate")
        };
        let group = g.group();
        assert_eq!((group.max_batch, group.in_flight), (idemgate::gate::MAX_BATCH, 1));
        assert!(group.enabled, "the group-commit pattern commits in groups");
        let BenchCommand::Broker(b) =
            parse(&["broker", "--group-threads", "3", "--group-listener-batch", "99", "--in-flight", "0"])
        else {
            panic!("broker")
        };
        let group = b.group();
        assert_eq!((b.listener_batch(), group.in_flight, group.queue), (32, 1, 4 * 3 * 32));
        assert!(group.enabled);
    }

    #[test]
    fn the_broker_bench_needs_a_server() {
        let BenchCommand::Broker(b) = parse(&["broker", "--backend", "sqlite"]) else { panic!("broker") };
        assert_eq!(b.backend().unwrap_err().to_string(), "bench broker: --backend is postgres or mysql");
        let BenchCommand::Broker(b) = parse(&["broker", "--backend", "mariadb"]) else { panic!("broker") };
        assert_eq!(b.backend().unwrap(), idemgate::store::Backend::MySql);
    }

    #[test]
    fn the_broker_bench_names_its_broker() {
        use idemgate::broker::BrokerKind;
        let BenchCommand::Broker(b) = parse(&["broker"]) else { panic!("broker") };
        assert_eq!(b.kind().unwrap(), BrokerKind::RocketMq);
        for (name, kind) in [("rabbitmq", BrokerKind::RabbitMq), ("kafka", BrokerKind::Kafka)] {
            let BenchCommand::Broker(b) = parse(&["broker", "--kind", name]) else { panic!("broker") };
            assert_eq!(b.kind().unwrap(), kind);
        }
        let BenchCommand::Broker(b) = parse(&["broker", "--kind", "nats"]) else { panic!("broker") };
        assert!(b.kind().unwrap_err().to_string().contains("--kind is rocketmq, rabbitmq or kafka"));
    }
}
