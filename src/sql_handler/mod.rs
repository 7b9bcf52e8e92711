//! The configured handler kind `[[sql_handlers]]`: business written as SQL statements, run in
//! order on the gate's connection, inside its transaction. This file owns the section's shape
//! and its checks at load (each refusal names its key as `sql_handlers[i].…`); the parameters
//! and the placeholder rewriting are in [`params`], the [`crate::handler::Handler`] in
//! [`handler`]. Nothing here opens a connection: the statements are prepared against the
//! database when the service is assembled ([`crate::handler::Handlers::verify`]).

pub(crate) mod handler;
pub(crate) mod params;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::handler::Handlers;
use crate::reconcile::check::{AnomalyKind, WindowEnd};
use crate::route::{MAX_BIZ_TYPE_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};
pub(crate) use handler::SqlHandler;
use params::{BUILT_IN, Parsed, Source};

/// `[[sql_handlers]]`: a handler made of SQL statements. An array of tables has no
/// `IDEMGATE_SECTION__KEY` form; the whole array may come from `IDEMGATE_SQL_HANDLERS` as
/// inline tables, such as
/// `[{name="wallet.credit", statements=[{sql="UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user", expect="one"}], params={cents="json:/cents:int", user="json:/user_id"}}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlHandlerConfig {
    /// `name`: the handler name routes refer to. Not a built-in handler's nor a
    /// `[[state_machines]]` entry's.
    pub name: String,
    /// `statements`: the statements, run in this order in the gate's transaction; at least one.
    pub statements: Vec<StatementConfig>,
    /// `params`: where each `:name` of the statements comes from, in a route's grammar
    /// ([`crate::delivery::value`]): `json:/pointer` (text),
    /// `json:/pointer:int|float|bool|epoch_ms|text`, `property:NAME` (text) or `keys` (text). `:biz_id`,
    /// `:biz_type`, `:execute_time`, `:msg_id` and `:uniq_key` need no entry.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// `describe`: a SELECT with `:biz_id` whose rows the trace page shows as the business
    /// state of a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe: Option<String>,
    /// `checks`: invariants the reconciler runs, each a SELECT that returns the keys breaking it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckConfig>,
    /// `business_unique`: the unique keys whose violation by a statement means the effect was
    /// applied before (a duplicate at layer `business_unique`), each a constraint's or unique
    /// index's name (`wallet_ledger_pkey`, MySQL's `PRIMARY`) or a table's columns
    /// (`wallet_ledger(credit_id)`). Any other unique violation is an error: retried, then
    /// dead-lettered. Each is looked up in the database when the service is assembled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub business_unique: Vec<String>,
}

/// One statement of a `[[sql_handlers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatementConfig {
    /// `sql`: one INSERT, UPDATE or DELETE with `:name` parameters.
    pub sql: String,
    /// `expect`: how many rows it must change: `one`, `at_least_one` or `any` (the default).
    #[serde(default)]
    pub expect: Expect,
    /// `on_zero`: what fewer rows than expected mean: `retry` (the default), `dead_letter` or
    /// `duplicate` (the effect was applied before: the claim commits, layer `business`).
    #[serde(default)]
    pub on_zero: OnZero,
}

/// How many rows a statement must change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// Exactly one; more is refused for good, and the transaction rolls back.
    One,
    /// One or more.
    AtLeastOne,
    /// Any number, none included.
    #[default]
    Any,
}

impl Expect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::One => "one",
            Self::AtLeastOne => "at_least_one",
            Self::Any => "any",
        }
    }
}

/// What a statement that changed fewer rows than expected means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnZero {
    /// The row may still be on its way: roll back and redeliver.
    #[default]
    Retry,
    /// It never will be: roll back and dead-letter.
    DeadLetter,
    /// The effect was applied before: nothing of this handler is kept, the claim commits and
    /// the delivery is a duplicate at layer `business`.
    Duplicate,
}

/// One reconciler invariant of a `[[sql_handlers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckConfig {
    /// `name`: how the anomalies name the invariant.
    pub name: String,
    /// `sql`: a SELECT returning one row per key breaking it: the bizId first (text or an
    /// integer), optionally a count of occurrences second. It may use `:since_ms` and
    /// `:until_ms`, the run's window in epoch milliseconds.
    pub sql: String,
    /// `kind`: the anomaly kind reported, `double_applied` by default.
    #[serde(default = "double_applied")]
    pub kind: String,
}

