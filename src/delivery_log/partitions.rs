//! The delivery log partitioned by day (PostgreSQL's declarative partitioning, MariaDB/MySQL's
//! `PARTITION BY RANGE`), on `logged_at_ms`, in UTC days.
//!
//! Retention then drops a whole day in one catalog change instead of deleting its rows one by
//! one, and leaves no dead rows behind. The table's shape is read from the catalog
//! ([`shape`]); SQLite keeps the plain table.
//!
//! - **Partitions** are a day each (`delivery_log_d20261206` on PostgreSQL, `p20261206` on
//!   MariaDB/MySQL), made [`DAYS_AHEAD`] days ahead by [`ensure_ahead`]; a row no day
//!   partition takes (the job fell behind, a clock far off) lands in the overflow partition
//!   (`delivery_log_overflow`, the DEFAULT one; `poverflow`, below MAXVALUE), never in an error.
//! - **Retention** ([`drop_expired`]) drops the day partitions that end at or before the cutoff:
//!   a row is kept for the retention and at most one day longer. The rows of the overflow and
//!   of the `before` partition (below) are deleted in batches, as on a plain table.
//! - **Moving an existing table** ([`convert_step`]) happens while consumers write, one bounded
//!   step per call, each step safe to repeat after a crash:
//!   - PostgreSQL: a unique index on `(attempt_id, logged_at_ms)` is built concurrently, then a
//!     CHECK that every row is older than a bound a day or more ahead is added and validated
//!     (neither blocks a writer); then, in one short transaction, the old table is renamed
//!     `delivery_log_before` and attached, without a scan, as the partition of everything older
//!     than the bound, under a new partitioned `delivery_log` that takes the old table's index
//!     definitions and its id sequence.
//!   - MariaDB/MySQL (no way to attach a table): a partitioned copy is made and kept current by
//!     triggers while the old rows are copied over in batches of ids; then one atomic
//!     `RENAME TABLE` swaps the two and the old table is dropped.
//!
//! Every step that takes a lock writers would queue behind bounds its wait ([`LOCK_WAIT`]), so
//! a step waiting behind a long reader fails and is retried by the next run rather than holding
//! every writer behind it; the concurrent index build and the validation, which let writers
//! through, wait as long as they need.
//!
//! This module owns the log's DDL. It must not take the archive lease (the archive job calls it
//! holding it) nor decide which rows have expired.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AssertSqlSafe, Connection, Executor, Row};

pub use crate::store::ddl::{LOCK_WAIT, Step};
use crate::store::ddl::{connection as ddl_connection, pg_drop_unfinished, run_all};
use crate::store::{Backend, Store};

/// A day, in milliseconds.
pub const DAY_MS: i64 = 86_400_000;
/// Day partitions exist this many days past today.
pub const DAYS_AHEAD: i64 = 3;
/// Ids of old rows one copy step of the MariaDB/MySQL move carries.
const COPY_BATCH_IDS: i64 = 5_000;
/// The most overflow rows moved into a new partition, under a lock on the log (PostgreSQL).
pub const MOVE_LIMIT: i64 = 10_000;
/// The overflow rows a scrape counts at most.
const OVERFLOW_COUNT_LIMIT: i64 = 100_000;

const TABLE: &str = "delivery_log";
const PG_BEFORE: &str = "delivery_log_before";
const PG_OVERFLOW: &str = "delivery_log_overflow";
const MY_BEFORE: &str = "pbefore";
const MY_OVERFLOW: &str = "poverflow";
const MY_COPY: &str = "delivery_log_partitioned";
const MY_OLD: &str = "delivery_log_unpartitioned";
const MY_PROGRESS: &str = "delivery_log_conversion";
const MY_TRIGGERS: [&str; 2] = ["delivery_log_copy_insert", "delivery_log_copy_delete"];
/// The CHECK that lets PostgreSQL attach the old table without reading it.
const PG_BOUND_CHECK: &str = "delivery_log_before_bound";
/// The unique index every partition carries (a unique index of a partitioned table must hold
/// the partition key).
const PG_ATTEMPT_INDEX: &str = "delivery_log_attempt_at";

