//! The single path: one delivery, one transaction. The claim, the handler and the log row
//! commit together or not at all; a duplicate rolls back and is logged in its own statement.
//!
//! **Every wait ends by the delivery's deadline** (`due`, [`Policy::delivery_timeout`] after its
//! listener call began). A transaction not ready to commit by then is dropped (rolled back: no
//! COMMIT is ever sent after the deadline) and the delivery is answered retry; the log row of a
//! delivery that did not commit gets [`ANSWER_GRACE`] more. A COMMIT already sent is waited for.
//!
//! **A COMMIT that loses its connection** ([`connection_lost`]) may have committed. The gate
//! remembers the attempt ([`super::ambiguous`]) and retries: a retry that finds this delivery's
//! own claim logs a `duplicate` with cause `ambiguous_commit`; when the retries run out, the
//! claim is read back on a fresh connection, and a claim of this delivery answers the delivery
//! as processed (its `processed` row committed with it) instead of `failed`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ambiguous::Unsettled;
use super::claim::Claimant;
use super::disposition::{Disposition, Phases, committed_disposition, rejection_disposition, replay_cause};
use super::guard;
use super::observer::{CommitScope, Observer, ReadBack};
use super::settings::{Identity, Policy, RETRY_BASE_MS};
use crate::clock::{Stopwatch, micros, now_ms};
use crate::delivery::Delivery;
use crate::delivery_log::{self, AttemptId, Entry};
use crate::handler::{Effect, HandlerError, Handlers, Work};
use crate::layout::Layout;
use crate::outcome::{Claim, ClaimDelivery, DuplicateCause, Layer, Outcome, Verdict, classify};
use crate::prefilter::{Check, Prefilter, PrefilterReport, Settle};
use crate::route::{BizKey, MAX_ID_CHARS, Rejection, Routes, excerpt};
use crate::store::{Store, connection_lost};
use crate::throttle::{Permit, Throttle};

/// After a delivery's deadline, how long its log row may still take to write: the answer of a
/// delivery that ran out of time is then still in the log. `consumer.delivery_timeout_ms` leaves
/// room for it below the broker client's deadline.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// The longest `consumer.delivery_timeout_ms` a broker that wants every delivery answered within
/// `answer_within` allows: the failed delivery's log row its grace ([`ANSWER_GRACE`])
/// and a second for the answer to travel, before the broker's deadline.
pub(crate) fn longest_delivery_timeout(answer_within: Duration) -> Duration {
    answer_within.saturating_sub(ANSWER_GRACE + Duration::from_secs(1))
}

/// Runs `work` until `due`; `None` when `due` came first. The work is dropped then: a
/// transaction it held rolls back, a statement it waited on is abandoned.
pub(super) async fn until<T>(due: Instant, work: impl Future<Output = T>) -> Option<T> {
    if Instant::now() >= due {
        return None;
    }
    tokio::time::timeout_at(tokio::time::Instant::from_std(due), work).await.ok()
}

/// The refusal of a delivery whose deadline came before its transaction was ready to commit.
pub(super) fn overdue(policy: &Policy) -> HandlerError {
    HandlerError::Retryable(format!(
        "ran out of time: not ready to commit within consumer.delivery_timeout_ms ({} ms) of its listener call; rolled back",
        policy.delivery_timeout.as_millis()
    ))
}

