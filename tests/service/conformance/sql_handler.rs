//! Configured `[[sql_handlers]]` through the gate, on every backend, built from `Settings` by the
//! service's own assembly: a wallet credit of two statements (an update held to one row and a
//! ledger insert under a business unique key), a debit, a bonus that must touch one wallet, and
//! a coupon redeemed by one conditional update. Racing copies apply once; a failing statement
//! takes the claim and the earlier statement back; each zero-row mapping, a business-unique
//! duplicate, missing and mistyped parameters, hostile values, the trace page's rows, a
//! configured reconciler check and the start-up refusals. Only the unique keys an entry names
//! in `business_unique` make a duplicate: a wallet event whose credit is already recorded is
//! one, while its reference or primary key taken by another row is an error, retried and then
//! dead-lettered.

use idemgate::app::{Application, Feed};
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate};
use idemgate::outcome::{Layer, Outcome, Verdict};
use idemgate::route::RouteConfig;
use idemgate::sql_handler::{Expect, OnZero, SqlHandlerConfig, StatementConfig};
use idemgate::store::{Backend, Sql, Store};
use idemgate_shop as shop;
use sqlx::Row;

use super::support::{TestDb, gate_settings, identity};
use super::{CLAIMS_OF, only_log_row};

const GROUP: &str = "wallet-service";
const TOPIC: &str = "wallet";

fn statement(sql: &str, expect: Expect, on_zero: OnZero) -> StatementConfig {
    StatementConfig { sql: sql.into(), expect, on_zero }
}

