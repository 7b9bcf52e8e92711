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
//! **Deadlines.** Every delivery is answered by [`Policy::delivery_timeout`] after its listener
//! call began: a transaction not ready to commit by then is rolled back and the delivery
//! answered retry, so that the broker client never abandons a call whose transaction may still
//! commit ([`core`]).
//!
//! **Consumer groups.** The group is part of the claim key. Instances of one group block each
//! other (they apply the same effect); two groups that apply different effects for the same
//! business key (say, stock and loyalty points) never block each other.

mod ambiguous;
mod claim;
mod committer;
mod core;
mod disposition;
mod group;
pub(crate) mod guard;
mod observer;
mod settings;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use claim::ClaimPath;
pub use committer::{Committer, GroupRunner};
pub(crate) use core::longest_delivery_timeout;
pub use disposition::Disposition;
pub use disposition::Phases;
pub use observer::{CommitScope, GroupEnd, GroupReport, Observer, ReadBack};
pub(crate) use settings::ConsumerSettings;
pub use settings::MAX_BATCH;
pub use settings::{GroupSettings, Identity, Policy};

use self::core::Core;
use crate::delivery::Delivery;
use crate::handler::Handlers;
use crate::layout::Layout;
use crate::prefilter::Prefilter;
use crate::route::{MAX_ID_CHARS, Routes, check_key_text};
use crate::setting::{Invalid, invalid};
use crate::store::Store;
use crate::throttle::Throttle;

