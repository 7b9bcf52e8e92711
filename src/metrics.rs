//! Every Prometheus metric idemgate exports, declared once with its help text.
//!
//! The gate reports each [`Disposition`] here; the 1m/5m sliding windows of the duplicate ratio
//! and the conflict rate are kept in process for users without recording rules; table sizes are
//! read from the database at scrape time, cheaply (catalogue estimates on the servers) and at
//! most every few seconds. Labels stay bounded: biz_type, topic, consumer group, outcome,
//! cause, layer, window, the reason a traceparent was refused; never a bizId, a msgId, a trace
//! id or an error text. Beside them, the standard
//! `process_*` series of the process itself (CPU seconds, resident memory, open file
//! descriptors, threads, start time), on Linux.
//!
//! This module owns names, labels and buckets. It must not decide anything about deliveries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use sqlx::Row;

use crate::archive::RunStatus;
use crate::broker::lag::{LagReading, ReadResult};
use crate::clock::now_ms;
use crate::delivery::{BrokerKind, Delivery, TraceparentFault};
use crate::gate::{CommitScope, Disposition, GroupEnd, GroupReport, Observer, ReadBack};
use crate::labelled::labelled;
use crate::outcome::{DuplicateCause, Layer, Outcome, RedeliveryCause};
use crate::prefilter::{FallbackCause, Settled, Step};
use crate::reconcile::AnomalyKind;
use crate::store::{Backend, Retries, Sql, Store, TransientCause};
use crate::version::VERSION;

/// Latency buckets in seconds: half a millisecond to thirty seconds.
const BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Group sizes: 1 to the largest group allowed.
const GROUP_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// The label values of a metric without labels.
const NO_LABELS: &[&str] = &[];

/// How long table sizes read at scrape time are reused.
const TABLE_SIZE_TTL: Duration = Duration::from_secs(15);

/// The registry and every metric in it.
pub struct Metrics {
    registry: Registry,
    group: String,
    /// This process's instance id, and when it started (Unix ms): the archive counters count
    /// the passes this process ended.
    instance_id: String,
    started_ms: i64,
    deliveries: IntCounterVec,
    conflicts: IntCounterVec,
    redelivery_duplicates: IntCounterVec,
    redeliveries: IntCounterVec,
    key_collisions: IntCounterVec,
    illegal_transitions: IntCounterVec,
    unlogged: IntCounterVec,
    invalid_traceparents: IntCounterVec,
    handler_seconds: HistogramVec,
    delivery_seconds: HistogramVec,
    end_to_end_seconds: HistogramVec,
    duplicate_ratio: GaugeVec,
    conflicts_per_second: GaugeVec,
    dedup_rows: IntGaugeVec,
    archive_runs: IntCounterVec,
    archive_rows_moved: IntCounterVec,
    archive_last_success: GaugeVec,
    archive_last_duration: GaugeVec,
    log_partitions_ahead: GaugeVec,
    log_overflow_rows: IntGaugeVec,
    reconcile_anomalies: IntGaugeVec,
    reconcile_last_run: GaugeVec,
    prefilter: IntCounterVec,
    prefilter_fallbacks: IntCounterVec,
    prefilter_settled: IntCounterVec,
    group_size: HistogramVec,
    group_commits: IntCounterVec,
    group_retries: IntCounterVec,
    transient_retries: IntCounterVec,
    ambiguous_commits: IntCounterVec,
    group_wait_seconds: HistogramVec,
    group_queue_full: IntCounterVec,
    group_deferred: IntCounterVec,
    group_fallbacks: IntCounterVec,
    http_shed: IntCounterVec,
    http_timeouts: IntCounterVec,
    http_connection_limit: IntCounterVec,
    http_open_connections: IntGaugeVec,
    lag_messages: IntGaugeVec,
    consumer_stalled: IntGaugeVec,
    lag_seconds: GaugeVec,
    lag_reads: IntCounterVec,
    buffered: IntGaugeVec,
    /// The topics the buffered gauge was last set for.
    buffered_topics: Mutex<BTreeSet<String>>,
    /// The latest consumer-lag reading, and the queues its gauges were set for.
    lag: Mutex<Option<(LagReading, BTreeSet<[String; 3]>)>>,
    windows: Mutex<BTreeMap<String, Window>>,
    from_database: tokio::sync::Mutex<Option<(Instant, FromDatabase)>>,
}

/// What a scrape reads from the database.
#[derive(Debug, Clone, Default)]
struct FromDatabase {
    rows: [i64; 2],
    /// The dedup archive passes this process ended, by status.
    runs: BTreeMap<String, u64>,
    /// The claims this process's dedup archive passes moved.
    rows_moved: u64,
    /// The last successful and the last finished dedup pass of any instance.
    last_success_s: Option<f64>,
    last_duration_s: Option<f64>,
    /// The group's latest successful reconcile run: when it finished (Unix seconds) and its
    /// anomalies by kind.
    reconcile: Option<(f64, BTreeMap<AnomalyKind, i64>)>,
    /// A partitioned delivery log's partitions: how far ahead they reach, what the overflow holds.
    partitions: Option<crate::delivery_log::partitions::Health>,
}

