//! Group commit: deliveries that arrive together share one database transaction, and each
//! keeps the guarantees it has alone.
//!
//! A durable commit costs a disk flush, and on a small server that flush, not the work, is
//! what limits one transaction per message. Here a group of up to `max_batch` deliveries (or
//! whatever arrived within `linger` of the first) goes through one transaction:
//!
//! 1. every key is resolved, and the Redis pre-filter (when on) is asked for all of them at
//!    once;
//! 2. the keys are claimed with **one multi-row insert per claim table** that skips the keys
//!    already taken and returns the ones it inserted (PostgreSQL and SQLite
//!    `ON CONFLICT DO NOTHING RETURNING`, MariaDB `INSERT IGNORE … RETURNING`; MySQL, which
//!    cannot return rows from an insert, `INSERT IGNORE` and then reads back which keys hold
//!    this group's claim: [`ClaimPath`]), in key order so that two groups wait for each other
//!    in one direction only;
//! 3. each fresh claim's handler runs inside its **own savepoint**. A handler that fails is
//!    rolled back to its savepoint and its claim deleted, so its key is unclaimed when the group
//!    commits and the delivery goes to retry, while the others commit;
//! 4. a key twice in one group: the first copy claims it, and the later copies are duplicates
//!    of that claim; if the first copy's handler failed, the next copy claims it in a further
//!    round, exactly as it would have alone;
//! 5. the earlier claims of the keys other deliveries hold are read in one statement per
//!    table, to name each duplicate's cause;
//! 6. every delivery's log row (processed, duplicate, failed, dead-lettered, invalid) is
//!    appended in one multi-row insert **in the same transaction**, and the group commits.
//!
//! Only then does any delivery of the group get its answer, so nothing is acknowledged before
//! its commit. A crash before the commit rolls the whole group back and the broker redelivers
//! it; a crash after the commit but before the acks brings back duplicates the claims stop.
//! No log row is ever written outside its group's transaction, so none can be lost.
//!
//! A transient conflict (deadlock, busy file, a dropped connection) retries the whole group.
//! If the group still cannot commit, it is **split**: each delivery goes through the gate
//! alone, so one delivery that breaks the transaction cannot hold the others back.
//!
//! The [`Committer`] turns single deliveries into groups: callers queue their delivery (the
//! queue is bounded, so when the database is slow the callers, and through them the broker
//! client's consume threads, wait instead of piling up) and `in_flight` tasks take groups off
//! the queue and commit them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::{mpsc, oneshot};

use serde::{Deserialize, Serialize};

use super::claim::Claimant;
use super::core::Core;
use super::disposition::{Disposition, Phases, committed_disposition, rejection_disposition};
use super::observer::{GroupEnd, GroupReport, Observer};
use crate::clock::{Stopwatch, micros, now_ms};
use crate::delivery::Delivery;
use crate::delivery_log::{self, Entry};
use crate::handler::{Effect, HandlerError, Work};
use crate::layout::ClaimTable;
use crate::outcome::{Claim, DuplicateCause, Layer, Outcome, Verdict};
use crate::prefilter::{Check, PrefilterReport, Settle, Token, claim_of};
use crate::route::{BizKey, Rejection};
use crate::setting::{Invalid, invalid};
use crate::store::{Backend, Conn, is_transient, query, query_built, values_list};

/// The most deliveries one group may hold. PostgreSQL keeps the ids of 64 subtransactions
/// (savepoints that wrote) per transaction in shared memory; one more and every other session's
/// snapshots slow down until the group commits.
pub const MAX_BATCH: usize = 64;

/// `[group_commit]`: deliveries that arrive together share one transaction, each in its own
/// savepoint. Off by default: one transaction per delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSettings {
    /// `IDEMGATE_GROUP_COMMIT__ENABLED`.
    pub enabled: bool,
    /// `IDEMGATE_GROUP_COMMIT__MAX_BATCH`: deliveries per transaction, 1 to 64.
    pub max_batch: usize,
    /// `IDEMGATE_GROUP_COMMIT__LINGER_MS`: how long the first delivery of a group waits for
    /// others, 0 to 1000. Under load the group fills before that; when traffic is light this is
    /// the latency group commit adds.
    pub linger_ms: u64,
    /// `IDEMGATE_GROUP_COMMIT__IN_FLIGHT`: groups committing at once (each holds one
    /// connection), 1 to 16.
    pub in_flight: usize,
    /// `IDEMGATE_GROUP_COMMIT__QUEUE`: deliveries waiting for a group at most; the next caller
    /// waits for room.
    pub queue: usize,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self { enabled: false, max_batch: 32, linger_ms: 2, in_flight: 2, queue: 256 }
    }
}

