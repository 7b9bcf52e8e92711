//! The configured handler kind `[[state_machines]]`: a state move that needs no code, built on
//! [`super::Transition`]. Each entry is checked when the settings load, its field named; the
//! key of the row to move comes from the message's key, or from a key source of its own.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Move, OnMissing, StateMachine, Transition, TransitionSpec, Value};
use crate::delivery::value::{Body, Source};
use crate::handler::{Answers, Effect, Fact, Handler, HandlerError, Handlers, Work};
use crate::route::{MAX_BIZ_ID_CHARS, MAX_BIZ_TYPE_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};
use crate::store::{Conn, Store};

/// `[[state_machines]]`: a handler made from configuration, for moves that need no code. An
/// array of tables has no `IDEMGATE_SECTION__KEY` form; the whole array may come from
/// `IDEMGATE_STATE_MACHINES` as inline tables, such as
/// `[{name="order.ship", table="shop_order", key_column="order_no", state_column="status", from=["PAID"], to="SHIPPED"}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateMachineConfig {
    /// `name` (in `IDEMGATE_STATE_MACHINES`, `{name = "…"}`): the handler name that routes refer
    /// to (`handler = "order.ship"`, or a route whose biz_type is this name). Must not be the
    /// name of a built-in handler.
    pub name: String,
    /// `table`: the table whose rows move. A plain identifier.
    pub table: String,
    /// `key_column`: the column that names a row (its primary or a unique key).
    pub key_column: String,
    /// `state_column`: the column that holds the row's state, as text.
    pub state_column: String,
    /// `from`: the states the move starts from.
    pub from: Vec<String>,
    /// `to`: the state the move makes.
    pub to: String,
    /// `done`: the states that mean the move was made already; absent means `[to]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<Vec<String>>,
    /// `on_missing`: `retry` (the default: the row may still be on its way) or `dead_letter`.
    #[serde(default)]
    pub on_missing: OnMissing,
    /// `set_time_column`: a column set to the gate's clock, epoch milliseconds, by the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_time_column: Option<String>,
    /// `row_key`: where the row's key comes from, as a route's `biz_id` says it (`keys`,
    /// `property:NAME`, `json:/pointer`); absent means the delivery's bizId. Set it when the
    /// messages are keyed by something else than the row (a shipment number for an order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_key: Option<String>,
}

impl StateMachineConfig {
    /// The handler this entry describes; the error names the field.
    pub fn handler(&self) -> Result<TransitionHandler, Invalid> {
        check_key_text(&self.name, MAX_BIZ_TYPE_CHARS).map_err(|m| invalid("name", m))?;
        let machine = StateMachine::new(&self.table, &self.key_column, &self.state_column)?;
        let mut spec = TransitionSpec::new(self.from.iter().cloned(), self.to.as_str());
        spec.done = self.done.clone();
        if let Some(column) = &self.set_time_column {
            spec = spec.set(column.as_str());
        }
        let transition = machine.transition(spec).map_err(|e| match e.key.as_str() {
            "set[0]" => Invalid { key: "set_time_column".to_owned(), ..e },
            _ => e,
        })?;
        let row_key = self
            .row_key
            .as_deref()
            .map(|text| Source::parse(text).map_err(|m| invalid("row_key", m)))
            .transpose()?;
        Ok(TransitionHandler {
            transition,
            row_key: row_key.map(|source| (source, self.row_key.clone().unwrap_or_default())),
            on_missing: self.on_missing,
        })
    }
}

/// The handlers of `configs`, each under its name. The first wrong entry is refused, its field
/// named as `state_machines[i].field`.
pub fn handlers(configs: &[StateMachineConfig]) -> Result<Handlers, Invalid> {
    let mut handlers = Handlers::new();
    for (i, config) in configs.iter().enumerate() {
        let handler =
            config.handler().map_err(|e| invalid(format!("state_machines[{i}].{}", e.key), e.message))?;
        if handlers.get(&config.name).is_some() {
            return Err(invalid(
                format!("state_machines[{i}].name"),
                format!("{:?} is the name of an earlier [[state_machines]] entry", config.name),
            ));
        }
        handlers.insert(config.name.clone(), handler);
    }
    Ok(handlers)
}

/// A configured move as a [`Handler`]: the row named by the delivery (its bizId, or
/// `row_key`) moves; a set time column gets the gate's clock.
#[derive(Debug)]
pub struct TransitionHandler {
    transition: Transition,
    /// Where the row key comes from, and that source as configured; `None`: the bizId.
    row_key: Option<(Source, String)>,
    on_missing: OnMissing,
}

impl TransitionHandler {
    pub fn transition(&self) -> &Transition {
        &self.transition
    }
}

impl TransitionHandler {
    /// The key of the row a delivery moves (its bizId, or `row_key`), checked as a key.
    fn row_of(&self, work: &Work<'_>) -> Result<String, HandlerError> {
        let key = match &self.row_key {
            None => work.key.biz_id.clone(),
            Some((source, _)) => source
                .read(work.delivery, &mut Body::new(&work.delivery.body))
                .map_err(|why| HandlerError::Invalid(format!("row_key: {why}")))?,
        };
        check_key_text(&key, MAX_BIZ_ID_CHARS)
            .map_err(|why| HandlerError::Invalid(format!("row_key {why}")))?;
        Ok(key)
    }