labelled! {
    /// Where the HTTP server's timeouts cut a client short.
    HttpTimeout {
        /// No whole request head within `http.header_read_timeout_ms`.
        Header => "header",
        /// No answer (the body still arriving) within `http.request_timeout_ms`.
        Request => "request",
    }
}

/// One open client connection in `idemgate_http_open_connections`, until dropped.
pub(crate) struct OpenConnection(prometheus::IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What a scrape needs to know about the process.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub backend: Backend,
    /// The broker the service consumes: every metric carries it as its `broker` label.
    pub broker: BrokerKind,
    pub consumer_group: String,
    /// This process's instance id, as in its logs and log rows.
    pub instance_id: String,
    /// The web UI's base URL, for links from alerts.
    pub ui_url: String,
}

/// Declares a counter with `labels` in `registry`.
fn counter(registry: &Registry, name: &str, labels: &[&str], help: &str) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// Declares a gauge with `labels` in `registry`.
fn gauge(registry: &Registry, name: &str, labels: &[&str], help: &str) -> GaugeVec {
    register(registry, GaugeVec::new(Opts::new(name, help), labels))
}

/// Declares an integer gauge with `labels` in `registry`.
fn int_gauge(registry: &Registry, name: &str, labels: &[&str], help: &str) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// Declares a histogram with `labels` and `buckets` in `registry`.
fn histogram(registry: &Registry, name: &str, labels: &[&str], buckets: &[f64], help: &str) -> HistogramVec {
    register(registry, HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels))
}

/// Registers a metric just declared, and hands it back.
fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("a valid metric definition");
    registry.register(Box::new(metric.clone())).expect("each metric registered once");
    metric
}

