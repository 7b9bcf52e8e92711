//! State-machine moves: "move this row from state A to state B" as one conditional update in
//! the gate's transaction, and the configured handler kind `[[state_machines]]` built on it.
//!
//! `UPDATE t SET state = ?, … WHERE key = ? AND state IN (…) [AND guards]` changes one row or
//! none. None is not one answer but several, told apart by reading the row back on the same
//! connection: the move was made before ([`Answer::AlreadyDone`], a duplicate at the
//! `state_machine` layer), the row is in a state the move cannot start from
//! ([`Answer::Illegal`], dead-lettered and counted apart), a guard such as the amount does not
//! hold ([`Answer::GuardFailed`]), the row does not exist ([`Answer::Missing`]), or another
//! transaction put the row into a from-state between the update and the read, in which case the
//! update runs once more.
//!
//! Table and column names cannot be bound parameters, so they are checked against a strict
//! identifier rule and written into statements that are built once, when the transition is
//! made; states, keys and every other value are bound. This module owns those statements and
//! the answers; it must not commit, roll back or open connections inside a delivery. The
//! configured handlers are in [`configured`].

mod configured;

pub use configured::{StateMachineConfig, TransitionHandler, handlers};

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::handler::{Effect, HandlerError};
use crate::outcome::Layer;
use crate::setting::{Invalid, invalid};
use crate::store::{AnyQuery, Backend, Conn, Store, number_placeholders, padded, placeholders};

/// The longest identifier: PostgreSQL's limit (63 bytes), which MySQL's 64 also admits.
const MAX_IDENTIFIER_CHARS: usize = 63;
/// The longest state name.
const MAX_STATE_CHARS: usize = 64;

/// Checks a table or column name: `^[A-Za-z_][A-Za-z0-9_]{0,62}$`. Nothing else (no quotes,
/// dots, spaces or dashes) ever reaches a statement's text.
pub(crate) fn check_identifier(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let plain = match chars.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.len() <= MAX_IDENTIFIER_CHARS
        }
        None => false,
    };
    if plain {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a plain SQL identifier (a letter or _, then letters, digits or _, at most {MAX_IDENTIFIER_CHARS})"
        ))
    }
}

fn check_state(state: &str) -> Result<(), String> {
    if state.is_empty() || state.chars().count() > MAX_STATE_CHARS {
        return Err(format!("{state:?} must be 1 to {MAX_STATE_CHARS} characters"));
    }
    if state.chars().any(char::is_control) {
        return Err(format!("\"{}\" contains a control character", state.escape_debug()));
    }
    Ok(())
}

/// A table whose rows move between states: the table, the column that names a row and the
/// column that holds its state (text). The names are checked when it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachine {
    table: String,
    key_column: String,
    state_column: String,
}

impl StateMachine {
    pub fn new(table: &str, key_column: &str, state_column: &str) -> Result<Self, Invalid> {
        for (field, name) in [("table", table), ("key_column", key_column), ("state_column", state_column)] {
            check_identifier(name).map_err(|m| invalid(field, m))?;
        }
        if key_column == state_column {
            return Err(invalid("state_column", "is the key column too"));
        }
        Ok(Self {
            table: table.to_owned(),
            key_column: key_column.to_owned(),
            state_column: state_column.to_owned(),
        })
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Builds the statements of one move. They are made here, once, not per delivery.
    pub fn transition(&self, spec: TransitionSpec) -> Result<Transition, Invalid> {
        Transition::build(self.clone(), spec)
    }
}

/// How a guard compares its column with the bound value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Compare {
    fn sql(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "<>",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }
}

/// An extra condition of a move: `column <compare> ?`, the value bound per move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub column: String,
    pub compare: Compare,
}

/// What a move is: the states it starts from, the state it makes, the states that mean it was
/// made already, the columns it sets besides the state and the guards it checks. Values are
/// not part of it; each [`Move`] binds its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionSpec {
    pub from: Vec<String>,
    pub to: String,
    /// The states that count as "already done"; `None` is `[to]`.
    pub done: Option<Vec<String>>,
    /// Columns set to a bound value along with the state, in the order a [`Move`] gives them.
    pub set: Vec<String>,
    /// Conditions that must hold besides the from-state, in the order a [`Move`] gives them.
    pub guards: Vec<Guard>,
}