    /// The move of the row `key`: its time column set to the gate's clock, when it has one.
    fn move_of(&self, key: &str, now_ms: i64) -> Move {
        let m = Move::of(key);
        if self.transition.set.is_empty() { m } else { m.set(now_ms) }
    }

    fn result(&self, key: &str, answer: super::Answer) -> Result<Effect, HandlerError> {
        self.transition.result(answer, &format!("{} {key}", self.transition.machine.table), self.on_missing)
    }
}

#[async_trait]
impl Handler for TransitionHandler {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let key = self.row_of(work)?;
        let answer = self.transition.apply(conn, work.backend, &self.move_of(&key, work.now_ms)).await?;
        self.result(&key, answer)
    }

    /// The group's moves as one conditional update where the backend returns the rows it
    /// changed ([`Transition::apply_many`]).
    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        let Some(first) = works.first() else { return Ok(Vec::new()) };
        let rows: Vec<Result<String, HandlerError>> = works.iter().map(|w| self.row_of(w)).collect();
        let moves: Vec<Move> =
            rows.iter().filter_map(|r| r.as_ref().ok()).map(|key| self.move_of(key, first.now_ms)).collect();
        let mut answers = self.transition.apply_many(conn, first.backend, &moves).await?.into_iter();
        Ok(rows
            .into_iter()
            .map(|row| {
                let key = row?;
                let answer =
                    answers.next().unwrap_or(super::Answer::Contended { state: "unknown".to_owned() });
                self.result(&key, answer)
            })
            .collect())
    }

    /// The row's state, what it means for the move, and the time column. Where rows are named
    /// by `row_key`, the bizId does not name the row, and the page says so.
    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        let t = &self.transition;
        let table = t.machine.table.as_str();
        if let Some((_, source)) = &self.row_key {
            return Ok(vec![Fact::new(
                table,
                format!("rows are named by {source} of each message, not by the bizId"),
            )]);
        }
        let Some((state, set)) = t.current(store, biz_id).await? else {
            return Ok(vec![Fact::new(table, format!("no row with {} {biz_id}", t.machine.key_column))]);
        };
        let state = state.unwrap_or_else(|| "NULL".to_owned());
        let meaning = if t.done.contains(&state) {
            format!("{state}: the move to {} is made", t.to)
        } else if t.from.contains(&state) {
            format!("{state}: can become {}", t.to)
        } else {
            format!("{state}: cannot become {}", t.to)
        };
        let mut facts =
            vec![Fact::new("row", format!("{table} {biz_id}")), Fact::new(&t.machine.state_column, meaning)];
        for (column, value) in t.set.iter().zip(set) {
            let shown = match value {
                Some(Value::Int(ms)) => crate::clock::format_ms(ms),
                Some(other) => other.to_string(),
                None => "not set".to_owned(),
            };
            facts.push(Fact::new(column, shown));
        }
        Ok(facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> StateMachineConfig {
        StateMachineConfig {
            name: "order.ship".into(),
            table: "shop_order".into(),
            key_column: "order_no".into(),
            state_column: "status".into(),
            from: vec!["PAID".into()],
            to: "SHIPPED".into(),
            done: None,
            on_missing: OnMissing::Retry,
            set_time_column: None,
            row_key: None,
        }
    }

    #[test]
    fn configured_entries_are_refused_with_their_field_named() {
        let cases: Vec<(StateMachineConfig, &str)> = vec![
            (
                StateMachineConfig { table: "x; drop".into(), ..config() },
                "state_machines[0].table: \"x; drop\" is not a plain SQL identifier",
            ),
            (StateMachineConfig { key_column: "id\"--".into(), ..config() }, "state_machines[0].key_column:"),
            (StateMachineConfig { state_column: "".into(), ..config() }, "state_machines[0].state_column:"),
            (
                StateMachineConfig { set_time_column: Some("t; x".into()), ..config() },
                "state_machines[0].set_time_column:",
            ),
            (
                StateMachineConfig { set_time_column: Some("status".into()), ..config() },
                "state_machines[0].set_time_column:",
            ),
            (
                StateMachineConfig { name: "a b".into(), ..config() },
                "state_machines[0].name: has a forbidden character",
            ),
            (StateMachineConfig { from: vec![], ..config() }, "state_machines[0].from: names no state"),
            (
                StateMachineConfig { done: Some(vec!["PAID".into()]), ..config() },
                "state_machines[0].done[0]:",
            ),
            (
                StateMachineConfig { row_key: Some("body".into()), ..config() },
                "state_machines[0].row_key: \"body\" is not a value source",
            ),
        ];
        for (c, expected) in cases {
            let err = handlers(&[c]).unwrap_err().to_string();
            let expected = format!("configuration key {expected}");
            assert!(err.starts_with(&expected), "expected {expected:?}, got {err:?}");
        }
        let twice = handlers(&[config(), config()]).unwrap_err();
        assert_eq!(twice.key, "state_machines[1].name");
        let built =
            handlers(&[config(), StateMachineConfig { name: "order.cancel".into(), ..config() }]).unwrap();
        assert_eq!(built.names().collect::<Vec<_>>(), ["order.cancel", "order.ship"]);
    }
}
