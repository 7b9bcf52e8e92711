//! The record of what the consumers did: the evidence a redelivery's sub-cause is read from.
//!
//! Each start of the service is a *run* of its instance (`consumer_instance`: one row per run,
//! its heartbeat every [`HEARTBEAT`], and how it stopped), and what its consumer saw happen is an
//! *event* of that run (`consumer_event`): the queues or partitions the broker gave it and took
//! from it, an answer (ack, offset commit) that could not reach the broker, the broker's own
//! timeout. The brokers' consumers report through a [`Record`] without waiting on the database:
//! an event is kept in memory at once (so that this instance's own evidence is never behind its
//! deliveries) and written by the record's task. A run whose heartbeat stopped without a clean
//! stop is marked `crash` by the next run of the group that starts, and by the reads here.
//!
//! The gate logs a redelivery without its sub-cause; the run that logged it reads the sub-cause
//! from this record ([`judge`]) once the record can tell, [`ATTRIBUTE_AFTER_MS`] later (by then a
//! run that died has missed its heartbeats, and the rebalance callbacks of both sides have run),
//! and writes it into the row. It must not name a duplicate's cause;
//! [`crate::outcome::classify`] does.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Row;

use crate::clock::now_ms;
use crate::delivery::BrokerKind;
use crate::delivery_log::{applied_before, clip};
use crate::labelled::labelled;
use crate::outcome::{ClaimDelivery, RedeliveryCause};
use crate::store::{Backend, Conn, Sql, Store, query};

/// How often a run's heartbeat is written.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A run whose heartbeat is older than this, and that recorded no stop, stopped without one.
pub const STALE_AFTER_MS: i64 = 3_000;
/// The most events kept in memory for this run's own reads, and waiting to be written.
const MAX_RECENT: usize = 4_096;
/// The longest queue name and detail kept, in characters.
const MAX_QUEUE_CHARS: usize = 320;
const MAX_DETAIL_CHARS: usize = 500;
/// The most events one attribution reads.
const MAX_EVENTS_READ: i64 = 500;
/// How long after a redelivery is logged its sub-cause is read.
pub const ATTRIBUTE_AFTER_MS: i64 = STALE_AFTER_MS + 1_000;
/// The most redeliveries attributed in one beat.
const MAX_ATTRIBUTED_PER_BEAT: i64 = 200;

/// What the service does with each attributed redelivery: its biz_type and sub-cause (the
/// metrics count it).
pub type OnAttributed = Box<dyn Fn(&str, RedeliveryCause) + Send + Sync>;

labelled! {
    /// What happened to a run of an instance.
    EventKind {
        /// The run started.
        Started => "started",
        /// The run stopped cleanly: its consumer answered what it held and left.
        Stopped => "stopped",
        /// The run's heartbeat ended without a clean stop (recorded by a later run).
        Crashed => "crashed",
        /// The broker gave the run a queue or partition.
        Assigned => "assigned",
        /// The broker took a queue or partition from the run (a rebalance, or the consumer
        /// cancelled by the broker).
        Revoked => "revoked",
        /// An answer (ack, reject, offset commit) did not reach the broker: it failed, timed
        /// out, or its connection was lost with deliveries unanswered.
        AckFailed => "ack_failed",
        /// The broker gave up waiting for an answer (RabbitMQ's `consumer_timeout`, Kafka's
        /// `max.poll.interval.ms`).
        ConsumeTimeout => "consume_timeout",
    }
}

labelled! {
    /// How a run stopped.
    Stop {
        /// It stopped as asked, after answering what it held.
        Clean => "clean",
        /// Its heartbeat ended without a clean stop: killed, crashed, cut off for good.
        Crash => "crash",
    }
}

/// One event, as kept in memory and written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at_ms: i64,
    pub kind: EventKind,
    /// The queue or partition it names, in the words of [`queue_name`]; empty for all of them.
    pub queue: String,
    pub detail: String,
}

