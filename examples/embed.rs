//! The whole service in a program of its own, with a handler written in Rust, as
//! docs/own-business.md shows it: `Application::build_with` assembles the gate, the web UI and
//! the schedules from `Settings`, and the program feeds the gate itself (`Feed::Caller`), so no
//! broker is needed. Run with `cargo run --example embed`: on a SQLite file in a temporary
//! folder it delivers a wallet credit, a redelivery of it and the same credit under another
//! message key, prints each outcome and the credit's trace.

use async_trait::async_trait;
use idemgate::{
    Application, Conn, Delivery, Effect, Fact, Feed, Handler, HandlerError, Handlers, Layer, RouteConfig,
    SearchBy, Settings, Sql, Store, StoreOptions, TraceQuery, Work, query, render_trace, trace,
};
use sqlx::Row;

static CREDIT: Sql = Sql::new("UPDATE wallet SET balance_cents = balance_cents + ? WHERE user_id = ?");
static LEDGER: Sql = Sql::new("INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (?, ?, ?)");
static LEDGER_ROWS: Sql = Sql::new("SELECT user_id, cents FROM wallet_ledger WHERE credit_id = ?");

/// Credits a wallet and writes the credit's ledger row, whose `credit_id` is unique.
struct Credit;

#[async_trait]
impl Handler for Credit {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let body: serde_json::Value = serde_json::from_slice(&work.delivery.body)
            .map_err(|e| HandlerError::Invalid(format!("body: {e}")))?;
        let (Some(credit_id), Some(user), Some(cents)) =
            (body["credit_id"].as_str(), body["user_id"].as_str(), body["cents"].as_i64())
        else {
            return Err(HandlerError::Invalid("credit_id, user_id and cents are required".into()));
        };
        // The ledger row first: a credit already there (sent again under another message key)
        // changes nothing, and SQLite leaves the transaction usable after the failed insert.
        let ledger =
            query(work.backend, &LEDGER).bind(credit_id).bind(user).bind(cents).execute(&mut *conn).await;
        match ledger {
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                return Ok(Effect::AlreadyApplied {
                    layer: Layer::BusinessUnique,
                    detail: format!("credit {credit_id} is in the ledger already"),
                });
            }
            other => other?,
        };
        let done = query(work.backend, &CREDIT).bind(cents).bind(user).execute(&mut *conn).await?;
        if done.rows_affected() == 0 {
            return Err(HandlerError::Retryable(format!("wallet of {user} not found yet")));
        }
        Ok(Effect::Applied)
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        let rows = store.query(&LEDGER_ROWS).bind(biz_id).fetch_all(store.pool()).await?;
        Ok(match rows.as_slice() {
            [] => vec![Fact::new("wallet ledger", "not credited")],
            [r] => vec![Fact::new(
                "wallet ledger",
                format!("{} cents to {}", r.try_get::<i64, _>(1)?, r.try_get::<String, _>(0)?),
            )],
            more => vec![Fact::alarm("wallet ledger", format!("CREDITED {} TIMES", more.len()))],
        })
    }
}

fn credit(msg_id: &str, uniq_key: &str, key: &str, credit_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: uniq_key.into(),
        topic: "wallet".into(),
        tags: "credit".into(),
        keys: vec![key.into()],
        body: serde_json::json!({ "credit_id": credit_id, "user_id": "u1", "cents": 500 })
            .to_string()
            .into_bytes(),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("wallet.db").display());

    // The business tables are the program's own.
    let store = Store::open(&url, &StoreOptions::default()).await?;
    for ddl in [
        "CREATE TABLE wallet (user_id TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL)",
        "CREATE TABLE wallet_ledger (credit_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, cents BIGINT NOT NULL)",
        "INSERT INTO wallet VALUES ('u1', 0)",
    ] {
        sqlx::query(ddl).execute(store.pool()).await?;
    }
    store.close().await;

    let mut settings = Settings::default();
    settings.database.url = url;
    settings.http.bind = "127.0.0.1:0".into();
    settings.consumer.group = "wallet_service".into();
    settings.routes = vec![RouteConfig {
        topic: "wallet".into(),
        tags: "credit".into(),
        biz_type: "wallet.credit".into(),
        biz_id: "keys".into(),
        execute_time: None,
        handler: None,
    }];
    let handlers = Handlers::new().with("wallet.credit", Credit);
    let app = Application::build_with(&settings, handlers, Feed::Caller).await?;
    let web = app.web().clone();
    let running = app.start().await?;
    println!("web UI at {}/", running.url());

    for d in [
        credit("M-1", "U-1", "C-1", "C-1"),
        // The broker again: the same message.
        credit("M-2", "U-1", "C-1", "C-1"),
        // The producer again, under another message key: the ledger's unique key stops it.
        credit("M-3", "U-3", "C-1-again", "C-1"),
    ] {
        let r = running.gate().process(&d).await;
        let layer = r.layer.map(|l| format!(" at {l}")).unwrap_or_default();
        let cause = r.cause.map(|c| format!(" ({c})")).unwrap_or_default();
        println!("{} {}: {}{cause}{layer}", d.msg_id, d.keys[0], r.outcome);
    }
    let store = running.gate().store().clone();
    let balance: i64 = sqlx::query_scalar("SELECT balance_cents FROM wallet WHERE user_id = 'u1'")
        .fetch_one(store.pool())
        .await?;
    println!("balance of u1: {balance} cents\n");
    assert_eq!(balance, 500);

    let q = TraceQuery::new("C-1", SearchBy::Any, None, None, None)?;
    print!("{}", render_trace(&trace(&store, &web.trace, &q).await?));
    running.stop().await
}