impl Metrics {
    /// Declares every metric and starts the known label values at 0: the `biz_types` and
    /// `topics` come from the routes.
    pub fn new(info: &BuildInfo, biz_types: &BTreeSet<String>, topics: &BTreeSet<String>) -> Self {
        // Every series says which kind of broker fed it, so that the dashboards and alerts of
        // services on different brokers tell them apart.
        let registry = Registry::new_custom(
            None,
            Some(std::collections::HashMap::from([("broker".to_owned(), info.broker.as_str().to_owned())])),
        )
        .expect("a valid constant label");
        // Each metric: its name and labels (and buckets), then its help text.
        let r = &registry;
        #[rustfmt::skip]
        let m = Self {
            // What became of each delivery, and the duplicates among them.
            deliveries: counter(r, "idemgate_deliveries_total", &["biz_type", "topic", "consumer_group", "outcome"],
                "Deliveries by outcome (processed, duplicate, failed, dead_lettered, invalid)."),
            conflicts: counter(r, "idemgate_conflicts_total", &["biz_type", "consumer_group", "layer", "cause"],
                "Duplicates stopped, by the defence layer that stopped them and their cause (redelivery, producer_retry, producer_resend, replay, ambiguous_commit, unknown)."),
            redelivery_duplicates: counter(r, "idemgate_redelivery_duplicates_total", &["biz_type", "consumer_group", "sub_cause"],
                "Duplicates of cause redelivery (the same stored copy delivered again), by what the broker did, read from the consumer record a few seconds after the duplicate: ack_lost, rebalance, crash, consume_timeout, unattributed."),
            redeliveries: counter(r, "idemgate_redeliveries_total", &["biz_type", "topic", "consumer_group"],
                "Deliveries with a broker reconsume count above 0 (retries)."),
            key_collisions: counter(r, "idemgate_key_collisions_total", &["biz_type", "consumer_group"],
                "Duplicates whose body differs from the claim's: one business key, two payloads."),
            illegal_transitions: counter(r, "idemgate_illegal_transitions_total", &["biz_type", "consumer_group"],
                "State-machine moves refused because the row was in a state the move cannot start from (dead-lettered); a move found already made is a conflict at layer state_machine instead."),
            unlogged: counter(r, "idemgate_unlogged_deliveries_total", &["consumer_group"],
                "Deliveries whose delivery-log row could not be written (each was not acknowledged)."),
            invalid_traceparents: counter(r, "idemgate_invalid_traceparents_total", &["consumer_group", "reason"],
                "Deliveries whose message carried a traceparent property that is not a valid W3C trace context, by why; each was processed as one without a trace id."),
            // Where a delivery's time went.
            handler_seconds: histogram(r, "idemgate_handler_duration_seconds", &["biz_type", "consumer_group"], BUCKETS,
                "Time in the business handler."),
            delivery_seconds: histogram(r, "idemgate_delivery_duration_seconds", &["biz_type", "outcome", "consumer_group"], BUCKETS,
                "Time in the gate per delivery: claim, handler, log and commit."),
            end_to_end_seconds: histogram(r, "idemgate_end_to_end_seconds", &["biz_type", "consumer_group"], BUCKETS,
                "From the message's birth at the producer to its outcome."),
            // Sliding windows of duplicates, in this process (filled at scrape time).
            duplicate_ratio: gauge(r, "idemgate_duplicate_ratio", &["biz_type", "consumer_group", "window"],
                "Duplicates / deliveries over a sliding window (1m, 5m), in this process."),
            conflicts_per_second: gauge(r, "idemgate_conflicts_per_second", &["biz_type", "consumer_group", "window"],
                "Duplicates stopped per second over a sliding window (1m, 5m), in this process."),
            // Read at scrape time from the database: tables, archive passes, log partitions, reconcile runs.
            dedup_rows: int_gauge(r, "idemgate_dedup_rows", &["table"],
                "Rows in the dedup table (live) and its archive; estimates on PostgreSQL and MariaDB."),
            archive_runs: counter(r, "idemgate_archive_runs_total", &["consumer_group", "status"],
                "Archive passes over the dedup table that this process ended since it started, by status (success, failed, skipped), from archive_run: a pass is counted by the one instance that ran it, or, left running by a process that died, by the instance that marked it failed; sum over instances."),
            archive_rows_moved: counter(r, "idemgate_archive_rows_moved_total", &["consumer_group"],
                "Claims moved to the archive table by this process's archive passes since it started, from archive_run; sum over instances."),
            archive_last_success: gauge(r, "idemgate_archive_last_success_timestamp_seconds", &["consumer_group"],
                "When the last successful archive pass over the dedup table finished, whichever instance ran it (Unix time), from archive_run: every instance on the database reports the same; take the max."),
            log_partitions_ahead: gauge(r, "idemgate_delivery_log_partitions_ahead_seconds", &["consumer_group"],
                "A partitioned delivery log: from now to the end of its newest day partition (the archive job makes them 3 days ahead; below a day, it has not run). Absent on a plain log."),
            log_overflow_rows: int_gauge(r, "idemgate_delivery_log_overflow_rows", &["consumer_group"],
                "A partitioned delivery log: rows in its overflow partition, which takes rows no day partition takes (counted up to 100000). Above zero, the partitions fell behind or a clock is off. Absent on a plain log."),
            archive_last_duration: gauge(r, "idemgate_archive_last_run_duration_seconds", &["consumer_group"],
                "How long the last finished archive pass over the dedup table took, whichever instance ran it, from archive_run."),
            reconcile_anomalies: int_gauge(r, "idemgate_reconcile_anomalies", &["consumer_group", "kind"],
                "Anomalies the latest successful reconcile run of the group found, by kind (lost, stuck, double_applied, orphan, key_collision, late_duplicate), from reconcile_run."),
            reconcile_last_run: gauge(r, "idemgate_reconcile_last_run_timestamp_seconds", &["consumer_group"],
                "When the latest successful reconcile run of the group finished (Unix time)."),
            // The Redis pre-filter.
            prefilter: counter(r, "idemgate_prefilter_total", &["biz_type", "consumer_group", "step"],
                "Deliveries through the Redis pre-filter, by what it said (claimed, duplicate, in_flight, fallback)."),
            prefilter_fallbacks: counter(r, "idemgate_prefilter_fallbacks_total", &["consumer_group", "cause"],
                "Deliveries the database alone decided because Redis failed, was too slow, or was skipped after a failure (timeout, error, circuit_open)."),
            prefilter_settled: counter(r, "idemgate_prefilter_settled_total", &["consumer_group", "result"],
                "Redis keys owned by a delivery, by their end (done, released after a rollback, not_owner: left to the delivery that holds it now, failed)."),
            // Group commit and the gate's transactions.
            group_size: histogram(r, "idemgate_group_size", &["consumer_group"], GROUP_SIZE_BUCKETS,
                "Deliveries per group-commit transaction (group commit on)."),
            group_commits: counter(r, "idemgate_group_commits_total", &["consumer_group", "result"],
                "Groups of deliveries by how they ended: committed in one transaction, or split (each delivery alone) after the group could not commit."),
            group_retries: counter(r, "idemgate_group_retries_total", &["consumer_group"],
                "Whole-group transactions started again after a transient conflict (deadlock, busy file, lost connection)."),
            transient_retries: counter(r, "idemgate_transient_retries_total", &["consumer_group", "cause"],
                "Gate transactions (one delivery's, or a whole group's) started again after a transient conflict, by cause: deadlock, certification (on a Galera node: another node's write won), serialization, lock_wait, busy, connection."),
            group_wait_seconds: histogram(r, "idemgate_group_queue_wait_seconds", &["consumer_group"], BUCKETS,
                "Time a delivery waited in the group-commit queue before its group started: grows when the database is the bottleneck."),
            ambiguous_commits: counter(r, "idemgate_ambiguous_commits_total", &["consumer_group", "scope", "read_back"],
                "COMMITs whose answer was lost with their connection (the database may have committed or not) and whose outcome was read back on a fresh connection: a group's always (its log rows), one delivery's when its retries ran out (its claim; with retries left its next attempt settles it instead, counted in idemgate_conflicts_total with cause ambiguous_commit). By scope (delivery, group) and by what the read-back said: committed (answered as applied), not_committed (retried as after any failure), unread (the database out of reach in time: a later attempt settles it)."),
            group_fallbacks: counter(r, "idemgate_group_fallbacks_total", &["consumer_group", "handler"],
                "Groups whose handler batch form failed (group_commit.batch): the group went back to just after its claims and ran again one delivery at a time, each in a savepoint of its own. By the handler whose batch failed."),
            group_queue_full: counter(r, "idemgate_group_queue_full_total", &["consumer_group"],
                "Deliveries that found the group-commit queue (group_commit.queue) full and waited for room before queueing: the database is not keeping up."),
            group_deferred: counter(r, "idemgate_group_deferrals_total", &["consumer_group"],
                "Times a delivery was set aside while a group formed because a group in flight in this instance claims its key: it joins the first group formed after that one commits, instead of waiting inside the database for the uncommitted claim. High under close duplicates; not an error."),
            // The HTTP server.
            http_shed: counter(r, "idemgate_http_requests_shed_total", &[],
                "Pages and API calls answered 503 at once because http.max_concurrent_requests were already in flight."),
            http_timeouts: counter(r, "idemgate_http_timeouts_total", &["phase"],
                "Client connections cut short by the HTTP server's timeouts, by phase: header (closed because no whole request head arrived within http.header_read_timeout_ms: a half-sent request, or a kept-alive connection left idle), request (answered 408 and closed because the request, its body most often, was not through within http.request_timeout_ms)."),
            http_connection_limit: counter(r, "idemgate_http_connection_limit_reached_total", &[],
                "Times the HTTP server stopped accepting connections because http.max_client_connections were open; new connections waited in the listen queue until one closed."),
            http_open_connections: int_gauge(r, "idemgate_http_open_connections", &[],
                "Client connections the HTTP server has open (at most http.max_client_connections)."),
            // The broker consumer: lag, stalls, buffered messages.
            lag_messages: int_gauge(r, "idemgate_consumer_lag_messages", &["consumer_group", "topic", "broker_name", "queue"],
                "Messages stored in a queue and not yet consumed by the group, read every broker.lag_interval_seconds: RocketMQ, a queue's max offset minus the group's committed offset (broker_name: the broker holding the queue); Kafka, a partition's high watermark minus the committed offset (queue: the partition, broker_name: partition); RabbitMQ, the ready messages of the group's queue (queue 0) and of its delay queue (queue 1), broker_name the queue's name."),
            consumer_stalled: int_gauge(r, "idemgate_consumer_stalled", &["consumer_group"],
                "1 while the consumer has answered no delivery for broker.stall_seconds and the lag readings find messages waiting (/readyz answers 503 meanwhile), else 0."),
            lag_seconds: gauge(r, "idemgate_consumer_lag_seconds", &["consumer_group", "topic"],
                "Age of the oldest message of the topic not yet consumed by the group (0 when nothing lags), from its store time at the broker."),
            lag_reads: counter(r, "idemgate_consumer_lag_reads_total", &["consumer_group", "topic", "result"],
                "Consumer-lag readings of a topic by result: complete, partial (a broker or an oldest message unread), failed (no figure)."),
            buffered: int_gauge(r, "idemgate_consumer_buffered_messages", &["consumer_group", "topic"],
                "Messages this instance's broker client has pulled and not yet consumed (those in the gate included), per topic, read every second. The client stops pulling a queue past its share of rocketmq.buffered_messages, so this stays near that bound while the database is slow, and near 0 when the consumer keeps up."),
            // Not metrics: what the gauges were last set for, the windows, the cache, this process.
            buffered_topics: Mutex::new(BTreeSet::new()),
            lag: Mutex::new(None),
            windows: Mutex::new(BTreeMap::new()),
            from_database: tokio::sync::Mutex::new(None),
            group: info.consumer_group.clone(),
            instance_id: info.instance_id.clone(),
            started_ms: now_ms(),
            registry: registry.clone(),
        };
        int_gauge(
            &registry,
            "idemgate_build_info",
            &["version", "backend", "ui_url", "consumer_group", "instance_id"],
            "Always 1; labels name the version, the database backend, the web UI's base URL and this process's instance id.",
        )
        .with_label_values(&[
            VERSION,
            info.backend.name(),
            &info.ui_url,
            &info.consumer_group,
            &info.instance_id,
        ])
        .set(1);
        // The process's own CPU, memory, file descriptors, threads and start time, as every
        // Prometheus client exports them (`process_*`). Read from /proc at scrape time, so
        // Linux only.
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("the process collector registered once");
        m.start_at_zero(biz_types, topics);
        m
    }

