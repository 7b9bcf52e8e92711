//! The gate: one delivery in, one disposition out, with the business effect applied at most
//! once per business key and consumer group.
//!
//! For each delivery the gate
//! 1. reads the business key ([`crate::route`]); a bad key is logged `invalid`;
//! 2. begins a transaction and **claims** the key in `idempotent_record` (insert first);
//! 3. if the key was taken, rolls back without running the handler, names the duplicate's cause
//!    and logs it;
//! 4. otherwise runs the handler in the same transaction, appends the `processed` log row, and
//!    commits: claim, effect and log row become durable together or not at all.
//!
//! A failing handler rolls everything back, so the key stays unclaimed and a redelivery can
//! still succeed. The unique index is the only arbiter between concurrent deliveries and
//! between processes: there is no in-process lock for a second instance to bypass.
//!
//! **Consumer groups.** The group is part of the claim key. Instances of one group block each
//! other (they apply the same effect); two groups that apply different effects for the same
//! business key (say, stock and loyalty points) never block each other.

mod claim;
pub mod group;
mod outcome;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use claim::{Claim, classify};
pub use group::GroupSettings;
pub(crate) use outcome::labelled;
pub use outcome::{Disposition, DuplicateCause, Layer, Outcome, Phases, Verdict};

use crate::delivery::Delivery;
use crate::delivery_log::{self, Entry};
use crate::handler::{Effect, HandlerError, Handlers, Work};
use crate::layout::Layout;
use crate::metrics::Metrics;
use crate::prefilter::{Check, Prefilter, PrefilterReport, Settle};
use crate::route::{BizKey, MAX_ID_CHARS, Rejection, Routes, check_key_text, excerpt};
use crate::store::{Store, is_transient};
use crate::throttle::{Permit, Throttle};
use claim::Claimant;

/// Who is consuming: part of every claim and log row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub consumer_group: String,
    /// This process, as shown in logs, log rows and metrics.
    pub instance_id: String,
}

impl Identity {
    /// `host-pid`: unique among the processes sharing a database.
    pub fn default_instance_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        format!("{host}-{}", std::process::id())
    }
}

/// How the gate treats failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The broker's `maxReconsumeTimes`: a retryable failure at this reconsume count is the
    /// last attempt and is logged `dead_lettered`.
    pub max_reconsume_times: i32,
    /// How often a transient database conflict (deadlock, busy file) is retried inside the
    /// gate before the broker is asked to redeliver.
    pub transient_retries: u32,
    /// How many duplicate warnings a second may log; the rest are counted and reported.
    pub duplicate_warnings_per_second: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Self { max_reconsume_times: 16, transient_retries: 3, duplicate_warnings_per_second: 20 }
    }
}

/// A gate's configuration is wrong.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("routes[{route}].handler: no handler named {name:?}; known handlers: {known}")]
    UnknownHandler { route: usize, name: String, known: String },
    #[error("consumer.group: {0}")]
    BadGroup(String),
    #[error("consumer.instance: {0}")]
    BadInstance(String),
}

/// The idempotent processing of deliveries. Share it behind an `Arc`.
///
/// By default each delivery gets its own transaction. With [`Gate::with_group_commit`],
/// deliveries that arrive together share one ([`group`]); `process` answers the same either way.
pub struct Gate {
    core: Arc<Core>,
    group: Option<GroupSettings>,
    /// The group committer, started by the first delivery.
    committer: std::sync::OnceLock<group::Committer>,
}