impl GroupSettings {
    /// The defaults, switched on.
    pub fn on() -> Self {
        Self { enabled: true, ..Self::default() }
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return Err(invalid(
                "group_commit.max_batch",
                format!(
                    "is {}; use 1 to {MAX_BATCH} (PostgreSQL tracks at most 64 savepoints per transaction cheaply)",
                    self.max_batch
                ),
            ));
        }
        if self.linger_ms > 1_000 {
            return Err(invalid("group_commit.linger_ms", "must be at most 1000"));
        }
        if !(1..=16).contains(&self.in_flight) {
            return Err(invalid("group_commit.in_flight", "must be between 1 and 16"));
        }
        if !(1..=100_000).contains(&self.queue) {
            return Err(invalid("group_commit.queue", "must be between 1 and 100000"));
        }
        Ok(())
    }
}

/// One queued delivery and where its answer goes.
struct Job {
    delivery: Delivery,
    queued: Instant,
    reply: oneshot::Sender<Disposition>,
}

/// The queue and the tasks that turn it into groups. Dropping it (with its gate) closes the
/// queue; the tasks finish the groups they hold and stop.
pub(crate) struct Committer {
    queue: mpsc::Sender<Job>,
    observer: Option<Arc<dyn Observer>>,
}

impl Committer {
    pub(crate) fn start(core: Arc<Core>, settings: &GroupSettings) -> Self {
        let (queue, jobs) = mpsc::channel(settings.queue.max(1));
        let jobs = Arc::new(tokio::sync::Mutex::new(jobs));
        for _ in 0..settings.in_flight.max(1) {
            tokio::spawn(commit_groups(core.clone(), jobs.clone(), settings.clone()));
        }
        Self { queue, observer: core.observer.clone() }
    }

    /// Queues `delivery` and waits for its group's answer. A full queue makes the caller wait
    /// for room first (counted: the database is not keeping up); the time in the queue is
    /// measured from when the delivery got in.
    pub(crate) async fn submit(&self, delivery: Delivery) -> Disposition {
        let room = match self.queue.try_reserve() {
            Ok(room) => room,
            Err(mpsc::error::TrySendError::Full(())) => {
                if let Some(observer) = &self.observer {
                    observer.group_queue_full();
                }
                match self.queue.reserve().await {
                    Ok(room) => room,
                    Err(_) => return abandoned(),
                }
            }
            Err(mpsc::error::TrySendError::Closed(())) => return abandoned(),
        };
        let (reply, answer) = oneshot::channel();
        room.send(Job { delivery, queued: Instant::now(), reply });
        answer.await.unwrap_or_else(|_| abandoned())
    }
}

/// The answer for a delivery whose group never finished (its runtime is shutting down): not
/// recorded, so not acknowledged.
fn abandoned() -> Disposition {
    Disposition {
        outcome: Outcome::Failed,
        verdict: Verdict::Retry,
        key: None,
        cause: None,
        layer: None,
        payload_match: None,
        error: Some("the group committer stopped before this delivery's group committed".to_owned()),
        latency: Duration::ZERO,
        logged: false,
        phases: Phases::default(),
        prefilter: None,
    }
}

/// One committer task: takes a group off the queue (the first delivery, then whatever else
/// arrives within the linger, up to the batch size), commits it, answers each caller.
async fn commit_groups(
    core: Arc<Core>,
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    settings: GroupSettings,
) {
    let max_batch = settings.max_batch.clamp(1, MAX_BATCH);
    loop {
        let group = {
            let mut jobs = jobs.lock().await;
            let Some(first) = jobs.recv().await else { return };
            let mut group = vec![first];
            let deadline = tokio::time::Instant::now() + settings.linger();
            while group.len() < max_batch {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, jobs.recv()).await {
                            Ok(Some(job)) => group.push(job),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
            group
        };
        if let Some(observer) = &core.observer {
            for job in &group {
                observer.group_wait(job.queued.elapsed());
            }
        }
        let (deliveries, replies): (Vec<Delivery>, Vec<oneshot::Sender<Disposition>>) =
            group.into_iter().map(|j| (j.delivery, j.reply)).unzip();
        let answers = core.process_group(&deliveries).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away has nothing to acknowledge.
            let _ = reply.send(answer);
        }
    }
}