    /// Starts `idemgate_group_fallbacks_total` at 0 for each of `handlers`, when groups run
    /// their batch forms: a panel or an alert on it then has a series before the first fallback.
    pub(crate) fn start_group_fallbacks_at_zero<'a>(&self, handlers: impl Iterator<Item = &'a str>) {
        for handler in handlers {
            self.group_fallbacks.with_label_values(&[self.group.as_str(), handler]);
        }
    }

    fn start_at_zero(&self, biz_types: &BTreeSet<String>, topics: &BTreeSet<String>) {
        let g = self.group.as_str();
        for biz_type in biz_types {
            for topic in topics {
                for outcome in Outcome::ALL {
                    self.deliveries.with_label_values(&[biz_type, topic, g, outcome.as_str()]);
                }
                self.redeliveries.with_label_values(&[biz_type, topic, g]);
            }
            for layer in Layer::ALL {
                for cause in DuplicateCause::ALL {
                    self.conflicts.with_label_values(&[biz_type, g, layer.as_str(), cause.as_str()]);
                }
            }
            for sub_cause in RedeliveryCause::ALL {
                self.redelivery_duplicates.with_label_values(&[biz_type, g, sub_cause.as_str()]);
            }
            self.key_collisions.with_label_values(&[biz_type, g]);
            for step in Step::ALL {
                self.prefilter.with_label_values(&[biz_type, g, step.as_str()]);
            }
            self.illegal_transitions.with_label_values(&[biz_type, g]);
            for window in ["1m", "5m"] {
                self.duplicate_ratio.with_label_values(&[biz_type, g, window]);
                self.conflicts_per_second.with_label_values(&[biz_type, g, window]);
            }
        }
        for topic in topics {
            // Deliveries that matched no route have no biz_type.
            self.deliveries.with_label_values(&["", topic, g, Outcome::Invalid.as_str()]);
            for result in ReadResult::ALL {
                self.lag_reads.with_label_values(&[g, topic, result.as_str()]);
            }
        }
        self.unlogged.with_label_values(&[g]);
        for fault in TraceparentFault::ALL {
            self.invalid_traceparents.with_label_values(&[g, fault.as_str()]);
        }
        for cause in FallbackCause::ALL {
            self.prefilter_fallbacks.with_label_values(&[g, cause.as_str()]);
        }
        for settled in Settled::ALL {
            self.prefilter_settled.with_label_values(&[g, settled.as_str()]);
        }
        for table in ["live", "archive"] {
            self.dedup_rows.with_label_values(&[table]);
        }
        for status in ENDED_PASSES {
            self.archive_runs.with_label_values(&[g, status.as_str()]);
        }
        self.archive_rows_moved.with_label_values(&[g]);
        for end in GroupEnd::ALL {
            self.group_commits.with_label_values(&[g, end.as_str()]);
        }
        self.group_retries.with_label_values(&[g]);
        for cause in TransientCause::ALL {
            self.transient_retries.with_label_values(&[g, cause.as_str()]);
        }
        for scope in CommitScope::ALL {
            for read_back in ReadBack::ALL {
                self.ambiguous_commits.with_label_values(&[g, scope.as_str(), read_back.as_str()]);
            }
        }
        self.group_size.with_label_values(&[g]);
        self.group_wait_seconds.with_label_values(&[g]);
        self.http_shed.with_label_values(NO_LABELS);
        for phase in HttpTimeout::ALL {
            self.http_timeouts.with_label_values(&[phase.as_str()]);
        }
        self.http_connection_limit.with_label_values(NO_LABELS);
        self.http_open_connections.with_label_values(NO_LABELS);
        self.group_queue_full.with_label_values(&[g]);
        self.group_deferred.with_label_values(&[g]);
        for kind in AnomalyKind::ALL {
            self.reconcile_anomalies.with_label_values(&[g, kind.as_str()]);
        }
    }

    /// Counts a page or API call turned away because too many were in flight.
    pub(crate) fn observe_http_shed(&self) {
        self.http_shed.with_label_values(NO_LABELS).inc();
    }

    /// Counts a connection or a request the HTTP server cut short.
    pub(crate) fn observe_http_timeout(&self, phase: HttpTimeout) {
        self.http_timeouts.with_label_values(&[phase.as_str()]).inc();
    }

    /// Counts a time the HTTP server reached `http.max_client_connections`.
    pub(crate) fn observe_http_connection_limit(&self) {
        self.http_connection_limit.with_label_values(NO_LABELS).inc();
    }

    /// Counts a client connection open until the guard is dropped.
    pub(crate) fn open_http_connection(&self) -> OpenConnection {
        let gauge = self.http_open_connections.with_label_values(NO_LABELS);
        gauge.inc();
        OpenConnection(gauge)
    }

    /// Sets the lag gauges from a reading: a queue no longer read loses its series, a topic whose
    /// oldest message could not be dated loses its age.
    /// Whether the consumer is stalled: answering nothing while messages wait.
    pub(crate) fn observe_consumer_stalled(&self, stalled: bool) {
        self.consumer_stalled.with_label_values(&[self.group.as_str()]).set(i64::from(stalled));
    }

    pub(crate) fn observe_consumer_lag(&self, reading: &LagReading) {
        let g = self.group.as_str();
        let mut latest = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        let mut queues = BTreeSet::new();
        for t in &reading.topics {
            self.lag_reads.with_label_values(&[g, &t.topic, t.result.as_str()]).inc();
            for q in &t.queues {
                let queue = q.queue.to_string();
                self.lag_messages.with_label_values(&[g, &t.topic, &q.source, &queue]).set(q.messages());
                queues.insert([t.topic.clone(), q.source.clone(), queue]);
            }
            match t.age_seconds(reading.read_at_ms) {
                Some(age) => self.lag_seconds.with_label_values(&[g, &t.topic]).set(age),
                None => {
                    let _ = self.lag_seconds.remove_label_values(&[g, &t.topic]);
                }
            }
        }
        if let Some((_, before)) = latest.as_ref() {
            for [topic, broker, queue] in before.difference(&queues) {
                let _ = self.lag_messages.remove_label_values(&[g, topic, broker, queue]);
            }
        }
        *latest = Some((reading.clone(), queues));
    }

    /// Sets the buffered-messages gauge of every topic the client holds queues of.
    /// A topic the client no longer holds any queue of (after a rebalance) goes to 0.
    pub(crate) fn observe_buffered_messages(&self, by_topic: &BTreeMap<String, u64>) {
        let g = self.group.as_str();
        let mut before = self.buffered_topics.lock().unwrap_or_else(|p| p.into_inner());
        for gone in before.iter().filter(|t| !by_topic.contains_key(*t)) {
            self.buffered.with_label_values(&[g, gone]).set(0);
        }
        for (topic, held) in by_topic {
            self.buffered.with_label_values(&[g, topic]).set(i64::try_from(*held).unwrap_or(i64::MAX));
            before.insert(topic.clone());
        }
    }

    /// The latest consumer-lag reading of this process, if it reads lag.
    pub fn consumer_lag(&self) -> Option<LagReading> {
        self.lag.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(r, _)| r.clone())
    }

    /// The text exposition, with the scrape-time values filled in first.
    pub async fn render(&self, store: Option<&Store>) -> String {
        self.fill_windows(now_ms() / 1000);
        if let Some(store) = store {
            self.fill_table_sizes(store).await;
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "could not encode the metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn fill_windows(&self, second: i64) {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (biz_type, w) in windows.iter() {
            for (label, span) in [("1m", 60), ("5m", 300)] {
                let (deliveries, conflicts) = w.sum(second, span);
                let ratio = if deliveries == 0 { 0.0 } else { conflicts as f64 / deliveries as f64 };
                self.duplicate_ratio.with_label_values(&[biz_type, &self.group, label]).set(ratio);
                self.conflicts_per_second
                    .with_label_values(&[biz_type, &self.group, label])
                    .set(conflicts as f64 / span as f64);
            }
        }
    }

    async fn fill_table_sizes(&self, store: &Store) {
        let mut cached = self.from_database.lock().await;
        let read = match &*cached {
            Some((at, read)) if at.elapsed() < TABLE_SIZE_TTL => read.clone(),
            _ => match read_database(store, &self.group, &self.instance_id, self.started_ms).await {
                Ok(read) => {
                    *cached = Some((Instant::now(), read.clone()));
                    read
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read table sizes, archive and reconcile runs for /metrics");
                    return;
                }
            },
        };
        self.dedup_rows.with_label_values(&["live"]).set(read.rows[0]);
        self.dedup_rows.with_label_values(&["archive"]).set(read.rows[1]);
        // Counters mirror this process's rows of archive_run: raise each to the rows' total.
        let g = self.group.as_str();
        for (status, passes) in &read.runs {
            let c = self.archive_runs.with_label_values(&[g, status]);
            c.inc_by(passes.saturating_sub(c.get()));
        }
        let c = self.archive_rows_moved.with_label_values(&[g]);
        c.inc_by(read.rows_moved.saturating_sub(c.get()));
        if let Some(at) = read.last_success_s {
            self.archive_last_success.with_label_values(&[g]).set(at);
        }
        if let Some(d) = read.last_duration_s {
            self.archive_last_duration.with_label_values(&[g]).set(d);
        }
        if let Some(p) = read.partitions {
            self.log_partitions_ahead.with_label_values(&[g]).set(p.ahead_ms as f64 / 1e3);
            self.log_overflow_rows.with_label_values(&[g]).set(p.overflow_rows);
        }
        if let Some((finished_s, counts)) = &read.reconcile {
            self.reconcile_last_run.with_label_values(&[&self.group]).set(*finished_s);
            for (kind, n) in counts {
                self.reconcile_anomalies.with_label_values(&[&self.group, kind.as_str()]).set(*n);
            }
        }
    }
}