/// What rows one partition takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Everything older than `to_ms`: the table as it was before it was partitioned.
    Before { to_ms: i64 },
    /// One day (or, after the job was stopped for a while, the days it missed).
    Day { from_ms: i64, to_ms: i64 },
    /// What no other partition takes.
    Overflow,
}

/// One partition, with the rows the catalog estimates it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub bound: Bound,
    pub estimated_rows: i64,
}

impl Partition {
    /// How a statement names this partition's rows: its own table on PostgreSQL,
    /// `delivery_log PARTITION (p)` on MySQL/MariaDB.
    pub fn table(&self, backend: Backend) -> String {
        partition_table(backend, &self.name)
    }

    /// The statement that drops this partition with its rows.
    pub fn drop_statement(&self, backend: Backend) -> String {
        match backend {
            Backend::MySql => format!("ALTER TABLE {TABLE} DROP PARTITION {}", self.name),
            Backend::Postgres | Backend::Sqlite => format!("DROP TABLE {}", self.name),
        }
    }

    /// The end of the time it takes, if it has one.
    pub fn to_ms(&self) -> Option<i64> {
        match self.bound {
            Bound::Before { to_ms } | Bound::Day { to_ms, .. } => Some(to_ms),
            Bound::Overflow => None,
        }
    }
}

/// The log's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    Plain,
    /// The partitions, oldest first, the overflow last.
    Partitioned(Vec<Partition>),
}

impl Shape {
    /// The end of the newest partition with a bound: rows logged before it have a partition of
    /// their own time.
    pub fn covered_until_ms(&self) -> Option<i64> {
        match self {
            Shape::Plain => None,
            Shape::Partitioned(parts) => parts.iter().filter_map(Partition::to_ms).max(),
        }
    }

    pub fn partitions(&self) -> &[Partition] {
        match self {
            Shape::Plain => &[],
            Shape::Partitioned(parts) => parts,
        }
    }

    /// The tables (PostgreSQL) or table partitions (MySQL/MariaDB, as `delivery_log PARTITION
    /// (p)`) whose expired rows are deleted row by row, in the order the archive walks them.
    pub fn row_wise_tables(&self, backend: Backend) -> Vec<String> {
        let Shape::Partitioned(parts) = self else { return vec![TABLE.to_owned()] };
        parts
            .iter()
            .filter(|p| matches!(p.bound, Bound::Before { .. } | Bound::Overflow))
            .map(|p| p.table(backend))
            .collect()
    }
}

/// How a statement names the rows of the partition `name` ([`Partition::table`]).
fn partition_table(backend: Backend, name: &str) -> String {
    match backend {
        Backend::MySql => format!("{TABLE} PARTITION ({name})"),
        Backend::Postgres | Backend::Sqlite => name.to_owned(),
    }
}

/// The UTC day `ms` falls in, from its first millisecond.
pub fn day_start(ms: i64) -> i64 {
    ms - ms.rem_euclid(DAY_MS)
}

/// `yyyymmdd` of the UTC day starting at `ms`.
fn day_name(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y%m%d").to_string())
        .unwrap_or_else(|| format!("ms{ms}"))
}

/// The first millisecond of the day a `p20261206` names.
fn day_of_name(name: &str) -> Option<i64> {
    let date = chrono::NaiveDate::parse_from_str(name.strip_prefix('p')?, "%Y%m%d").ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// The partition name of the day (or days) starting at `from_ms`.
fn partition_name(backend: Backend, from_ms: i64) -> String {
    match backend {
        Backend::MySql => format!("p{}", day_name(from_ms)),
        Backend::Postgres | Backend::Sqlite => format!("{TABLE}_d{}", day_name(from_ms)),
    }
}

/// The bound of everything older when a plain table is moved at `now_ms`: the start of the day
/// after tomorrow, so that rows written while the move goes on stay below it.
fn before_bound(now_ms: i64) -> i64 {
    day_start(now_ms) + 2 * DAY_MS
}

/// Reads the log's shape from the catalog.
pub async fn shape(store: &Store) -> Result<Shape, sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    match store.backend() {
        Backend::Sqlite => Ok(Shape::Plain),
        Backend::Postgres => pg_shape(&mut conn).await,
        Backend::MySql => my_shape(&mut conn, TABLE).await,
    }
}

