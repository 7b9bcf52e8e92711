//! The claim: inserting the business key into its claim table ([`crate::layout`]) inside the business
//! transaction, and reading an earlier claim back to explain a duplicate; one key at a time,
//! or a group's keys in one multi-row statement per claim table ([`claim_many`], [`find_many`]).
//!
//! Insert first, never select first: a select-then-insert lets two deliveries both see "absent"
//! and both apply the effect. The unique index is the only arbiter; the read here happens only
//! after the index has said "taken", to name the cause.
//!
//! A claim keeps what naming a later duplicate's cause needs and no more: the key, the msgId,
//! the UNIQ_KEY, 96 bits of the body's hash ([`crate::outcome::claim_hash`]) and the
//! time. Which instance applied it is the log's to say (the processed delivery's row);
//! `instance_id` is written empty (the column stays, for the claims made before and for
//! readers that still select it).

use std::collections::{HashMap, HashSet};

use sqlx::Row;

use super::settings::MAX_BATCH;
use crate::delivery::Delivery;
use crate::layout::ClaimTable;
use crate::outcome::{Claim, claim_hash};
use crate::route::BizKey;
use crate::store::{Backend, Conn, Pad, bind_rows, padded, padded_values, query, query_built};

/// Who is claiming, and when: the consumer group is part of the key (see
/// [`crate::gate::Identity`]).
pub(crate) struct Claimant<'a> {
    pub consumer_group: &'a str,
    pub now_ms: i64,
}

/// What a claim's `instance_id` holds: nothing (the log names the instance).
const NO_INSTANCE: &str = "";

/// Inserts the claim. True when this delivery now owns the key; false when it was taken.
///
/// A concurrent, uncommitted claim of the same key makes this wait for that transaction: if it
/// commits, the answer is false; if it rolls back, this insert goes through.
pub(crate) async fn claim(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    who: &Claimant<'_>,
    key: &BizKey,
    d: &Delivery,
    payload_hash: &str,
) -> Result<bool, sqlx::Error> {
    table
        .claim
        .execute(conn, backend, |q| {
            key.bind_in(q, who.consumer_group)
                .bind(d.msg_id.as_str())
                .bind(d.uniq_key.as_str())
                .bind(claim_hash(payload_hash))
                .bind(NO_INSTANCE)
                .bind(who.now_ms)
        })
        .await
}

/// Reads the claim that holds `key` for `consumer_group` in `table`.
pub(crate) async fn find(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    key: &BizKey,
) -> Result<Option<Claim>, sqlx::Error> {
    let row = key.bind_in(query(backend, &table.find), consumer_group).fetch_optional(conn).await?;
    row.as_ref().map(Claim::from_row).transpose()
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

/// One delivery of a group whose key is claimed in one multi-row statement: its place in the
/// group, its key, the delivery and its body's hash.
pub(super) struct Member<'a> {
    pub index: usize,
    pub key: &'a BizKey,
    pub delivery: &'a Delivery,
    pub hash: &'a str,
}

