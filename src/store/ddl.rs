//! What the service's schema moves share: one bounded step at a time ([`Step`]), run on a
//! connection of their own ([`connection`]) whose lock waits are bounded ([`LOCK_WAIT`]), so
//! that a step waiting behind a long reader fails and is tried again by the next run rather than
//! holding every writer behind it.

use std::time::Duration;

use sqlx::{AnyConnection, AssertSqlSafe, Executor, Row};

use super::{Backend, MySqlFlavour, Store};

/// How long a step waits for a lock before it gives up (and the next run tries again).
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// One step of a schema move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing is left to do (or the backend keeps its shape).
    Done,
    /// This step did what it says; more follow.
    More(String),
    /// Nothing to do before something else ends (another process's index build, a lock held
    /// past [`LOCK_WAIT`]); the next run goes on.
    Waiting(String),
}

/// A connection of its own for long DDL: no statement bound (a concurrent index build or a
/// validation reads the whole table), lock waits bounded by `lock_wait`. It is closed, not
/// returned to the pool, so the pool's connections keep their own settings.
pub async fn connection(store: &Store, lock_wait: Option<Duration>) -> Result<AnyConnection, sqlx::Error> {
    let mut conn = store.pool().acquire().await?.detach();
    let ms = lock_wait.map_or(0, |w| w.as_millis());
    match store.backend() {
        Backend::Postgres => {
            conn.execute(AssertSqlSafe(format!("SET statement_timeout = 0; SET lock_timeout = {ms}")))
                .await?;
        }
        Backend::MySql => {
            // lock_wait_timeout counts whole seconds; MariaDB's max_statement_time, MySQL's
            // max_execution_time (SELECTs only) bound statements: off here.
            let secs = lock_wait.map_or(31_536_000, |w| w.as_secs().max(1));
            conn.execute(AssertSqlSafe(format!("SET SESSION lock_wait_timeout = {secs}"))).await?;
            if store.mysql_flavour() == Some(MySqlFlavour::MariaDb) {
                conn.execute("SET SESSION max_statement_time = 0").await?;
            }
        }
        Backend::Sqlite => {}
    }
    Ok(conn)
}

/// Runs `statements` in order on `conn`.
pub async fn run_all(conn: &mut AnyConnection, statements: &[String]) -> Result<(), sqlx::Error> {
    for s in statements {
        conn.execute(AssertSqlSafe(s.clone())).await?;
    }
    Ok(())
}

/// The rows of `table`, counted up to `limit`: whether a table is small enough to move now.
pub async fn rows_up_to(store: &Store, table: &str, limit: i64) -> Result<i64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!("SELECT COUNT(*) FROM (SELECT 1 FROM {table} LIMIT {limit}) t")))
        .fetch_one(store.pool())
        .await?
        .try_get(0)
}

/// PostgreSQL: `index`, which a concurrent build killed half-way left invalid, dropped
/// (concurrently) so that the next step builds it again; unless another session is building it
/// still, which the next run waits for.
pub async fn pg_drop_unfinished(conn: &mut AnyConnection, index: &str) -> Result<Step, sqlx::Error> {
    let building: i64 =
        sqlx::query("SELECT COUNT(*) FROM pg_stat_progress_create_index WHERE index_relid = to_regclass($1)")
            .bind(index.to_owned())
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
    if building > 0 {
        return Ok(Step::Waiting(format!("the index {index} is being built by another session")));
    }
    conn.execute(AssertSqlSafe(format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"))).await?;
    Ok(Step::More(format!("dropped the unfinished index {index}")))
}

/// True when `e` is a lock wait given up (PostgreSQL's `lock_timeout`, MySQL's lock wait
/// timeout, a metadata lock's included).
pub fn lock_wait_ended(e: &sqlx::Error) -> bool {
    super::transient_cause(e, false) == Some(super::TransientCause::LockWait)
}