impl TransitionSpec {
    pub fn new<S: Into<String>>(from: impl IntoIterator<Item = S>, to: impl Into<String>) -> Self {
        Self {
            from: from.into_iter().map(Into::into).collect(),
            to: to.into(),
            done: None,
            set: Vec::new(),
            guards: Vec::new(),
        }
    }

    /// The states that mean the move was made already (instead of `[to]`): a SHIPPED order was
    /// PAID once, so a payment confirmation finding SHIPPED may count as done.
    pub fn done<S: Into<String>>(mut self, states: impl IntoIterator<Item = S>) -> Self {
        self.done = Some(states.into_iter().map(Into::into).collect());
        self
    }

    /// Also sets `column` to the move's next set value.
    pub fn set(mut self, column: impl Into<String>) -> Self {
        self.set.push(column.into());
        self
    }

    /// Also requires `column <compare> ?` with the move's next guard value.
    pub fn guard(mut self, column: impl Into<String>, compare: Compare) -> Self {
        self.guards.push(Guard { column: column.into(), compare });
        self
    }
}

/// A value bound into a move: a row key, a set value or a guard value; also a value read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Text(s) => f.write_str(s),
        }
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl Value {
    fn bind(&self, q: AnyQuery) -> AnyQuery {
        match self {
            Self::Int(n) => q.bind(*n),
            Self::Text(s) => q.bind(s.as_str()),
        }
    }

    /// Column `i` of `row`, whatever its type; `None` for NULL.
    fn read(row: &sqlx::any::AnyRow, i: usize) -> Result<Option<Self>, sqlx::Error> {
        use sqlx::Row;
        if let Ok(n) = row.try_get::<Option<i64>, _>(i) {
            return Ok(n.map(Self::Int));
        }
        if let Ok(s) = row.try_get::<Option<String>, _>(i) {
            return Ok(s.map(Self::Text));
        }
        Ok(row.try_get::<Option<f64>, _>(i)?.map(|x| Self::Text(x.to_string())))
    }
}

/// One move of one row: its key, then the values of the transition's set columns and guards,
/// in the order the transition names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    key: Value,
    set: Vec<Value>,
    guards: Vec<Value>,
}

impl Move {
    pub fn of(key: impl Into<Value>) -> Self {
        Self { key: key.into(), set: Vec::new(), guards: Vec::new() }
    }

    pub fn set(mut self, value: impl Into<Value>) -> Self {
        self.set.push(value.into());
        self
    }

    pub fn guard(mut self, value: impl Into<Value>) -> Self {
        self.guards.push(value.into());
        self
    }
}

/// What the row showed when the update changed nothing: its set columns and guard columns,
/// in the transition's order (`None` for NULL), for the messages that explain the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub set: Vec<Option<Value>>,
    pub guards: Vec<Option<Value>>,
}

/// Where a move ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The row moved to the to-state.
    Moved,
    /// The row is in a done state: the move was made before. A duplicate.
    AlreadyDone { state: String, found: Found },
    /// The row is in a state the move cannot start from.
    Illegal { state: String, found: Found },
    /// The row is in a from-state, but a guard does not hold (the amount differs).
    GuardFailed { state: String, found: Found },
    /// No row has the key.
    Missing,
    /// The row came into a from-state while the move ran and still did not move on the second
    /// update: it keeps changing under the move. Answered as retryable rather than guessed.
    Contended { state: String },
}

/// What to do when the row does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Retry later: the row may still be on its way (the order after its payment).
    #[default]
    Retry,
    /// Give up at once: dead-lettered with the body kept.
    DeadLetter,
}

/// A statement whose text was made once from checked identifiers, in each backend's form.
#[derive(Debug)]
struct Statement {
    sqlite: SqlStr,
    postgres: SqlStr,
    mysql: SqlStr,
}