fn params(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// The configured handlers of these cases.
pub fn configs() -> Vec<SqlHandlerConfig> {
    let config = |name: &str, statements, params| SqlHandlerConfig {
        name: name.into(),
        statements,
        params,
        describe: None,
        checks: vec![],
        business_unique: vec![],
    };
    vec![
        SqlHandlerConfig {
            describe: Some("SELECT user_id, cents, msg_id FROM wallet_ledger WHERE credit_id = :biz_id".into()),
            checks: vec![
                idemgate::sql_handler::CheckConfig {
                    name: "credit_once".into(),
                    sql: "SELECT credit_id FROM wallet_ledger GROUP BY credit_id HAVING COUNT(*) > 1".into(),
                    kind: "double_applied".into(),
                },
                idemgate::sql_handler::CheckConfig {
                    name: "no negative balance".into(),
                    sql: "SELECT user_id, COUNT(*) FROM wallet WHERE balance_cents < 0 AND balance_cents < :until_ms \
                          AND :since_ms > balance_cents GROUP BY user_id".into(),
                    kind: "orphan".into(),
                },
            ],
            business_unique: vec!["wallet_ledger(credit_id)".into()],
            ..config(
                "wallet.credit",
                vec![
                    statement(
                        "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user",
                        Expect::One,
                        OnZero::Retry,
                    ),
                    statement(
                        "INSERT INTO wallet_ledger (credit_id, user_id, cents, note, msg_id) \
                         VALUES (:credit, :user, :cents, :note, :msg_id)",
                        Expect::One,
                        OnZero::Retry,
                    ),
                ],
                params(&[
                    ("cents", "json:/cents:int"),
                    ("user", "json:/user_id"),
                    ("credit", "json:/credit_id"),
                    ("note", "json:/note"),
                ]),
            )
        },
        config(
            "wallet.debit",
            vec![statement(
                "UPDATE wallet SET balance_cents = balance_cents - :cents WHERE user_id = :user AND balance_cents >= :cents",
                Expect::One,
                OnZero::DeadLetter,
            )],
            params(&[("cents", "json:/cents:int"), ("user", "json:/user_id")]),
        ),
        config(
            "wallet.bonus",
            vec![statement(
                "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id LIKE :users",
                Expect::One,
                OnZero::Retry,
            )],
            params(&[("cents", "json:/cents:int"), ("users", "json:/users")]),
        ),
        config(
            "coupon.redeem",
            vec![statement(
                "UPDATE coupon SET state = 'USED', used_by = :user WHERE code = :biz_id AND state = 'NEW'",
                Expect::One,
                OnZero::Duplicate,
            )],
            params(&[("user", "property:USER")]),
        ),
        SqlHandlerConfig {
            business_unique: vec!["wallet_event_credit".into()],
            ..config(
                "wallet.event",
                vec![statement(
                    "INSERT INTO wallet_event (event_no, credit_id, ref) VALUES (:event_no, :credit, :ref)",
                    Expect::One,
                    OnZero::Retry,
                )],
                params(&[("event_no", "json:/event_no:int"), ("credit", "json:/credit_id"), ("ref", "json:/ref")]),
            )
        },
    ]
}

fn routes() -> Vec<RouteConfig> {
    ["credit", "debit", "bonus", "redeem", "event"]
        .into_iter()
        .map(|tag| {
            let handler = if tag == "redeem" { "coupon.redeem".to_owned() } else { format!("wallet.{tag}") };
            RouteConfig {
                topic: TOPIC.into(),
                tags: tag.into(),
                biz_type: handler.clone(),
                biz_id: "keys".into(),
                execute_time: None,
                handler: Some(handler),
            }
        })
        .collect()
}

/// The settings of these cases: the shop's and the wallet's routes, the configured handlers.
fn settings(instance: &str) -> Settings {
    let mut s = gate_settings(&identity(GROUP, instance), routes());
    s.sql_handlers = configs();
    s.validate().expect("valid settings");
    s
}

static CREATE_WALLET: Sql =
    Sql::new("CREATE TABLE wallet (user_id VARCHAR(64) NOT NULL PRIMARY KEY, balance_cents BIGINT NOT NULL)");
static CREATE_LEDGER: Sql = Sql::new(
    "CREATE TABLE wallet_ledger (credit_id VARCHAR(128) NOT NULL PRIMARY KEY, user_id VARCHAR(64) NOT NULL, \
     cents BIGINT NOT NULL, note TEXT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
);
static CREATE_COUPON: Sql = Sql::new(
    "CREATE TABLE coupon (code VARCHAR(64) NOT NULL PRIMARY KEY, state VARCHAR(16) NOT NULL, used_by VARCHAR(64))",
);
/// A wallet's events: one per credit (the business key, a unique index of the same name on
/// every backend), numbered by the producer, each with a reference of its own.
static CREATE_EVENT: Sql = Sql::new(
    "CREATE TABLE wallet_event (event_no BIGINT NOT NULL PRIMARY KEY, credit_id VARCHAR(128) NOT NULL, \
     ref VARCHAR(64) NOT NULL)",
);
static CREATE_EVENT_CREDIT: Sql =
    Sql::new("CREATE UNIQUE INDEX wallet_event_credit ON wallet_event (credit_id)");
static CREATE_EVENT_REF: Sql = Sql::new("CREATE UNIQUE INDEX wallet_event_ref ON wallet_event (ref)");
static EVENTS: Sql = Sql::new("SELECT COUNT(*) FROM wallet_event");
static ADD_WALLET: Sql = Sql::new("INSERT INTO wallet (user_id, balance_cents) VALUES (?, ?)");
static ADD_COUPON: Sql = Sql::new("INSERT INTO coupon (code, state) VALUES (?, ?)");
static BALANCE: Sql = Sql::new("SELECT balance_cents FROM wallet WHERE user_id = ?");
static WALLETS: Sql = Sql::new("SELECT COUNT(*) FROM wallet");
static LEDGER_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM wallet_ledger WHERE credit_id = ?");
static ALL_LEDGER_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM wallet_ledger");
static NOTE: Sql = Sql::new("SELECT note, user_id FROM wallet_ledger WHERE credit_id = ?");
static COUPON: Sql = Sql::new("SELECT state, used_by FROM coupon WHERE code = ?");

/// A test database with the wallet's tables and `wallets` in it.
async fn wallet_db(backend: Backend, wallets: &[(&str, i64)]) -> TestDb {
    let db = TestDb::new(backend).await;
    for ddl in [
        &CREATE_WALLET,
        &CREATE_LEDGER,
        &CREATE_COUPON,
        &CREATE_EVENT,
        &CREATE_EVENT_CREDIT,
        &CREATE_EVENT_REF,
    ] {
        db.store.query(ddl).execute(db.store.pool()).await.expect("business table");
    }
    for (user, cents) in wallets {
        db.store.query(&ADD_WALLET).bind(*user).bind(*cents).execute(db.store.pool()).await.expect("wallet");
    }
    db
}

/// The gate the service would assemble from [`settings`] on `store`, its handlers prepared
/// against the database first.
async fn wallet_gate(store: Store, instance: &str) -> Gate {
    let s = settings(instance);
    let handlers = s.handlers_with(shop::handlers()).expect("handlers");
    handlers.verify(&store).await.expect("every statement prepares");
    idemgate::app::assemble_gate(&s, store, handlers, None).expect("gate")
}

fn message(tag: &str, key: &str, msg_id: &str, body: serde_json::Value) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: tag.into(),
        keys: vec![key.into()],
        body: body.to_string().into_bytes(),
        ..Default::default()
    }
}