/// Everything a gate knows; the group committer's tasks share it.
pub(crate) struct Core {
    store: Store,
    routes: Routes,
    handlers: Handlers,
    identity: Identity,
    policy: Policy,
    duplicate_warnings: Throttle,
    metrics: Option<Arc<Metrics>>,
    /// See [`Gate::with_late_duplicate_guard`].
    late_duplicate_guard: bool,
    /// See [`Gate::with_prefilter`].
    prefilter: Option<Arc<Prefilter>>,
    /// The claim tables, read from the database on first use ([`crate::layout::recorded`]).
    layout: tokio::sync::OnceCell<Layout>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("store", &self.core.store)
            .field("identity", &self.core.identity)
            .field("handlers", &self.core.handlers)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Where an attempt ended.
enum Attempt {
    Committed {
        effect: Effect,
    },
    Taken(&'static crate::layout::ClaimTable),
    /// Claimed afresh, but the archive holds the key: a duplicate older than the retention.
    Archived(Claim),
    Refused(HandlerError),
}

impl Gate {
    /// Checks that every route has a handler and that the identity fits the key columns.
    pub fn new(
        store: Store,
        routes: Routes,
        handlers: Handlers,
        identity: Identity,
        policy: Policy,
    ) -> Result<Self, GateError> {
        for (route, name) in routes.handler_names() {
            if handlers.get(name).is_none() {
                return Err(GateError::UnknownHandler {
                    route,
                    name: name.to_owned(),
                    known: handlers.names().collect::<Vec<_>>().join(", "),
                });
            }
        }
        check_key_text(&identity.consumer_group, MAX_ID_CHARS).map_err(GateError::BadGroup)?;
        if identity.instance_id.is_empty() || identity.instance_id.chars().count() > MAX_ID_CHARS {
            return Err(GateError::BadInstance(format!("must be 1 to {MAX_ID_CHARS} characters")));
        }
        let duplicate_warnings = Throttle::new(policy.duplicate_warnings_per_second, Duration::from_secs(1));
        let core = Core {
            store,
            routes,
            handlers,
            identity,
            policy,
            duplicate_warnings,
            metrics: None,
            late_duplicate_guard: false,
            prefilter: None,
            layout: tokio::sync::OnceCell::new(),
        };
        Ok(Self { core: Arc::new(core), group: None, committer: std::sync::OnceLock::new() })
    }

    /// The gate's parts, while it is being configured: the committer's tasks share them only
    /// from the first delivery on, and the builder methods consume the gate before that.
    fn core_mut(&mut self) -> &mut Core {
        Arc::get_mut(&mut self.core).expect("a gate is configured before its first delivery")
    }

    /// Reports every disposition to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.core_mut().metrics = Some(metrics);
        self
    }

    /// Processes deliveries that arrive together in one transaction each group, with a
    /// savepoint per delivery ([`group`]). `process` then queues the delivery and answers once
    /// its group has committed.
    pub fn with_group_commit(mut self, settings: GroupSettings) -> Self {
        self.group = Some(settings);
        self
    }

    /// Also looks every fresh claim up in `idempotent_record_archive`; a hit is rolled back and
    /// counted as a duplicate at the `late_duplicate` layer ([`crate::archive::guard`]).
    pub fn with_late_duplicate_guard(mut self, on: bool) -> Self {
        self.core_mut().late_duplicate_guard = on;
        self
    }

    /// Asks Redis first for the biz_types `prefilter` covers ([`crate::prefilter`]).
    pub fn with_prefilter(mut self, prefilter: Arc<Prefilter>) -> Self {
        self.core_mut().prefilter = Some(prefilter);
        self
    }

    /// Uses `layout` (as [`crate::layout::ensure`] returned it) instead of reading it from the
    /// database on first use.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        let _ = self.core_mut().layout.set(layout);
        self
    }

    pub fn store(&self) -> &Store {
        &self.core.store
    }

    /// The Redis pre-filter, when one is configured.
    pub fn prefilter(&self) -> Option<&Arc<Prefilter>> {
        self.core.prefilter.as_ref()
    }

    pub fn identity(&self) -> &Identity {
        &self.core.identity
    }

    pub fn routes(&self) -> &Routes {
        &self.core.routes
    }

    pub fn policy(&self) -> &Policy {
        &self.core.policy
    }

    /// The group commit settings, when it is on.
    pub fn group_commit(&self) -> Option<&GroupSettings> {
        self.group.as_ref()
    }