fn sql_text(text: String) -> SqlStr {
    // Only identifiers that passed `check_identifier` and fixed keywords are in the text; every
    // value is a placeholder.
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

impl Statement {
    /// The same statement on every backend, `?` renumbered for PostgreSQL.
    fn portable(text: String) -> Self {
        Self {
            postgres: sql_text(number_placeholders(&text)),
            mysql: sql_text(text.clone()),
            sqlite: sql_text(text),
        }
    }

    /// A read of the latest committed row, as the update before it saw it. MySQL/MariaDB's
    /// repeatable read answers a plain SELECT from the transaction's first snapshot, which may
    /// be older than the commit the update waited for; a locking read (`FOR UPDATE`) reads the
    /// latest row there. PostgreSQL's read committed takes a new snapshot per statement, and
    /// SQLite's writer holds the whole database, so a plain SELECT is right on both, and the
    /// lock would only cost them: on PostgreSQL it makes a read-only transaction write.
    fn latest(text: String) -> Self {
        Self {
            postgres: sql_text(number_placeholders(&text)),
            mysql: sql_text(format!("{text} FOR UPDATE")),
            sqlite: sql_text(text),
        }
    }

    fn query(&self, backend: Backend) -> AnyQuery {
        sqlx::query(self.text(backend).clone())
    }

    fn text(&self, backend: Backend) -> &SqlStr {
        match backend {
            Backend::Sqlite => &self.sqlite,
            Backend::Postgres => &self.postgres,
            Backend::MySql => &self.mysql,
        }
    }
}

/// A move of a [`StateMachine`] with its statements built. Share it (it is `Sync`); apply it
/// with [`Transition::apply`] on the gate's connection, inside its transaction.
#[derive(Debug)]
pub struct Transition {
    machine: StateMachine,
    from: Vec<String>,
    to: String,
    done: Vec<String>,
    set: Vec<String>,
    guards: Vec<Guard>,
    /// `UPDATE t SET state = ?, set… WHERE key = ? AND state IN (from…) AND guards…`
    update: Statement,
    /// `SELECT state, set…, guard columns…, whether the guards hold FROM t WHERE key = ?`,
    /// locking on MySQL/MariaDB.
    read: Statement,
    /// `SELECT state, set… FROM t WHERE key = ?`, for the trace page.
    current: Statement,
    /// Statements run by [`Transition::apply`], for measuring.
    statements: AtomicU64,
}

/// What classifying a read row decided.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Answer(Answer),
    /// In a from-state with every guard holding: a concurrent commit put it there; update again.
    UpdateAgain {
        state: String,
    },
}

impl Transition {
    fn build(machine: StateMachine, spec: TransitionSpec) -> Result<Self, Invalid> {
        let TransitionSpec { from, to, done, set, guards } = spec;
        if from.is_empty() {
            return Err(invalid("from", "names no state"));
        }
        for (i, s) in from.iter().enumerate() {
            check_state(s).map_err(|m| invalid(format!("from[{i}]"), m))?;
        }
        check_state(&to).map_err(|m| invalid("to", m))?;
        if from.contains(&to) {
            return Err(invalid("to", format!("{to:?} is also a from-state; a move must change the state")));
        }
        let done = done.unwrap_or_else(|| vec![to.clone()]);
        if done.is_empty() {
            return Err(invalid("done", "names no state; leave it out to mean [to]"));
        }
        for (i, s) in done.iter().enumerate() {
            check_state(s).map_err(|m| invalid(format!("done[{i}]"), m))?;
            if from.contains(s) {
                return Err(invalid(
                    format!("done[{i}]"),
                    format!(
                        "{s:?} is also a from-state; a state cannot be both where the move starts and proof it was made"
                    ),
                ));
            }
        }
        let mut columns: BTreeSet<&str> = [machine.key_column.as_str(), machine.state_column.as_str()].into();
        for (i, c) in set.iter().enumerate() {
            check_identifier(c).map_err(|m| invalid(format!("set[{i}]"), m))?;
            if !columns.insert(c) {
                return Err(invalid(
                    format!("set[{i}]"),
                    format!("{c:?} is the key, the state or another set column"),
                ));
            }
        }
        for (i, g) in guards.iter().enumerate() {
            check_identifier(&g.column).map_err(|m| invalid(format!("guards[{i}]"), m))?;
        }

        let StateMachine { table, key_column: key, state_column: state } = &machine;
        let mut assignments = format!("{state} = ?");
        for c in &set {
            assignments.push_str(&format!(", {c} = ?"));
        }
        let conditions: Vec<String> =
            guards.iter().map(|g| format!("{} {} ?", g.column, g.compare.sql())).collect();
        let mut update = format!(
            "UPDATE {table} SET {assignments} WHERE {key} = ? AND {state} IN ({})",
            placeholders(from.len())
        );
        for c in &conditions {
            update.push_str(&format!(" AND {c}"));
        }
        let mut shown = vec![state.as_str()];
        shown.extend(set.iter().map(String::as_str));
        let guards_hold = if conditions.is_empty() {
            "1".to_owned()
        } else {
            format!("CASE WHEN {} THEN 1 ELSE 0 END", conditions.join(" AND "))
        };
        let mut read_columns = shown.clone();
        read_columns.extend(guards.iter().map(|g| g.column.as_str()));
        let read = format!("SELECT {}, {guards_hold} FROM {table} WHERE {key} = ?", read_columns.join(", "));
        let current = format!("SELECT {} FROM {table} WHERE {key} = ?", shown.join(", "));
        Ok(Self {
            update: Statement::portable(update),
            read: Statement::latest(read),
            current: Statement::portable(current),
            machine,
            from,
            to,
            done,
            set,
            guards,
            statements: AtomicU64::new(0),
        })
    }