/// A credit of `cents` to `user` under message key `key`, its ledger row `credit_id`.
fn credit(key: &str, credit_id: &str, user: &str, cents: i64, msg_id: &str) -> Delivery {
    let body = serde_json::json!({ "credit_id": credit_id, "user_id": user, "cents": cents, "note": "" });
    message("credit", key, msg_id, body)
}

fn outcome(d: &Disposition) -> (Outcome, Option<Layer>, Verdict) {
    (d.outcome, d.layer, d.verdict)
}

async fn balance(db: &TestDb, user: &str) -> i64 {
    db.scalar(&BALANCE, &[user]).await
}

pub mod cases {
    use super::*;

    pub async fn sixteen_concurrent_credits_of_one_key_apply_once(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100)]).await;
        let gates = [
            std::sync::Arc::new(wallet_gate(db.store.clone(), "a").await),
            std::sync::Arc::new(wallet_gate(db.second_store().await, "b").await),
        ];
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (g, barrier) = (gates[i % 2].clone(), barrier.clone());
                let mut d = credit("CR-RACE", "CR-RACE", "u-1", 250, &format!("M-{i}"));
                d.uniq_key = if i % 2 == 0 { "U-1".to_owned() } else { format!("U-resend-{i}") };
                tokio::spawn(async move {
                    barrier.wait().await;
                    g.process(&d).await
                })
            })
            .collect();
        let mut ends = Vec::new();
        for t in tasks {
            let d = t.await.expect("no panic");
            assert_eq!(d.verdict, Verdict::Ack, "{d:?}");
            ends.push(d.outcome);
        }
        let processed = ends.iter().filter(|o| **o == Outcome::Processed).count();
        let duplicates = ends.iter().filter(|o| **o == Outcome::Duplicate).count();
        assert_eq!((processed, duplicates), (1, 15), "{ends:?}");
        assert_eq!(balance(&db, "u-1").await, 350, "credited once");
        assert_eq!(db.scalar(&LEDGER_ROWS, &["CR-RACE"]).await, 1, "one ledger row");
        assert_eq!(db.scalar(&CLAIMS_OF, &["CR-RACE"]).await, 1, "one claim");
    }

    pub async fn a_failing_second_statement_takes_back_the_first_and_the_claim(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100)]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        // Without its ledger table the second statement fails after the first has credited.
        sqlx::query("ALTER TABLE wallet_ledger RENAME TO wallet_ledger_away")
            .execute(db.store.pool())
            .await
            .expect("rename");
        let first = g.process(&credit("CR-1", "CR-1", "u-1", 250, "M-1")).await;
        sqlx::query("ALTER TABLE wallet_ledger_away RENAME TO wallet_ledger")
            .execute(db.store.pool())
            .await
            .expect("rename back");
        assert_eq!(outcome(&first), (Outcome::Failed, None, Verdict::Retry), "{first:?}");
        assert_eq!(balance(&db, "u-1").await, 100, "the first statement's credit was rolled back");
        assert_eq!(db.scalar(&CLAIMS_OF, &["CR-1"]).await, 0, "the key stays unclaimed");
        let row = only_log_row(&db, "M-1").await;
        assert_eq!(row.outcome, "failed");
        let error = row.error.unwrap_or_default();
        assert!(error.starts_with("sql_handlers[0].statements[1] (\"wallet.credit\"): "), "{error}");
        assert!(error.contains("wallet_ledger"), "the database's own words: {error}");

        let mut retry = credit("CR-1", "CR-1", "u-1", 250, "M-1-retry");
        retry.uniq_key = "U-M-1".into();
        retry.reconsume_times = 1;
        assert_eq!(outcome(&g.process(&retry).await), (Outcome::Processed, None, Verdict::Ack));
        assert_eq!(balance(&db, "u-1").await, 350);
        assert_eq!(db.scalar(&LEDGER_ROWS, &["CR-1"]).await, 1);
        assert_eq!(db.scalar(&CLAIMS_OF, &["CR-1"]).await, 1);
    }

    pub async fn each_zero_row_mapping_and_a_statement_that_touches_too_many_rows(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100), ("vip-1", 0), ("vip-2", 0)]).await;
        for (code, state) in [("C-1", "NEW"), ("C-2", "USED")] {
            db.store
                .query(&ADD_COUPON)
                .bind(code)
                .bind(state)
                .execute(db.store.pool())
                .await
                .expect("coupon");
        }
        let g = wallet_gate(db.store.clone(), "a").await;

        // retry: the wallet is not there yet.
        let early = g.process(&credit("CR-E", "CR-E", "u-404", 5, "M-early")).await;
        assert_eq!(outcome(&early), (Outcome::Failed, None, Verdict::Retry));
        assert_eq!(
            early.error.as_deref(),
            Some("sql_handlers[0].statements[0] (\"wallet.credit\"): changed no row, expected one; retrying")
        );
        assert_eq!(db.scalar(&CLAIMS_OF, &["CR-E"]).await, 0);

        // dead_letter: not enough money, and never will be for this message.
        let body = serde_json::json!({ "user_id": "u-1", "cents": 500 });
        let d = message("debit", "DB-1", "M-debit", body);
        let debit = g.process(&d).await;
        assert_eq!(outcome(&debit), (Outcome::DeadLettered, None, Verdict::DeadLetter));
        let row = only_log_row(&db, "M-debit").await;
        assert_eq!(row.payload.as_deref(), Some(&d.body[..]), "the body is kept for replay");
        assert_eq!(balance(&db, "u-1").await, 100);
        let ok = message("debit", "DB-2", "M-debit-2", serde_json::json!({ "user_id": "u-1", "cents": 40 }));
        assert_eq!(g.process(&ok).await.outcome, Outcome::Processed);
        assert_eq!(balance(&db, "u-1").await, 60, ":cents used twice, bound twice");

        // duplicate: the coupon was used already; the claim commits, at layer business.
        let redeem = |code: &str, msg: &str| {
            let mut d = message("redeem", code, msg, serde_json::json!({}));
            d.properties.insert("USER".into(), "u-1".into());
            d
        };
        assert_eq!(
            outcome(&g.process(&redeem("C-1", "M-c1")).await),
            (Outcome::Processed, None, Verdict::Ack)
        );
        let row = db.store.query(&COUPON).bind("C-1").fetch_one(db.store.pool()).await.expect("coupon");
        assert_eq!(
            (row.get::<String, _>(0), row.get::<Option<String>, _>(1)),
            ("USED".into(), Some("u-1".into()))
        );
        let used = g.process(&redeem("C-2", "M-c2")).await;
        assert_eq!(outcome(&used), (Outcome::Duplicate, Some(Layer::Business), Verdict::Ack), "{used:?}");
        let row = only_log_row(&db, "M-c2").await;
        assert_eq!((row.outcome.as_str(), row.layer.as_deref()), ("duplicate", Some("business")));
        assert_eq!(
            row.error.as_deref(),
            Some(
                "sql_handlers[3].statements[0] (\"coupon.redeem\"): changed no row, expected one: the effect was applied before"
            )
        );
        assert_eq!(db.scalar(&CLAIMS_OF, &["C-2"]).await, 1, "the duplicate's claim commits");
        let row = db.store.query(&COUPON).bind("C-2").fetch_one(db.store.pool()).await.expect("coupon");
        assert_eq!(row.get::<Option<String>, _>(1), None, "nothing changed");

        // expect = "one" and two rows changed: refused for good, rolled back.
        let bonus = message("bonus", "B-1", "M-bonus", serde_json::json!({ "users": "vip-%", "cents": 7 }));
        let r = g.process(&bonus).await;
        assert_eq!(outcome(&r), (Outcome::DeadLettered, None, Verdict::DeadLetter));
        assert_eq!(
            r.error.as_deref(),
            Some(
                "sql_handlers[2].statements[0] (\"wallet.bonus\"): changed 2 rows, expected one; rolled back"
            )
        );
        assert_eq!((balance(&db, "vip-1").await, balance(&db, "vip-2").await), (0, 0));
        assert_eq!(db.scalar(&CLAIMS_OF, &["B-1"]).await, 0);
    }

    pub async fn a_business_unique_duplicate_keeps_the_claim_and_takes_back_the_credit(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100)]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        assert_eq!(g.process(&credit("K-1", "CR-U", "u-1", 250, "M-1")).await.outcome, Outcome::Processed);
        // The same credit under another message key: the claim does not stop it, the ledger's
        // unique key does, and the balance update before it is taken back.
        let again = g.process(&credit("K-2", "CR-U", "u-1", 250, "M-2")).await;
        assert_eq!(
            outcome(&again),
            (Outcome::Duplicate, Some(Layer::BusinessUnique), Verdict::Ack),
            "{again:?}"
        );
        let row = only_log_row(&db, "M-2").await;
        assert_eq!((row.outcome.as_str(), row.layer.as_deref()), ("duplicate", Some("business_unique")));
        let error = row.error.unwrap_or_default();
        assert!(
            error.starts_with(
                "sql_handlers[0].statements[1] (\"wallet.credit\"): a unique key already holds this row"
            ),
            "{error}"
        );
        assert_eq!(balance(&db, "u-1").await, 350, "credited once");
        assert_eq!(db.scalar(&LEDGER_ROWS, &["CR-U"]).await, 1);
        assert_eq!(db.scalar(&CLAIMS_OF, &["K-2"]).await, 1, "the duplicate's claim commits");
        // And the transaction went on: a later credit applies.
        assert_eq!(g.process(&credit("K-3", "CR-V", "u-1", 1, "M-3")).await.outcome, Outcome::Processed);
        assert_eq!(balance(&db, "u-1").await, 351);
    }

    /// A wallet event under message key `key`: event number `no` of credit `credit_id`.
    fn event(key: &str, no: i64, credit_id: &str, reference: &str, msg_id: &str) -> Delivery {
        let body = serde_json::json!({ "event_no": no, "credit_id": credit_id, "ref": reference });
        message("event", key, msg_id, body)
    }

    pub async fn only_a_named_business_unique_key_makes_a_duplicate_any_other_is_retried_then_dead_lettered(
        backend: Backend,
    ) {
        let db = wallet_db(backend, &[]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        let last = g.policy().max_reconsume_times;
        assert_eq!(g.process(&event("E-1", 1, "CR-1", "R-1", "M-1")).await.outcome, Outcome::Processed);

        // The credit again, under another message key: the named key, a duplicate.
        let again = g.process(&event("E-2", 2, "CR-1", "R-2", "M-2")).await;
        assert_eq!(
            outcome(&again),
            (Outcome::Duplicate, Some(Layer::BusinessUnique), Verdict::Ack),
            "{again:?}"
        );
        assert_eq!(db.scalar(&CLAIMS_OF, &["E-2"]).await, 1, "the duplicate's claim commits");

        // Another credit whose reference another row holds, and one whose event number another
        // row holds (the numbers handed out again after a restore): errors, not duplicates.
        for (key, no, reference, index) in [("E-3", 3, "R-1", "ref"), ("E-4", 1, "R-4", "primary key")] {
            let credit = format!("CR-{key}");
            let msg = format!("M-{key}");
            let first = g.process(&event(key, no, &credit, reference, &msg)).await;
            assert_eq!(outcome(&first), (Outcome::Failed, None, Verdict::Retry), "{index}: {first:?}");
            let error = first.error.clone().unwrap_or_default();
            assert!(
                error.starts_with("sql_handlers[4].statements[0] (\"wallet.event\"): "),
                "{index}: {error}"
            );
            assert!(
                error.ends_with("(a unique key not named in business_unique: an error, not a duplicate)"),
                "{error}"
            );
            let words = match (backend, index) {
                (Backend::Postgres, "ref") => {
                    "duplicate key value violates unique constraint \"wallet_event_ref\""
                }
                (Backend::Postgres, _) => {
                    "duplicate key value violates unique constraint \"wallet_event_pkey\""
                }
                (Backend::MySql, "ref") => "Duplicate entry 'R-1' for key 'wallet_event_ref'",
                (Backend::MySql, _) => "Duplicate entry '1' for key 'PRIMARY'",
                (Backend::Sqlite, "ref") => "UNIQUE constraint failed: wallet_event.ref",
                (Backend::Sqlite, _) => "UNIQUE constraint failed: wallet_event.event_no",
            };
            assert!(error.contains(words), "{index}: the database's own words {words:?} in {error}");
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 0, "{index}: the claim is not committed");

            let mut last_try = event(key, no, &credit, reference, &format!("{msg}-last"));
            last_try.reconsume_times = last;
            let dead = g.process(&last_try).await;
            // At the last attempt the broker moves the message to its DLQ when asked to retry.
            assert_eq!(outcome(&dead), (Outcome::DeadLettered, None, Verdict::Retry), "{index}: {dead:?}");
            let row = only_log_row(&db, &format!("{msg}-last")).await;
            assert_eq!(row.outcome, "dead_lettered");
            assert!(row.error.unwrap_or_default().contains(words), "{index}: the dead letter says why");
            assert_eq!(row.payload.as_deref(), Some(&last_try.body[..]), "the body is kept for replay");
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 0, "{index}: still unclaimed");
        }
        assert_eq!(db.scalar(&EVENTS, &[]).await, 1, "only the first event was written");
    }

    pub async fn a_missing_or_mistyped_parameter_is_invalid_with_its_name(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100)]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        let cases = [
            (
                serde_json::json!({ "credit_id": "c", "user_id": "u-1", "note": "" }),
                "sql_handlers[0] (\"wallet.credit\"): parameter cents: the body has no field /cents",
            ),
            (
                serde_json::json!({ "credit_id": "c", "user_id": "u-1", "cents": "12", "note": "" }),
                "sql_handlers[0] (\"wallet.credit\"): parameter cents: field /cents is \"12\", expected an integer",
            ),
            (
                serde_json::json!({ "credit_id": "c", "user_id": 7, "cents": 12, "note": "" }),
                "sql_handlers[0] (\"wallet.credit\"): parameter user: field /user_id is 7, expected a string",
            ),
        ];
        for (i, (body, expected)) in cases.into_iter().enumerate() {
            let msg = format!("M-{i}");
            let r = g.process(&message("credit", &format!("K-{i}"), &msg, body)).await;
            assert_eq!(outcome(&r), (Outcome::Invalid, None, Verdict::Ack));
            let row = only_log_row(&db, &msg).await;
            assert_eq!((row.outcome.as_str(), row.error.as_deref()), ("invalid", Some(expected)));
        }
        let mut no_user = message("redeem", "C-9", "M-prop", serde_json::json!({}));
        no_user.properties.clear();
        let r = g.process(&no_user).await;
        assert_eq!(r.outcome, Outcome::Invalid);
        assert_eq!(
            r.error.as_deref(),
            Some("sql_handlers[3] (\"coupon.redeem\"): parameter user: the message has no property USER")
        );
        assert_eq!(balance(&db, "u-1").await, 100);
        assert_eq!(db.scalar(&ALL_LEDGER_ROWS, &[]).await, 0);
    }

    pub async fn hostile_values_are_bound_never_executed(backend: Backend) {
        let hostile = "'; DROP TABLE wallet; --";
        let db = wallet_db(backend, &[(hostile, 0), ("u-1", 0)]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        let note = format!("it's \"quoted\" \\ :cents ? $1 {}", "x'\"".repeat(3_400));
        assert!(note.len() > 10_000);
        let body = serde_json::json!({ "credit_id": "CR-H1", "user_id": hostile, "cents": 5, "note": note });
        assert_eq!(g.process(&message("credit", "K-H1", "M-1", body)).await.outcome, Outcome::Processed);
        let body = serde_json::json!({ "credit_id": "x' OR '1'='1", "user_id": "u-1' OR '1'='1", "cents": 5, "note": "" });
        let r = g.process(&message("credit", "K-H2", "M-2", body)).await;
        assert_eq!(r.outcome, Outcome::Failed, "no wallet has that name: {r:?}");
        assert_eq!(db.scalar(&WALLETS, &[]).await, 2, "the wallet table is intact");
        assert_eq!(balance(&db, hostile).await, 5);
        assert_eq!(balance(&db, "u-1").await, 0);
        let row = db.store.query(&NOTE).bind("CR-H1").fetch_one(db.store.pool()).await.expect("ledger row");
        assert_eq!(row.get::<String, _>(0), note, "stored verbatim");
        assert_eq!(row.get::<String, _>(1), hostile);
    }

    pub async fn the_trace_page_shows_the_rows_and_the_reconciler_runs_the_checks(backend: Backend) {
        let db = wallet_db(backend, &[("u-1", 100), ("u-2", 0)]).await;
        let g = wallet_gate(db.store.clone(), "a").await;
        assert_eq!(g.process(&credit("CR-T", "CR-T", "u-1", 250, "M-T")).await.outcome, Outcome::Processed);
        let s = settings("a");
        let handlers = s.handlers_with(shop::handlers()).expect("handlers");
        let handler = handlers.get("wallet.credit").expect("configured");
        let facts = handler.describe(&db.store, "CR-T").await.expect("describe");
        let shown: Vec<(&str, &str)> = facts.iter().map(|f| (f.label.as_str(), f.value.as_str())).collect();
        assert_eq!(shown, [("user_id", "u-1"), ("cents", "250"), ("msg_id", "M-T")]);
        let none = handler.describe(&db.store, "CR-404").await.expect("describe");
        assert_eq!(none[0].value, "no rows for this bizId");

        sqlx::query("UPDATE wallet SET balance_cents = -3 WHERE user_id = 'u-2'")
            .execute(db.store.pool())
            .await
            .expect("a broken invariant");
        let checks = handlers.checks(&s.routes());
        let names: Vec<(&str, &str)> =
            checks.iter().map(|c| (c.name.as_ref(), c.biz_type.as_ref())).collect();
        assert!(names.contains(&("credit_once", "wallet.credit")), "{names:?}");
        let now = idemgate::clock::now_ms();
        let options = idemgate::reconcile::ReconcileOptions {
            consumer_group: GROUP.into(),
            biz_type: Some("wallet.credit".into()),
            since_ms: now - 3_600_000,
            until_ms: now + 1,
            stuck_after_ms: 600_000,
            log_retention_ms: 86_400_000,
            max_per_kind: 50,
            instance_id: "a".into(),
            started_by: "test".into(),
        };
        let report =
            idemgate::reconcile::reconcile_once(&db.store, &options, &checks, now).await.expect("a run");
        let found: Vec<(&str, &str)> =
            report.anomalies.iter().map(|a| (a.kind.as_str(), a.biz_id.as_str())).collect();
        assert_eq!(found, [("orphan", "u-2")], "{:?}", report.anomalies);
        assert_eq!(report.anomalies[0].detail, "breaks the invariant (no negative balance)");
    }

    pub async fn a_wrong_handler_is_refused_at_start_with_the_statement_named(backend: Backend) {
        let db = wallet_db(backend, &[]).await;
        let start = async |change: &dyn Fn(&mut Settings)| {
            let mut s = settings("a");
            s.database.url = db.url().to_owned();
            s.http.bind = "127.0.0.1:0".into();
            change(&mut s);
            // Refused where the service is assembled, with the program's handlers (the shop's).
            let handlers = match s.handlers_with(shop::handlers()) {
                Ok(handlers) => handlers,
                Err(e) => return format!("{e:#}"),
            };
            match Application::build_with(&s, handlers, Feed::Caller).await {
                Ok(_) => panic!("the service built"),
                Err(e) => format!("{e:#}"),
            }
        };
        let typo = start(&|s| {
            s.sql_handlers[0].statements[1].sql =
                s.sql_handlers[0].statements[1].sql.replace("wallet_ledger", "walet_ledger")
        })
        .await;
        assert!(
            typo.contains("handler \"wallet.credit\": sql_handlers[0].statements[1] (\"wallet.credit\"): the database refused the statement"),
            "{typo}"
        );
        assert!(typo.contains("walet_ledger"), "the database's message: {typo}");
        let column = start(&|s| {
            s.sql_handlers[3].statements[0].sql =
                s.sql_handlers[3].statements[0].sql.replace("used_by", "usedby")
        })
        .await;
        assert!(column.contains("sql_handlers[3].statements[0] (\"coupon.redeem\")"), "{column}");
        assert!(column.contains("usedby"), "{column}");
        let describe = start(&|s| {
            s.sql_handlers[0].describe =
                Some("SELECT nope FROM wallet_ledger WHERE credit_id = :biz_id".into())
        })
        .await;
        assert!(describe.contains("sql_handlers[0].describe (\"wallet.credit\")"), "{describe}");

        let unknown_key =
            start(&|s| s.sql_handlers[4].business_unique = vec!["wallet_event_pkey_typo".into()]).await;
        assert!(
            unknown_key.contains(
                "sql_handlers[4].business_unique[0] (\"wallet.event\"): the database has no unique constraint or index \"wallet_event_pkey_typo\""
            ),
            "{unknown_key}"
        );
        assert!(
            unknown_key.contains("wallet_event_credit on wallet_event(credit_id)")
                && unknown_key.contains("wallet_event_ref on wallet_event(ref)"),
            "what the table has: {unknown_key}"
        );
        let wrong_columns =
            start(&|s| s.sql_handlers[0].business_unique = vec!["wallet_ledger(user_id)".into()]).await;
        assert!(
            wrong_columns.contains("sql_handlers[0].business_unique[0] (\"wallet.credit\"): the database has no unique constraint or index wallet_ledger(user_id)"),
            "{wrong_columns}"
        );
        let malformed = start(&|s| s.sql_handlers[4].business_unique = vec!["wallet_event(".into()]).await;
        assert!(
            malformed.contains(
                "configuration key sql_handlers[4].business_unique[0]: \"wallet_event(\" is neither"
            ),
            "{malformed}"
        );

        let undefined = start(&|s| s.sql_handlers[1].statements[0].sql.push_str(" AND :limit > 0")).await;
        assert!(
            undefined.contains(
                "configuration key sql_handlers[1].statements[0].sql: uses :limit, which is not a parameter"
            ),
            "{undefined}"
        );
        let not_dml = start(&|s| s.sql_handlers[1].statements[0].sql = "TRUNCATE wallet".into()).await;
        assert!(
            not_dml.contains("configuration key sql_handlers[1].statements[0].sql: is a TRUNCATE statement; only INSERT, UPDATE, DELETE is allowed here"),
            "{not_dml}"
        );
        let shadow = start(&|s| {
            s.sql_handlers[1].name = "stock.deduct".into();
        })
        .await;
        assert!(
            shadow.contains("configuration key sql_handlers[1].name: \"stock.deduct\" is already the name of a built-in handler"),
            "{shadow}"
        );
    }
}

on_every_backend!(
    sixteen_concurrent_credits_of_one_key_apply_once,
    a_failing_second_statement_takes_back_the_first_and_the_claim,
    each_zero_row_mapping_and_a_statement_that_touches_too_many_rows,
    a_business_unique_duplicate_keeps_the_claim_and_takes_back_the_credit,
    only_a_named_business_unique_key_makes_a_duplicate_any_other_is_retried_then_dead_lettered,
    a_missing_or_mistyped_parameter_is_invalid_with_its_name,
    hostile_values_are_bound_never_executed,
    the_trace_page_shows_the_rows_and_the_reconciler_runs_the_checks,
    a_wrong_handler_is_refused_at_start_with_the_statement_named,
);

on_every_backend_with_group_commit!(
    sixteen_concurrent_credits_of_one_key_apply_once,
    a_failing_second_statement_takes_back_the_first_and_the_claim,
    each_zero_row_mapping_and_a_statement_that_touches_too_many_rows,
    a_business_unique_duplicate_keeps_the_claim_and_takes_back_the_credit,
    only_a_named_business_unique_key_makes_a_duplicate_any_other_is_retried_then_dead_lettered,
);