async fn pg_shape(conn: &mut AnyConnection) -> Result<Shape, sqlx::Error> {
    let kind: Option<String> =
        sqlx::query("SELECT relkind::text FROM pg_class WHERE oid = to_regclass('delivery_log')")
            .fetch_optional(&mut *conn)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
    if kind.as_deref() != Some("p") {
        return Ok(Shape::Plain);
    }
    let rows = sqlx::query(
        "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)::text, GREATEST(c.reltuples, 0)::bigint \
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = to_regclass('delivery_log')",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut parts = Vec::new();
    for row in rows {
        let (name, bound, estimated_rows): (String, String, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let bound = parse_pg_bound(&bound).ok_or_else(|| {
            sqlx::Error::Protocol(format!("partition {name} of the log has a bound not ours: {bound}"))
        })?;
        parts.push(Partition { name, bound, estimated_rows });
    }
    parts.sort_by_key(order);
    Ok(Shape::Partitioned(parts))
}

/// Oldest first, the overflow last.
fn order(p: &Partition) -> (i64, i64) {
    match p.bound {
        Bound::Before { .. } => (0, i64::MIN),
        Bound::Day { from_ms, .. } => (0, from_ms),
        Bound::Overflow => (1, 0),
    }
}

/// Reads `FOR VALUES FROM (MINVALUE) TO ('1765065600000')`, `… FROM ('a') TO ('b')` or
/// `DEFAULT`.
fn parse_pg_bound(text: &str) -> Option<Bound> {
    if text.trim() == "DEFAULT" {
        return Some(Bound::Overflow);
    }
    let value = |after: &str| -> Option<String> {
        let start = text.find(after)? + after.len();
        let end = start + text[start..].find(')')?;
        Some(text[start..end].trim().trim_matches('\'').to_owned())
    };
    let (from, to) = (value("FROM (")?, value("TO (")?);
    let to_ms = to.parse().ok()?;
    if from == "MINVALUE" {
        return Some(Bound::Before { to_ms });
    }
    Some(Bound::Day { from_ms: from.parse().ok()?, to_ms })
}

async fn my_shape(conn: &mut AnyConnection, table: &str) -> Result<Shape, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT CAST(PARTITION_NAME AS CHAR), CAST(PARTITION_DESCRIPTION AS CHAR), CAST(COALESCE(TABLE_ROWS, 0) AS SIGNED) \
         FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
         ORDER BY PARTITION_ORDINAL_POSITION",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await?;
    let mut parts = Vec::new();
    let mut from_ms = None;
    for row in rows {
        let name: Option<String> = row.try_get(0)?;
        let Some(name) = name else { return Ok(Shape::Plain) };
        let description: Option<String> = row.try_get(1)?;
        let estimated_rows: i64 = row.try_get(2)?;
        let description = description.unwrap_or_default();
        let bound = if description == "MAXVALUE" {
            Bound::Overflow
        } else {
            let to_ms: i64 = description.trim().parse().map_err(|_| {
                sqlx::Error::Protocol(format!(
                    "partition {name} of {table} has a bound not ours: {description}"
                ))
            })?;
            // A partition takes what is below its bound and above the one before: the first
            // day left once `pbefore` is dropped starts, as far as it is concerned, at its
            // name's day.
            let bound = match from_ms {
                _ if name == MY_BEFORE => Bound::Before { to_ms },
                Some(from_ms) => Bound::Day { from_ms, to_ms },
                None => Bound::Day { from_ms: day_of_name(&name).unwrap_or(to_ms - DAY_MS), to_ms },
            };
            from_ms = Some(to_ms);
            bound
        };
        parts.push(Partition { name, bound, estimated_rows });
    }
    if parts.is_empty() {
        return Ok(Shape::Plain);
    }
    Ok(Shape::Partitioned(parts))
}

/// Takes the next step of moving the log to the partitioned shape at `now_ms`: call it until
/// it says [`Step::Done`], holding the archive lease so no two processes take steps at once.
pub async fn convert_step(store: &Store, now_ms: i64) -> Result<Step, sqlx::Error> {
    match store.backend() {
        Backend::Sqlite => Ok(Step::Done),
        Backend::Postgres => match shape(store).await? {
            Shape::Partitioned(_) => Ok(Step::Done),
            Shape::Plain => pg_step(store, now_ms).await,
        },
        Backend::MySql => my_step(store, now_ms).await,
    }
}

async fn pg_step(store: &Store, now_ms: i64) -> Result<Step, sqlx::Error> {
    // 1. The unique index every partition will carry, built without blocking writers. A build
    // killed half-way leaves an invalid index: dropped and built again.
    let mut conn = ddl_connection(store, None).await?;
    let valid: Option<bool> = sqlx::query(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass('delivery_log_attempt_at')",
    )
    .fetch_optional(&mut conn)
    .await?
    .map(|r| r.try_get(0))
    .transpose()?;
    match valid {
        None => {
            conn.execute(AssertSqlSafe(format!(
                "CREATE UNIQUE INDEX CONCURRENTLY {PG_ATTEMPT_INDEX} ON {TABLE} (attempt_id, logged_at_ms) \
                 WHERE attempt_id IS NOT NULL"
            )))
            .await?;
            return Ok(Step::More(format!("built the unique index {PG_ATTEMPT_INDEX} concurrently")));
        }
        Some(false) => return pg_drop_unfinished(&mut conn, PG_ATTEMPT_INDEX).await,
        Some(true) => {}
    }
    // 2. Every row older than a bound at least a day ahead, said by a CHECK, added without a
    // read and validated without blocking writers; one that has come too close is replaced.
    let check = sqlx::query(
        "SELECT pg_get_constraintdef(oid)::text, convalidated FROM pg_constraint \
         WHERE conrelid = to_regclass('delivery_log') AND conname = 'delivery_log_before_bound'",
    )
    .fetch_optional(&mut conn)
    .await?;
    let check: Option<(Option<i64>, bool)> = check
        .map(|r| -> Result<_, sqlx::Error> { Ok((first_number(&r.try_get::<String, _>(0)?), r.try_get(1)?)) })
        .transpose()?;
    conn.execute(AssertSqlSafe(format!("SET lock_timeout = {}", LOCK_WAIT.as_millis()))).await?;
    let bound = match check {
        Some((Some(bound), validated)) if bound >= now_ms + DAY_MS / 2 => {
            if !validated {
                conn.execute("SET lock_timeout = 0").await?;
                conn.execute(AssertSqlSafe(format!(
                    "ALTER TABLE {TABLE} VALIDATE CONSTRAINT {PG_BOUND_CHECK}"
                )))
                .await?;
                return Ok(Step::More(format!("validated {PG_BOUND_CHECK}")));
            }
            bound
        }
        _ => {
            let bound = before_bound(now_ms);
            run_all(
                &mut conn,
                &[
                    format!("ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {PG_BOUND_CHECK}"),
                    format!(
                        "ALTER TABLE {TABLE} ADD CONSTRAINT {PG_BOUND_CHECK} CHECK (logged_at_ms < {bound}) NOT VALID"
                    ),
                ],
            )
            .await?;
            return Ok(Step::More(format!("added {PG_BOUND_CHECK} (logged_at_ms < {bound})")));
        }
    };
    // 3. The swap, in one transaction of catalog changes only.
    let mut tx = conn.begin().await?;
    let sequence: Option<String> = sqlx::query("SELECT pg_get_serial_sequence('delivery_log', 'id')::text")
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    let indexes = sqlx::query(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid)::text, i.indisprimary, i.indisunique \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass('delivery_log') ORDER BY c.relname",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut renames = Vec::new();
    let mut definitions = Vec::new();
    for row in &indexes {
        let (name, definition, primary, unique): (String, String, bool, bool) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
        renames.push(format!(
            "ALTER INDEX {} RENAME TO {}",
            quoted(&name),
            quoted(&before_index_name(&name))
        ));
        // The primary key and the unique index of the attempt alone stay on the old table
        // only: a partitioned table's unique index must hold the partition key, and ids come
        // from the sequence.
        let only_the_old_tables = primary || (unique && name != PG_ATTEMPT_INDEX);
        if !only_the_old_tables {
            definitions.push(definition);
        }
    }
    let mut statements = vec![format!("ALTER TABLE {TABLE} RENAME TO {PG_BEFORE}")];
    statements.extend(renames);
    statements.push(format!(
        "CREATE TABLE {TABLE} (LIKE {PG_BEFORE} INCLUDING DEFAULTS INCLUDING STORAGE) PARTITION BY RANGE (logged_at_ms)"
    ));
    if let Some(sequence) = sequence {
        statements.push(format!("ALTER SEQUENCE {sequence} OWNED BY {TABLE}.id"));
    }
    // The old definitions, word for word, on the new table: the old table's indexes match them
    // and are attached as they are, none built.
    statements.extend(definitions);
    statements.push(format!(
        "ALTER TABLE {TABLE} ATTACH PARTITION {PG_BEFORE} FOR VALUES FROM (MINVALUE) TO ({bound})"
    ));
    statements.push(format!("CREATE TABLE {PG_OVERFLOW} PARTITION OF {TABLE} DEFAULT"));
    for s in &statements {
        tx.execute(AssertSqlSafe(s.clone())).await?;
    }
    tx.commit().await?;
    Ok(Step::Done)
}

/// The first run of digits in `text`, as a number.
fn first_number(text: &str) -> Option<i64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits: String = text[start..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `delivery_log_key` → `delivery_log_before_key`, within PostgreSQL's 63 bytes.
fn before_index_name(name: &str) -> String {
    let renamed = match name.strip_prefix(TABLE) {
        Some(rest) => format!("{PG_BEFORE}{rest}"),
        None => format!("{PG_BEFORE}_{name}"),
    };
    renamed.chars().take(63).collect()
}

/// A PostgreSQL identifier in double quotes.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn my_step(store: &Store, now_ms: i64) -> Result<Step, sqlx::Error> {
    let mut conn = ddl_connection(store, Some(LOCK_WAIT)).await?;
    if let Shape::Partitioned(_) = my_shape(&mut conn, TABLE).await? {
        // A move that swapped and died before dropping the old table.
        if my_table_exists(&mut conn, MY_OLD).await? {
            my_cleanup(&mut conn).await?;
            return Ok(Step::More(format!("dropped {MY_OLD}, left by an earlier move")));
        }
        return Ok(Step::Done);
    }
    // 1. The partitioned copy, empty.
    if !matches!(my_shape(&mut conn, MY_COPY).await?, Shape::Partitioned(_)) {
        let bound = before_bound(now_ms);
        run_all(
            &mut conn,
            &[
                format!("DROP TABLE IF EXISTS {MY_COPY}"),
                format!("CREATE TABLE {MY_COPY} LIKE {TABLE}"),
                format!(
                    "ALTER TABLE {MY_COPY} DROP PRIMARY KEY, ADD PRIMARY KEY (id, logged_at_ms), \
                     DROP KEY delivery_log_attempt, ADD UNIQUE KEY delivery_log_attempt (attempt_id, logged_at_ms) \
                     PARTITION BY RANGE (logged_at_ms) (PARTITION {MY_BEFORE} VALUES LESS THAN ({bound}), \
                     PARTITION {MY_OVERFLOW} VALUES LESS THAN MAXVALUE)"
                ),
            ],
        )
        .await?;
        return Ok(Step::More(format!("made the partitioned copy {MY_COPY}")));
    }
    // 2. Triggers that keep the copy current from here on.
    let columns: Vec<String> = sqlx::query(
        "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'delivery_log' ORDER BY ORDINAL_POSITION",
    )
    .fetch_all(&mut conn)
    .await?
    .iter()
    .map(|r| r.try_get::<String, _>(0))
    .collect::<Result<_, _>>()?;
    let listed = columns.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ");
    let new_values = columns.iter().map(|c| format!("NEW.`{c}`")).collect::<Vec<_>>().join(", ");
    let triggers: i64 = sqlx::query(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() \
         AND TRIGGER_NAME IN ('delivery_log_copy_insert', 'delivery_log_copy_delete')",
    )
    .fetch_one(&mut conn)
    .await?
    .try_get(0)?;
    if triggers < MY_TRIGGERS.len() as i64 {
        run_all(
            &mut conn,
            &[
                format!(
                    "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {TABLE} FOR EACH ROW \
                     INSERT INTO {MY_COPY} ({listed}) VALUES ({new_values}) \
                     ON DUPLICATE KEY UPDATE {MY_COPY}.id = {MY_COPY}.id",
                    MY_TRIGGERS[0]
                ),
                format!(
                    "CREATE TRIGGER IF NOT EXISTS {} AFTER DELETE ON {TABLE} FOR EACH ROW \
                     DELETE FROM {MY_COPY} WHERE id = OLD.id AND logged_at_ms = OLD.logged_at_ms",
                    MY_TRIGGERS[1]
                ),
            ],
        )
        .await?;
        return Ok(Step::More(format!("made the triggers that copy new rows to {MY_COPY}")));
    }
    // 3. The ids to copy: every row there before the triggers.
    conn.execute(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {MY_PROGRESS} (high_id BIGINT NOT NULL PRIMARY KEY, copied_through BIGINT NOT NULL)"
    )))
    .await?;
    let progress = sqlx::query(AssertSqlSafe(format!("SELECT high_id, copied_through FROM {MY_PROGRESS}")))
        .fetch_optional(&mut conn)
        .await?;
    let Some(progress) = progress else {
        conn.execute(AssertSqlSafe(format!(
            "INSERT INTO {MY_PROGRESS} (high_id, copied_through) SELECT COALESCE(MAX(id), 0), 0 FROM {TABLE}"
        )))
        .await?;
        return Ok(Step::More("noted the ids to copy".into()));
    };
    let (high, through): (i64, i64) = (progress.try_get(0)?, progress.try_get(1)?);
    // 4. A batch of old rows.
    if through < high {
        let next = (through + COPY_BATCH_IDS).min(high);
        let mut tx = conn.begin().await?;
        let copied = tx
            .execute(
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {MY_COPY} ({listed}) SELECT {listed} FROM {TABLE} WHERE id > ? AND id <= ? \
                     ON DUPLICATE KEY UPDATE {MY_COPY}.id = {MY_COPY}.id"
                )))
                .bind(through)
                .bind(next),
            )
            .await?
            .rows_affected();
        tx.execute(
            sqlx::query(AssertSqlSafe(format!("UPDATE {MY_PROGRESS} SET copied_through = ?"))).bind(next),
        )
        .await?;
        tx.commit().await?;
        return Ok(Step::More(format!("copied ids {}..={next} ({copied} rows) of {high}", through + 1)));
    }
    // 5. The swap, atomic, then the old table goes.
    conn.execute(AssertSqlSafe(format!("RENAME TABLE {TABLE} TO {MY_OLD}, {MY_COPY} TO {TABLE}"))).await?;
    my_cleanup(&mut conn).await?;
    Ok(Step::Done)
}