/// This run's record: where the consumer reports what it saw.
pub struct Record {
    store: Store,
    consumer_group: String,
    instance_id: String,
    broker: BrokerKind,
    started_at_ms: i64,
    recent: Mutex<VecDeque<Event>>,
    /// Events not yet written, oldest first.
    pending: Mutex<VecDeque<Event>>,
    wake: tokio::sync::Notify,
    /// Events dropped since the last beat because the writer fell behind by [`MAX_RECENT`];
    /// each beat warns of them.
    dropped: std::sync::atomic::AtomicU64,
    /// The time from which this run's redeliveries still wait for their sub-cause.
    cursor: Mutex<i64>,
    on_attributed: std::sync::OnceLock<OnAttributed>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("consumer_group", &self.consumer_group)
            .field("instance_id", &self.instance_id)
            .field("broker", &self.broker)
            .field("started_at_ms", &self.started_at_ms)
            .finish_non_exhaustive()
    }
}

impl Record {
    pub fn new(store: Store, consumer_group: &str, instance_id: &str, broker: BrokerKind) -> Arc<Self> {
        Arc::new(Self {
            store,
            consumer_group: consumer_group.to_owned(),
            instance_id: instance_id.to_owned(),
            broker,
            started_at_ms: now_ms(),
            recent: Mutex::new(VecDeque::new()),
            pending: Mutex::new(VecDeque::new()),
            wake: tokio::sync::Notify::new(),
            dropped: std::sync::atomic::AtomicU64::new(0),
            cursor: Mutex::new(now_ms()),
            on_attributed: std::sync::OnceLock::new(),
        })
    }

    /// Calls `f` with each redelivery this run attributes (once; later calls are ignored).
    pub fn on_attributed(&self, f: OnAttributed) {
        let _ = self.on_attributed.set(f);
    }