/// A delivery of a group, as far as the gate got before the transaction.
struct Slot<'a> {
    d: &'a Delivery,
    hash: String,
    before: Before,
    token: Option<Token>,
    report: Option<PrefilterReport>,
    redis_us: u64,
}

enum Before {
    /// The key could not be read.
    Rejected(Disposition, BizKey),
    /// Redis remembered the key as done.
    RedisDuplicate(BizKey, Option<Claim>),
    /// To be claimed in `table`.
    Claim(BizKey, &'static ClaimTable),
}

/// What the transaction decided for one delivery.
enum Decided {
    Committed(Effect),
    /// Another delivery, outside this group, holds the key in this table.
    Taken(&'static ClaimTable),
    /// An earlier delivery of this group claimed the key.
    TakenInGroup(usize),
    /// The archive holds the key (the late-duplicate guard).
    Archived(Claim),
    Refused(HandlerError),
}

/// The savepoint each delivery's handler runs in. One name serves all: a rollback goes to the
/// latest savepoint of that name, which is the running delivery's.
const SAVEPOINT: &str = "SAVEPOINT idemgate_delivery";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idemgate_delivery";

/// Phases the whole group shares.
#[derive(Default, Clone, Copy)]
struct Shared {
    begin_us: u64,
    claim_us: u64,
    lookup_us: u64,
    log_us: u64,
    commit_us: u64,
}

impl Core {
    /// Processes `deliveries` as one group and answers in their order.
    pub(crate) async fn process_group(&self, deliveries: &[Delivery]) -> Vec<Disposition> {
        if deliveries.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let mut slots = match self.layout().await {
            Ok(layout) => deliveries
                .iter()
                .map(|d| {
                    let before = match self.routes.resolve(d) {
                        Ok(key) => {
                            let table = layout.table_for(
                                &self.identity.consumer_group,
                                &key.biz_type,
                                &key.biz_id,
                                key.execute_time,
                            );
                            Before::Claim(key, table)
                        }
                        Err(rejection) => rejected(d, rejection),
                    };
                    Slot { d, hash: d.payload_hash(), before, token: None, report: None, redis_us: 0 }
                })
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(error = %e, size = deliveries.len(), "could not read the claim layout; the group is split");
                return self.split(Vec::new(), deliveries, 0).await;
            }
        };
        self.ask_prefilter(&mut slots).await;

        let mut retries = 0;
        let answers = loop {
            match self.commit_group(&slots, started).await {
                Ok(answers) => break Ok(answers),
                Err(e) if is_transient(&e) && retries < self.policy.transient_retries => {
                    retries += 1;
                    let jitter = rand::random_range(0..=5u64 << retries);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                Err(e) => break Err(e),
            }
        };
        let answers = match answers {
            Ok(answers) => answers,
            Err(e) => {
                tracing::warn!(
                    error = %e, size = slots.len(), retries,
                    "a group could not commit; each of its deliveries goes through the gate alone"
                );
                return self.split(slots, deliveries, retries).await;
            }
        };

        let mut out = Vec::with_capacity(slots.len());
        let settles = slots.into_iter().zip(answers).map(|(mut slot, (mut r, claim))| async move {
            if let (Some(p), Some(token)) = (self.prefilter.as_deref(), slot.token.take()) {
                let settling = Instant::now();
                let settled = p.settle(token, claim.as_ref().map_or(Settle::Release, Settle::Done)).await;
                slot.redis_us += micros(settling.elapsed());
                if let Some(report) = slot.report.as_mut() {
                    report.settled = Some(settled);
                }
            }
            r.phases.redis_us += slot.redis_us;
            r.prefilter = slot.report;
            r.latency = started.elapsed();
            (slot.d, r)
        });
        for (d, r) in futures_util::future::join_all(settles).await {
            self.observe(d, &r);
            out.push(r);
        }
        self.observe_group(GroupReport { size: out.len(), end: GroupEnd::Committed, retries });
        out
    }