async fn my_cleanup(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    let mut statements: Vec<String> =
        MY_TRIGGERS.iter().map(|t| format!("DROP TRIGGER IF EXISTS {t}")).collect();
    statements.push(format!("DROP TABLE IF EXISTS {MY_PROGRESS}"));
    statements.push(format!("DROP TABLE IF EXISTS {MY_OLD}"));
    run_all(conn, &statements).await
}

async fn my_table_exists(conn: &mut AnyConnection, table: &str) -> Result<bool, sqlx::Error> {
    let n: i64 = sqlx::query(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    Ok(n > 0)
}

/// Makes the day partitions missing between the newest one and [`DAYS_AHEAD`] days past
/// `now_ms`. The names of those made. Nothing on a plain log.
///
/// A first new partition after a gap (the job did not run for days) takes the whole gap, up to
/// today. Rows the overflow already holds for a new partition's days move into it, under a lock
/// on the log, when they are few ([`MOVE_LIMIT`]); on PostgreSQL, more are left where they are
/// (read as any other row, deleted row by row once expired) and the new partitions start the
/// day after the newest of them, so that no writer waits behind a long move. MariaDB/MySQL
/// split the overflow whatever it holds, copying its rows while writes wait: the alerts on the
/// partitions falling behind and on the overflow come well before (docs/runbook.md).
pub async fn ensure_ahead(store: &Store, now_ms: i64) -> Result<Vec<String>, sqlx::Error> {
    let shape = shape(store).await?;
    let Some(mut from) = shape.covered_until_ms() else { return Ok(Vec::new()) };
    let until = day_start(now_ms) + (DAYS_AHEAD + 1) * DAY_MS;
    let backend = store.backend();
    if backend == Backend::Postgres && from < until {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT COUNT(*), MAX(logged_at_ms) FROM (SELECT logged_at_ms FROM {PG_OVERFLOW} \
             WHERE logged_at_ms >= {from} AND logged_at_ms < {until} LIMIT {}) t",
            MOVE_LIMIT + 1
        )))
        .fetch_one(store.pool())
        .await?;
        let (held, newest): (i64, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
        if let Some(newest) = newest.filter(|_| held > MOVE_LIMIT) {
            let after = day_start(newest) + DAY_MS;
            tracing::warn!(
                rows_at_least = held,
                "the log's overflow partition holds rows of days that have no partition yet; the new \
                 partitions start after them, and those rows stay in the overflow until they expire"
            );
            from = from.max(after);
        }
    }
    let mut days = Vec::new();
    while from < until {
        let to = (from + DAY_MS).max(day_start(now_ms));
        days.push((partition_name(backend, from), from, to));
        from = to;
    }
    if days.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = ddl_connection(store, Some(LOCK_WAIT)).await?;
    match backend {
        Backend::Postgres => {
            for (name, from, to) in &days {
                let moved = pg_overflow_rows(&mut conn, *from, *to).await?;
                let mut tx = conn.begin().await?;
                if moved {
                    // A partition whose rows sit in the DEFAULT one cannot be made beside it.
                    tx.execute(AssertSqlSafe(format!("ALTER TABLE {TABLE} DETACH PARTITION {PG_OVERFLOW}")))
                        .await?;
                }
                tx.execute(AssertSqlSafe(format!(
                    "CREATE TABLE {name} PARTITION OF {TABLE} FOR VALUES FROM ({from}) TO ({to})"
                )))
                .await?;
                if moved {
                    let range = format!("logged_at_ms >= {from} AND logged_at_ms < {to}");
                    run_all(
                        &mut tx,
                        &[
                            format!("INSERT INTO {name} SELECT * FROM {PG_OVERFLOW} WHERE {range}"),
                            format!("DELETE FROM {PG_OVERFLOW} WHERE {range}"),
                            format!("ALTER TABLE {TABLE} ATTACH PARTITION {PG_OVERFLOW} DEFAULT"),
                        ],
                    )
                    .await?;
                }
                tx.commit().await?;
            }
        }
        Backend::MySql => {
            let new = days
                .iter()
                .map(|(name, _, to)| format!("PARTITION {name} VALUES LESS THAN ({to})"))
                .collect::<Vec<_>>()
                .join(", ");
            conn.execute(AssertSqlSafe(format!(
                "ALTER TABLE {TABLE} REORGANIZE PARTITION {MY_OVERFLOW} INTO \
                 ({new}, PARTITION {MY_OVERFLOW} VALUES LESS THAN MAXVALUE)"
            )))
            .await?;
        }
        Backend::Sqlite => {}
    }
    Ok(days.into_iter().map(|(name, ..)| name).collect())
}

