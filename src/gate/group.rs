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
//! [`super::committer`] turns single deliveries into groups; the multi-row statements are the
//! claim's ([`super::claim`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use sqlx::{AssertSqlSafe, Executor};

use super::claim::{ClaimPath, Member, claim_many, find_many};
use super::core::{Core, RETRY_BASE_MS};
use super::disposition::{Disposition, Phases, committed_disposition, rejection_disposition};
use super::observer::{GroupEnd, GroupReport};
use crate::clock::{Stopwatch, micros, now_ms};
use crate::delivery::Delivery;
use crate::delivery_log::{self, Entry};
use crate::handler::{Effect, HandlerError, Work};
use crate::layout::ClaimTable;
use crate::outcome::{Claim, DuplicateCause, Layer, Outcome};
use crate::prefilter::{Check, PrefilterReport, Settle, Token, claim_of};
use crate::route::{BizKey, Rejection};
use crate::store::{Backend, Conn, is_transient, query, retry_transient};

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

        let (answers, retries) = retry_transient(self.policy.transient_retries, RETRY_BASE_MS, || {
            self.commit_group(&slots, started)
        })
        .await;
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
                let claimed = claim_many(&mut tx, backend, path, table, &who, members).await?;
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
                find_many(conn, backend, table, &self.identity.consumer_group, members, &mut found).await?;
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
    key.bind_in(query(backend, &table.release), consumer_group).execute(&mut *tx).await?;
    Ok(())
}
