//! A `[[sql_handlers]]` entry as a [`Handler`]: its statements run in order on the gate's
//! connection, each value bound, each row count held to its expectation; a violation of a
//! unique key the entry names in `business_unique` is a duplicate, any other is an error. The
//! describe statement and the checks run on the store for the trace page and the reconciler.
//! This file runs the statements checked in [`super`]; it must not commit, open connections of
//! its own, or format a value into SQL.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, Executor, Row, ValueRef};

use super::params::{self, Parsed, Source, Value};
use super::{BusinessKey, CheckStatement, Expect, OnZero, Statement};
use crate::delivery::value::Body;
use crate::handler::{Effect, Fact, Handler, HandlerError, Work};
use crate::outcome::Layer;
use crate::reconcile::check::{Check, CheckSql};
use crate::store::{AnyQuery, Backend, Conn, Store, UniqueKey, Violated};

/// The savepoint the statements run in where a duplicate must take back what earlier ones
/// changed (and, on PostgreSQL, where a failed statement would otherwise end the transaction).
const SAVEPOINT: &str = "SAVEPOINT idemgate_sql_handler";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idemgate_sql_handler";

/// The most rows of business state the trace page shows.
const MAX_DESCRIBED_ROWS: usize = 20;

/// A configured handler of SQL statements.
#[derive(Debug)]
pub(crate) struct SqlHandler {
    /// Its key in the configuration, `sql_handlers[i]`.
    at: String,
    name: String,
    statements: Vec<Statement>,
    sources: BTreeMap<String, Source>,
    describe: Option<Parsed>,
    checks: Vec<CheckStatement>,
    /// `business_unique` as written.
    business_unique: Vec<BusinessKey>,
    /// The unique keys `business_unique` names, as the database's catalog holds them: found by
    /// [`Handler::verify`] when the service is assembled. Until then no violation is a duplicate.
    business_keys: OnceLock<Vec<UniqueKey>>,
}

/// Why a statement did not do what it should.
enum Stop {
    /// The effect was applied before: take back this handler's statements, keep the claim.
    Duplicate {
        layer: Layer,
        detail: String,
    },
    Refused(HandlerError),
}

impl SqlHandler {
    pub(super) fn new(
        at: String,
        name: String,
        statements: Vec<Statement>,
        sources: BTreeMap<String, Source>,
        describe: Option<Parsed>,
        checks: Vec<CheckStatement>,
        business_unique: Vec<BusinessKey>,
    ) -> Self {
        Self {
            at,
            name,
            statements,
            sources,
            describe,
            checks,
            business_unique,
            business_keys: OnceLock::new(),
        }
    }

    /// True when `error`, raised by statement `j`, is a violation of a `business_unique` key.
    fn breaks_business_key(
        &self,
        j: usize,
        backend: Backend,
        error: &dyn sqlx::error::DatabaseError,
    ) -> bool {
        let Some(violated) = Violated::of(backend, error) else { return false };
        let writes = self.statements[j].parsed.table.as_deref();
        self.business_keys.get().is_some_and(|keys| keys.iter().any(|k| k.is_named_by(&violated, writes)))
    }

    /// The unique keys of the database that `business_unique` names, each found at least once;
    /// the first one missing is refused with its key and what the statements' tables do have.
    fn business_keys_in(&self, keys: &[UniqueKey]) -> Result<Vec<UniqueKey>, String> {
        let mut named = Vec::new();
        for (k, wanted) in self.business_unique.iter().enumerate() {
            let found: Vec<&UniqueKey> = keys.iter().filter(|key| wanted.is(key)).collect();
            if found.is_empty() {
                let tables: Vec<&str> =
                    self.statements.iter().filter_map(|s| s.parsed.table.as_deref()).collect();
                let theirs: Vec<String> = keys
                    .iter()
                    .filter(|key| tables.iter().any(|t| t.eq_ignore_ascii_case(&key.table)))
                    .map(UniqueKey::describe)
                    .collect();
                let text = match wanted {
                    BusinessKey::Name(name) => format!("{name:?}"),
                    BusinessKey::Columns { table, columns } => format!("{table}({})", columns.join(", ")),
                };
                return Err(format!(
                    "{}.business_unique[{k}] ({:?}): the database has no unique constraint or index {text}; \
                     the unique keys of the tables the statements write are: {}",
                    self.at,
                    self.name,
                    if theirs.is_empty() { "none".to_owned() } else { theirs.join("; ") }
                ));
            }
            named.extend(found.into_iter().cloned());
        }
        Ok(named)
    }

