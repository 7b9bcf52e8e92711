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
//!    this group's claim: [`super::claim::ClaimPath`]), in key order so that two groups wait for each other
//!    in one direction only;
//! 3. on the batch path, one savepoint is taken and each handler's batch form takes its fresh
//!    deliveries at once ([`crate::handler::Handler::handle_batch`]); a refused delivery's
//!    claim is deleted. If a batch fails, the group rolls back to that savepoint and runs as
//!    without the batch path: each fresh claim's handler inside its **own savepoint**. A
//!    handler that fails is rolled back to its savepoint and its claim deleted, so its key is
//!    unclaimed when the group commits and the delivery goes to retry, while the others commit;
//! 4. a key twice in one group: the first copy claims it, and the later copies are duplicates
//!    of that claim; if the first copy's handler failed, the next copy claims it in a further
//!    round, exactly as it would have alone;
//! 5. the earlier claims of the keys other deliveries hold, to name each duplicate's cause,
//!    come back from the claim statement itself on PostgreSQL, and are read in one statement
//!    per table otherwise (and for a claim committed while the insert waited for it);
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
//! alone, so one delivery that breaks the transaction cannot hold the others back. A lock wait
//! that ran out (`database.lock_timeout_ms`) splits the group at once: the lock is held
//! elsewhere, maybe for long, and only the deliveries that need it should wait for it again.
//!
//! **A COMMIT that lost its connection** may have committed the whole group. Before the group
//! runs again, it looks for its own log rows on a fresh connection (one row of the group, by
//! msgId, instance and the group's logging millisecond: they commit together or not at all). Found:
//! the group committed, and its deliveries get the answers it decided, with no second row and
//! nothing applied twice. Absent: nothing committed, and the group runs again. Unreadable: the
//! keys it claimed are remembered as ambiguous ([`super::ambiguous`]), so that the retry that
//! finds their claims logs them `ambiguous_commit`, not `redelivery`.
//!
//! The group's transaction must be ready to commit by the group's deadline, the earliest of its
//! deliveries' (see [`super::core`]); else it is rolled back and split, and each delivery,
//! alone and already out of time, is answered retry.
//!
//! [`super::committer`] turns single deliveries into groups; the multi-row statements are the
//! claim's ([`super::claim`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use sqlx::{AssertSqlSafe, Executor};

use super::claim::{ClaimPath, Member, claim_many, find_many};
use super::core::{Core, until};
use super::disposition::{Disposition, Phases, committed_disposition, rejection_disposition};
use super::observer::{CommitScope, GroupEnd, GroupReport, ReadBack};
use crate::clock::{Stopwatch, micros, now_ms};
use crate::delivery::Delivery;
use crate::delivery_log::{self, Entry};
use crate::handler::{Effect, HandlerError, Work, handle_each};
use crate::layout::ClaimTable;
use crate::outcome::{Claim, ClaimDelivery, DuplicateCause, Layer, Outcome};
use crate::prefilter::{Check, PrefilterReport, Settle, Token, claim_of};
use crate::route::{BizKey, Rejection};
use crate::store::{Backend, Conn, Retries, TransientCause, connection_lost, is_transient, query};
use crate::throttle::Throttle;

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

/// The savepoint a group's batch forms run after: taken once the claims are in, rolled back to
/// when a batch fails, so that the group runs again one delivery at a time.
const GROUP_SAVEPOINT: &str = "SAVEPOINT idemgate_group";
const ROLLBACK_TO_GROUP_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idemgate_group";

/// A handler's answer for one delivery, and its time for it in microseconds.
type Handled = (Result<Effect, HandlerError>, u64);

/// Phases the whole group shares.
#[derive(Default, Clone, Copy)]
struct Shared {
    begin_us: u64,
    claim_us: u64,
    lookup_us: u64,
    log_us: u64,
    commit_us: u64,
}

/// Why a group's transaction did not commit.
enum Unfinished {
    /// It failed, after its retries of transient conflicts.
    Failed(sqlx::Error),
    /// A statement waited for a lock to the end of its lock timeout: not retried as a group.
    LockWait(sqlx::Error),
    /// The group's deadline came first.
    Overdue,
}

