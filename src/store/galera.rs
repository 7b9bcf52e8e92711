//! What a MariaDB Galera node asks of the service. Galera replicates every write to every node
//! at COMMIT and certifies it there, so it changes three rules the gate relies on:
//!
//! - a read on one node may not yet see what another node committed: every connection to a
//!   Galera node sets `wsrep_sync_wait = 1` ([`prepare_connection`]), so that each read first
//!   waits for the node to apply every write set the cluster had ordered when it began (causal
//!   reads: the duplicate's earlier claim, the archive guard, the leases, replay's check);
//! - a table without a primary key replicates badly (each row found by a scan on every node, and
//!   no safe parallel apply), and only InnoDB tables replicate: [`check`] refuses to start on a
//!   database with such a table, naming it;
//! - two nodes must not hand out the same auto-increment id, or every concurrent insert on two
//!   nodes fails certification: [`check`] refuses a node whose increment is below the cluster's
//!   size while `wsrep_auto_increment_control` is off.
//!
//! It also reads how the node makes a commit durable ([`flush_log_at_trx_commit`]): a commit
//! Galera acknowledged is in every node's memory, but under the setting MariaDB's Galera guides
//! recommend (2: the redo log written at each commit, flushed once a second) it is on no disk
//! yet, and Jepsen lost acknowledged transactions to nodes crashing in quick succession
//! (MariaDB Galera Cluster 12.1.2, March 2026). The service warns at start unless it is 1.
//!
//! Conflicts with other nodes' writes surface at COMMIT as error 1213, which the store counts as
//! [`super::TransientCause::Certification`]. This module must not know about claims or deliveries.

use sqlx::{AnyConnection, AnyPool, Executor, Row};

/// Causal reads: a read waits until the node has applied what the cluster ordered before it.
const CAUSAL_READS: &str = "SET SESSION wsrep_sync_wait = 1";

/// The tables of this database that are not InnoDB or have no primary key, with their engine.
const UNFIT_TABLES: &str = "SELECT t.TABLE_NAME, COALESCE(t.ENGINE, ''), \
     CASE WHEN EXISTS (SELECT 1 FROM information_schema.TABLE_CONSTRAINTS c \
         WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME \
         AND c.CONSTRAINT_TYPE = 'PRIMARY KEY') THEN 1 ELSE 0 END \
     FROM information_schema.TABLES t \
     WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_TYPE = 'BASE TABLE' \
     ORDER BY t.TABLE_NAME";

/// The settings that decide how auto-increment ids are handed out, and the cluster's size.
const ID_SETTINGS: &str = "SELECT CAST(@@wsrep_auto_increment_control AS SIGNED), \
     CAST(@@auto_increment_increment AS SIGNED), CAST(@@auto_increment_offset AS SIGNED), (SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS \
     WHERE VARIABLE_NAME = 'WSREP_CLUSTER_SIZE')";

#[derive(Debug, thiserror::Error)]
pub(crate) enum GaleraError {
    #[error(
        "table {table} has no primary key: a Galera cluster replicates it badly (every row found by a \
         scan on every node, no parallel apply); give it one before running on Galera"
    )]
    NoPrimaryKey { table: String },
    #[error("table {table} is {engine}, not InnoDB: a Galera cluster replicates only InnoDB tables")]
    NotInnoDb { table: String, engine: String },
    #[error(
        "auto_increment_increment is {increment} on a cluster of {size} nodes with \
         wsrep_auto_increment_control off: two nodes would hand out the same ids and every \
         concurrent insert on two nodes would fail certification; turn wsrep_auto_increment_control \
         on, or set auto_increment_increment to at least {size} and a distinct auto_increment_offset \
         on each node"
    )]
    SharedIds { increment: i64, size: i64 },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// How a Galera node hands out auto-increment ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdSettings {
    /// `wsrep_auto_increment_control`: the node sets the two below from the cluster's size
    /// and its own index, every time the membership changes.
    pub control: bool,
    pub increment: i64,
    pub offset: i64,
    pub cluster_size: i64,
}

/// True when the connection's server is a Galera node (`wsrep_on`).
pub(crate) async fn is_node(conn: &mut AnyConnection) -> Result<bool, sqlx::Error> {
    // SHOW, not @@wsrep_on: MySQL and MariaDB built without wsrep have no such variable.
    let row = conn.fetch_optional("SHOW SESSION VARIABLES LIKE 'wsrep_on'").await?;
    Ok(match row {
        Some(row) => row.try_get::<String, _>(1)?.eq_ignore_ascii_case("ON"),
        None => false,
    })
}

/// Turns causal reads on for a new connection when its server is a Galera node.
pub(crate) async fn prepare_connection(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    if is_node(conn).await? {
        conn.execute(CAUSAL_READS).await?;
    }
    Ok(())
}

/// `innodb_flush_log_at_trx_commit`: 1 flushes the redo log to disk before a commit returns;
/// 2 writes it to the operating system and flushes once a second; 0 neither.
const FLUSH_SETTING: &str = "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)";

/// How the node makes a commit durable: `innodb_flush_log_at_trx_commit`. Anything but 1
/// leaves up to a second of acknowledged commits in memory only, on every node at once.
pub async fn flush_log_at_trx_commit(pool: &AnyPool) -> Result<i64, sqlx::Error> {
    sqlx::query(FLUSH_SETTING).fetch_one(pool).await?.try_get(0)
}

/// The node's auto-increment settings.
pub async fn id_settings(pool: &AnyPool) -> Result<IdSettings, sqlx::Error> {
    let row = sqlx::query(ID_SETTINGS).fetch_one(pool).await?;
    Ok(IdSettings {
        control: row.try_get::<i64, _>(0)? != 0,
        increment: row.try_get(1)?,
        offset: row.try_get(2)?,
        cluster_size: row.try_get::<Option<i64>, _>(3)?.unwrap_or(1),
    })
}

/// The start-up checks on a Galera node (see [`super::Store::is_galera`]): every table of the
/// database is InnoDB and has a primary key, and the node hands out ids no other node hands
/// out. Returns the node's auto-increment settings.
pub(crate) async fn check(pool: &AnyPool) -> Result<IdSettings, GaleraError> {
    for row in sqlx::query(UNFIT_TABLES).fetch_all(pool).await? {
        let table: String = row.try_get(0)?;
        let engine: String = row.try_get(1)?;
        if !engine.eq_ignore_ascii_case("InnoDB") {
            return Err(GaleraError::NotInnoDb { table, engine });
        }
        if row.try_get::<i64, _>(2)? == 0 {
            return Err(GaleraError::NoPrimaryKey { table });
        }
    }
    let ids = id_settings(pool).await?;
    if !ids.control && ids.increment < ids.cluster_size {
        return Err(GaleraError::SharedIds { increment: ids.increment, size: ids.cluster_size });
    }
    Ok(ids)
}