    /// `sql_handlers[i].statements[j] ("name")`: how messages name statement `j`.
    fn statement_key(&self, j: usize) -> String {
        format!("{}.statements[{j}] ({:?})", self.at, self.name)
    }

    /// Runs statement `j` with `values` and holds its row count to the expectation.
    async fn run(&self, j: usize, values: Vec<Value>, work: &Work<'_>, conn: &mut Conn) -> Result<(), Stop> {
        let s = &self.statements[j];
        let done = match bind(s.parsed.written.query(work.backend), values).execute(&mut *conn).await {
            Ok(done) => done,
            Err(sqlx::Error::Database(db)) if self.breaks_business_key(j, work.backend, db.as_ref()) => {
                return Err(Stop::Duplicate {
                    layer: Layer::BusinessUnique,
                    detail: format!(
                        "{}: a unique key already holds this row: {}",
                        self.statement_key(j),
                        db.message()
                    ),
                });
            }
            Err(e) if crate::store::is_transient(&e) => return Err(Stop::Refused(HandlerError::Database(e))),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                return Err(Stop::Refused(HandlerError::Retryable(format!(
                    "{}: {} (a unique key not named in business_unique: an error, not a duplicate)",
                    self.statement_key(j),
                    db.message()
                ))));
            }
            Err(sqlx::Error::Database(db)) => {
                return Err(Stop::Refused(HandlerError::Retryable(format!(
                    "{}: {}",
                    self.statement_key(j),
                    db.message()
                ))));
            }
            Err(e) => return Err(Stop::Refused(HandlerError::Database(e))),
        };
        let rows = done.rows_affected();
        let too_few = match s.expect {
            Expect::Any => false,
            Expect::AtLeastOne => rows == 0,
            Expect::One if rows > 1 => {
                return Err(Stop::Refused(HandlerError::Permanent(format!(
                    "{}: changed {rows} rows, expected one; rolled back",
                    self.statement_key(j)
                ))));
            }
            Expect::One => rows == 0,
        };
        if !too_few {
            return Ok(());
        }
        let what = format!("{}: changed no row, expected {}", self.statement_key(j), s.expect.as_str());
        Err(match s.on_zero {
            OnZero::Retry => Stop::Refused(HandlerError::Retryable(format!("{what}; retrying"))),
            OnZero::DeadLetter => Stop::Refused(HandlerError::Permanent(what)),
            OnZero::Duplicate => Stop::Duplicate {
                layer: Layer::Business,
                detail: format!("{what}: the effect was applied before"),
            },
        })
    }

    /// True where the statements run in a savepoint: on PostgreSQL (a failed statement ends
    /// the transaction otherwise), and wherever a later statement's duplicate would have to take
    /// back an earlier one. On SQLite and MySQL/MariaDB a failed statement undoes only itself.
    fn needs_savepoint(&self, backend: Backend) -> bool {
        backend == Backend::Postgres || self.statements.len() > 1
    }
}

/// `query` with `values` bound in order.
fn bind(query: AnyQuery, values: Vec<Value>) -> AnyQuery {
    values.into_iter().fold(query, |q, v| match v {
        Value::Text(t) => q.bind(t),
        Value::Int(n) => q.bind(n),
        Value::Float(f) => q.bind(f),
        Value::Bool(b) => q.bind(b),
    })
}