    /// Records `kind` for `queue` now, without waiting: kept in memory at once, written by
    /// [`Record::run`].
    pub fn note(&self, kind: EventKind, queue: &str, detail: &str) {
        let event = Event {
            at_ms: now_ms(),
            kind,
            queue: clip(queue, MAX_QUEUE_CHARS),
            detail: clip(detail, MAX_DETAIL_CHARS),
        };
        push_bounded(&mut self.recent.lock().unwrap_or_else(|p| p.into_inner()), event.clone());
        if push_bounded(&mut self.pending.lock().unwrap_or_else(|p| p.into_inner()), event) {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.wake.notify_one();
    }

    /// This run's own events, from memory (the latest [`MAX_RECENT`]).
    fn own_events(&self) -> Vec<Event> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Starts the run: its row, its `started` event, and the earlier runs of the group whose
    /// heartbeat ended without a stop marked `crash`.
    pub async fn start(&self) -> Result<(), sqlx::Error> {
        let backend = self.store.backend();
        let mut conn = self.store.pool().acquire().await?;
        mark_crashed(&mut conn, backend, &self.consumer_group, now_ms()).await?;
        query(backend, &INSERT_RUN)
            .bind(self.instance_id.clone())
            .bind(self.started_at_ms)
            .bind(self.consumer_group.clone())
            .bind(self.broker.as_str())
            .bind(self.started_at_ms)
            .execute(&mut *conn)
            .await?;
        self.note(EventKind::Started, "", "");
        Ok(())
    }

    /// Writes the events as they come and the heartbeat every [`HEARTBEAT`], until the task is
    /// dropped. A failed write is retried at the next beat; nothing waits on it.
    pub async fn run(self: Arc<Self>) {
        let mut beat = tokio::time::interval(HEARTBEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = beat.tick() => {
                    if let Err(e) = self.beat().await {
                        tracing::debug!(error = %e, "the consumer record's heartbeat was not written; it is tried again");
                    }
                }
                () = self.wake.notified() => {}
            }
            if let Err(e) = self.flush().await {
                tracing::debug!(error = %e, "the consumer record's events were not written yet; they are tried again");
            }
            let dropped = self.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "the consumer record could not write its events as fast as they came: the oldest were dropped, and redeliveries they would explain may be logged unattributed"
                );
            }
            if let Err(e) = self.attribute_pending().await {
                tracing::debug!(error = %e, "this run's redeliveries were not attributed yet; they are tried again");
            }
        }
    }

    /// Reads and writes the sub-cause of this run's redeliveries logged at least
    /// [`ATTRIBUTE_AFTER_MS`] ago, oldest first, at most [`MAX_ATTRIBUTED_PER_BEAT`] at a time.
    pub async fn attribute_pending(&self) -> Result<usize, sqlx::Error> {
        let backend = self.store.backend();
        let now = now_ms();
        let until = now - ATTRIBUTE_AFTER_MS;
        let from = *self.cursor.lock().unwrap_or_else(|p| p.into_inner());
        if until <= from {
            return Ok(0);
        }
        let mut conn = self.store.pool().acquire().await?;
        let rows = query(backend, &PENDING)
            .bind(from)
            .bind(until)
            .bind(self.consumer_group.clone())
            .bind(self.instance_id.clone())
            .bind(MAX_ATTRIBUTED_PER_BEAT)
            .fetch_all(&mut *conn)
            .await?;
        let full = rows.len() as i64 >= MAX_ATTRIBUTED_PER_BEAT;
        let mut reached = until;
        for row in &rows {
            let pending = Pending {
                id: row.try_get(0)?,
                logged_at_ms: row.try_get(1)?,
                biz_type: row.try_get(2)?,
                biz_id: row.try_get(3)?,
                execute_time: row.try_get(4)?,
            };
            let key = (pending.biz_type.as_str(), pending.biz_id.as_str(), pending.execute_time);
            let applied =
                applied_before(&mut conn, backend, &self.consumer_group, key, pending.logged_at_ms).await?;
            let cause = match applied {
                Some(applied) => {
                    let run = facts(&mut conn, backend, &applied, now).await?;
                    let mine = self.own_events();
                    judge(&applied, &run, &mine, &self.instance_id, self.broker, now)
                }
                None => RedeliveryCause::Unattributed,
            };
            query(backend, &SET_SUB_CAUSE)
                .bind(cause.as_str())
                .bind(pending.id)
                .bind(pending.logged_at_ms)
                .execute(&mut *conn)
                .await?;
            if let Some(f) = self.on_attributed.get() {
                f(&pending.biz_type, cause);
            }
            reached = pending.logged_at_ms;
        }
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = if full { reached } else { until };
        Ok(rows.len())
    }

    async fn beat(&self) -> Result<(), sqlx::Error> {
        let mut conn = self.store.pool().acquire().await?;
        query(self.store.backend(), &BEAT)
            .bind(now_ms())
            .bind(self.instance_id.clone())
            .bind(self.started_at_ms)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Writes the pending events, oldest first; one that fails stays for the next call.
    async fn flush(&self) -> Result<(), sqlx::Error> {
        let batch: Vec<Event> =
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        if batch.is_empty() {
            return Ok(());
        }
        let mut conn = self.store.pool().acquire().await?;
        for (written, event) in batch.iter().enumerate() {
            if let Err(e) =
                insert_event(&mut conn, self.store.backend(), &self.consumer_group, &self.instance_id, event)
                    .await
            {
                self.pending.lock().unwrap_or_else(|p| p.into_inner()).drain(..written);
                return Err(e);
            }
        }
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).drain(..batch.len());
        Ok(())
    }

    /// Ends the run cleanly: the pending events written, its stop recorded. Bounded by
    /// `within`; a stop that cannot be written leaves the run to be judged by its heartbeat.
    pub async fn stop(&self, within: Duration) {
        self.note(EventKind::Stopped, "", "");
        let done = async {
            self.flush().await?;
            let mut conn = self.store.pool().acquire().await?;
            let now = now_ms();
            query(self.store.backend(), &STOP)
                .bind(now)
                .bind(now)
                .bind(Stop::Clean.as_str())
                .bind(self.instance_id.clone())
                .bind(self.started_at_ms)
                .execute(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>(())
        };
        match tokio::time::timeout(within, done).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the clean stop was not recorded"),
            Err(_) => tracing::warn!("the clean stop was not recorded in time"),
        }
    }
}

