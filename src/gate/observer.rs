//! What the gate reports as it works. The gate knows nothing of Prometheus: the service's
//! [`crate::metrics::Metrics`] implements this, and a test may count with its own.

use std::time::Duration;

use super::disposition::Disposition;
use crate::delivery::Delivery;
use crate::store::Retries;

/// Told of every delivery's disposition and, under group commit, of every group.
pub trait Observer: Send + Sync {
    /// One delivery was decided (logged or not).
    fn delivery(&self, d: &Delivery, r: &Disposition);
    /// A delivery's transaction, or a whole group's, was started again after transient
    /// conflicts (on a Galera node, mostly failed certifications): how many, by cause.
    fn transient_retries(&self, _retries: &Retries) {}
    /// A group committed or rolled back.
    fn group(&self, _report: &GroupReport) {}
    /// A delivery waited this long in the queue before its group began.
    fn group_wait(&self, _waited: Duration) {}
    /// A delivery found the group queue full and had to wait for room.
    fn group_queue_full(&self) {}
    /// Deliveries were set aside `count` times while a group formed: a group in flight holds
    /// their key, and they go into the first group formed after it ends.
    fn group_deferred(&self, _count: u64) {}
    /// A handler's batch form failed in a group: the group was rolled back to just after its
    /// claims and ran again one delivery at a time.
    fn group_fallback(&self, _handler: &str) {}
    /// A COMMIT lost its answer with its connection, and reading back on a fresh connection
    /// (a group's log rows, always; one delivery's claim, once its retries ran out: before, its
    /// next attempt settles it) said this.
    fn ambiguous_commit(&self, _scope: CommitScope, _read_back: ReadBack) {}
}

/// Whose COMMIT lost its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitScope {
    /// One delivery's transaction.
    Delivery,
    /// A whole group's (group commit).
    Group,
}

impl CommitScope {
    pub const ALL: [CommitScope; 2] = [CommitScope::Delivery, CommitScope::Group];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivery => "delivery",
            Self::Group => "group",
        }
    }
}

/// What the read-back after an ambiguous COMMIT said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// It committed: the delivery (or the group) is answered as applied.
    Committed,
    /// It did not: the delivery is retried as after any failure.
    NotCommitted,
    /// The database could not be read in time: the next attempt settles it, and logs a
    /// `duplicate` with cause `ambiguous_commit` when it finds the claim as its own.
    Unread,
}

impl ReadBack {
    pub const ALL: [ReadBack; 3] = [ReadBack::Committed, ReadBack::NotCommitted, ReadBack::Unread];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Committed => "committed",
            Self::NotCommitted => "not_committed",
            Self::Unread => "unread",
        }
    }
}

/// How a group ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// One transaction for the whole group.
    Committed,
    /// The group could not commit and each delivery went through the gate alone.
    Split,
}

impl GroupEnd {
    pub const ALL: [GroupEnd; 2] = [GroupEnd::Committed, GroupEnd::Split];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Committed => "committed",
            Self::Split => "split",
        }
    }
}

/// What one group did, for the metrics.
#[derive(Debug, Clone)]
pub struct GroupReport {
    pub size: usize,
    pub end: GroupEnd,
    /// Whole-group retries after a transient conflict.
    pub retries: u32,
}