/// Everything a gate knows; the group committer's tasks share it.
pub(crate) struct Core {
    pub(super) store: Store,
    pub(super) routes: Routes,
    pub(super) handlers: Handlers,
    pub(super) identity: Identity,
    pub(super) policy: Policy,
    pub(super) duplicate_warnings: Throttle,
    /// The rate limit on invalid deliveries' warnings, of the same budget as duplicates'.
    pub(super) invalid_warnings: Throttle,
    pub(super) observer: Option<Arc<dyn Observer>>,
    /// See [`Gate::with_late_duplicate_guard`].
    pub(super) late_duplicate_guard: bool,
    /// Groups run their handlers' batch forms ([`GroupSettings::batch`](super::GroupSettings)).
    pub(super) batch_handlers: bool,
    /// See [`Gate::with_prefilter`].
    pub(super) prefilter: Option<Arc<Prefilter>>,
    /// The claim tables, read from the database on first use ([`crate::layout::recorded`]).
    pub(super) layout: tokio::sync::OnceCell<Layout>,
    /// The deliveries whose COMMIT lost its answer, until their fate is known.
    pub(super) unsettled: Unsettled,
    /// This run's record of what the consumer did, which attributes the redeliveries this gate
    /// logs ([`Gate::with_record`](super::Gate::with_record)).
    pub(super) record: Option<Arc<crate::instances::Record>>,
}

/// Where an attempt ended.
pub(super) enum Attempt {
    Committed {
        effect: Effect,
    },
    Taken(&'static crate::layout::ClaimTable),
    /// Claimed afresh, but the archive holds the key: a duplicate older than the retention.
    Archived(Claim),
    Refused(HandlerError),
    /// The deadline came before the transaction was ready to commit: rolled back.
    Overdue,
}

/// Where an attempt stood when its transaction was ready: to commit, or already ended.
enum Ready {
    Commit(sqlx::Transaction<'static, sqlx::Any>, Effect),
    Ended(Attempt),
}

impl Core {
    /// Decides `d` by `due`, and reports the disposition.
    pub(super) async fn process(&self, d: &Delivery, due: Instant) -> Disposition {
        let r = self.decide(d, due).await;
        self.observe(d, &r);
        r
    }

    pub(super) fn observe(&self, d: &Delivery, r: &Disposition) {
        if let Some(observer) = &self.observer {
            observer.delivery(d, r);
        }
    }

    /// Runs `attempt` again after each transient conflict, within the policy's
    /// `transient_retries`, and reports the retries by cause to the observer. Returns the last
    /// result and how many retries it took.
    pub(super) async fn retried<T, F: Future<Output = Result<T, sqlx::Error>>>(
        &self,
        attempt: impl FnMut() -> F,
    ) -> (Result<T, sqlx::Error>, u32) {
        let (result, retries) =
            self.store.retry_transient(self.policy.transient_retries, RETRY_BASE_MS, attempt).await;
        if retries.count() > 0
            && let Some(observer) = &self.observer
        {
            observer.transient_retries(&retries);
        }
        (result, retries.count())
    }

    pub(super) async fn decide(&self, d: &Delivery, due: Instant) -> Disposition {
        let started = Instant::now();
        let key = match self.routes.resolve(d) {
            Ok(key) => key,
            Err(rejection) => return self.reject(d, rejection, started, due).await,
        };
        let payload_hash = d.payload_hash();
        let mut phases = Phases::default();
        let prefilter = self.prefilter.as_deref().filter(|p| p.covers(&key.biz_type));
        let mut token = None;
        let mut report = None;
        if let Some(p) = prefilter {
            let asked = Instant::now();
            let check = p.check(&self.identity.consumer_group, &key).await;
            phases.redis_us += micros(asked.elapsed());
            report = Some(PrefilterReport::of(&check));
            match check {
                Check::Owned(t) => token = Some(t),
                Check::Duplicate(earlier) => {
                    let found = Found::Redis(earlier);
                    let (mut r, _) =
                        self.duplicate(d, key, &payload_hash, found, Span { started, due }, phases).await;
                    r.prefilter = report;
                    return r;
                }
                Check::InFlight | Check::Fallback(_) => {}
            }
        }
        let (mut r, settle) = self.conclude(d, key, &payload_hash, Span { started, due }, phases).await;
        if let (Some(p), Some(token)) = (prefilter, token) {
            let settling = Instant::now();
            let settled = p.settle(token, settle.as_ref().map_or(Settle::Release, Settle::Done)).await;
            r.phases.redis_us += micros(settling.elapsed());
            r.latency = started.elapsed();
            if let Some(report) = report.as_mut() {
                report.settled = Some(settled);
            }
        }
        r.prefilter = report;
        r
    }