    /// Processes one delivery. Never panics on input and never fails: every problem becomes a
    /// disposition, and a delivery whose log row could not be written is never acknowledged.
    ///
    /// With group commit on, the delivery waits in the group queue (the queue is bounded, so a
    /// slow database slows the callers down) and the answer comes after its group's commit.
    pub async fn process(&self, d: &Delivery) -> Disposition {
        match &self.group {
            None => self.core.process(d).await,
            Some(settings) => {
                let committer =
                    self.committer.get_or_init(|| group::Committer::start(self.core.clone(), settings));
                committer.submit(d.clone()).await
            }
        }
    }

    /// Processes `deliveries` as one group, in one transaction, whether or not group commit is
    /// configured; the answers are in the deliveries' order.
    pub async fn process_group(&self, deliveries: &[Delivery]) -> Vec<Disposition> {
        self.core.process_group(deliveries).await
    }
}

impl Core {
    async fn process(&self, d: &Delivery) -> Disposition {
        let r = self.decide(d).await;
        self.observe(d, &r);
        r
    }

    fn observe(&self, d: &Delivery, r: &Disposition) {
        if let Some(metrics) = &self.metrics {
            metrics.observe(d, r);
        }
    }

    async fn decide(&self, d: &Delivery) -> Disposition {
        let started = Instant::now();
        let key = match self.routes.resolve(d) {
            Ok(key) => key,
            Err(rejection) => return self.reject(d, rejection, started).await,
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
                    let (mut r, _) = self.duplicate(d, key, &payload_hash, found, started, phases).await;
                    r.prefilter = report;
                    return r;
                }
                Check::InFlight | Check::Fallback(_) => {}
            }
        }
        let (mut r, settle) = self.conclude(d, key, &payload_hash, started, phases).await;
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
    async fn conclude(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        started: Instant,
        mut phases: Phases,
    ) -> (Disposition, Option<Claim>) {
        let attempt = loop {
            match self.attempt(d, &key, payload_hash, started, &mut phases).await {
                Err(e) if is_transient(&e) && phases.transient_retries < self.policy.transient_retries => {
                    phases.transient_retries += 1;
                    let jitter = rand::random_range(0..=5u64 << phases.transient_retries);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                other => break other,
            }
        };
        match attempt {
            Ok(Attempt::Committed { effect }) => {
                let claim = crate::prefilter::claim_of(d, payload_hash);
                let mut r = committed_disposition(d, key, &effect, phases);
                r.latency = started.elapsed();
                (r, Some(claim))
            }
            Ok(Attempt::Taken(table)) => {
                self.duplicate(d, key, payload_hash, Found::Db(table), started, phases).await
            }
            Ok(Attempt::Archived(claim)) => {
                self.duplicate(d, key, payload_hash, Found::Archive(claim), started, phases).await
            }
            Ok(Attempt::Refused(why)) => {
                (self.refused(d, key, payload_hash, why, started, phases).await, None)
            }
            Err(e) => {
                let why = HandlerError::Retryable(format!("database error: {e}"));
                (self.refused(d, key, payload_hash, why, started, phases).await, None)
            }
        }
    }

    /// This gate as the claimant of a key at `now_ms`.
    fn claimant(&self, now_ms: i64) -> Claimant<'_> {
        Claimant {
            consumer_group: &self.identity.consumer_group,
            instance_id: &self.identity.instance_id,
            now_ms,
        }
    }

    /// The gate's claim tables.
    async fn layout(&self) -> Result<Layout, sqlx::Error> {
        self.layout.get_or_try_init(|| crate::layout::recorded(&self.store)).await.copied()
    }

    /// One transaction: claim, handler, log row, commit.
    async fn attempt(
        &self,
        d: &Delivery,
        key: &BizKey,
        payload_hash: &str,
        started: Instant,
        phases: &mut Phases,
    ) -> Result<Attempt, sqlx::Error> {
        let backend = self.store.backend();
        let now_ms = now_ms();
        let who = self.claimant(now_ms);
        let mut watch = Stopwatch::start();

        let table =
            self.layout().await?.table_for(who.consumer_group, &key.biz_type, &key.biz_id, key.execute_time);
        let mut tx = self.store.begin().await?;
        watch.lap(&mut phases.begin_us);
        let claimed = claim::claim(&mut tx, backend, table, &who, key, d, payload_hash).await?;
        let archived = if claimed && self.late_duplicate_guard {
            crate::archive::guard::archived_claim(&mut tx, backend, who.consumer_group, key).await?
        } else {
            None
        };
        watch.lap(&mut phases.claim_us);
        if !claimed {
            tx.rollback().await?;
            return Ok(Attempt::Taken(table));
        }
        if let Some(archived) = archived {
            tx.rollback().await?;
            return Ok(Attempt::Archived(archived));
        }

        let handler =
            self.handlers.get(&key.handler).expect("Gate::new checked that every route's handler exists");
        let work = Work { delivery: d, key, backend, now_ms };
        let result = handler.handle(&work, &mut tx).await;
        watch.lap(&mut phases.handler_us);
        let effect = match result {
            Ok(effect) => effect,
            Err(HandlerError::Database(e)) => {
                tx.rollback().await?;
                return Err(e);
            }
            Err(refusal) => {
                tx.rollback().await?;
                return Ok(Attempt::Refused(refusal));
            }
        };

        if let Effect::AlreadyApplied { layer, .. } = &effect {
            self.warn_duplicate(d, key, DuplicateCause::Unknown, Some(*layer));
        }
        let mut done = committed_disposition(d, key.clone(), &effect, Phases::default());
        done.latency = started.elapsed();
        let mut entry = self.entry(d, Some(key), Some(payload_hash), &done, now_ms);
        entry.error = effect.detail();
        delivery_log::append(&mut tx, backend, &entry).await?;
        watch.lap(&mut phases.log_us);
        tx.commit().await?;
        watch.lap(&mut phases.commit_us);
        Ok(Attempt::Committed { effect })
    }

    /// The key was taken where `found` says: name the cause, log the duplicate, acknowledge.
    /// Also returns the earlier claim, when it could be read.
    async fn duplicate(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        found: Found,
        started: Instant,
        mut phases: Phases,
    ) -> (Disposition, Option<Claim>) {
        let backend = self.store.backend();
        let (layer, earlier) = match found {
            Found::Archive(claim) => (Layer::LateDuplicate, Some(claim)),
            Found::Redis(claim) => (Layer::Redis, claim),
            Found::Db(table) => {
                let lookup_started = Instant::now();
                let earlier = match self.store.pool().acquire().await {
                    Ok(mut conn) => {
                        claim::find(&mut conn, backend, table, &self.identity.consumer_group, &key).await
                    }
                    Err(e) => Err(e),
                };
                phases.lookup_us += micros(lookup_started.elapsed());
                let earlier = earlier.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "could not read the earlier claim of a duplicate; its cause is logged as unknown");
                    None
                });
                (Layer::Db, earlier)
            }
        };
        let disposition = self.duplicate_disposition(d, &key, payload_hash, layer, earlier.as_ref(), phases);
        (self.record(d, Some(key), Some(payload_hash), disposition, started).await, earlier)
    }

    /// A duplicate stopped at `layer`, whose key `earlier` claimed: its cause, whether the body
    /// matches, and the warnings (rate-limited; a key collision always logs an error).
    fn duplicate_disposition(
        &self,
        d: &Delivery,
        key: &BizKey,
        payload_hash: &str,
        layer: Layer,
        earlier: Option<&Claim>,
        phases: Phases,
    ) -> Disposition {
        let (cause, payload_match) = classify(d, payload_hash, earlier);
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
    async fn refused(
        &self,
        d: &Delivery,
        key: BizKey,
        payload_hash: &str,
        why: HandlerError,
        started: Instant,
        phases: Phases,
    ) -> Disposition {
        let disposition = self.refusal_disposition(d, &key, why, phases);
        self.record(d, Some(key), Some(payload_hash), disposition, started).await
    }

    /// What a refusal means: retry, dead-letter or invalid, logged at INFO or WARN.
    fn refusal_disposition(
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
    async fn reject(&self, d: &Delivery, rejection: Rejection, started: Instant) -> Disposition {
        let (disposition, key) = rejection_disposition(d, rejection);
        self.record(d, Some(key), None, disposition, started).await
    }

    /// Writes the log row of a delivery that did not commit an effect. If the row cannot be
    /// written, the delivery is not acknowledged: the broker brings it back and nothing is lost.
    async fn record(
        &self,
        d: &Delivery,
        key: Option<BizKey>,
        payload_hash: Option<&str>,
        mut disposition: Disposition,
        started: Instant,
    ) -> Disposition {
        let backend = self.store.backend();
        disposition.latency = started.elapsed();
        let entry = self.entry(d, key.as_ref(), payload_hash, &disposition, now_ms());
        let log_started = Instant::now();
        let written = match self.store.pool().acquire().await {
            Ok(mut conn) => delivery_log::append(&mut conn, backend, &entry).await,
            Err(e) => Err(e),
        };
        disposition.phases.log_us += micros(log_started.elapsed());
        match written {
            Ok(()) => disposition.logged = true,
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
    fn entry<'a>(
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

    fn warn_duplicate(&self, d: &Delivery, key: &BizKey, cause: DuplicateCause, layer: Option<Layer>) {
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

/// Where the claim of a duplicate was found.
enum Found {
    /// The unique index of this claim table refused the insert.
    Db(&'static crate::layout::ClaimTable),
    /// The archive held it (the late-duplicate guard).
    Archive(Claim),
    /// Redis remembered it as done, with its claim when the value was readable.
    Redis(Option<Claim>),
}

/// A delivery whose effect committed: `processed`, or a duplicate the handler itself found
/// (a state-machine move already made).
fn committed_disposition(d: &Delivery, key: BizKey, effect: &Effect, phases: Phases) -> Disposition {
    let (outcome, layer) = match effect {
        Effect::Applied => (Outcome::Processed, None),
        Effect::AlreadyApplied { layer, .. } => (Outcome::Duplicate, Some(*layer)),
    };
    Disposition {
        outcome,
        verdict: Verdict::Ack,
        key: Some(key),
        cause: replay_cause(d).or(layer.map(|_| DuplicateCause::Unknown)),
        layer,
        payload_match: None,
        error: None,
        latency: Duration::ZERO,
        logged: true,
        phases,
        prefilter: None,
    }
}

/// An unreadable key: logged `invalid` with the reason and the body. The returned key holds
/// what could be read of it, for the log row.
fn rejection_disposition(d: &Delivery, rejection: Rejection) -> (Disposition, BizKey) {
    tracing::warn!(
        msg_id = ?excerpt(&d.msg_id, MAX_ID_CHARS), topic = ?excerpt(&d.topic, 64),
        reason = %rejection.reason, "invalid delivery"
    );
    let disposition = Disposition {
        outcome: Outcome::Invalid,
        verdict: Verdict::Ack,
        key: None,
        cause: None,
        layer: None,
        payload_match: None,
        error: Some(rejection.reason),
        latency: Duration::ZERO,
        logged: false,
        phases: Phases::default(),
        prefilter: None,
    };
    let key = BizKey {
        biz_type: rejection.biz_type,
        biz_id: rejection.biz_id,
        execute_time: 0,
        handler: String::new(),
    };
    (disposition, key)
}

/// `replay` for a delivery re-published by `idemgate replay`, whatever its outcome: the log
/// then tells a replayed attempt from the original ones.
fn replay_cause(d: &Delivery) -> Option<DuplicateCause> {
    d.is_replay().then_some(DuplicateCause::Replay)
}

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Charges the time since its last lap to a phase.
struct Stopwatch(Instant);

impl Stopwatch {
    fn start() -> Self {
        Self(Instant::now())
    }

    fn lap(&mut self, phase: &mut u64) {
        let now = Instant::now();
        *phase += micros(now - self.0);
        self.0 = now;
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