/// Appends `event`, dropping the oldest past [`MAX_RECENT`]; true when one was dropped.
fn push_bounded(events: &mut VecDeque<Event>, event: Event) -> bool {
    let full = events.len() >= MAX_RECENT;
    if full {
        events.pop_front();
    }
    events.push_back(event);
    full
}

static INSERT_RUN: Sql = Sql::new(
    "INSERT INTO consumer_instance (instance_id, started_at_ms, consumer_group, broker, heartbeat_at_ms) \
     VALUES (?, ?, ?, ?, ?)",
);
static BEAT: Sql =
    Sql::new("UPDATE consumer_instance SET heartbeat_at_ms = ? WHERE instance_id = ? AND started_at_ms = ?");
static STOP: Sql = Sql::new(
    "UPDATE consumer_instance SET heartbeat_at_ms = ?, stopped_at_ms = ?, stop = ? \
     WHERE instance_id = ? AND started_at_ms = ?",
);
static INSERT_EVENT: Sql = Sql::new(
    "INSERT INTO consumer_event (at_ms, consumer_group, instance_id, kind, queue, detail) VALUES (?, ?, ?, ?, ?, ?)",
);
static STALE_RUNS: Sql = Sql::new(
    "SELECT instance_id, started_at_ms, heartbeat_at_ms FROM consumer_instance \
     WHERE consumer_group = ? AND stopped_at_ms IS NULL AND heartbeat_at_ms < ? LIMIT 100",
);
static MARK_CRASHED: Sql = Sql::new(
    "UPDATE consumer_instance SET stopped_at_ms = heartbeat_at_ms, stop = ? \
     WHERE instance_id = ? AND started_at_ms = ? AND stopped_at_ms IS NULL",
);
static RUN_AT: Sql = Sql::new(
    "SELECT started_at_ms, heartbeat_at_ms, stopped_at_ms, stop FROM consumer_instance \
     WHERE instance_id = ? AND started_at_ms <= ? ORDER BY started_at_ms DESC LIMIT 1",
);
static PENDING: Sql = Sql::new(
    "SELECT id, logged_at_ms, biz_type, biz_id, execute_time FROM delivery_log \
     WHERE outcome = 'duplicate' AND logged_at_ms >= ? AND logged_at_ms < ? AND consumer_group = ? \
     AND instance_id = ? AND cause = 'redelivery' AND sub_cause IS NULL ORDER BY logged_at_ms LIMIT ?",
);
static SET_SUB_CAUSE: Sql =
    Sql::new("UPDATE delivery_log SET sub_cause = ? WHERE id = ? AND logged_at_ms = ?");

/// A redelivery waiting for its sub-cause.
struct Pending {
    id: i64,
    logged_at_ms: i64,
    biz_type: String,
    biz_id: String,
    execute_time: i64,
}

static EVENTS_SINCE: Sql = Sql::new(
    "SELECT at_ms, kind, queue, detail FROM consumer_event \
     WHERE instance_id = ? AND at_ms >= ? AND at_ms <= ? ORDER BY at_ms LIMIT ?",
);