    /// The database's part: the claim (with retries of transient conflicts) and its outcome.
    /// Also returns the claim that now holds the key, if any, for the pre-filter to remember.
    pub(super) async fn conclude(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        span: Span,
        phases: Phases,
    ) -> (Disposition, Option<Claim>) {
        let Span { started, .. } = span;
        // Every attempt's time counts, the failed ones' too.
        let timing = std::sync::Mutex::new(phases);
        let (attempt, retries) = self.retried(|| self.attempt(d, &key, payload_hash, span, &timing)).await;
        let mut phases = timing.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        phases.transient_retries += retries;
        if !matches!(attempt, Ok(Attempt::Taken(_)) | Err(_)) {
            // This attempt's own transaction decided: an earlier ambiguous one did not commit.
            self.unsettled.forget(&key, d);
        }
        match attempt {
            Ok(Attempt::Committed { effect }) => {
                let claim = crate::prefilter::claim_of(d, payload_hash);
                let mut r = committed_disposition(d, key, &effect, phases);
                r.latency = started.elapsed();
                (r, Some(claim))
            }
            Ok(Attempt::Taken(table)) => {
                self.duplicate(d, key, payload_hash, Found::Db(table), span, phases).await
            }
            Ok(Attempt::Archived(claim)) => {
                self.duplicate(d, key, payload_hash, Found::Archive(claim), span, phases).await
            }
            Ok(Attempt::Refused(why)) => (self.refused(d, key, payload_hash, why, span, phases).await, None),
            Ok(Attempt::Overdue) => {
                let why = overdue(&self.policy);
                (self.refused(d, key, payload_hash, why, span, phases).await, None)
            }
            Err(e) if self.unsettled.holds(&key, d) => {
                self.settle_ambiguous(d, key, payload_hash, e, span, phases).await
            }
            Err(e) => {
                let why = HandlerError::Retryable(format!("database error: {e}"));
                (self.refused(d, key, payload_hash, why, span, phases).await, None)
            }
        }
    }

    /// The retries of a delivery whose COMMIT lost its answer ran out (`e` the last error): reads
    /// its claim back on a fresh connection, by the deadline's grace, to learn whether the
    /// commit happened. A claim of this delivery: the effect and its `processed` row committed,
    /// and the delivery is answered processed, with no second row. No claim: nothing committed,
    /// and the delivery fails as any other. Unreadable: it fails, and the broker's redelivery
    /// finds the truth in the claim.
    async fn settle_ambiguous(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        e: sqlx::Error,
        span: Span,
        mut phases: Phases,
    ) -> (Disposition, Option<Claim>) {
        self.unsettled.forget(&key, d);
        let backend = self.store.backend();
        let lookup_started = Instant::now();
        let read = self.retried(|| async {
            let table = self.layout().await?.table_for(
                &self.identity.consumer_group,
                &key.biz_type,
                &key.biz_id,
                key.execute_time,
            );
            let mut conn = self.store.pool().acquire().await?;
            super::claim::find(&mut conn, backend, table, &self.identity.consumer_group, &key).await
        });
        let (claim, retries) =
            until(span.due + ANSWER_GRACE, read).await.unwrap_or_else(|| (Err(sqlx::Error::PoolTimedOut), 0));
        phases.transient_retries += retries;
        phases.lookup_us += micros(lookup_started.elapsed());
        let read_back = match &claim {
            Ok(Some(claim)) if claim.msg_id == d.msg_id => ReadBack::Committed,
            Ok(_) => ReadBack::NotCommitted,
            Err(_) => ReadBack::Unread,
        };
        if let Some(observer) = &self.observer {
            observer.ambiguous_commit(CommitScope::Delivery, read_back);
        }
        match claim {
            Ok(Some(claim)) if claim.msg_id == d.msg_id => {
                tracing::info!(
                    biz_type = %key.biz_type, biz_id = %key.biz_id, msg_id = ?d.msg_id, error = %e,
                    "a commit lost its answer and the retries ran out; the claim read back is this delivery's: it committed"
                );
                let mut r = committed_disposition(d, key, &Effect::Applied, phases);
                r.latency = span.started.elapsed();
                (r, Some(claim))
            }
            read => {
                let why = match read {
                    Err(read) => format!(
                        "database error: {e}; the commit lost its answer and its claim could not be read back: {read}"
                    ),
                    Ok(_) => format!("database error: {e}; the commit lost its answer and did not commit"),
                };
                let why = HandlerError::Retryable(why);
                (self.refused(d, key, payload_hash, why, span, phases).await, None)
            }
        }
    }