/// The idempotent processing of deliveries. Share it behind an `Arc`.
///
/// By default each delivery gets its own transaction. With [`Gate::with_group_commit`],
/// deliveries that arrive together share one ([`group`]); `process` answers the same either way.
pub struct Gate {
    core: Arc<Core>,
    group: Option<GroupSettings>,
    /// The group committer, started by the first delivery.
    committer: std::sync::OnceLock<committer::Committer>,
    /// The committer keeps a key out of two groups in flight ([`committer`]).
    defer_held_keys: bool,
    /// Raised by the first committer task that panics ([`Gate::group_commit_fault`]).
    faults: committer::Faults,
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

impl Gate {
    /// Checks that every route has a handler (the one place that check is made: every gate,
    /// the service's and any other, is made here) and that the identity fits the key columns.
    /// A refusal names its key: `routes[2].handler`, `consumer.group`.
    pub fn new(
        store: Store,
        routes: Routes,
        handlers: Handlers,
        identity: Identity,
        policy: Policy,
    ) -> Result<Self, Invalid> {
        for (route, name) in routes.handler_names() {
            if handlers.get(name).is_none() {
                return Err(invalid(
                    format!("routes[{route}].handler"),
                    format!(
                        "no handler named {name:?} (a route without `handler` uses its biz_type); known handlers: {}",
                        handlers.names().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        check_key_text(&identity.consumer_group, MAX_ID_CHARS).map_err(|m| invalid("consumer.group", m))?;
        if identity.instance_id.is_empty() || identity.instance_id.chars().count() > MAX_ID_CHARS {
            return Err(invalid("consumer.instance", format!("must be 1 to {MAX_ID_CHARS} characters")));
        }
        let duplicate_warnings = Throttle::new(policy.duplicate_warnings_per_second, Duration::from_secs(1));
        let invalid_warnings = Throttle::new(policy.duplicate_warnings_per_second, Duration::from_secs(1));
        let core = Core {
            store,
            routes,
            handlers,
            identity,
            policy,
            duplicate_warnings,
            invalid_warnings,
            observer: None,
            late_duplicate_guard: false,
            batch_handlers: true,
            prefilter: None,
            layout: tokio::sync::OnceCell::new(),
            unsettled: Default::default(),
            record: None,
        };
        Ok(Self {
            core: Arc::new(core),
            group: None,
            committer: std::sync::OnceLock::new(),
            defer_held_keys: true,
            faults: tokio::sync::watch::Sender::new(None),
        })
    }

    /// The gate's parts, while it is being configured: the committer's tasks share them only
    /// from the first delivery on, and the builder methods consume the gate before that.
    fn core_mut(&mut self) -> &mut Core {
        Arc::get_mut(&mut self.core).expect("a gate is configured before its first delivery")
    }

    /// Reports every disposition, group and wait to `observer` (the metrics, in the service).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.core_mut().observer = Some(observer);
        self
    }

    /// Processes deliveries that arrive together in one transaction each group ([`group`]),
    /// through the handlers' batch forms unless `settings.batch` is off. `process` then queues
    /// the delivery and answers once its group has committed.
    /// Settings whose `enabled` is false leave each delivery its own transaction.
    pub fn with_group_commit(mut self, settings: GroupSettings) -> Self {
        self.core_mut().batch_handlers = settings.batch;
        self.group = settings.enabled.then_some(settings);
        self
    }

    /// Lets the committer put one key in two groups in flight, which then wait for each other in
    /// the database: what the benchmarks compare the committer's deferral against.
    pub fn without_key_deferral(mut self) -> Self {
        self.defer_held_keys = false;
        self
    }

    /// Also looks every fresh claim up in `idempotent_record_archive`; a hit is rolled back and
    /// counted as a duplicate at the `late_duplicate` layer ([`guard`]).
    pub fn with_late_duplicate_guard(mut self, on: bool) -> Self {
        self.core_mut().late_duplicate_guard = on;
        self
    }

    /// Reads a redelivery's sub-cause from `record`, this run's record of what the consumer did,
    /// and the runs before it ([`crate::instances`]).
    pub fn with_record(mut self, record: Arc<crate::instances::Record>) -> Self {
        self.core_mut().record = Some(record);
        self
    }

    /// Asks Redis first for the biz_types `prefilter` covers ([`crate::prefilter`]).
    pub fn with_prefilter(mut self, prefilter: Arc<Prefilter>) -> Self {
        self.core_mut().prefilter = Some(prefilter);
        self
    }

    /// Uses `layout` (as [`crate::layout::ensure`] returned it) instead of reading it from the
    /// database on first use.
    pub(crate) fn with_layout(mut self, layout: Layout) -> Self {
        let _ = self.core_mut().layout.set(layout);
        self
    }

    /// This run's record of what the consumer did, when the gate reads sub-causes from one.
    pub fn record(&self) -> Option<&Arc<crate::instances::Record>> {
        self.core.record.as_ref()
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
    ///
    /// The answer comes within the policy's `delivery_timeout` (and the answer grace for a log
    /// row after it): a delivery not ready to commit by then is rolled back and answered retry.
    pub async fn process(&self, d: &Delivery) -> Disposition {
        self.process_since(d, Instant::now()).await
    }

    /// [`Gate::process`] for a delivery of a listener call that began at `began`: its deadline
    /// runs from there, so that the deliveries of one call share it.
    pub async fn process_since(&self, d: &Delivery, began: Instant) -> Disposition {
        let due = began + self.core.policy.delivery_timeout;
        match &self.group {
            None => self.core.process(d, due).await,
            Some(settings) => {
                let committer = self.committer.get_or_init(|| {
                    committer::Committer::start(
                        self.core.clone(),
                        settings,
                        self.defer_held_keys,
                        self.faults.clone(),
                    )
                });
                committer.submit(d.clone(), due).await
            }
        }
    }

    /// Processes `deliveries` as one group, in one transaction, whether or not group commit is
    /// configured; the answers are in the deliveries' order, within the policy's
    /// `delivery_timeout`.
    pub async fn process_group(&self, deliveries: &[Delivery]) -> Vec<Disposition> {
        self.core.process_group(deliveries, Instant::now() + self.core.policy.delivery_timeout).await
    }

    /// Resolves when a group-commit task has panicked, with the panic's message; never
    /// otherwise. The group it held was rolled back and answered retry, and so is every
    /// delivery that task would have taken: the service stops on it ([`crate::app`]).
    pub(crate) async fn group_commit_fault(&self) -> String {
        let mut faults = self.faults.subscribe();
        let what = faults.wait_for(Option::is_some).await.ok().and_then(|what| what.clone());
        match what {
            Some(what) => what,
            None => std::future::pending().await,
        }
    }
}