    /// Asks Redis about every covered key at once (the connection pipelines them).
    async fn ask_prefilter(&self, slots: &mut [Slot<'_>]) {
        let Some(p) = self.prefilter.as_deref() else { return };
        let group = self.identity.consumer_group.as_str();
        let checks = slots.iter().map(|slot| async move {
            match &slot.before {
                Before::Claim(key, _) if p.covers(&key.biz_type) => {
                    let asked = Instant::now();
                    Some((p.check(group, key).await, micros(asked.elapsed())))
                }
                _ => None,
            }
        });
        let checks = futures_util::future::join_all(checks).await;
        for (slot, check) in slots.iter_mut().zip(checks) {
            let Some((check, us)) = check else { continue };
            slot.redis_us += us;
            slot.report = Some(PrefilterReport::of(&check));
            match check {
                Check::Owned(token) => slot.token = Some(token),
                Check::Duplicate(earlier) => {
                    if let Before::Claim(key, _) = &slot.before {
                        slot.before = Before::RedisDuplicate(key.clone(), earlier);
                    }
                }
                Check::InFlight | Check::Fallback(_) => {}
            }
        }
    }

    /// One try at the group's transaction. Returns each delivery's disposition (not yet
    /// timed) and the claim that now holds its key, for the pre-filter.
    async fn commit_group(
        &self,
        slots: &[Slot<'_>],
        started: Instant,
    ) -> Result<Vec<(Disposition, Option<Claim>)>, sqlx::Error> {
        let backend = self.store.backend();
        let path = ClaimPath::of(&self.store);
        let now_ms = now_ms();
        let who = self.claimant(now_ms);
        let mut shared = Shared::default();
        let mut handler_us = vec![0u64; slots.len()];
        let mut watch = Stopwatch::start();

        let mut tx = self.store.begin().await?;
        watch.lap(&mut shared.begin_us);
        let mut decided: Vec<Option<Decided>> = (0..slots.len()).map(|_| None).collect();
        // Rounds: the first undecided copy of each key claims it; later copies wait for the
        // round's verdict on that key.
        loop {
            let mut leaders: HashMap<(&str, &str, &str, i64), usize> = HashMap::new();
            for (i, slot) in slots.iter().enumerate() {
                if let (Before::Claim(key, table), None) = (&slot.before, &decided[i]) {
                    leaders.entry((table.name, &key.biz_type, &key.biz_id, key.execute_time)).or_insert(i);
                }
            }
            if leaders.is_empty() {
                break;
            }
            let mut round: Vec<usize> = leaders.values().copied().collect();
            round.sort_unstable();

            for (table, members) in by_table(slots, round.iter().copied()).values() {
                let claimed = claim_many(&mut tx, backend, path, table, &who, slots, members).await?;
                for &i in members {
                    if !claimed.contains(&i) {
                        decided[i] = Some(Decided::Taken(table));
                    }
                }
            }
            watch.lap(&mut shared.claim_us);

            // Handlers that name the shared row they lock run in that row's order, so that
            // two groups in flight take their locks in one order and never deadlock.
            let mut fresh: Vec<(Option<String>, usize)> = round
                .iter()
                .filter(|&&i| decided[i].is_none())
                .filter_map(|&i| match &slots[i].before {
                    Before::Claim(key, _) => {
                        let work = Work { delivery: slots[i].d, key, backend, now_ms };
                        Some((self.handlers.get(&key.handler).and_then(|h| h.lock_order(&work)), i))
                    }
                    _ => None,
                })
                .collect();
            fresh.sort();
            for (_, i) in fresh {
                let Before::Claim(key, table) = &slots[i].before else { continue };
                let d = slots[i].d;
                (&mut *tx).execute(AssertSqlSafe(SAVEPOINT)).await?;
                let archived = match self.late_duplicate_guard {
                    true => super::guard::archived_claim(&mut tx, backend, who.consumer_group, key).await?,
                    false => None,
                };
                if let Some(archived) = archived {
                    take_back(&mut tx, backend, table, who.consumer_group, key).await?;
                    decided[i] = Some(Decided::Archived(archived));
                    continue;
                }
                let handler = self
                    .handlers
                    .get(&key.handler)
                    .expect("Gate::new checked that every route's handler exists");
                let work = Work { delivery: d, key, backend, now_ms };
                let handling = Instant::now();
                let result = handler.handle(&work, &mut tx).await;
                handler_us[i] = micros(handling.elapsed());
                decided[i] = Some(match result {
                    Ok(effect) => Decided::Committed(effect),
                    // A deadlock may have rolled back more than the savepoint (InnoDB rolls
                    // back the whole transaction): the group starts again.
                    Err(HandlerError::Database(e)) if is_transient(&e) => return Err(e),
                    Err(why) => {
                        take_back(&mut tx, backend, table, who.consumer_group, key).await?;
                        Decided::Refused(match why {
                            HandlerError::Database(e) => {
                                HandlerError::Retryable(format!("database error: {e}"))
                            }
                            other => other,
                        })
                    }
                });
            }
            // Savepoints, rollbacks and taken-back claims count as claiming; the handlers' own
            // time is counted per delivery.
            let mut round_us = 0;
            watch.lap(&mut round_us);
            let handlers_us: u64 = round.iter().map(|&i| handler_us[i]).sum();
            shared.claim_us += round_us.saturating_sub(handlers_us);

            // Later copies of a key this round decided.
            let verdicts: HashMap<(&str, &str, &str, i64), usize> = leaders;
            for i in 0..slots.len() {
                if decided[i].is_some() {
                    continue;
                }
                let Before::Claim(key, table) = &slots[i].before else { continue };
                let Some(&leader) = verdicts.get(&(table.name, &key.biz_type, &key.biz_id, key.execute_time))
                else {
                    continue;
                };
                decided[i] = match &decided[leader] {
                    Some(Decided::Committed(_)) => Some(Decided::TakenInGroup(leader)),
                    Some(Decided::Taken(t)) => Some(Decided::Taken(t)),
                    Some(Decided::Archived(c)) => Some(Decided::Archived(c.clone())),
                    Some(Decided::TakenInGroup(j)) => Some(Decided::TakenInGroup(*j)),
                    // The copy that claimed it failed: the next copy tries in the next round.
                    Some(Decided::Refused(_)) | None => None,
                };
            }
        }
        let earlier = self.earlier_claims(&mut tx, backend, slots, &decided).await;
        watch.lap(&mut shared.lookup_us);

        let phases_of = |i: usize| Phases {
            begin_us: shared.begin_us,
            claim_us: shared.claim_us,
            handler_us: handler_us[i],
            lookup_us: shared.lookup_us,
            group_size: u32::try_from(slots.len()).unwrap_or(u32::MAX),
            ..Phases::default()
        };
        let mut answers = Vec::with_capacity(slots.len());
        for (i, slot) in slots.iter().enumerate() {
            let d = slot.d;
            let phases = phases_of(i);
            let answer = match (&slot.before, decided[i].take()) {
                (Before::Rejected(r, _), _) => (r.clone(), None),
                (Before::RedisDuplicate(key, claim), _) => {
                    let mut r =
                        self.duplicate_disposition(d, key, &slot.hash, Layer::Redis, claim.as_ref(), phases);
                    r.key = Some(key.clone());
                    (r, claim.clone())
                }
                (Before::Claim(key, _), Some(Decided::Committed(effect))) => {
                    if let Effect::AlreadyApplied { layer, .. } = &effect {
                        self.warn_duplicate(d, key, DuplicateCause::Unknown, Some(*layer));
                    }
                    let mut r = committed_disposition(d, key.clone(), &effect, phases);
                    r.error = effect.detail().map(str::to_owned);
                    (r, Some(claim_of(d, &slot.hash)))
                }
                (Before::Claim(key, _), Some(Decided::Taken(_))) => {
                    let claim = earlier.get(&i).cloned();
                    let mut r =
                        self.duplicate_disposition(d, key, &slot.hash, Layer::Db, claim.as_ref(), phases);
                    r.key = Some(key.clone());
                    (r, claim)
                }
                (Before::Claim(key, _), Some(Decided::TakenInGroup(j))) => {
                    let claim = claim_of(slots[j].d, &slots[j].hash);
                    let mut r =
                        self.duplicate_disposition(d, key, &slot.hash, Layer::Db, Some(&claim), phases);
                    r.key = Some(key.clone());
                    (r, Some(claim))
                }
                (Before::Claim(key, _), Some(Decided::Archived(claim))) => {
                    let mut r = self.duplicate_disposition(
                        d,
                        key,
                        &slot.hash,
                        Layer::LateDuplicate,
                        Some(&claim),
                        phases,
                    );
                    r.key = Some(key.clone());
                    (r, Some(claim))
                }
                (Before::Claim(key, _), Some(Decided::Refused(why))) => {
                    let mut r = self.refusal_disposition(d, key, why, phases);
                    // As alone: an invalid delivery's metrics carry no biz_type.
                    r.key = (r.outcome != Outcome::Invalid).then(|| key.clone());
                    (r, None)
                }
                (Before::Claim(..), None) => unreachable!("the rounds end when every claim is decided"),
            };
            answers.push(answer);
        }

        let logged_at_ms = crate::clock::now_ms();
        let latency = started.elapsed();
        for (r, _) in &mut answers {
            r.latency = latency;
        }
        let entries: Vec<Entry<'_>> = slots
            .iter()
            .zip(&answers)
            .map(|(slot, (r, _))| {
                let (key, hash) = match &slot.before {
                    Before::Rejected(_, key) => (key, None),
                    Before::RedisDuplicate(key, _) | Before::Claim(key, _) => (key, Some(slot.hash.as_str())),
                };
                self.entry(slot.d, Some(key), hash, r, logged_at_ms)
            })
            .collect();
        delivery_log::append_many(&mut tx, backend, &entries).await?;
        drop(entries);
        watch.lap(&mut shared.log_us);
        tx.commit().await?;
        watch.lap(&mut shared.commit_us);
        for (r, _) in &mut answers {
            r.logged = true;
            r.phases.group_size = u32::try_from(slots.len()).unwrap_or(u32::MAX);
            r.phases.log_us = shared.log_us;
            r.phases.commit_us = shared.commit_us;
        }
        Ok(answers)
    }

    /// The claims that deliveries outside the group hold, read in one statement per table. On
    /// MariaDB on a connection of its own: a read inside the group's transaction could miss a
    /// claim committed after the transaction's snapshot (repeatable read). PostgreSQL's read
    /// committed sees it from inside, and SQLite's writer is the only one.
    async fn earlier_claims(
        &self,
        tx: &mut Conn,
        backend: Backend,
        slots: &[Slot<'_>],
        decided: &[Option<Decided>],
    ) -> HashMap<usize, Claim> {
        let taken = (0..slots.len()).filter(|&i| matches!(decided[i], Some(Decided::Taken(_))));
        let by_table = by_table(slots, taken);
        let mut found = HashMap::new();
        if by_table.is_empty() {
            return found;
        }
        let read = async {
            let mut own: Option<sqlx::pool::PoolConnection<sqlx::Any>> = None;
            let conn: &mut Conn = match backend {
                Backend::MySql => &mut *own.insert(self.store.pool().acquire().await?),
                Backend::Postgres | Backend::Sqlite => tx,
            };
            for (table, members) in by_table.values() {
                find_many(conn, backend, table, &self.identity.consumer_group, slots, members, &mut found)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = read.await {
            tracing::warn!(error = %e, "could not read the earlier claims of a group's duplicates; their causes are logged as unknown");
        }
        found
    }

    /// Each delivery through the gate alone, after the group could not commit. Keys the
    /// pre-filter gave this group are released first, so each delivery asks again.
    async fn split(&self, slots: Vec<Slot<'_>>, deliveries: &[Delivery], retries: u32) -> Vec<Disposition> {
        if let Some(p) = self.prefilter.as_deref() {
            for mut slot in slots {
                if let Some(token) = slot.token.take() {
                    p.settle(token, Settle::Release).await;
                }
            }
        }
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            out.push(self.process(d).await);
        }
        self.observe_group(GroupReport { size: out.len(), end: GroupEnd::Split, retries });
        out
    }

    fn observe_group(&self, report: GroupReport) {
        if let Some(observer) = &self.observer {
            observer.group(&report);
        }
    }
}

/// The slots `indices` (deliveries with a key to claim) by their claim table, in table order.
fn by_table<'t>(
    slots: &[Slot<'_>],
    indices: impl Iterator<Item = usize>,
) -> BTreeMap<&'t str, (&'static ClaimTable, Vec<usize>)> {
    let mut tables: BTreeMap<&str, (&'static ClaimTable, Vec<usize>)> = BTreeMap::new();
    for i in indices {
        if let Before::Claim(_, table) = &slots[i].before {
            tables.entry(table.name).or_insert_with(|| (*table, Vec::new())).1.push(i);
        }
    }
    tables
}

fn rejected(d: &Delivery, rejection: Rejection) -> Before {
    let (r, key) = rejection_disposition(d, rejection);
    Before::Rejected(r, key)
}

/// Rolls the running delivery back to its savepoint and deletes its claim: when the group
/// commits, the key is free for a retry.
async fn take_back(
    tx: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    key: &BizKey,
) -> Result<(), sqlx::Error> {
    (&mut *tx).execute(AssertSqlSafe(ROLLBACK_TO_SAVEPOINT)).await?;
    query(backend, &table.release)
        .bind(consumer_group)
        .bind(key.biz_type.as_str())
        .bind(key.biz_id.as_str())
        .bind(key.execute_time)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The batch claim's columns.
const CLAIM_COLUMNS: &str = "(consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms)";

/// How a group's multi-row claim learns which of its keys it inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPath {
    /// The insert returns the rows it inserted: `ON CONFLICT DO NOTHING RETURNING` on
    /// PostgreSQL and SQLite, `INSERT IGNORE … RETURNING` on MariaDB 10.5+.
    Returning,
    /// MySQL has no `INSERT … RETURNING`: `INSERT IGNORE`, then the rows this group wrote read
    /// back in the same transaction.
    ReadBack,
}

impl ClaimPath {
    /// The path `store`'s server allows ([`crate::store::Store::insert_returns_rows`]).
    pub fn of(store: &crate::store::Store) -> Self {
        if store.insert_returns_rows() { Self::Returning } else { Self::ReadBack }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Returning => "one insert returning the claimed keys",
            Self::ReadBack => "INSERT IGNORE, then the group's own claims read back",
        }
    }
}

/// Claims the keys of `members` (one copy of each key) in `table` with one multi-row insert
/// that skips taken keys, in key order. Returns the members whose claim was inserted.
async fn claim_many(
    tx: &mut Conn,
    backend: Backend,
    path: ClaimPath,
    table: &ClaimTable,
    who: &Claimant<'_>,
    slots: &[Slot<'_>],
    members: &[usize],
) -> Result<HashSet<usize>, sqlx::Error> {
    let mut ordered: Vec<(usize, &BizKey)> = members
        .iter()
        .filter_map(|&i| match &slots[i].before {
            Before::Claim(key, _) => Some((i, key)),
            _ => None,
        })
        .collect();
    ordered.sort_by(|a, b| {
        (&a.1.biz_type, &a.1.biz_id, a.1.execute_time).cmp(&(&b.1.biz_type, &b.1.biz_id, b.1.execute_time))
    });
    let mut claimed = HashSet::new();
    for chunk in ordered.chunks(MAX_BATCH) {
        let values = values_list(9, chunk.len());
        // The route checked every value against its column, so IGNORE can only skip a taken
        // key here, never cut a value (and the read-back would notice if it did).
        let sql = match (backend, path) {
            (Backend::Postgres | Backend::Sqlite, _) => format!(
                "INSERT INTO {} {CLAIM_COLUMNS} VALUES {values} \
                 ON CONFLICT (consumer_group, biz_type, biz_id, execute_time) DO NOTHING \
                 RETURNING biz_type, biz_id, execute_time",
                table.name
            ),
            (Backend::MySql, ClaimPath::Returning) => format!(
                "INSERT IGNORE INTO {} {CLAIM_COLUMNS} VALUES {values} RETURNING biz_type, biz_id, execute_time",
                table.name
            ),
            (Backend::MySql, ClaimPath::ReadBack) => {
                format!("INSERT IGNORE INTO {} {CLAIM_COLUMNS} VALUES {values}", table.name)
            }
        };
        let mut q = query_built(backend, sql);
        for &(i, key) in chunk {
            let d = slots[i].d;
            q = q
                .bind(who.consumer_group.to_owned())
                .bind(key.biz_type.clone())
                .bind(key.biz_id.clone())
                .bind(key.execute_time)
                .bind(d.msg_id.clone())
                .bind(d.uniq_key.clone())
                .bind(slots[i].hash.clone())
                .bind(who.instance_id.to_owned())
                .bind(who.now_ms);
        }
        let inserted = match (backend, path) {
            (Backend::MySql, ClaimPath::ReadBack) => {
                let count = q.execute(&mut *tx).await?.rows_affected();
                let ours = read_back(tx, backend, table, who, slots, chunk).await?;
                // Every row this insert wrote is visible to its own transaction and matches the
                // values it wrote. More matches than rows inserted: another delivery's claim
                // looks exactly like one of ours (the same message claimed in the same
                // millisecond by this instance), fewer: a value was not stored as written.
                // Either way this group cannot tell, and each delivery goes through the gate
                // alone, whose claim is exact.
                if ours.len() as u64 != count {
                    return Err(sqlx::Error::Protocol(format!(
                        "the group's claim inserted {count} rows but {} read back as its own",
                        ours.len()
                    )));
                }
                ours
            }
            _ => {
                let rows = q.fetch_all(&mut *tx).await?;
                let mut inserted = HashSet::with_capacity(rows.len());
                for row in rows {
                    inserted.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
                }
                inserted
            }
        };
        for &(i, key) in chunk {
            if inserted.contains(&(key.biz_type.clone(), key.biz_id.clone(), key.execute_time)) {
                claimed.insert(i);
            }
        }
    }
    Ok(claimed)
}

/// The keys of `chunk` whose claim in `table` is the one this group just wrote: the same
/// message (msgId, UNIQ_KEY, body hash), by this instance, at this group's claim time.
async fn read_back(
    tx: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    who: &Claimant<'_>,
    slots: &[Slot<'_>],
    chunk: &[(usize, &BizKey)],
) -> Result<HashSet<(String, String, i64)>, sqlx::Error> {
    let any_of = vec![
        "(biz_type = ? AND biz_id = ? AND execute_time = ? AND msg_id = ? AND uniq_key = ? AND payload_hash = ?)";
        chunk.len()
    ]
    .join(" OR ");
    let sql = format!(
        "SELECT biz_type, biz_id, execute_time FROM {} \
         WHERE consumer_group = ? AND instance_id = ? AND claimed_at_ms = ? AND ({any_of})",
        table.name
    );
    let mut q = query_built(backend, sql)
        .bind(who.consumer_group.to_owned())
        .bind(who.instance_id.to_owned())
        .bind(who.now_ms);
    for &(i, key) in chunk {
        let d = slots[i].d;
        q = q
            .bind(key.biz_type.clone())
            .bind(key.biz_id.clone())
            .bind(key.execute_time)
            .bind(d.msg_id.clone())
            .bind(d.uniq_key.clone())
            .bind(slots[i].hash.clone());
    }
    let mut ours = HashSet::with_capacity(chunk.len());
    for row in q.fetch_all(&mut *tx).await? {
        ours.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
    }
    Ok(ours)
}

/// Keys per statement that reads earlier claims.
const FIND_CHUNK: usize = 16;

/// Reads the claims of `members`' keys from `table` in one statement per [`FIND_CHUNK`] keys.
async fn find_many(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    slots: &[Slot<'_>],
    members: &[usize],
    found: &mut HashMap<usize, Claim>,
) -> Result<(), sqlx::Error> {
    let keyed: Vec<(usize, &BizKey)> = members
        .iter()
        .filter_map(|&i| match &slots[i].before {
            Before::Claim(key, _) => Some((i, key)),
            _ => None,
        })
        .collect();
    for chunk in keyed.chunks(FIND_CHUNK) {
        // Always FIND_CHUNK conditions, the last key repeated: one statement text, prepared
        // once per connection, instead of one per count of duplicates.
        let any_of = vec!["(biz_type = ? AND biz_id = ? AND execute_time = ?)"; FIND_CHUNK].join(" OR ");
        let sql = format!(
            "SELECT msg_id, uniq_key, payload_hash, biz_type, biz_id, execute_time FROM {} \
             WHERE consumer_group = ? AND ({any_of})",
            table.name
        );
        let mut q = query_built(backend, sql).bind(consumer_group.to_owned());
        let last = chunk[chunk.len() - 1].1;
        for key in chunk.iter().map(|(_, k)| *k).chain(std::iter::repeat(last)).take(FIND_CHUNK) {
            q = q.bind(key.biz_type.clone()).bind(key.biz_id.clone()).bind(key.execute_time);
        }
        let mut claims: HashMap<(String, String, i64), Claim> = HashMap::new();
        for row in q.fetch_all(&mut *conn).await? {
            claims.insert((row.try_get(3)?, row.try_get(4)?, row.try_get(5)?), Claim::from_row(&row)?);
        }
        for &(i, key) in chunk {
            if let Some(c) = claims.get(&(key.biz_type.clone(), key.biz_id.clone(), key.execute_time)) {
                found.insert(i, c.clone());
            }
        }
    }
    Ok(())
}