    /// This gate as the claimant of a key at `now_ms`.
    pub(super) fn claimant(&self, now_ms: i64) -> Claimant<'_> {
        Claimant { consumer_group: &self.identity.consumer_group, now_ms }
    }

    /// The gate's claim tables.
    pub(super) async fn layout(&self) -> Result<Layout, sqlx::Error> {
        self.layout.get_or_try_init(|| crate::layout::recorded(&self.store)).await.copied()
    }

    /// One transaction: claim, handler, log row, commit; the transaction ready to commit by
    /// `span.due`, or dropped (rolled back) and the attempt [`Attempt::Overdue`].
    pub(super) async fn attempt(
        &self,
        d: &Delivery,
        key: &BizKey,
        payload_hash: &str,
        span: Span,
        timing: &std::sync::Mutex<Phases>,
    ) -> Result<Attempt, sqlx::Error> {
        // Held for one lap at a time, never across an await.
        let phase = |lap: &mut Stopwatch, field: fn(&mut Phases) -> &mut u64| {
            let mut phases = timing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            lap.lap(field(&mut phases));
        };
        let backend = self.store.backend();
        let now_ms = now_ms();
        let who = self.claimant(now_ms);
        let mut watch = Stopwatch::start();

        let ready = until(span.due, async {
            let table = self.layout().await?.table_for(
                who.consumer_group,
                &key.biz_type,
                &key.biz_id,
                key.execute_time,
            );
            let mut tx = self.store.begin().await?;
            phase(&mut watch, |p| &mut p.begin_us);
            let claimed = super::claim::claim(&mut tx, backend, table, &who, key, d, payload_hash).await?;
            let archived = if claimed && self.late_duplicate_guard {
                guard::archived_claim(&mut tx, backend, who.consumer_group, key).await?
            } else {
                None
            };
            phase(&mut watch, |p| &mut p.claim_us);
            if !claimed {
                tx.rollback().await?;
                return Ok(Ready::Ended(Attempt::Taken(table)));
            }
            if let Some(archived) = archived {
                tx.rollback().await?;
                return Ok(Ready::Ended(Attempt::Archived(archived)));
            }

            let handler =
                self.handlers.get(&key.handler).expect("Gate::new checked that every route's handler exists");
            let work = Work { delivery: d, key, backend, now_ms };
            let result = handler.handle(&work, &mut tx).await;
            phase(&mut watch, |p| &mut p.handler_us);
            let effect = match result {
                Ok(effect) => effect,
                Err(HandlerError::Database(e)) => {
                    tx.rollback().await?;
                    return Err(e);
                }
                Err(refusal) => {
                    tx.rollback().await?;
                    return Ok(Ready::Ended(Attempt::Refused(refusal)));
                }
            };

            if let Effect::AlreadyApplied { layer, .. } = &effect {
                self.warn_duplicate(d, key, DuplicateCause::Unknown, Some(*layer));
            }
            let mut done = committed_disposition(d, key.clone(), &effect, Phases::default());
            done.latency = span.started.elapsed();
            let mut entry = self.entry(d, Some(key), Some(payload_hash), &done, now_ms);
            entry.error = effect.detail();
            delivery_log::append(&mut tx, backend, &entry).await?;
            phase(&mut watch, |p| &mut p.log_us);
            Ok(Ready::Commit(tx, effect))
        })
        .await;
        let (tx, effect) = match ready {
            None => return Ok(Attempt::Overdue),
            Some(Err(e)) => return Err(e),
            Some(Ok(Ready::Ended(attempt))) => return Ok(attempt),
            Some(Ok(Ready::Commit(tx, effect))) => (tx, effect),
        };
        if let Err(e) = tx.commit().await {
            if connection_lost(&e) {
                self.unsettled.remember(key, d);
            }
            return Err(e);
        }
        phase(&mut watch, |p| &mut p.commit_us);
        Ok(Attempt::Committed { effect })
    }