/// Whether the DEFAULT partition holds a row of `[from, to)`.
async fn pg_overflow_rows(conn: &mut AnyConnection, from: i64, to: i64) -> Result<bool, sqlx::Error> {
    // Numbers this process computed, written into the statement like the DDL's bounds.
    let n: i64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM {PG_OVERFLOW} WHERE logged_at_ms >= {from} AND logged_at_ms < {to} LIMIT 1) t"
    )))
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    Ok(n > 0)
}

/// What [`drop_expired`] dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    pub partitions: Vec<String>,
    /// The rows the catalog estimated they held.
    pub estimated_rows: i64,
}

/// Drops every partition whose time ends at or before `cutoff_ms` (the overflow never). A
/// partition a reader holds past [`LOCK_WAIT`] stays for the next run.
pub async fn drop_expired(store: &Store, cutoff_ms: i64) -> Result<Dropped, sqlx::Error> {
    let shape = shape(store).await?;
    let expired: Vec<&Partition> =
        shape.partitions().iter().filter(|p| p.to_ms().is_some_and(|to| to <= cutoff_ms)).collect();
    let mut dropped = Dropped::default();
    if expired.is_empty() {
        return Ok(dropped);
    }
    let mut conn = ddl_connection(store, Some(LOCK_WAIT)).await?;
    for p in expired {
        conn.execute(AssertSqlSafe(p.drop_statement(store.backend()))).await?;
        dropped.partitions.push(p.name.clone());
        dropped.estimated_rows += p.estimated_rows;
    }
    Ok(dropped)
}