impl Core {
    /// Processes `deliveries` as one group by `due` and answers in their order.
    pub(crate) async fn process_group(&self, deliveries: &[Delivery], due: Instant) -> Vec<Disposition> {
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
                        Err(rejection) => rejected(d, rejection, &self.invalid_warnings),
                    };
                    Slot { d, hash: d.payload_hash(), before, token: None, report: None, redis_us: 0 }
                })
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(error = %e, size = deliveries.len(), "could not read the claim layout; the group is split");
                return self.split(Vec::new(), deliveries, 0, due).await;
            }
        };
        self.ask_prefilter(&mut slots).await;

        let galera = self.store.is_galera();
        let (answers, retries) = self
            .retried(|| async {
                match self.commit_group(&slots, started, due).await {
                    Ok(Some(answers)) => Ok(Ok(answers)),
                    Ok(None) => Ok(Err(Unfinished::Overdue)),
                    Err(e) if crate::store::transient_cause(&e, galera) == Some(TransientCause::LockWait) => {
                        Ok(Err(Unfinished::LockWait(e)))
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        let unfinished = match answers {
            Ok(Ok(answers)) => Ok(answers),
            Ok(Err(unfinished)) => Err(unfinished),
            Err(e) => Err(Unfinished::Failed(e)),
        };
        let answers = match unfinished {
            Ok(answers) => answers,
            Err(unfinished) => {
                let size = slots.len();
                match &unfinished {
                    Unfinished::Failed(e) => tracing::warn!(
                        error = %e, size, retries,
                        "a group could not commit; each of its deliveries goes through the gate alone"
                    ),
                    Unfinished::LockWait(e) => {
                        // Its deliveries start again alone: a retry of the lock wait, counted so.
                        if let Some(observer) = &self.observer {
                            observer.transient_retries(&Retries::of(TransientCause::LockWait));
                        }
                        tracing::info!(
                            error = %e, size,
                            "a group waited for a lock to the end of database.lock_timeout_ms; each of its deliveries goes through the gate alone"
                        );
                    }
                    Unfinished::Overdue => tracing::warn!(
                        size,
                        retries,
                        "a group was not ready to commit by its deadline (consumer.delivery_timeout_ms); rolled back, each of its deliveries is answered retry"
                    ),
                }
                return self.split(slots, deliveries, retries, due).await;
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

    /// One try at the group's transaction, ready to commit by `due` or rolled back (`None`).
    /// Returns each delivery's disposition (not yet timed) and the claim that now holds its
    /// key, for the pre-filter.
    async fn commit_group(
        &self,
        slots: &[Slot<'_>],
        started: Instant,
        due: Instant,
    ) -> Result<Option<Vec<(Disposition, Option<Claim>)>>, sqlx::Error> {
        let mut shared = Shared::default();
        let mut watch = Stopwatch::start();
        let Some(ready) = until(due, self.prepare_group(slots, started, &mut shared, &mut watch)).await
        else {
            return Ok(None);
        };
        let (tx, mut answers, logged_at_ms) = ready?;
        if let Err(e) = tx.commit().await
            && (!connection_lost(&e) || !self.group_committed(slots, &answers, logged_at_ms, due).await)
        {
            return Err(e);
        }
        watch.lap(&mut shared.commit_us);
        for (r, _) in &mut answers {
            r.logged = true;
            r.phases.group_size = u32::try_from(slots.len()).unwrap_or(u32::MAX);
            r.phases.log_us = shared.log_us;
            r.phases.commit_us = shared.commit_us;
        }
        Ok(Some(answers))
    }

    /// After the group's COMMIT lost its connection: whether the group committed, read from its
    /// own log rows on a fresh connection (the first delivery's row at `logged_at_ms`), by the
    /// deadline's grace. When that cannot be read, the keys the group claimed are remembered as
    /// ambiguous for the retry, and the group is taken as not committed.
    async fn group_committed(
        &self,
        slots: &[Slot<'_>],
        answers: &[(Disposition, Option<Claim>)],
        logged_at_ms: i64,
        due: Instant,
    ) -> bool {
        let (Some(slot), Some((first, _))) = (slots.first(), answers.first()) else { return false };
        let backend = self.store.backend();
        let (key, hash) = match &slot.before {
            Before::Rejected(_, key) => (key, None),
            Before::RedisDuplicate(key, _) | Before::Claim(key, _) => (key, Some(slot.hash.as_str())),
        };
        let entry = self.entry(slot.d, Some(key), hash, first, logged_at_ms);
        let read = self.retried(|| async {
            let mut conn = self.store.pool().acquire().await?;
            delivery_log::is_logged(&mut conn, backend, &entry).await
        });
        let read = until(due + super::core::ANSWER_GRACE, read).await.map(|(read, _)| read);
        if let Some(observer) = &self.observer {
            let read_back = match &read {
                Some(Ok(true)) => ReadBack::Committed,
                Some(Ok(false)) => ReadBack::NotCommitted,
                Some(Err(_)) | None => ReadBack::Unread,
            };
            observer.ambiguous_commit(CommitScope::Group, read_back);
        }
        match read {
            Some(Ok(committed)) => {
                tracing::info!(
                    size = slots.len(),
                    committed,
                    "a group's COMMIT lost its connection; its log rows, read back, say whether it committed"
                );
                committed
            }
            Some(Err(_)) | None => {
                tracing::warn!(
                    size = slots.len(),
                    "a group's COMMIT lost its connection and its rows could not be read back; it runs again, and a claim it finds of its own is logged ambiguous_commit"
                );
                for (slot, (r, _)) in slots.iter().zip(answers) {
                    if let (Before::Claim(key, _), Outcome::Processed) = (&slot.before, r.outcome) {
                        self.unsettled.remember(key, slot.d);
                    }
                }
                false
            }
        }
    }

    /// The group's transaction up to its commit: the claims, the handlers, the log rows, and the
    /// rows' logging time.
    #[allow(clippy::type_complexity)]
    async fn prepare_group(
        &self,
        slots: &[Slot<'_>],
        started: Instant,
        shared: &mut Shared,
        watch: &mut Stopwatch,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Any>, Vec<(Disposition, Option<Claim>)>, i64), sqlx::Error>
    {
        let backend = self.store.backend();
        let path = ClaimPath::of(&self.store);
        let now_ms = now_ms();
        let who = self.claimant(now_ms);
        let mut handler_us = vec![0u64; slots.len()];

        let mut tx = self.store.begin().await?;
        watch.lap(&mut shared.begin_us);
        let mut decided: Vec<Option<Decided>> = (0..slots.len()).map(|_| None).collect();
        // The claims that held taken keys, where the claim statement returned them.
        let mut held: HashMap<usize, Claim> = HashMap::new();
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
                let claimed = claim_many(&mut tx, backend, path, table, &who, members, &mut held).await?;
                for m in members {
                    if !claimed.contains(&m.index) {
                        decided[m.index] = Some(Decided::Taken(table));
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
            let mut fresh: Vec<usize> = fresh.into_iter().map(|(_, i)| i).collect();
            if self.late_duplicate_guard {
                let mut unarchived = Vec::with_capacity(fresh.len());
                for i in fresh {
                    let Before::Claim(key, table) = &slots[i].before else { continue };
                    match super::guard::archived_claim(&mut tx, backend, who.consumer_group, key).await? {
                        Some(archived) => {
                            release(&mut tx, backend, table, who.consumer_group, key).await?;
                            decided[i] = Some(Decided::Archived(archived));
                        }
                        None => unarchived.push(i),
                    }
                }
                fresh = unarchived;
            }
            let works: Vec<Work<'_>> = fresh
                .iter()
                .filter_map(|&i| match &slots[i].before {
                    Before::Claim(key, _) => Some(Work { delivery: slots[i].d, key, backend, now_ms }),
                    _ => None,
                })
                .collect();
            let batched = match self.batch_handlers {
                true => self.handle_batched(&mut tx, &works).await?,
                false => None,
            };
            let answers = match batched {
                Some(answers) => answers,
                None => self.handle_alone(&mut tx, &works).await?,
            };
            for ((&i, work), (answer, us)) in fresh.iter().zip(&works).zip(answers) {
                let Before::Claim(_, table) = &slots[i].before else { continue };
                handler_us[i] = us;
                decided[i] = Some(match answer {
                    Ok(effect) => Decided::Committed(effect),
                    // A deadlock may have rolled back more than the delivery's own work
                    // (InnoDB rolls back the whole transaction): the group starts again.
                    Err(HandlerError::Database(e)) if is_transient(&e) => return Err(e),
                    Err(why) => {
                        release(&mut tx, backend, table, who.consumer_group, work.key).await?;
                        Decided::Refused(match why {
                            HandlerError::Database(e) => {
                                HandlerError::Retryable(format!("database error: {e}"))
                            }
                            other => other,
                        })
                    }
                });
            }
            // The guard and the deletes of refused claims count as claiming; the handlers' own
            // time (their savepoints included) is counted per delivery.
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
        let (earlier, mut evidence) = self.earlier_claims(&mut tx, backend, slots, &decided, held).await;
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
                    let mut r = self.duplicate_disposition(
                        d,
                        key,
                        &slot.hash,
                        Layer::Redis,
                        (claim.as_ref(), None),
                        phases,
                    );
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
                    let applied = evidence.remove(&i);
                    let mut r = self.duplicate_disposition(
                        d,
                        key,
                        &slot.hash,
                        Layer::Db,
                        (claim.as_ref(), applied.as_ref()),
                        phases,
                    );
                    r.key = Some(key.clone());
                    (r, claim)
                }
                (Before::Claim(key, _), Some(Decided::TakenInGroup(j))) => {
                    let claim = claim_of(slots[j].d, &slots[j].hash);
                    let mut r = self.duplicate_disposition(
                        d,
                        key,
                        &slot.hash,
                        Layer::Db,
                        (Some(&claim), None),
                        phases,
                    );
                    r.key = Some(key.clone());
                    (r, Some(claim))
                }
                (Before::Claim(key, _), Some(Decided::Archived(claim))) => {
                    let mut r = self.duplicate_disposition(
                        d,
                        key,
                        &slot.hash,
                        Layer::LateDuplicate,
                        (Some(&claim), None),
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
        Ok((tx, answers, logged_at_ms))
    }

    /// The batch path: after one savepoint, each handler's batch form takes its fresh
    /// deliveries at once (handlers in name order, each one's deliveries in lock order), with
    /// no savepoint per delivery. `None` when a batch failed: the group is back at the
    /// savepoint, the fallback is counted, and the deliveries go through
    /// [`Core::handle_alone`] instead. Each answer comes with the handler's time for it.
    async fn handle_batched(
        &self,
        tx: &mut Conn,
        works: &[Work<'_>],
    ) -> Result<Option<Vec<Handled>>, sqlx::Error> {
        if works.is_empty() {
            return Ok(Some(Vec::new()));
        }
        (&mut *tx).execute(AssertSqlSafe(GROUP_SAVEPOINT)).await?;
        let mut by_handler: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (n, work) in works.iter().enumerate() {
            by_handler.entry(work.key.handler.as_str()).or_default().push(n);
        }
        let mut answers: Vec<Option<Handled>> = (0..works.len()).map(|_| None).collect();
        for (name, members) in by_handler {
            let handler =
                self.handlers.get(name).expect("Gate::new checked that every route's handler exists");
            let batch: Vec<Work<'_>> = members.iter().map(|&n| works[n]).collect();
            let started = Instant::now();
            let result = handler.handle_batch(&batch, tx).await;
            let us = micros(started.elapsed()) / batch.len() as u64;
            let why = match result {
                Ok(batch_answers) if batch_answers.len() == batch.len() => {
                    for (&n, answer) in members.iter().zip(batch_answers) {
                        answers[n] = Some((answer, us));
                    }
                    continue;
                }
                Err(HandlerError::Database(e)) if is_transient(&e) => return Err(e),
                Ok(batch_answers) => {
                    format!("{} answers for {} deliveries", batch_answers.len(), batch.len())
                }
                Err(e) => e.to_string(),
            };
            tracing::warn!(
                handler = name, size = batch.len(), error = %why,
                "a handler's batch failed; the group runs again one delivery at a time"
            );
            (&mut *tx).execute(AssertSqlSafe(ROLLBACK_TO_GROUP_SAVEPOINT)).await?;
            if let Some(observer) = &self.observer {
                observer.group_fallback(name);
            }
            return Ok(None);
        }
        Ok(answers.into_iter().collect())
    }

    /// The per-delivery path: each delivery through its handler alone, in lock order, in a
    /// savepoint of its own ([`handle_each`]), so that one failing delivery takes back only its
    /// own work. Each answer comes with the handler's time for it.
    async fn handle_alone(&self, tx: &mut Conn, works: &[Work<'_>]) -> Result<Vec<Handled>, sqlx::Error> {
        let mut out = Vec::with_capacity(works.len());
        for work in works {
            let handler = self
                .handlers
                .get(&work.key.handler)
                .expect("Gate::new checked that every route's handler exists");
            let started = Instant::now();
            let answer = match handle_each(handler.as_ref(), std::slice::from_ref(work), tx).await {
                Ok(answers) => answers
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| Err(HandlerError::Retryable("the handler gave no answer".to_owned()))),
                Err(HandlerError::Database(e)) => return Err(e),
                Err(other) => Err(other),
            };
            out.push((answer, micros(started.elapsed())));
        }
        Ok(out)
    }

    /// The claims that deliveries outside the group hold: those the claim statement returned
    /// (`held`, on PostgreSQL), and the others read in one statement per table; and the log's
    /// rows of the deliveries that made them, the evidence of their causes. On MariaDB on a
    /// connection of its own: a read inside the group's transaction could miss a claim committed
    /// after the transaction's snapshot (repeatable read). PostgreSQL's read committed sees it
    /// from inside, and SQLite's writer is the only one.
    async fn earlier_claims(
        &self,
        tx: &mut Conn,
        backend: Backend,
        slots: &[Slot<'_>],
        decided: &[Option<Decided>],
        held: HashMap<usize, Claim>,
    ) -> (HashMap<usize, Claim>, HashMap<usize, ClaimDelivery>) {
        let taken = (0..slots.len())
            .filter(|&i| matches!(decided[i], Some(Decided::Taken(_))) && !held.contains_key(&i));
        let by_table = by_table(slots, taken);
        let mut found = held;
        let mut applied = HashMap::new();
        if found.is_empty() && by_table.is_empty() {
            return (found, applied);
        }
        let mut own: Option<sqlx::pool::PoolConnection<sqlx::Any>> = None;
        let conn: &mut Conn = match backend {
            Backend::MySql => match self.store.pool().acquire().await {
                Ok(conn) => &mut *own.insert(conn),
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the earlier claims of a group's duplicates; their causes are logged as unknown");
                    return (found, applied);
                }
            },
            Backend::Postgres | Backend::Sqlite => tx,
        };
        let claims = async {
            for (table, members) in by_table.values() {
                find_many(conn, backend, table, &self.identity.consumer_group, members, &mut found).await?;
            }
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = claims.await {
            tracing::warn!(error = %e, "could not read the earlier claims of a group's duplicates; their causes are logged as unknown");
        }
        // What the log holds of the deliveries that made those claims
        // ([`delivery_log::applied`]): the stored copy each was read from, one duplicate at a
        // time, as duplicates are few. A read that fails leaves the rest unread: their causes
        // fall back to the claims alone.
        let deliveries = async {
            for (&i, claim) in &found {
                let Before::Claim(key, _) = &slots[i].before else { continue };
                let group = &self.identity.consumer_group;
                if let Some(row) = delivery_log::applied(conn, backend, group, key, claim).await? {
                    applied.insert(i, row);
                }
            }
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = deliveries.await {
            tracing::warn!(error = %e, "could not read what the log holds of the earlier claims' deliveries; their causes are read from the claims alone");
        }
        (found, applied)
    }

    /// Each delivery through the gate alone by the group's `due`, after the group could not
    /// commit. Keys the pre-filter gave this group are released first, so each delivery asks
    /// again.
    async fn split(
        &self,
        slots: Vec<Slot<'_>>,
        deliveries: &[Delivery],
        retries: u32,
        due: Instant,
    ) -> Vec<Disposition> {
        if let Some(p) = self.prefilter.as_deref() {
            for mut slot in slots {
                if let Some(token) = slot.token.take() {
                    p.settle(token, Settle::Release).await;
                }
            }
        }
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            out.push(self.process(d, due).await);
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

/// The slots `indices` that have a key to claim, by their claim table, in table order.
fn by_table<'s>(
    slots: &'s [Slot<'_>],
    indices: impl Iterator<Item = usize>,
) -> BTreeMap<&'static str, (&'static ClaimTable, Vec<Member<'s>>)> {
    let mut tables: BTreeMap<&str, (&'static ClaimTable, Vec<Member<'s>>)> = BTreeMap::new();
    for i in indices {
        let slot = &slots[i];
        if let Before::Claim(key, table) = &slot.before {
            let member = Member { index: i, key, delivery: slot.d, hash: &slot.hash };
            tables.entry(table.name).or_insert_with(|| (*table, Vec::new())).1.push(member);
        }
    }
    tables
}

fn rejected(d: &Delivery, rejection: Rejection, warnings: &Throttle) -> Before {
    let (r, key) = rejection_disposition(d, rejection, warnings);
    Before::Rejected(r, key)
}

/// Deletes the claim of a delivery that applied nothing (refused, or found in the archive): when
/// the group commits, the key is free for a retry.
async fn release(
    tx: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    key: &BizKey,
) -> Result<(), sqlx::Error> {
    key.bind_in(query(backend, &table.release), consumer_group).execute(&mut *tx).await?;
    Ok(())
}