#[async_trait]
impl Handler for SqlHandler {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        // Every value is read before any statement runs: a message without them changes nothing.
        let mut body = Body::new(&work.delivery.body);
        let mut values = Vec::with_capacity(self.statements.len());
        for s in &self.statements {
            values.push(
                params::values(&s.parsed.names, &self.sources, work.delivery, work.key, &mut body)
                    .map_err(|why| HandlerError::Invalid(format!("{} ({:?}): {why}", self.at, self.name)))?,
            );
        }
        let savepoint = self.needs_savepoint(work.backend);
        if savepoint {
            (&mut *conn).execute(AssertSqlSafe(SAVEPOINT)).await?;
        }
        for (j, values) in values.into_iter().enumerate() {
            match self.run(j, values, work, conn).await {
                Ok(()) => {}
                Err(Stop::Refused(why)) => return Err(why),
                Err(Stop::Duplicate { layer, detail }) => {
                    if savepoint {
                        (&mut *conn).execute(AssertSqlSafe(ROLLBACK_TO_SAVEPOINT)).await?;
                    }
                    return Ok(Effect::AlreadyApplied { layer, detail });
                }
            }
        }
        Ok(Effect::Applied)
    }

    /// The describe statement's rows for `biz_id`, one fact per column (at most
    /// [`MAX_DESCRIBED_ROWS`] rows), or a line saying there are none.
    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        let Some(parsed) = &self.describe else { return Ok(Vec::new()) };
        let q =
            parsed.names.iter().fold(parsed.written.query(store.backend()), |q, _| q.bind(biz_id.to_owned()));
        let mut rows = q.fetch(store.pool());
        let mut facts = Vec::new();
        let mut seen = 0;
        while let Some(row) = rows.try_next().await? {
            seen += 1;
            if seen > MAX_DESCRIBED_ROWS {
                facts.push(Fact::new(
                    &self.name,
                    format!("more than {MAX_DESCRIBED_ROWS} rows; the first shown"),
                ));
                break;
            }
            for (i, column) in row.columns().iter().enumerate() {
                use sqlx::Column;
                let label = if seen == 1 {
                    column.name().to_owned()
                } else {
                    format!("{} (row {seen})", column.name())
                };
                facts.push(Fact::new(label, shown(&row, i)));
            }
        }
        if seen == 0 {
            facts.push(Fact::new(&self.name, "no rows for this bizId"));
        }
        Ok(facts)
    }

    fn checks(&self) -> Vec<Check> {
        self.checks
            .iter()
            .map(|c| Check {
                name: Cow::Owned(c.name.clone()),
                kind: c.kind,
                // Filled in with the biz_type of the route that names this handler.
                biz_type: Cow::Borrowed(""),
                sql: CheckSql::Written { sql: c.parsed.written.clone(), binds: c.binds.clone() },
                describe: |n| {
                    if n > 1 {
                        format!("found {n} times, breaking the invariant")
                    } else {
                        "breaks the invariant".to_owned()
                    }
                },
            })
            .collect()
    }

    /// Prepares every statement on a connection of `store`, in a transaction rolled back: a
    /// table or column that does not exist is refused now, not at the first delivery.
    async fn verify(&self, store: &Store) -> Result<(), String> {
        use sqlx::Connection;
        let backend = store.backend();
        // A connection of its own, closed afterwards: a statement prepared here without its
        // parameters' types must not stay in a pooled connection's statement cache.
        let mut conn = store.pool().acquire().await.map_err(|e| format!("{}: {e}", self.at))?.detach();
        let mut tx = conn.begin().await.map_err(|e| format!("{}: {e}", self.at))?;
        let mut all: Vec<(String, &Parsed)> =
            self.statements.iter().enumerate().map(|(j, s)| (self.statement_key(j), &s.parsed)).collect();
        if let Some(describe) = &self.describe {
            all.push((format!("{}.describe ({:?})", self.at, self.name), describe));
        }
        for (k, c) in self.checks.iter().enumerate() {
            all.push((format!("{}.checks[{k}] ({:?})", self.at, self.name), &c.parsed));
        }
        for (key, parsed) in all {
            let text = parsed.written.text(backend);
            if let Err(e) = (&mut *tx).prepare(text).await {
                drop(tx);
                let _ = conn.close().await;
                let why = match &e {
                    sqlx::Error::Database(db) => db.message().to_owned(),
                    other => other.to_string(),
                };
                return Err(format!("{key}: the database refused the statement: {why}"));
            }
        }
        let named = if self.business_unique.is_empty() {
            Ok(Vec::new())
        } else {
            crate::store::unique_keys(&mut tx, backend)
                .await
                .map_err(|e| format!("{}.business_unique: reading the unique keys: {e}", self.at))
                .and_then(|keys| self.business_keys_in(&keys))
        };
        tx.rollback().await.map_err(|e| format!("{}: {e}", self.at))?;
        let _ = conn.close().await;
        // The first assembly's answer stands: every store a handler is verified against holds
        // the same business tables.
        let _ = self.business_keys.set(named?);
        Ok(())
    }
}

/// Column `i` of `row` as text for people: NULL, an integer, a float, a boolean, text, or the
/// size of bytes.
fn shown(row: &sqlx::any::AnyRow, i: usize) -> String {
    if row.try_get_raw(i).is_ok_and(|v| v.is_null()) {
        return "NULL".to_owned();
    }
    if let Ok(v) = row.try_get::<i64, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<i32, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<i16, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<f64, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<f32, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<bool, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = row.try_get::<String, _>(i) {
        return v;
    }
    match row.try_get::<Vec<u8>, _>(i) {
        Ok(bytes) => format!("{} bytes", bytes.len()),
        Err(e) => format!("(cannot be shown: {e})"),
    }
}