fn double_applied() -> String {
    AnomalyKind::DoubleApplied.as_str().to_owned()
}

/// The handlers of `configs`, each under its name. The first wrong entry is refused with its
/// key named; a name in `taken` (the built-in and the state-machine handlers) is refused too.
pub(crate) fn handlers(configs: &[SqlHandlerConfig], taken: &Handlers) -> Result<Handlers, Invalid> {
    let mut handlers = Handlers::new();
    for (i, config) in configs.iter().enumerate() {
        let at = format!("sql_handlers[{i}]");
        if taken.get(&config.name).is_some() {
            return Err(invalid(
                format!("{at}.name"),
                format!(
                    "{:?} is already the name of a built-in handler or of a [[state_machines]] entry; choose another",
                    config.name
                ),
            ));
        }
        if handlers.get(&config.name).is_some() {
            return Err(invalid(
                format!("{at}.name"),
                format!("{:?} is the name of an earlier [[sql_handlers]] entry", config.name),
            ));
        }
        handlers.insert(config.name.clone(), build(config, &at)?);
    }
    Ok(handlers)
}

/// A statement of the handler, checked and rewritten.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    pub parsed: Parsed,
    pub expect: Expect,
    pub on_zero: OnZero,
}

/// A unique key a handler names in `business_unique`, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BusinessKey {
    /// A constraint's or unique index's name.
    Name(String),
    /// A table's unique key by its columns, in any order.
    Columns { table: String, columns: Vec<String> },
}

impl BusinessKey {
    /// Reads `name` or `table(col, …)`: plain SQL identifiers, in any case.
    fn parse(text: &str) -> Result<Self, String> {
        let plain = |s: &str| {
            let s = s.trim();
            let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.len() <= 64
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
            ok.then(|| s.to_owned())
        };
        let refused = || {
            format!(
                "{:?} is neither a constraint or index name nor table(column, …) of plain SQL identifiers",
                text.chars().take(80).collect::<String>()
            )
        };
        match text.split_once('(') {
            None => plain(text).map(Self::Name).ok_or_else(refused),
            Some((table, rest)) => {
                let columns = rest.trim_end().strip_suffix(')').ok_or_else(refused)?;
                let columns =
                    columns.split(',').map(plain).collect::<Option<Vec<_>>>().ok_or_else(refused)?;
                Ok(Self::Columns { table: plain(table).ok_or_else(refused)?, columns })
            }
        }
    }

    /// True when the catalog's `key` is this one.
    pub(crate) fn is(&self, key: &crate::store::UniqueKey) -> bool {
        match self {
            Self::Name(name) => key.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)),
            Self::Columns { table, columns } => {
                key.table.eq_ignore_ascii_case(table)
                    && key.columns.len() == columns.len()
                    && columns.iter().all(|c| {
                        key.columns.iter().any(|k| k.as_deref().is_some_and(|k| k.eq_ignore_ascii_case(c)))
                    })
            }
        }
    }
}

/// A configured check, checked and rewritten.
#[derive(Debug, Clone)]
pub(crate) struct CheckStatement {
    pub name: String,
    pub kind: AnomalyKind,
    pub parsed: Parsed,
    pub binds: Vec<WindowEnd>,
}