/// The gate reports every delivery and group here.
impl Metrics {
    /// Counts a redelivery of `biz_type` whose sub-cause the consumer record told.
    pub fn observe_redelivery(&self, biz_type: &str, sub_cause: RedeliveryCause) {
        self.redelivery_duplicates
            .with_label_values(&[biz_type, self.group.as_str(), sub_cause.as_str()])
            .inc();
    }
}

impl Observer for Metrics {
    /// Records one delivery's fate.
    fn delivery(&self, d: &Delivery, r: &Disposition) {
        let g = self.group.as_str();
        let biz_type = r.key.as_ref().map(|k| k.biz_type.as_str()).unwrap_or("");
        self.deliveries.with_label_values(&[biz_type, &d.topic, g, r.outcome.as_str()]).inc();
        if d.reconsume_times > 0 {
            self.redeliveries.with_label_values(&[biz_type, &d.topic, g]).inc();
        }
        let conflict = r.outcome == Outcome::Duplicate;
        if conflict {
            let layer = r.layer.unwrap_or(Layer::Db);
            let cause = r.cause.unwrap_or(DuplicateCause::Unknown);
            self.conflicts.with_label_values(&[biz_type, g, layer.as_str(), cause.as_str()]).inc();
        }
        if r.payload_match == Some(false) {
            self.key_collisions.with_label_values(&[biz_type, g]).inc();
        }
        if r.outcome == Outcome::DeadLettered && r.layer == Some(Layer::StateMachine) {
            self.illegal_transitions.with_label_values(&[biz_type, g]).inc();
        }
        if !r.logged {
            self.unlogged.with_label_values(&[g]).inc();
        }
        if let Err(fault) = d.trace_id() {
            self.invalid_traceparents.with_label_values(&[g, fault.as_str()]).inc();
        }
        if let Some(p) = &r.prefilter {
            self.prefilter.with_label_values(&[biz_type, g, p.step.as_str()]).inc();
            if let Some(cause) = p.fallback {
                self.prefilter_fallbacks.with_label_values(&[g, cause.as_str()]).inc();
            }
            if let Some(settled) = p.settled {
                self.prefilter_settled.with_label_values(&[g, settled.as_str()]).inc();
            }
        }
        if r.phases.handler_us > 0 {
            self.handler_seconds.with_label_values(&[biz_type, g]).observe(r.phases.handler_us as f64 / 1e6);
        }
        self.delivery_seconds
            .with_label_values(&[biz_type, r.outcome.as_str(), g])
            .observe(r.latency.as_secs_f64());
        if d.born_at_ms > 0 {
            let age_ms = (now_ms() - d.born_at_ms).max(0);
            self.end_to_end_seconds.with_label_values(&[biz_type, g]).observe(age_ms as f64 / 1e3);
        }
        let second = now_ms() / 1000;
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.entry(biz_type.to_owned()).or_default().add(second, conflict);
    }