/// Claims the keys of `members` (one copy of each key) in `table` with one multi-row insert
/// that skips taken keys, in key order. Returns the indices of the members whose claim was
/// inserted.
///
/// On PostgreSQL the same statement also returns the claims that already held the other keys
/// (a data-modifying `WITH`: the insert, then the table joined to the same values), into
/// `earlier` by the members' indices, so that the duplicates' causes need no statement of their
/// own. That read sees the statement's snapshot: a claim committed by another transaction
/// while this insert waited for it is not in it, and is read afterwards as on the other
/// backends ([`find_many`]). Its cost is one index probe per key inside the statement, paid
/// whether or not the group has duplicates. SQLite and MariaDB cannot put an insert in a
/// `WITH`: there the earlier claims are read by a second statement.
pub(super) async fn claim_many(
    tx: &mut Conn,
    backend: Backend,
    path: ClaimPath,
    table: &ClaimTable,
    who: &Claimant<'_>,
    members: &[Member<'_>],
    earlier: &mut HashMap<usize, Claim>,
) -> Result<HashSet<usize>, sqlx::Error> {
    let mut ordered: Vec<&Member<'_>> = members.iter().collect();
    ordered.sort_by(|a, b| {
        (&a.key.biz_type, &a.key.biz_id, a.key.execute_time).cmp(&(
            &b.key.biz_type,
            &b.key.biz_id,
            b.key.execute_time,
        ))
    });
    let mut claimed = HashSet::new();
    for chunk in ordered.chunks(MAX_BATCH) {
        // The last key repeated up to a fixed count of rows: the copy is skipped like any taken
        // key, and each connection prepares a few texts of this statement, not one per count.
        let values = padded_values(9, chunk.len());
        // The route checked every value against its column, so IGNORE can only skip a taken
        // key here, never cut a value (and the read-back would notice if it did).
        let sql = match (backend, path) {
            (Backend::Postgres, _) => format!(
                "WITH v {CLAIM_COLUMNS} AS (VALUES {values}), \
                 claimed AS (INSERT INTO {t} {CLAIM_COLUMNS} SELECT * FROM v \
                 ON CONFLICT (consumer_group, biz_type, biz_id, execute_time) DO NOTHING \
                 RETURNING biz_type, biz_id, execute_time) \
                 SELECT NULL, NULL, NULL, biz_type, biz_id, execute_time FROM claimed \
                 UNION ALL \
                 SELECT r.msg_id, r.uniq_key, r.payload_hash, r.biz_type, r.biz_id, r.execute_time \
                 FROM {t} r JOIN v ON r.consumer_group = v.consumer_group AND r.biz_type = v.biz_type \
                 AND r.biz_id = v.biz_id AND r.execute_time = v.execute_time",
                t = table.name
            ),
            (Backend::Sqlite, _) => format!(
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
        let last = chunk[chunk.len() - 1];
        let q = bind_rows(query_built(backend, sql), chunk, &last, Pad::Repeat, |q, m| {
            m.key
                .bind_in(q, who.consumer_group)
                .bind(m.delivery.msg_id.as_str())
                .bind(m.delivery.uniq_key.as_str())
                .bind(claim_hash(m.hash))
                .bind(NO_INSTANCE)
                .bind(who.now_ms)
        });
        let inserted = match (backend, path) {
            (Backend::MySql, ClaimPath::ReadBack) => {
                let count = q.execute(&mut *tx).await?.rows_affected();
                let ours = read_back(tx, backend, table, who, chunk).await?;
                // Every row this insert wrote is visible to its own transaction and matches the
                // values it wrote. More matches than rows inserted: another delivery's claim
                // looks exactly like one of ours (the same message claimed in the same
                // millisecond), fewer: a value was not stored as written.
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
            (Backend::Postgres, _) => {
                let mut inserted = HashSet::with_capacity(chunk.len());
                let mut held: HashMap<(String, String, i64), Claim> = HashMap::new();
                for row in q.fetch_all(&mut *tx).await? {
                    let key = (row.try_get(3)?, row.try_get(4)?, row.try_get(5)?);
                    match row.try_get::<Option<String>, _>(0)? {
                        None => {
                            inserted.insert(key);
                        }
                        Some(_) => {
                            held.insert(key, Claim::from_row(&row)?);
                        }
                    }
                }
                for m in chunk {
                    let key = (m.key.biz_type.clone(), m.key.biz_id.clone(), m.key.execute_time);
                    if let (false, Some(claim)) = (inserted.contains(&key), held.remove(&key)) {
                        earlier.insert(m.index, claim);
                    }
                }
                inserted
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
        for m in chunk {
            if inserted.contains(&(m.key.biz_type.clone(), m.key.biz_id.clone(), m.key.execute_time)) {
                claimed.insert(m.index);
            }
        }
    }
    Ok(claimed)
}

/// The keys of `chunk` whose claim in `table` is the one this group just wrote: the same
/// message (msgId, UNIQ_KEY, body hash) at this group's claim time. Another claim that looks
/// exactly like one of these (the same message claimed in the same millisecond elsewhere) makes
/// more rows match than the insert wrote, which the caller refuses.
async fn read_back(
    tx: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    who: &Claimant<'_>,
    chunk: &[&Member<'_>],
) -> Result<HashSet<(String, String, i64)>, sqlx::Error> {
    // Padded like the insert, the last key repeated.
    let any_of = vec![
        "(biz_type = ? AND biz_id = ? AND execute_time = ? AND msg_id = ? AND uniq_key = ? AND payload_hash = ?)";
        padded(chunk.len())
    ]
    .join(" OR ");
    let sql = format!(
        "SELECT biz_type, biz_id, execute_time FROM {} \
         WHERE consumer_group = ? AND claimed_at_ms = ? AND ({any_of})",
        table.name
    );
    let q = query_built(backend, sql).bind(who.consumer_group).bind(who.now_ms);
    let last = chunk[chunk.len() - 1];
    let q = bind_rows(q, chunk, &last, Pad::Repeat, |q, m| {
        m.key
            .bind_parts(q)
            .bind(m.delivery.msg_id.as_str())
            .bind(m.delivery.uniq_key.as_str())
            .bind(claim_hash(m.hash))
    });
    let mut ours = HashSet::with_capacity(chunk.len());
    for row in q.fetch_all(&mut *tx).await? {
        ours.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
    }
    Ok(ours)
}

/// Keys per statement that reads earlier claims.
const FIND_CHUNK: usize = 16;

/// Reads the claims of `members`' keys from `table` in one statement per [`FIND_CHUNK`] keys,
/// into `found` by the members' indices.
pub(super) async fn find_many(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    members: &[Member<'_>],
    found: &mut HashMap<usize, Claim>,
) -> Result<(), sqlx::Error> {
    for chunk in members.chunks(FIND_CHUNK) {
        // Always FIND_CHUNK conditions, the last key repeated: one statement text, prepared
        // once per connection, instead of one per count of duplicates.
        let any_of = vec!["(biz_type = ? AND biz_id = ? AND execute_time = ?)"; FIND_CHUNK].join(" OR ");
        let sql = format!(
            "SELECT msg_id, uniq_key, payload_hash, biz_type, biz_id, execute_time FROM {} \
             WHERE consumer_group = ? AND ({any_of})",
            table.name
        );
        let mut q = query_built(backend, sql).bind(consumer_group);
        let last = chunk[chunk.len() - 1].key;
        for key in chunk.iter().map(|m| m.key).chain(std::iter::repeat(last)).take(FIND_CHUNK) {
            q = key.bind_parts(q);
        }
        let mut claims: HashMap<(String, String, i64), Claim> = HashMap::new();
        for row in q.fetch_all(&mut *conn).await? {
            claims.insert((row.try_get(3)?, row.try_get(4)?, row.try_get(5)?), Claim::from_row(&row)?);
        }
        for m in chunk {
            if let Some(c) = claims.get(&(m.key.biz_type.clone(), m.key.biz_id.clone(), m.key.execute_time)) {
                found.insert(m.index, c.clone());
            }
        }
    }
    Ok(())
}