    pub fn machine(&self) -> &StateMachine {
        &self.machine
    }

    pub fn from(&self) -> &[String] {
        &self.from
    }

    pub fn to(&self) -> &str {
        &self.to
    }

    pub fn done(&self) -> &[String] {
        &self.done
    }

    /// Statements [`Transition::apply`] has run so far, over all moves.
    pub fn statements_run(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Makes the move on `conn` (the gate's transaction) and says where it ended. One
    /// statement when the row moves; a read besides when it does not, and one more
    /// update when a concurrent commit put the row into a from-state.
    pub async fn apply(&self, conn: &mut Conn, backend: Backend, m: &Move) -> Result<Answer, sqlx::Error> {
        self.check(m)?;
        if self.update(conn, backend, m).await? {
            return Ok(Answer::Moved);
        }
        self.settle(conn, backend, m).await
    }

    /// Makes the moves of `moves` on `conn` (the gate's transaction, a group's deliveries) and
    /// says where each ended, in their order, as if each had been applied alone in that order.
    ///
    /// On PostgreSQL and SQLite the first move of each row is made by **one conditional update
    /// for all of them**, whose `RETURNING` names the rows that moved; only the rows that did
    /// not are read back to say why, and a later move of a row already in the list is made
    /// alone after it. MySQL/MariaDB cannot return rows from an update, and a count of changed
    /// rows cannot say which ones moved: there each move is made as [`Transition::apply`]
    /// makes it, one after the other on the same connection.
    pub async fn apply_many(
        &self,
        conn: &mut Conn,
        backend: Backend,
        moves: &[Move],
    ) -> Result<Vec<Answer>, sqlx::Error> {
        let mut answers: Vec<Option<Answer>> = vec![None; moves.len()];
        if backend != Backend::MySql && moves.len() > 1 {
            let mut rows = HashSet::new();
            let mut first = Vec::with_capacity(moves.len());
            for m in moves {
                self.check(m)?;
                first.push(rows.insert(m.key.to_string()));
            }
            let firsts: Vec<&Move> = moves.iter().zip(&first).filter(|(_, f)| **f).map(|(m, _)| m).collect();
            let moved = self.update_many(conn, backend, &firsts).await?;
            for (i, m) in moves.iter().enumerate() {
                if first[i] {
                    answers[i] = Some(match moved.contains(&m.key.to_string()) {
                        true => Answer::Moved,
                        false => self.settle(conn, backend, m).await?,
                    });
                }
            }
        }
        for (i, m) in moves.iter().enumerate() {
            if answers[i].is_none() {
                answers[i] = Some(self.apply(conn, backend, m).await?);
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// A move must bind as many set and guard values as the transition names.
    fn check(&self, m: &Move) -> Result<(), sqlx::Error> {
        if m.set.len() != self.set.len() || m.guards.len() != self.guards.len() {
            return Err(sqlx::Error::InvalidArgument(format!(
                "the move to {} on {} takes {} set and {} guard values, not {} and {}",
                self.to,
                self.machine.table,
                self.set.len(),
                self.guards.len(),
                m.set.len(),
                m.guards.len()
            )));
        }
        Ok(())
    }

    /// After an update that did not move the row: reads it back to say why, and updates once
    /// more when a concurrent commit put it into a from-state.
    async fn settle(&self, conn: &mut Conn, backend: Backend, m: &Move) -> Result<Answer, sqlx::Error> {
        let mut updated_again = false;
        loop {
            let Some((state, found, guards_hold)) = self.read(conn, backend, m).await? else {
                return Ok(Answer::Missing);
            };
            match self.classify(state, found, guards_hold) {
                Step::Answer(answer) => return Ok(answer),
                Step::UpdateAgain { state } if updated_again => return Ok(Answer::Contended { state }),
                Step::UpdateAgain { .. } => {
                    updated_again = true;
                    if self.update(conn, backend, m).await? {
                        return Ok(Answer::Moved);
                    }
                }
            }
        }
    }

    /// The moves of `moves` (one per row) in one update: `SET col = CASE key WHEN ? THEN ? …
    /// END … WHERE key IN (…) AND state IN (from…) AND CASE key WHEN ? THEN guards… END
    /// RETURNING key`, the list padded to a few fixed lengths (the last move repeated) so that
    /// the statement cache keeps one text per length. Returns the keys of the rows that moved,
    /// as text. Built per call from the checked identifiers; every value is bound.
    async fn update_many(
        &self,
        conn: &mut Conn,
        backend: Backend,
        moves: &[&Move],
    ) -> Result<HashSet<String>, sqlx::Error> {
        let Some(last) = moves.last() else { return Ok(HashSet::new()) };
        let n = padded(moves.len());
        let padded_moves: Vec<&Move> =
            moves.iter().copied().chain(std::iter::repeat(*last)).take(n).collect();
        let StateMachine { table, key_column: key, state_column: state } = &self.machine;
        let whens = |then: &str| vec![format!("WHEN ? THEN {then}"); n].join(" ");
        let mut sql = format!("UPDATE {table} SET {state} = ?");
        for c in &self.set {
            sql.push_str(&format!(", {c} = CASE {key} {} END", whens("?")));
        }
        sql.push_str(&format!(
            " WHERE {key} IN ({}) AND {state} IN ({})",
            placeholders(n),
            placeholders(self.from.len())
        ));
        if !self.guards.is_empty() {
            let all: Vec<String> =
                self.guards.iter().map(|g| format!("{} {} ?", g.column, g.compare.sql())).collect();
            sql.push_str(&format!(" AND CASE {key} {} END", whens(&format!("({})", all.join(" AND ")))));
        }
        sql.push_str(&format!(" RETURNING {key}"));
        let mut q = crate::store::query_built(backend, sql).bind(self.to.as_str());
        for j in 0..self.set.len() {
            for m in &padded_moves {
                q = m.set[j].bind(m.key.bind(q));
            }
        }
        for m in &padded_moves {
            q = m.key.bind(q);
        }
        for s in &self.from {
            q = q.bind(s.as_str());
        }
        if !self.guards.is_empty() {
            for m in &padded_moves {
                q = m.key.bind(q);
                for v in &m.guards {
                    q = v.bind(q);
                }
            }
        }
        self.statements.fetch_add(1, Ordering::Relaxed);
        let mut moved = HashSet::with_capacity(moves.len());
        for row in q.fetch_all(&mut *conn).await? {
            if let Some(k) = Value::read(&row, 0)? {
                moved.insert(k.to_string());
            }
        }
        Ok(moved)
    }

    async fn update(&self, conn: &mut Conn, backend: Backend, m: &Move) -> Result<bool, sqlx::Error> {
        let mut q = self.update.query(backend).bind(self.to.as_str());
        for v in &m.set {
            q = v.bind(q);
        }
        q = m.key.bind(q);
        for s in &self.from {
            q = q.bind(s.as_str());
        }
        for v in &m.guards {
            q = v.bind(q);
        }
        self.statements.fetch_add(1, Ordering::Relaxed);
        Ok(q.execute(&mut *conn).await?.rows_affected() == 1)
    }

    /// The row's state (`None` for NULL), its set and guard columns, and whether the guards
    /// hold; `None` when there is no row.
    async fn read(
        &self,
        conn: &mut Conn,
        backend: Backend,
        m: &Move,
    ) -> Result<Option<(Option<String>, Found, bool)>, sqlx::Error> {
        use sqlx::Row;
        let mut q = self.read.query(backend);
        for v in &m.guards {
            q = v.bind(q);
        }
        q = m.key.bind(q);
        self.statements.fetch_add(1, Ordering::Relaxed);
        let Some(row) = q.fetch_optional(&mut *conn).await? else {
            return Ok(None);
        };
        let state: Option<String> = row.try_get(0)?;
        let mut found = Found::default();
        for i in 0..self.set.len() {
            found.set.push(Value::read(&row, 1 + i)?);
        }
        for i in 0..self.guards.len() {
            found.guards.push(Value::read(&row, 1 + self.set.len() + i)?);
        }
        let guards_hold: i64 = row.try_get(1 + self.set.len() + self.guards.len())?;
        Ok(Some((state, found, guards_hold == 1)))
    }

    fn classify(&self, state: Option<String>, found: Found, guards_hold: bool) -> Step {
        let Some(state) = state else {
            return Step::Answer(Answer::Illegal { state: "NULL".to_owned(), found });
        };
        if self.done.contains(&state) {
            Step::Answer(Answer::AlreadyDone { state, found })
        } else if !self.from.contains(&state) {
            Step::Answer(Answer::Illegal { state, found })
        } else if guards_hold {
            Step::UpdateAgain { state }
        } else {
            Step::Answer(Answer::GuardFailed { state, found })
        }
    }

    /// The handler's result for `answer`, its messages naming the row as `what` (such as
    /// "order O-1"): `Moved` applied; `AlreadyDone` a duplicate at the `state_machine` layer;
    /// `Illegal` an [`HandlerError::IllegalTransition`]; `GuardFailed` permanent; `Missing`
    /// as `on_missing` says; `Contended` retryable.
    pub fn result(&self, answer: Answer, what: &str, on_missing: OnMissing) -> Result<Effect, HandlerError> {
        match answer {
            Answer::Moved => Ok(Effect::Applied),
            Answer::AlreadyDone { state, .. } => Ok(Effect::AlreadyApplied {
                layer: Layer::StateMachine,
                detail: format!("{what} is already {state}"),
            }),
            Answer::Illegal { state, .. } => Err(HandlerError::IllegalTransition(format!(
                "illegal transition: {what} is {state} and cannot become {}",
                self.to
            ))),
            Answer::GuardFailed { state, found } => {
                let seen: Vec<String> = self
                    .guards
                    .iter()
                    .zip(&found.guards)
                    .map(|(g, v)| {
                        format!("{} is {}", g.column, v.as_ref().map_or("NULL".to_owned(), Value::to_string))
                    })
                    .collect();
                Err(HandlerError::Permanent(format!(
                    "{what} is {state} but does not meet the conditions to become {} ({})",
                    self.to,
                    seen.join(", ")
                )))
            }
            Answer::Missing => Err(match on_missing {
                OnMissing::Retry => {
                    HandlerError::Retryable(format!("{what} does not exist yet; it may still be on its way"))
                }
                OnMissing::DeadLetter => HandlerError::Permanent(format!("{what} does not exist")),
            }),
            Answer::Contended { .. } => Err(HandlerError::Retryable(format!("{what} is changing; retrying"))),
        }
    }

    /// The row's state and set columns now, read through the pool (for the trace page); `None`
    /// when there is no row.
    pub async fn current(
        &self,
        store: &Store,
        key: &str,
    ) -> Result<Option<(Option<String>, Vec<Option<Value>>)>, sqlx::Error> {
        use sqlx::Row;
        let row = self.current.query(store.backend()).bind(key).fetch_optional(store.pool()).await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let state: Option<String> = row.try_get(0)?;
        let set = (0..self.set.len()).map(|i| Value::read(&row, 1 + i)).collect::<Result<_, _>>()?;
        Ok(Some((state, set)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order_machine() -> StateMachine {
        StateMachine::new("shop_order", "order_no", "status").unwrap()
    }

    #[test]
    fn only_plain_identifiers_are_accepted() {
        for good in ["shop_order", "_t", "T1", "a", &"x".repeat(63)] {
            assert!(check_identifier(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1table",
            "x; drop table idempotent_record",
            "shop.order",
            "\"quoted\"",
            "`tick`",
            "a b",
            "a-b",
            "tablé",
            "t\u{0}",
            "order--",
            &"x".repeat(64),
        ] {
            let err = check_identifier(bad).unwrap_err();
            assert!(err.contains("is not a plain SQL identifier"), "{bad:?}: {err}");
        }
        let err = StateMachine::new("x; drop", "id", "state").unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration key table: \"x; drop\" is not a plain SQL identifier (a letter or _, then letters, digits or _, at most 63)"
        );
        assert_eq!(StateMachine::new("t", "id", "id").unwrap_err().key, "state_column");
    }

    #[test]
    fn a_move_is_refused_when_its_states_or_columns_are_wrong() {
        let m = order_machine();
        let field = |spec: TransitionSpec| m.transition(spec).unwrap_err().key;
        assert_eq!(field(TransitionSpec::new(Vec::<String>::new(), "PAID")), "from");
        assert_eq!(field(TransitionSpec::new(["UNPAID", "PAID"], "PAID")), "to");
        assert_eq!(field(TransitionSpec::new(["UNPAID"], "")), "to");
        assert_eq!(field(TransitionSpec::new(["UNPAID"], "PAID").done(["UNPAID"])), "done[0]");
        assert_eq!(field(TransitionSpec::new(["UNPAID"], "PAID").done(Vec::<String>::new())), "done");
        assert_eq!(field(TransitionSpec::new(["A\nB"], "PAID")), "from[0]");
        assert_eq!(field(TransitionSpec::new(["UNPAID"], "PAID").set("paid_at_ms").set("x y")), "set[1]");
        assert_eq!(field(TransitionSpec::new(["UNPAID"], "PAID").set("status")), "set[0]");
        assert_eq!(
            field(TransitionSpec::new(["UNPAID"], "PAID").guard("1=1 OR 1", Compare::Eq)),
            "guards[0]"
        );
    }

    #[test]
    fn the_statements_bind_every_value_and_read_the_latest_row() {
        let t = order_machine()
            .transition(
                TransitionSpec::new(["UNPAID", "PENDING"], "PAID")
                    .set("payment_no")
                    .set("paid_at_ms")
                    .guard("amount_cents", Compare::Eq),
            )
            .unwrap();
        assert_eq!(
            t.update.text(Backend::MySql).as_str(),
            "UPDATE shop_order SET status = ?, payment_no = ?, paid_at_ms = ? \
             WHERE order_no = ? AND status IN (?, ?) AND amount_cents = ?"
        );
        assert_eq!(
            t.update.text(Backend::Postgres).as_str(),
            "UPDATE shop_order SET status = $1, payment_no = $2, paid_at_ms = $3 \
             WHERE order_no = $4 AND status IN ($5, $6) AND amount_cents = $7"
        );
        assert_eq!(t.update.text(Backend::Sqlite).as_str(), t.update.text(Backend::MySql).as_str());
        assert_eq!(
            t.read.text(Backend::Sqlite).as_str(),
            "SELECT status, payment_no, paid_at_ms, amount_cents, CASE WHEN amount_cents = ? THEN 1 ELSE 0 END \
             FROM shop_order WHERE order_no = ?"
        );
        assert_eq!(
            t.read.text(Backend::Postgres).as_str(),
            "SELECT status, payment_no, paid_at_ms, amount_cents, CASE WHEN amount_cents = $1 THEN 1 ELSE 0 END \
             FROM shop_order WHERE order_no = $2"
        );
        assert!(t.read.text(Backend::MySql).as_str().ends_with("WHERE order_no = ? FOR UPDATE"));
        assert_eq!(
            t.current.text(Backend::Postgres).as_str(),
            "SELECT status, payment_no, paid_at_ms FROM shop_order WHERE order_no = $1"
        );
        assert_eq!(t.done(), ["PAID"]);

        let plain = order_machine()
            .transition(TransitionSpec::new(["PAID"], "SHIPPED").guard("amount_cents", Compare::Ge))
            .unwrap();
        assert_eq!(
            plain.update.text(Backend::MySql).as_str(),
            "UPDATE shop_order SET status = ? WHERE order_no = ? AND status IN (?) AND amount_cents >= ?"
        );
        let unguarded = order_machine().transition(TransitionSpec::new(["PAID"], "SHIPPED")).unwrap();
        assert_eq!(
            unguarded.read.text(Backend::Sqlite).as_str(),
            "SELECT status, 1 FROM shop_order WHERE order_no = ?"
        );
    }

    #[test]
    fn a_row_that_did_not_move_is_classified_by_its_state_and_guards() {
        let t = order_machine()
            .transition(
                TransitionSpec::new(["UNPAID"], "PAID")
                    .done(["PAID", "SHIPPED"])
                    .guard("amount_cents", Compare::Eq),
            )
            .unwrap();
        let found = Found::default;
        let step = |state: Option<&str>, hold| t.classify(state.map(str::to_owned), found(), hold);
        assert_eq!(
            step(Some("PAID"), false),
            Step::Answer(Answer::AlreadyDone { state: "PAID".into(), found: found() })
        );
        assert_eq!(
            step(Some("SHIPPED"), true),
            Step::Answer(Answer::AlreadyDone { state: "SHIPPED".into(), found: found() })
        );
        assert_eq!(
            step(Some("CANCELLED"), true),
            Step::Answer(Answer::Illegal { state: "CANCELLED".into(), found: found() })
        );
        assert_eq!(step(None, true), Step::Answer(Answer::Illegal { state: "NULL".into(), found: found() }));
        assert_eq!(
            step(Some("UNPAID"), false),
            Step::Answer(Answer::GuardFailed { state: "UNPAID".into(), found: found() })
        );
        // In a from-state with the guards holding, the update missed a concurrent commit.
        assert_eq!(step(Some("UNPAID"), true), Step::UpdateAgain { state: "UNPAID".into() });
    }

    #[test]
    fn answers_become_the_handlers_results() {
        let t = order_machine()
            .transition(TransitionSpec::new(["UNPAID"], "PAID").guard("amount_cents", Compare::Eq))
            .unwrap();
        let found = Found { set: vec![], guards: vec![Some(Value::Int(900))] };
        let what = "order O-1";
        assert_eq!(t.result(Answer::Moved, what, OnMissing::Retry).unwrap(), Effect::Applied);
        assert_eq!(
            t.result(
                Answer::AlreadyDone { state: "PAID".into(), found: found.clone() },
                what,
                OnMissing::Retry
            )
            .unwrap(),
            Effect::AlreadyApplied { layer: Layer::StateMachine, detail: "order O-1 is already PAID".into() }
        );
        let illegal = t.result(
            Answer::Illegal { state: "CANCELLED".into(), found: found.clone() },
            what,
            OnMissing::Retry,
        );
        assert!(
            matches!(&illegal, Err(HandlerError::IllegalTransition(m)) if m == "illegal transition: order O-1 is CANCELLED and cannot become PAID"),
            "{illegal:?}"
        );
        let guard = t.result(Answer::GuardFailed { state: "UNPAID".into(), found }, what, OnMissing::Retry);
        assert!(
            matches!(&guard, Err(HandlerError::Permanent(m)) if m == "order O-1 is UNPAID but does not meet the conditions to become PAID (amount_cents is 900)"),
            "{guard:?}"
        );
        assert!(matches!(t.result(Answer::Missing, what, OnMissing::Retry), Err(HandlerError::Retryable(_))));
        assert!(matches!(
            t.result(Answer::Missing, what, OnMissing::DeadLetter),
            Err(HandlerError::Permanent(_))
        ));
        assert!(matches!(
            t.result(Answer::Contended { state: "UNPAID".into() }, what, OnMissing::DeadLetter),
            Err(HandlerError::Retryable(_))
        ));
    }
}