/// The handler of one entry; `at` is its key (`sql_handlers[i]`).
fn build(config: &SqlHandlerConfig, at: &str) -> Result<SqlHandler, Invalid> {
    check_key_text(&config.name, MAX_BIZ_TYPE_CHARS).map_err(|m| invalid(format!("{at}.name"), m))?;
    if config.statements.is_empty() {
        return Err(invalid(format!("{at}.statements"), "names no statement; give at least one"));
    }
    let mut sources = BTreeMap::new();
    for (name, text) in &config.params {
        let key = format!("{at}.params.{name}");
        if BUILT_IN.contains(&name.as_str()) {
            return Err(invalid(key, format!("{name} is a built-in parameter; it needs no entry")));
        }
        if !name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(invalid(key, "a parameter name is letters, digits and _, not starting with a digit"));
        }
        sources.insert(name.clone(), Source::parse(text).map_err(|m| invalid(key, m))?);
    }
    for name in BUILT_IN {
        sources.insert(name.to_owned(), Source::built_in(name).expect("a built-in"));
    }
    let mut statements = Vec::with_capacity(config.statements.len());
    let mut used = std::collections::BTreeSet::new();
    for (j, s) in config.statements.iter().enumerate() {
        let key = format!("{at}.statements[{j}].sql");
        let parsed = parse_as(&s.sql, &key, &["INSERT", "UPDATE", "DELETE"])?;
        for name in &parsed.names {
            if !sources.contains_key(name) {
                return Err(invalid(
                    key,
                    format!(
                        "uses :{name}, which is not a parameter: declare it in {at}.params (the built-in ones are {})",
                        BUILT_IN.join(", ")
                    ),
                ));
            }
            used.insert(name.clone());
        }
        statements.push(Statement { parsed, expect: s.expect, on_zero: s.on_zero });
    }
    if let Some(unused) = config.params.keys().find(|n| !used.contains(*n)) {
        return Err(invalid(format!("{at}.params.{unused}"), "is used by no statement"));
    }
    let describe = match &config.describe {
        None => None,
        Some(sql) => {
            let key = format!("{at}.describe");
            let parsed = parse_as(sql, &key, &["SELECT"])?;
            if let Some(other) = parsed.names.iter().find(|n| *n != "biz_id") {
                return Err(invalid(
                    key,
                    format!("uses :{other}; a describe statement is given :biz_id only"),
                ));
            }
            Some(parsed)
        }
    };
    let mut checks = Vec::with_capacity(config.checks.len());
    for (k, c) in config.checks.iter().enumerate() {
        let key = format!("{at}.checks[{k}]");
        if c.name.trim().is_empty() {
            return Err(invalid(format!("{key}.name"), "is empty"));
        }
        let kind = AnomalyKind::parse(&c.kind).ok_or_else(|| {
            invalid(
                format!("{key}.kind"),
                format!(
                    "{:?} is not an anomaly kind; use one of {}",
                    c.kind,
                    AnomalyKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let parsed = parse_as(&c.sql, &format!("{key}.sql"), &["SELECT"])?;
        let binds = parsed
            .names
            .iter()
            .map(|n| match n.as_str() {
                "since_ms" => Ok(WindowEnd::Since),
                "until_ms" => Ok(WindowEnd::Until),
                other => Err(invalid(
                    format!("{key}.sql"),
                    format!("uses :{other}; a check is given :since_ms and :until_ms only"),
                )),
            })
            .collect::<Result<_, _>>()?;
        checks.push(CheckStatement { name: c.name.clone(), kind, parsed, binds });
    }
    let business_unique = config
        .business_unique
        .iter()
        .enumerate()
        .map(|(k, text)| {
            BusinessKey::parse(text).map_err(|m| invalid(format!("{at}.business_unique[{k}]"), m))
        })
        .collect::<Result<_, _>>()?;
    Ok(SqlHandler::new(
        at.to_owned(),
        config.name.clone(),
        statements,
        sources,
        describe,
        checks,
        business_unique,
    ))
}

/// `sql` parsed, its first word one of `verbs`; the error names `key`.
fn parse_as(sql: &str, key: &str, verbs: &[&str]) -> Result<Parsed, Invalid> {
    let parsed = params::parse(sql).map_err(|m| invalid(key, m))?;
    if !verbs.contains(&parsed.verb.as_str()) {
        return Err(invalid(
            key,
            format!("is a {} statement; only {} is allowed here", parsed.verb, verbs.join(", ")),
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credit() -> SqlHandlerConfig {
        SqlHandlerConfig {
            name: "wallet.credit".into(),
            statements: vec![
                StatementConfig {
                    sql: "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user".into(),
                    expect: Expect::One,
                    on_zero: OnZero::Retry,
                },
                StatementConfig {
                    sql: "INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (:biz_id, :user, :cents)"
                        .into(),
                    expect: Expect::One,
                    on_zero: OnZero::Retry,
                },
            ],
            params: [("cents", "json:/cents:int"), ("user", "json:/user_id")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            describe: Some("SELECT user_id, cents FROM wallet_ledger WHERE credit_id = :biz_id".into()),
            checks: vec![CheckConfig {
                name: "credit_once".into(),
                sql: "SELECT credit_id FROM wallet_ledger GROUP BY credit_id HAVING COUNT(*) > 1".into(),
                kind: double_applied(),
            }],
            business_unique: vec!["wallet_ledger(credit_id)".into()],
        }
    }

    fn refused(config: SqlHandlerConfig) -> String {
        handlers(
            &[config],
            &crate::handler::doing_nothing(&["order.create", "payment.confirm", "stock.deduct"]),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn a_valid_entry_is_a_handler_under_its_name() {
        let built = handlers(&[credit()], &Handlers::new()).unwrap();
        assert_eq!(built.names().collect::<Vec<_>>(), ["wallet.credit"]);
        let checks = built.get("wallet.credit").unwrap().checks();
        assert_eq!((checks.len(), checks[0].name.as_ref()), (1, "credit_once"));
    }

    #[test]
    fn wrong_entries_are_refused_with_their_key_named() {
        let with_sql = |j: usize, sql: &str| {
            let mut c = credit();
            c.statements[j].sql = sql.into();
            c
        };
        let cases = [
            (
                with_sql(1, "INSERT INTO wallet_ledger (credit_id, cents) VALUES (:biz_id, :amount)"),
                "configuration key sql_handlers[0].statements[1].sql: uses :amount, which is not a parameter",
            ),
            (
                with_sql(0, "SELECT * FROM wallet WHERE user_id = :user AND :cents > 0"),
                "configuration key sql_handlers[0].statements[0].sql: is a SELECT statement; only INSERT, UPDATE, DELETE",
            ),
            (
                with_sql(0, "DROP TABLE wallet"),
                "configuration key sql_handlers[0].statements[0].sql: is a DROP statement",
            ),
            (
                with_sql(0, "UPDATE wallet SET b = :cents WHERE u = :user; DELETE FROM wallet"),
                "sql_handlers[0].statements[0].sql: holds more than one statement",
            ),
            (
                SqlHandlerConfig { statements: vec![], ..credit() },
                "sql_handlers[0].statements: names no statement",
            ),
            (
                SqlHandlerConfig { name: "stock.deduct".into(), ..credit() },
                "configuration key sql_handlers[0].name: \"stock.deduct\" is already the name of a built-in handler",
            ),
            (
                SqlHandlerConfig { name: "a b".into(), ..credit() },
                "sql_handlers[0].name: has a forbidden character",
            ),
            (
                SqlHandlerConfig {
                    describe: Some("DELETE FROM wallet WHERE user_id = :biz_id".into()),
                    ..credit()
                },
                "sql_handlers[0].describe: is a DELETE statement; only SELECT",
            ),
            (
                SqlHandlerConfig {
                    describe: Some("SELECT 1 FROM wallet WHERE user_id = :user".into()),
                    ..credit()
                },
                "sql_handlers[0].describe: uses :user",
            ),
        ];
        for (config, expected) in cases {
            let err = refused(config);
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
        let mut c = credit();
        c.params.insert("biz_id".into(), "json:/id".into());
        assert!(refused(c).contains("sql_handlers[0].params.biz_id: biz_id is a built-in parameter"));
        let mut c = credit();
        c.params.insert("spare".into(), "json:/spare".into());
        assert!(refused(c).contains("sql_handlers[0].params.spare: is used by no statement"));
        let mut c = credit();
        c.params.insert("cents".into(), "json:/cents:money".into());
        assert!(refused(c).contains(
            "sql_handlers[0].params.cents: \"json:/cents:money\": \"money\" is not a parameter type"
        ));
        let mut c = credit();
        c.checks[0].kind = "weird".into();
        assert!(refused(c).contains("sql_handlers[0].checks[0].kind: \"weird\" is not an anomaly kind"));
        let mut c = credit();
        c.checks[0].sql = "SELECT credit_id FROM wallet_ledger WHERE user_id = :user".into();
        assert!(refused(c).contains("sql_handlers[0].checks[0].sql: uses :user"));
        for wrong in ["", "wallet ledger", "wallet_ledger(", "wallet_ledger()", "t(a, b c)", "x;drop"] {
            let mut c = credit();
            c.business_unique = vec!["wallet_ledger_pkey".into(), wrong.into()];
            let err = refused(c);
            assert!(err.contains("sql_handlers[0].business_unique[1]: "), "{wrong:?}: {err}");
            assert!(err.contains("is neither a constraint or index name nor table(column, …)"), "{err}");
        }
        assert_eq!(
            BusinessKey::parse(" wallet_ledger ( credit_id, User_Id ) "),
            Ok(BusinessKey::Columns {
                table: "wallet_ledger".into(),
                columns: vec!["credit_id".into(), "User_Id".into()]
            })
        );
        assert_eq!(BusinessKey::parse("PRIMARY"), Ok(BusinessKey::Name("PRIMARY".into())));
        let twice = handlers(&[credit(), credit()], &Handlers::new()).map(|_| ()).unwrap_err();
        assert_eq!(twice.key, "sql_handlers[1].name");
    }
}
