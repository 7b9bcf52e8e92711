//! The archive lease: one row in `archive_lease` that lets one instance archive at a time when
//! several `serve` processes share a database, with no coordinator besides the database.
//!
//! Taking it is an insert-if-absent, or a conditional update of an expired row; it is renewed
//! before every batch and given back at the end by expiring it. A run that crashed leaves its row
//! behind and the lease simply expires. The row keeps when it was last taken, so that instances
//! woken by the same schedule tick take it once between them: a run that finished quickly does
//! not let a slower instance archive again for the same tick. This module owns `archive_lease`; it must not decide what a run does.

use sqlx::Row;

use crate::store::{InsertIfAbsent, Sql, Store, insert_if_absent};

/// The lease every archive run takes.
pub(crate) const ARCHIVE_LEASE: &str = "archive";

static TAKE: InsertIfAbsent = insert_if_absent!(
    "INSERT INTO archive_lease (name, holder, acquired_at_ms, expires_at_ms) VALUES (?, ?, ?, ?)",
    conflict = "(name)",
    index = "PRIMARY"
);
static TAKE_OVER: Sql = Sql::new(
    "UPDATE archive_lease SET holder = ?, acquired_at_ms = ?, expires_at_ms = ? \
     WHERE name = ? AND expires_at_ms <= ? AND acquired_at_ms < ?",
);
static RENEW: Sql = Sql::new("UPDATE archive_lease SET expires_at_ms = ? WHERE name = ? AND holder = ?");
// Given back by expiring it at 0 rather than "now": another host's clock may be behind ours.
static RELEASE: Sql = Sql::new("UPDATE archive_lease SET expires_at_ms = 0 WHERE name = ? AND holder = ?");
static HOLDER: Sql = Sql::new("SELECT holder, expires_at_ms FROM archive_lease WHERE name = ?");

/// A lease this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    pub name: String,
    /// `instance/token`: unique per run, so two runs in one process do not share it.
    pub holder: String,
}

/// Who holds a lease we could not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub holder: String,
    pub until_ms: i64,
}

impl Lease {
    /// Takes `name` for `holder` until `now_ms + ttl_ms`, unless another holder's lease is still
    /// running, or the lease was taken at or after `tick_ms` (the schedule tick this run serves;
    /// `i64::MAX` for a run by hand); then says whose it is.
    ///
    /// On a Galera cluster two instances on two nodes may both take the lease on their own node;
    /// the later commit then fails certification. That attempt is made again, and finds the
    /// lease taken since the tick, as on one server.
    pub(crate) async fn acquire(
        store: &Store,
        name: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
        tick_ms: i64,
    ) -> Result<Result<Lease, Held>, sqlx::Error> {
        let wanted = Lease { name: name.to_owned(), holder: holder.to_owned() };
        let (taken, _) =
            store.retry_transient(3, 20, || wanted.try_take(store, now_ms, ttl_ms, tick_ms)).await;
        Ok(match taken? {
            true => Ok(wanted),
            // Released between our two statements: report it as free from now; the next tick takes it.
            false => Err(self::holder(store, name)
                .await?
                .unwrap_or(Held { holder: String::new(), until_ms: now_ms })),
        })
    }

    /// One attempt at taking this lease (see [`Lease::acquire`]): true when it is ours.
    async fn try_take(
        &self,
        store: &Store,
        now_ms: i64,
        ttl_ms: i64,
        tick_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let (name, holder) = (self.name.as_str(), self.holder.as_str());
        let backend = store.backend();
        let mut conn = store.pool().acquire().await?;
        let expires = now_ms + ttl_ms;
        let taken = TAKE
            .execute(&mut conn, backend, |q| q.bind(name).bind(holder).bind(now_ms).bind(expires))
            .await?;
        if taken {
            return Ok(true);
        }
        let over = store
            .query(&TAKE_OVER)
            .bind(holder)
            .bind(now_ms)
            .bind(expires)
            .bind(name)
            .bind(now_ms)
            .bind(tick_ms)
            .execute(&mut *conn)
            .await?;
        Ok(over.rows_affected() == 1)
    }

    /// Extends the lease to `now_ms + ttl_ms`. False when it is no longer ours (it expired and
    /// another instance took it).
    pub(crate) async fn renew(&self, store: &Store, now_ms: i64, ttl_ms: i64) -> Result<bool, sqlx::Error> {
        // MySQL/MariaDB report matched rows here, not changed ones: sqlx connects with
        // CLIENT_FOUND_ROWS, so an unchanged expiry still counts as renewed.
        let done = store
            .query(&RENEW)
            .bind(now_ms + ttl_ms)
            .bind(self.name.as_str())
            .bind(self.holder.as_str())
            .execute(store.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives the lease back, if it is still ours, by expiring it. The row stays: it remembers
    /// when the lease was last taken.
    pub(crate) async fn release(&self, store: &Store) -> Result<(), sqlx::Error> {
        store
            .query(&RELEASE)
            .bind(self.name.as_str())
            .bind(self.holder.as_str())
            .execute(store.pool())
            .await?;
        Ok(())
    }
}

/// Who holds `name`, and until when (possibly in the past: an expired lease not yet taken over).
pub(crate) async fn holder(store: &Store, name: &str) -> Result<Option<Held>, sqlx::Error> {
    let row = store.query(&HOLDER).bind(name).fetch_optional(store.pool()).await?;
    row.map(|r| Ok(Held { holder: r.try_get(0)?, until_ms: r.try_get(1)? })).transpose()
}