    /// Records one group commit's size and end.
    fn group(&self, report: &GroupReport) {
        let g = self.group.as_str();
        self.group_size.with_label_values(&[g]).observe(report.size as f64);
        self.group_commits.with_label_values(&[g, report.end.as_str()]).inc();
        if report.retries > 0 {
            self.group_retries.with_label_values(&[g]).inc_by(u64::from(report.retries));
        }
    }

    /// Counts the gate's transactions started again after transient conflicts, by cause.
    fn transient_retries(&self, retries: &Retries) {
        for (cause, n) in retries.by_cause() {
            self.transient_retries
                .with_label_values(&[self.group.as_str(), cause.as_str()])
                .inc_by(u64::from(n));
        }
    }

    /// Counts a group that fell back from `handler`'s batch form to one delivery at a time.
    fn group_fallback(&self, handler: &str) {
        self.group_fallbacks.with_label_values(&[self.group.as_str(), handler]).inc();
    }

    fn ambiguous_commit(&self, scope: CommitScope, read_back: ReadBack) {
        self.ambiguous_commits
            .with_label_values(&[self.group.as_str(), scope.as_str(), read_back.as_str()])
            .inc();
    }

    /// Records how long one delivery waited for its group.
    fn group_wait(&self, waited: Duration) {
        self.group_wait_seconds.with_label_values(&[self.group.as_str()]).observe(waited.as_secs_f64());
    }

