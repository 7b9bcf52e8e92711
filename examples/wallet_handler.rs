//! A custom handler on the gate, as docs/handlers.md shows it: credit a wallet exactly once per
//! business key. Run with `cargo run --example wallet_handler`; it uses a SQLite file in a
//! temporary folder and delivers the same credit twice.

use idemgate::{
    Conn, Delivery, Effect, Gate, Handler, HandlerError, Handlers, Identity, Policy, RouteConfig, Routes,
    Sql, Store, StoreOptions, Work, query,
};

static CREDIT: Sql = Sql::new("UPDATE wallet SET balance_cents = balance_cents + ? WHERE user_id = ?");

struct Credit;

#[async_trait::async_trait]
impl Handler for Credit {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let body: serde_json::Value = serde_json::from_slice(&work.delivery.body)
            .map_err(|e| HandlerError::Invalid(format!("body: {e}")))?;
        let (Some(user), Some(cents)) = (body["user_id"].as_str(), body["cents"].as_i64()) else {
            return Err(HandlerError::Invalid("user_id and cents are required".into()));
        };
        let done = query(work.backend, &CREDIT).bind(cents).bind(user).execute(&mut *conn).await?;
        if done.rows_affected() == 0 {
            return Err(HandlerError::Retryable(format!("wallet of {user} not found yet")));
        }
        Ok(Effect::Applied)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("wallet.db").display());
    let store = Store::open(&url, &StoreOptions::default()).await?;
    sqlx::query("CREATE TABLE wallet (user_id TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL)")
        .execute(store.pool())
        .await?;
    sqlx::query("INSERT INTO wallet VALUES ('u1', 0)").execute(store.pool()).await?;

    let routes = Routes::new(&[RouteConfig {
        topic: "wallet".into(),
        tags: "credit".into(),
        biz_type: "wallet.credit".into(),
        biz_id: "json:/credit_id".into(),
        execute_time: None,
        handler: None,
    }])?;
    let handlers = Handlers::new().with("wallet.credit", Credit);
    let identity = Identity { consumer_group: "wallet_service".into(), instance_id: "example".into() };
    let gate = Gate::new(store.clone(), routes, handlers, identity, Policy::default())?;

    let credit = Delivery {
        msg_id: "M-1".into(),
        uniq_key: "U-1".into(),
        topic: "wallet".into(),
        tags: "credit".into(),
        body: br#"{"credit_id":"C-1","user_id":"u1","cents":500}"#.to_vec(),
        ..Default::default()
    };
    let first = gate.process(&credit).await;
    let again = gate.process(&Delivery { msg_id: "M-2".into(), ..credit }).await;
    let balance: i64 = sqlx::query_scalar("SELECT balance_cents FROM wallet WHERE user_id = 'u1'")
        .fetch_one(store.pool())
        .await?;
    println!(
        "first: {}, again: {} ({:?}), balance: {balance} cents",
        first.outcome, again.outcome, again.cause
    );
    assert_eq!(balance, 500);
    Ok(())
}