/// What a scrape reports of the partitions: how far ahead they reach and the rows in the
/// overflow (counted up to a bound). `None` on a plain log.
pub async fn health(store: &Store, now_ms: i64) -> Result<Option<Health>, sqlx::Error> {
    let shape = shape(store).await?;
    let Some(until) = shape.covered_until_ms() else { return Ok(None) };
    let counted = match store.backend() {
        Backend::MySql => partition_table(Backend::MySql, MY_OVERFLOW),
        Backend::Postgres | Backend::Sqlite => PG_OVERFLOW.to_owned(),
    };
    let row: AnyRow = sqlx::query(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM {counted} LIMIT {OVERFLOW_COUNT_LIMIT}) t"
    )))
    .fetch_one(store.pool())
    .await?;
    Ok(Some(Health { ahead_ms: until - now_ms, overflow_rows: row.try_get(0)? }))
}

/// See [`health`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// From now to the end of the newest partition.
    pub ahead_ms: i64,
    pub overflow_rows: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_bounds_are_read_back() {
        assert_eq!(parse_pg_bound("DEFAULT"), Some(Bound::Overflow));
        assert_eq!(
            parse_pg_bound("FOR VALUES FROM (MINVALUE) TO ('1765065600000')"),
            Some(Bound::Before { to_ms: 1_765_065_600_000 })
        );
        assert_eq!(
            parse_pg_bound("FOR VALUES FROM ('86400000') TO ('172800000')"),
            Some(Bound::Day { from_ms: 86_400_000, to_ms: 172_800_000 })
        );
        assert_eq!(parse_pg_bound("FOR VALUES IN (1)"), None);
    }

    #[test]
    fn days_are_named_and_bounded_in_utc() {
        let dec6 = 1_796_515_200_000; // 2026-12-06T00:00:00Z
        assert_eq!(day_start(dec6 + DAY_MS - 1), dec6);
        assert_eq!(day_start(dec6), dec6);
        assert_eq!(partition_name(Backend::Postgres, dec6), "delivery_log_d20261206");
        assert_eq!(partition_name(Backend::MySql, dec6), "p20261206");
        assert_eq!(day_of_name("p20261206"), Some(dec6));
        assert_eq!(day_of_name("poverflow"), None);
        assert_eq!(before_bound(dec6 + 1), dec6 + 2 * DAY_MS);
    }

    #[test]
    fn index_names_move_to_the_old_table_within_the_length_postgres_keeps() {
        assert_eq!(before_index_name("delivery_log_key_outcome"), "delivery_log_before_key_outcome");
        assert_eq!(before_index_name("delivery_log_pkey"), "delivery_log_before_pkey");
        assert_eq!(before_index_name("x".repeat(80).as_str()).len(), 63);
        assert_eq!(first_number("CHECK ((logged_at_ms < '1765065600000'::bigint))"), Some(1_765_065_600_000));
    }

    #[test]
    fn only_the_old_table_and_the_overflow_are_deleted_row_by_row() {
        let parts = vec![
            Partition { name: "pbefore".into(), bound: Bound::Before { to_ms: 10 }, estimated_rows: 0 },
            Partition { name: "p1".into(), bound: Bound::Day { from_ms: 10, to_ms: 20 }, estimated_rows: 0 },
            Partition { name: "poverflow".into(), bound: Bound::Overflow, estimated_rows: 0 },
        ];
        let shape = Shape::Partitioned(parts);
        assert_eq!(
            shape.row_wise_tables(Backend::MySql),
            ["delivery_log PARTITION (pbefore)", "delivery_log PARTITION (poverflow)"]
        );
        assert_eq!(shape.covered_until_ms(), Some(20));
        assert_eq!(Shape::Plain.row_wise_tables(Backend::Postgres), ["delivery_log"]);
    }
}