    /// Counts a delivery that found the group-commit queue full.
    fn group_queue_full(&self) {
        self.group_queue_full.with_label_values(&[self.group.as_str()]).inc();
    }

    /// Counts deliveries set aside because a group in flight claims their key.
    fn group_deferred(&self, count: u64) {
        self.group_deferred.with_label_values(&[self.group.as_str()]).inc_by(count);
    }
}

/// Per-second counts of the last five minutes, in a ring.
#[derive(Debug, Clone)]
struct Window {
    seconds: [i64; 300],
    deliveries: [u32; 300],
    conflicts: [u32; 300],
}

impl Default for Window {
    fn default() -> Self {
        Self { seconds: [-1; 300], deliveries: [0; 300], conflicts: [0; 300] }
    }
}

impl Window {
    fn add(&mut self, second: i64, conflict: bool) {
        let i = second.rem_euclid(300) as usize;
        if self.seconds[i] != second {
            self.seconds[i] = second;
            self.deliveries[i] = 0;
            self.conflicts[i] = 0;
        }
        self.deliveries[i] += 1;
        self.conflicts[i] += u32::from(conflict);
    }

    /// Deliveries and conflicts in the last `span` seconds up to `now`.
    fn sum(&self, now: i64, span: i64) -> (u64, u64) {
        let mut totals = (0u64, 0u64);
        for i in 0..300 {
            let s = self.seconds[i];
            if s > now - span && s <= now {
                totals.0 += u64::from(self.deliveries[i]);
                totals.1 += u64::from(self.conflicts[i]);
            }
        }
        totals
    }
}