    /// The key was taken where `found` says: name the cause, log the duplicate, acknowledge.
    /// Also returns the earlier claim, when it could be read.
    pub(super) async fn duplicate(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        found: Found,
        span: Span,
        mut phases: Phases,
    ) -> (Disposition, Option<Claim>) {
        let backend = self.store.backend();
        let (layer, earlier) = match found {
            Found::Archive(claim) => (Layer::LateDuplicate, Some(claim)),
            Found::Redis(claim) => (Layer::Redis, claim),
            Found::Db(table) => {
                let lookup_started = Instant::now();
                // Retried on a fresh connection like the log row below: without the earlier claim
                // the cause is unknown and a key collision goes unseen.
                let lookup = self.retried(|| async {
                    let mut conn = self.store.pool().acquire().await?;
                    let claim =
                        super::claim::find(&mut conn, backend, table, &self.identity.consumer_group, &key)
                            .await?;
                    let applied = match &claim {
                        Some(c) => {
                            delivery_log::applied(&mut conn, backend, &self.identity.consumer_group, &key, c)
                                .await?
                        }
                        None => None,
                    };
                    Ok((claim, applied))
                });
                let (earlier, retries) =
                    until(span.due, lookup).await.unwrap_or_else(|| (Err(sqlx::Error::PoolTimedOut), 0));
                phases.transient_retries += retries;
                phases.lookup_us += micros(lookup_started.elapsed());
                let (earlier, applied) = earlier.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "could not read the earlier claim of a duplicate in time; its cause is logged as unknown");
                    (None, None)
                });
                let disposition = self.duplicate_disposition(
                    d,
                    &key,
                    payload_hash,
                    Layer::Db,
                    (earlier.as_ref(), applied.as_ref()),
                    phases,
                );
                return (self.record(d, Some(key), Some(payload_hash), disposition, span).await, earlier);
            }
        };
        let disposition =
            self.duplicate_disposition(d, &key, payload_hash, layer, (earlier.as_ref(), None), phases);
        (self.record(d, Some(key), Some(payload_hash), disposition, span).await, earlier)
    }

    /// A duplicate stopped at `layer`, whose key `earlier` claimed (`applied`: the log's row of
    /// the delivery that made the claim, where it was read): its cause, whether the body
    /// matches, and the warnings (rate-limited; a key collision always logs an error).
    pub(super) fn duplicate_disposition(
        &self,
        d: &Delivery,
        key: &BizKey,
        payload_hash: &str,
        layer: Layer,
        (earlier, applied): (Option<&Claim>, Option<&ClaimDelivery>),
        phases: Phases,
    ) -> Disposition {
        let (mut cause, payload_match) = classify(d, payload_hash, earlier, applied);
        if layer == Layer::Db && self.unsettled.is_own_claim(key, d, earlier) {
            cause = DuplicateCause::AmbiguousCommit;
        }
        self.warn_duplicate(d, key, cause, Some(layer));
        if payload_match == Some(false) {
            tracing::error!(
                biz_type = %key.biz_type, biz_id = %key.biz_id, msg_id = ?d.msg_id, uniq_key = ?d.uniq_key,
                claimed_by = ?earlier.map(|c| c.msg_id.as_str()),
                "key collision: a duplicate carries a different body than the delivery that claimed the key"
            );
        }
        let error =
            (payload_match == Some(false)).then_some("key collision: the body differs from the claim's");
        Disposition {
            outcome: Outcome::Duplicate,
            verdict: Verdict::Ack,
            cause: Some(cause),
            layer: Some(layer),
            payload_match,
            error: error.map(str::to_owned),
            latency: Duration::ZERO,
            logged: false,
            phases,
            key: None,
            prefilter: None,
        }
    }

    /// The handler or the database said no: retry, dead-letter or invalid.
    pub(super) async fn refused(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        why: HandlerError,
        span: Span,
        phases: Phases,
    ) -> Disposition {
        let disposition = self.refusal_disposition(d, &key, why, phases);
        self.record(d, Some(key), Some(payload_hash), disposition, span).await
    }

    /// What a refusal means: retry, dead-letter or invalid, logged at INFO or WARN.
    pub(super) fn refusal_disposition(
        &self,
        d: &Delivery,
        key: &BizKey,
        why: HandlerError,
        phases: Phases,
    ) -> Disposition {
        let (outcome, verdict) = match &why {
            HandlerError::Invalid(_) => (Outcome::Invalid, Verdict::Ack),
            HandlerError::Permanent(_) | HandlerError::IllegalTransition(_) => {
                (Outcome::DeadLettered, Verdict::DeadLetter)
            }
            HandlerError::Retryable(_) | HandlerError::Database(_) => {
                if d.reconsume_times >= self.policy.max_reconsume_times {
                    (Outcome::DeadLettered, Verdict::Retry)
                } else {
                    (Outcome::Failed, Verdict::Retry)
                }
            }
        };
        let error = why.to_string();
        match outcome {
            Outcome::Failed => tracing::info!(
                biz_type = %key.biz_type, biz_id = %key.biz_id, msg_id = ?d.msg_id,
                reconsume_times = d.reconsume_times, error = %error, "delivery failed; the broker will redeliver it"
            ),
            // A handler's invalid refusals share the rate limit of the gate's own.
            Outcome::Invalid => {
                if let Permit::Emit { held_back } = self.invalid_warnings.check() {
                    tracing::warn!(
                        biz_type = %key.biz_type, biz_id = %key.biz_id, msg_id = ?d.msg_id,
                        reconsume_times = d.reconsume_times, outcome = %outcome, error = %error,
                        similar_warnings_held_back = held_back, "delivery given up"
                    );
                }
            }
            _ => tracing::warn!(
                biz_type = %key.biz_type, biz_id = %key.biz_id, msg_id = ?d.msg_id,
                reconsume_times = d.reconsume_times, outcome = %outcome, error = %error, "delivery given up"
            ),
        }
        Disposition {
            outcome,
            verdict,
            key: None,
            cause: None,
            // An illegal state-machine move is told apart from other dead letters by its layer.
            layer: matches!(why, HandlerError::IllegalTransition(_)).then_some(Layer::StateMachine),
            payload_match: None,
            error: Some(error),
            latency: Duration::ZERO,
            logged: false,
            phases,
            prefilter: None,
        }
    }

    /// The key could not be read: log `invalid` with the reason and the body.
    pub(super) async fn reject(
        &self,
        d: &Delivery,
        rejection: Rejection,
        started: Instant,
        due: Instant,
    ) -> Disposition {
        let (disposition, key) = rejection_disposition(d, rejection, &self.invalid_warnings);
        self.record(d, Some(key), None, disposition, Span { started, due }).await
    }

    /// Writes the log row of a delivery that did not commit an effect, by [`ANSWER_GRACE`] after
    /// its deadline. If the row cannot be written, the delivery is not acknowledged: the broker
    /// brings it back and nothing is lost.
    pub(super) async fn record(
        &self,
        d: &Delivery,
        key: Option<BizKey>,
        payload_hash: Option<&str>,
        mut disposition: Disposition,
        span: Span,
    ) -> Disposition {
        let backend = self.store.backend();
        disposition.latency = span.started.elapsed();
        let entry = self.entry(d, key.as_ref(), payload_hash, &disposition, now_ms());
        let log_started = Instant::now();
        // A lost connection (a node gone behind the proxy) is retried on a fresh one, so that the
        // attempt is in the log even when the transaction before it failed for the same reason.
        // The row carries the attempt's id: when the lost answer was that of an insert that
        // committed, the retry finds the row there and writes no second one.
        let attempt = AttemptId::new();
        let write = self.retried(|| async {
            let mut conn = self.store.pool().acquire().await?;
            delivery_log::append_once(&mut conn, backend, &entry, &attempt).await
        });
        let (written, retries) = until(span.due + ANSWER_GRACE, write).await.unwrap_or_else(|| {
            let late = sqlx::Error::Protocol(
                "the log row was not written within its grace after the deadline".into(),
            );
            (Err(late), 0)
        });
        disposition.phases.transient_retries += retries;
        disposition.phases.log_us += micros(log_started.elapsed());
        match written {
            Ok(_) => disposition.logged = true,
            Err(e) => {
                tracing::error!(
                    error = %e, msg_id = ?excerpt(&d.msg_id, MAX_ID_CHARS), outcome = %disposition.outcome,
                    "could not write the delivery log; asking the broker to redeliver"
                );
                disposition.verdict = Verdict::Retry;
            }
        }
        if disposition.outcome != Outcome::Invalid {
            disposition.key = key;
        }
        disposition
    }

    /// The log row of `disposition`. A rejected delivery's `key` holds what could be read of it.
    pub(super) fn entry<'a>(
        &'a self,
        d: &'a Delivery,
        key: Option<&'a BizKey>,
        payload_hash: Option<&'a str>,
        disposition: &'a Disposition,
        logged_at_ms: i64,
    ) -> Entry<'a> {
        Entry {
            logged_at_ms,
            instance_id: &self.identity.instance_id,
            consumer_group: &self.identity.consumer_group,
            delivery: d,
            biz_type: key.map_or("", |k| k.biz_type.as_str()),
            biz_id: key.map_or("", |k| k.biz_id.as_str()),
            execute_time: key.map_or(0, |k| k.execute_time),
            outcome: disposition.outcome,
            cause: disposition.cause.or(replay_cause(d)),
            layer: disposition.layer,
            payload_match: disposition.payload_match,
            payload_hash,
            error: disposition.error.as_deref(),
            latency_us: micros(disposition.latency) as i64,
            keep_payload: matches!(disposition.outcome, Outcome::DeadLettered | Outcome::Invalid),
        }
    }

    pub(super) fn warn_duplicate(
        &self,
        d: &Delivery,
        key: &BizKey,
        cause: DuplicateCause,
        layer: Option<Layer>,
    ) {
        if let Permit::Emit { held_back } = self.duplicate_warnings.check() {
            tracing::warn!(
                biz_type = %key.biz_type,
                biz_id = %key.biz_id,
                execute_time = key.execute_time,
                msg_id = ?d.msg_id,
                uniq_key = ?d.uniq_key,
                cause = %cause,
                layer = layer.map(Layer::as_str).unwrap_or("db"),
                reconsume_times = d.reconsume_times,
                similar_warnings_held_back = held_back,
                "duplicate delivery skipped"
            );
        }
    }
}

/// When a delivery began, and when its answer is due.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub started: Instant,
    pub due: Instant,
}

/// Where the claim of a duplicate was found.
pub(super) enum Found {
    /// The unique index of this claim table refused the insert.
    Db(&'static crate::layout::ClaimTable),
    /// The archive held it (the late-duplicate guard).
    Archive(Claim),
    /// Redis remembered it as done, with its claim when the value was readable.
    Redis(Option<Claim>),
}
