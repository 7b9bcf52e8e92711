//! The reconciler's vocabulary: what a run looks at, what it reports, and the business
//! invariants a handler registers with it. The handlers name these
//! ([`crate::handler::Handler::checks`]) and the run records them ([`super::runs`]) without
//! depending on the scan itself.

use std::borrow::Cow;
use std::time::Duration;

use serde::Serialize;

use crate::labelled::labelled;
use crate::store::{Sql, Written};

labelled! {
    /// What kind of disagreement between deliveries, claims and effects.
    AnomalyKind {
        /// Failed or dead-lettered, never processed, nothing pending: it needs a replay.
        Lost => "lost",
        /// Still being retried after `stuck_after`.
        Stuck => "stuck",
        /// More than one `processed` delivery for one claim key, or a business ledger with two
        /// effects. This must never happen.
        DoubleApplied => "double_applied",
        /// A claim without its `processed` delivery, or a `processed` delivery without a claim.
        Orphan => "orphan",
        /// The same key sent with different bodies.
        KeyCollision => "key_collision",
        /// A key seen again after its claim was archived.
        LateDuplicate => "late_duplicate",
    }
}

impl AnomalyKind {
    /// What an engineer should do about it.
    pub(crate) fn advice(self) -> &'static str {
        match self {
            Self::Lost => {
                "never applied: fix the cause, then replay the dead letter (its trace page, or idemgate replay)"
            }
            Self::Stuck => "still retrying: look at the error on its trace",
            Self::DoubleApplied => "the effect was applied more than once: correct the business data",
            Self::Orphan => "claims and processed deliveries disagree: something wrote around the gate",
            Self::KeyCollision => "one key for different content: the first body won; fix the producer",
            Self::LateDuplicate => {
                "a copy arrived after its claim was archived: lengthen the dedup retention or turn on the late-duplicate guard"
            }
        }
    }
}

/// A business invariant a handler's owner registers: a statement over the business tables that
/// returns the keys breaking it, one row each, the bizId first. Like the reconciler's own, it
/// should read its window through an index (the stock ledger's is on `applied_at_ms`) and
/// anything else by key: [`crate::store::plan`] reads the plan of a built-in one.
#[derive(Clone)]
pub struct Check {
    pub name: Cow<'static, str>,
    pub kind: AnomalyKind,
    pub biz_type: Cow<'static, str>,
    pub sql: CheckSql,
    /// The anomaly's text for a row's count of occurrences (1 where the statement gives none).
    pub describe: fn(i64) -> String,
}

/// The statement of a [`Check`].
#[derive(Debug, Clone)]
pub enum CheckSql {
    /// Written in code: given `since_ms, until_ms` as parameters, it returns
    /// `(biz_id, occurrences)` rows.
    Window(&'static Sql),
    /// Written in the configuration: its placeholders are given the window's ends as `binds`
    /// says, and it returns `(biz_id)` or `(biz_id, occurrences)` rows, the bizId as text or an
    /// integer.
    Written { sql: Written, binds: Vec<WindowEnd> },
}

/// One end of the window a run looks at, as a configured check's parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEnd {
    /// `:since_ms`: the window's first millisecond.
    Since,
    /// `:until_ms`: the millisecond after the window.
    Until,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("name", &self.name).field("kind", &self.kind).finish()
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub consumer_group: String,
    pub biz_type: String,
    pub biz_id: String,
    pub execute_time: i64,
    pub first_seen_ms: Option<i64>,
    pub last_seen_ms: Option<i64>,
    pub detail: String,
}

/// What one run looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileOptions {
    pub consumer_group: String,
    /// Only this biz_type; `None` for all.
    pub biz_type: Option<String>,
    /// The window: deliveries logged (and claims made) in `[since_ms, until_ms)`.
    pub since_ms: i64,
    pub until_ms: i64,
    /// A key still failing this long after its first failure is stuck.
    pub stuck_after_ms: i64,
    /// Claims older than the log's retention have no log rows to compare with; they are not
    /// called orphans.
    pub log_retention_ms: i64,
    /// The most anomalies reported per kind (and per check); the rest are counted as cut.
    pub max_per_kind: usize,
    pub instance_id: String,
    pub started_by: String,
}

/// How long ago `window` started from `now`, as options for a run by hand.
pub(crate) fn window(now_ms: i64, window: Duration) -> (i64, i64) {
    (now_ms - i64::try_from(window.as_millis()).unwrap_or(i64::MAX), now_ms + 1)
}