async fn insert_event(
    conn: &mut Conn,
    backend: Backend,
    consumer_group: &str,
    instance_id: &str,
    e: &Event,
) -> Result<(), sqlx::Error> {
    query(backend, &INSERT_EVENT)
        .bind(e.at_ms)
        .bind(consumer_group.to_owned())
        .bind(instance_id.to_owned())
        .bind(e.kind.as_str())
        .bind(e.queue.clone())
        .bind(e.detail.clone())
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks the runs of `consumer_group` whose heartbeat ended before `now_ms - STALE_AFTER_MS`
/// without a stop as `crash`, each with a `crashed` event at its last heartbeat.
async fn mark_crashed(
    conn: &mut Conn,
    backend: Backend,
    consumer_group: &str,
    now_ms: i64,
) -> Result<(), sqlx::Error> {
    let stale = query(backend, &STALE_RUNS)
        .bind(consumer_group.to_owned())
        .bind(now_ms - STALE_AFTER_MS)
        .fetch_all(&mut *conn)
        .await?;
    for row in stale {
        let (instance, started, heartbeat): (String, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let marked = query(backend, &MARK_CRASHED)
            .bind(Stop::Crash.as_str())
            .bind(instance.clone())
            .bind(started)
            .execute(&mut *conn)
            .await?;
        if marked.rows_affected() > 0 {
            let event = Event {
                at_ms: heartbeat,
                kind: EventKind::Crashed,
                queue: String::new(),
                detail: format!("no heartbeat after {}", crate::clock::format_ms(heartbeat)),
            };
            insert_event(conn, backend, consumer_group, &instance, &event).await?;
        }
    }
    Ok(())
}

static EXPIRED_EVENTS: Sql = Sql::new("SELECT id FROM consumer_event WHERE at_ms < ? ORDER BY id LIMIT ?");
static DELETE_EVENTS: Sql = Sql::new("DELETE FROM consumer_event WHERE id >= ? AND id <= ? AND at_ms < ?");
static DELETE_RUNS: Sql =
    Sql::new("DELETE FROM consumer_instance WHERE heartbeat_at_ms < ? AND stopped_at_ms IS NOT NULL");

/// Deletes the events older than `cutoff_ms`, `batch` rows a statement, and the runs that
/// stopped before it (a run with no stop on record stays until a later run marks it):
/// the record is kept as long as the log it explains. Returns the events deleted.
pub async fn expire(store: &Store, cutoff_ms: i64, batch: i64) -> Result<u64, sqlx::Error> {
    let backend = store.backend();
    let mut deleted = 0;
    loop {
        let mut conn = store.pool().acquire().await?;
        let ids = query(backend, &EXPIRED_EVENTS).bind(cutoff_ms).bind(batch).fetch_all(&mut *conn).await?;
        let (Some(first), Some(last)) = (ids.first(), ids.last()) else { break };
        let (first, last): (i64, i64) = (first.try_get(0)?, last.try_get(0)?);
        let done =
            query(backend, &DELETE_EVENTS).bind(first).bind(last).bind(cutoff_ms).execute(&mut *conn).await?;
        deleted += done.rows_affected();
        if (ids.len() as i64) < batch {
            break;
        }
    }
    let mut conn = store.pool().acquire().await?;
    query(backend, &DELETE_RUNS).bind(cutoff_ms).execute(&mut *conn).await?;
    Ok(deleted)
}

/// What the record says of the run that applied a claim's delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunFacts {
    /// The run's last heartbeat and how it stopped, when the run is on record.
    heartbeat_at_ms: Option<i64>,
    stop: Option<Stop>,
    /// Its events from the delivery's start on.
    events: Vec<Event>,
}

/// Reads what the record holds of the run of `applied.instance_id` that applied the claim's
/// delivery, up to `now_ms`.
async fn facts(
    conn: &mut Conn,
    backend: Backend,
    applied: &ClaimDelivery,
    now_ms: i64,
) -> Result<RunFacts, sqlx::Error> {
    let started = applied.logged_at_ms - applied.latency_us / 1_000 - 1_000;
    let run = query(backend, &RUN_AT)
        .bind(applied.instance_id.clone())
        .bind(applied.logged_at_ms)
        .fetch_optional(&mut *conn)
        .await?;
    let (heartbeat_at_ms, stop) = match &run {
        Some(row) => {
            let stop: Option<String> = row.try_get(3)?;
            (Some(row.try_get::<i64, _>(1)?), stop.as_deref().and_then(Stop::parse))
        }
        None => (None, None),
    };
    let rows = query(backend, &EVENTS_SINCE)
        .bind(applied.instance_id.clone())
        .bind(started)
        .bind(now_ms)
        .bind(MAX_EVENTS_READ)
        .fetch_all(&mut *conn)
        .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in rows {
        let kind: String = row.try_get(1)?;
        let Some(kind) = EventKind::parse(&kind) else { continue };
        events.push(Event { at_ms: row.try_get(0)?, kind, queue: row.try_get(2)?, detail: row.try_get(3)? });
    }
    Ok(RunFacts { heartbeat_at_ms, stop, events })
}

/// The sub-cause of a redelivery of the copy `applied` applied, delivered again to `me` at
/// `now_ms`, from the facts of the run that applied it and `me`'s own events:
///
/// 1. that run recorded the broker's timeout from the delivery's start on: `consume_timeout`;
/// 2. after the delivery was applied, it recorded an answer that did not reach the broker
///    (`ack_lost`) or the delivery's queue taken from it (`rebalance`): whichever came first;
/// 3. it stopped without a clean stop (marked `crash`, or its heartbeat is older than
///    [`STALE_AFTER_MS`] and no stop is on record): `crash`;
/// 4. on a broker that moves queues (RocketMQ, Kafka), `me` holds the delivery's queue (its
///    last event of it gave it), applied by another run, or that run stopped cleanly with the
///    delivery unanswered: `rebalance`;
/// 5. otherwise `unattributed`: never a guess.
pub(crate) fn judge(
    applied: &ClaimDelivery,
    run: &RunFacts,
    me: &[Event],
    me_id: &str,
    broker: BrokerKind,
    now_ms: i64,
) -> RedeliveryCause {
    let after = |e: &&Event| e.at_ms >= applied.logged_at_ms;
    let this_queue = |e: &&Event| e.queue.is_empty() || e.queue == applied.queue;
    if run.events.iter().any(|e| e.kind == EventKind::ConsumeTimeout) {
        return RedeliveryCause::ConsumeTimeout;
    }
    // Whichever came first to the unanswered delivery: its answer lost (an offset commit that
    // failed because the partition had already been taken is the rebalance's doing), or its
    // queue taken (a queue taken after the answer could not be sent is the lost answer's).
    let revoked =
        |e: &&Event| e.kind == EventKind::Revoked && !e.queue.is_empty() && e.queue == applied.queue;
    let ack_failed = |e: &&Event| e.kind == EventKind::AckFailed && this_queue(e);
    let first =
        run.events.iter().filter(after).filter(|e| revoked(e) || ack_failed(e)).min_by_key(|e| e.at_ms);
    if let Some(e) = first {
        return if e.kind == EventKind::Revoked {
            RedeliveryCause::Rebalance
        } else {
            RedeliveryCause::AckLost
        };
    }
    let stale = run.heartbeat_at_ms.is_some_and(|h| h < now_ms - STALE_AFTER_MS);
    match run.stop {
        Some(Stop::Crash) => return RedeliveryCause::Crash,
        None if stale => return RedeliveryCause::Crash,
        _ => {}
    }
    let moves_queues = broker != BrokerKind::RabbitMq;
    // This run holds the queue another run applied the copy from: the queue moved between them
    // (RocketMQ's two owners overlap until the old one's own rebalance drops it).
    let held_by_me = me
        .iter()
        .filter(|e| e.queue == applied.queue && matches!(e.kind, EventKind::Assigned | EventKind::Revoked))
        .max_by_key(|e| e.at_ms)
        .is_some_and(|e| e.kind == EventKind::Assigned);
    let given_to_me = applied.instance_id != me_id && held_by_me;
    if moves_queues && (given_to_me || run.stop == Some(Stop::Clean)) {
        return RedeliveryCause::Rebalance;
    }
    RedeliveryCause::Unattributed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied() -> ClaimDelivery {
        ClaimDelivery {
            stored_copy: "m0".into(),
            instance_id: "a".into(),
            logged_at_ms: 10_000,
            latency_us: 2_000_000,
            queue: "orders · q3".into(),
        }
    }

    fn event(at_ms: i64, kind: EventKind, queue: &str) -> Event {
        Event { at_ms, kind, queue: queue.into(), detail: String::new() }
    }

    fn alive(events: Vec<Event>) -> RunFacts {
        RunFacts { heartbeat_at_ms: Some(11_500), stop: None, events }
    }

    #[test]
    fn each_sub_cause_is_read_from_its_own_evidence() {
        let a = applied();
        let judge = |run: &RunFacts, me: &[Event], broker| judge(&a, run, me, "b", broker, 12_000);
        let k = BrokerKind::Kafka;
        assert_eq!(
            judge(&alive(vec![event(9_000, EventKind::ConsumeTimeout, "")]), &[], k),
            RedeliveryCause::ConsumeTimeout
        );
        assert_eq!(
            judge(&alive(vec![event(10_100, EventKind::AckFailed, "orders · q3")]), &[], k),
            RedeliveryCause::AckLost
        );
        assert_eq!(
            judge(&alive(vec![event(10_100, EventKind::AckFailed, "orders · q4")]), &[], k),
            RedeliveryCause::Unattributed,
            "another queue's failed answer says nothing of this one"
        );
        assert_eq!(
            judge(&alive(vec![event(10_200, EventKind::Revoked, "orders · q3")]), &[], k),
            RedeliveryCause::Rebalance
        );
        let taken_then_failed = vec![
            event(10_200, EventKind::Revoked, "orders · q3"),
            event(10_300, EventKind::AckFailed, "orders · q3"),
        ];
        assert_eq!(
            judge(&alive(taken_then_failed), &[], k),
            RedeliveryCause::Rebalance,
            "the commit failed because the partition was taken"
        );
        let failed_then_taken =
            vec![event(10_200, EventKind::AckFailed, ""), event(10_300, EventKind::Revoked, "orders · q3")];
        assert_eq!(judge(&alive(failed_then_taken), &[], k), RedeliveryCause::AckLost, "cut off, then taken");
        assert_eq!(
            judge(&alive(vec![event(9_000, EventKind::Revoked, "orders · q3")]), &[], k),
            RedeliveryCause::Unattributed,
            "taken before the delivery was applied: not this delivery's story"
        );
        let crashed = RunFacts { heartbeat_at_ms: Some(10_500), stop: Some(Stop::Crash), events: vec![] };
        assert_eq!(judge(&crashed, &[], k), RedeliveryCause::Crash);
        let silent = RunFacts { heartbeat_at_ms: Some(8_000), stop: None, events: vec![] };
        assert_eq!(judge(&silent, &[], k), RedeliveryCause::Crash, "a heartbeat older than 3 s and no stop");
        let given = [event(10_300, EventKind::Assigned, "orders · q3")];
        assert_eq!(judge(&alive(vec![]), &given, k), RedeliveryCause::Rebalance);
        let overlapping = [event(9_000, EventKind::Assigned, "orders · q3")];
        assert_eq!(
            judge(&alive(vec![]), &overlapping, k),
            RedeliveryCause::Rebalance,
            "given before the old owner applied it: both held it until the old one let go"
        );
        let given_back = [
            event(9_000, EventKind::Assigned, "orders · q3"),
            event(9_500, EventKind::Revoked, "orders · q3"),
        ];
        assert_eq!(judge(&alive(vec![]), &given_back, k), RedeliveryCause::Unattributed, "no longer held");
        assert_eq!(
            judge(&alive(vec![]), &given, BrokerKind::RabbitMq),
            RedeliveryCause::Unattributed,
            "RabbitMQ's consumers share one queue: a consumer starting moves nothing"
        );
        let clean = RunFacts { heartbeat_at_ms: Some(10_500), stop: Some(Stop::Clean), events: vec![] };
        assert_eq!(judge(&clean, &[], k), RedeliveryCause::Rebalance);
        assert_eq!(judge(&alive(vec![]), &[], k), RedeliveryCause::Unattributed);
        let unknown = RunFacts::default();
        assert_eq!(judge(&unknown, &[], k), RedeliveryCause::Unattributed, "a run not on record");
    }

    #[test]
    fn names_are_clipped_and_memory_is_bounded() {
        let mut events = VecDeque::new();
        for i in 0..(MAX_RECENT as i64 + 10) {
            let _ = push_bounded(&mut events, event(i, EventKind::Assigned, "q"));
        }
        assert_eq!(events.len(), MAX_RECENT);
        assert_eq!(events.front().map(|e| e.at_ms), Some(10));
        assert_eq!(clip("ééé", 2), "éé");
        assert_eq!(BrokerKind::Kafka.queue("orders", 2), "orders · partition 2");
    }
}