// Row counts without a full scan: PostgreSQL's and InnoDB's own statistics (refreshed by
// autovacuum / ANALYZE, good to a few percent); SQLite has none, but its tables are small.
static PG_ROWS: Sql = Sql::new(
    "SELECT CAST(GREATEST(reltuples, 0) AS BIGINT) FROM pg_class WHERE relname = ? AND relkind = 'r'",
);
static MYSQL_ROWS: Sql = Sql::new(
    "SELECT CAST(TABLE_ROWS AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
);
static SQLITE_LIVE_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_all");
static SQLITE_ARCHIVE_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_archive");

static ARCHIVE_PASSES: Sql = Sql::new(
    "SELECT status, rows_moved, started_at_ms, finished_at_ms, instance_id, closed_by FROM archive_run \
     WHERE kind = 'dedup' ORDER BY id",
);

/// The statuses a pass ends with: what `idemgate_archive_runs_total` counts.
const ENDED_PASSES: [RunStatus; 3] = [RunStatus::Success, RunStatus::Failed, RunStatus::Skipped];

/// What a scrape of `instance`, a process started at `started_ms`, reads of the database.
///
/// Every instance on one database reads the same `archive_run`, so its counters take only the
/// rows this process wrote: the passes it ended since it started (`closed_by`, the instance
/// that ran a pass or, for one whose process died, the one that marked it failed) and the
/// rows its own passes moved. A sum over the instances then counts each pass once, also when
/// an instance dies and another takes the lease. The last success and the last duration are
/// the database's, the same on every instance.
async fn read_database(
    store: &Store,
    group: &str,
    instance: &str,
    started_ms: i64,
) -> Result<FromDatabase, sqlx::Error> {
    let mut read = FromDatabase { rows: table_sizes(store).await?, ..FromDatabase::default() };
    for status in ENDED_PASSES {
        read.runs.insert(status.as_str().to_owned(), 0);
    }
    // One row per pass (a few a day), so reading them all is cheap.
    for row in store.query(&ARCHIVE_PASSES).fetch_all(store.pool()).await? {
        let status: String = row.try_get(0)?;
        let rows_moved: i64 = row.try_get(1)?;
        let started: i64 = row.try_get(2)?;
        let finished: Option<i64> = row.try_get(3)?;
        let ran_by: String = row.try_get(4)?;
        let closed_by: Option<String> = row.try_get(5)?;
        if ran_by == instance && started >= started_ms {
            read.rows_moved += u64::try_from(rows_moved).unwrap_or(0);
        }
        let Some(finished) = finished else { continue };
        if closed_by.as_deref() == Some(instance)
            && finished >= started_ms
            && let Some(passes) = read.runs.get_mut(&status)
        {
            *passes += 1;
        }
        read.last_duration_s = Some((finished - started).max(0) as f64 / 1e3);
        if status == RunStatus::Success.as_str() {
            read.last_success_s = Some(finished as f64 / 1e3);
        }
    }
    read.partitions = crate::delivery_log::partitions::health(store, now_ms()).await?;
    if let Some(run) = crate::reconcile::runs::last_success(store, group).await? {
        let counts = crate::reconcile::runs::counts(store, run.id).await?;
        read.reconcile = Some((run.finished_at_ms.unwrap_or(run.started_at_ms) as f64 / 1e3, counts));
    }
    Ok(read)
}

/// Live claims (every claim table of the layout) and archived ones.
async fn table_sizes(store: &Store) -> Result<[i64; 2], sqlx::Error> {
    let live = crate::layout::current(store).await?.tables();
    let archive = vec!["idempotent_record_archive".to_owned()];
    let mut sizes = [0; 2];
    for (i, tables) in [live, archive].into_iter().enumerate() {
        for table in tables {
            let q = match store.backend() {
                Backend::Postgres => store.query(&PG_ROWS).bind(table),
                Backend::MySql => store.query(&MYSQL_ROWS).bind(table),
                // The view counts every shard at once.
                Backend::Sqlite if i == 0 => store.query(&SQLITE_LIVE_ROWS),
                Backend::Sqlite => store.query(&SQLITE_ARCHIVE_ROWS),
            };
            let row = q.fetch_optional(store.pool()).await?;
            sizes[i] += match row {
                Some(r) => r.try_get::<Option<i64>, _>(0)?.unwrap_or(0),
                None => 0,
            };
            if store.backend() == Backend::Sqlite {
                break;
            }
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_sums_only_its_own_span() {
        let mut w = Window::default();
        for s in 1000..1300 {
            w.add(s, s % 3 == 0);
        }
        assert_eq!(w.sum(1299, 60), (60, 20));
        assert_eq!(w.sum(1299, 300), (300, 100));
        // Seconds that fall out of the ring are forgotten.
        w.add(1700, true);
        assert_eq!(w.sum(1700, 60), (1, 1));
        assert_eq!(w.sum(1700, 300), (1, 1));
    }
}
