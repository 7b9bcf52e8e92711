//! Whether a dead letter's body was cut at the size limit is a flag of its log row
//! (`payload_truncated`), and replay decides from that flag alone: a handler error that happens
//! to read like the log's own note does not make a good dead letter unreplayable, and a body
//! that really was cut is never re-published. Rows logged before the flag existed get it from
//! their note, once, when the database is migrated.

use async_trait::async_trait;
use idemgate::clock::now_ms;
use idemgate::delivery::Delivery;
use idemgate::delivery_log::MAX_KEPT_PAYLOAD;
use idemgate::gate::Gate;
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::outcome::{Outcome, Verdict};
use idemgate::replay::{self, Action, Line, Selection};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, Sql, Store};
use sqlx::Row;

use super::support::{TestDb, gate, identity};

const GROUP: &str = "catalogue-service";
const TOPIC: &str = "catalogue";

/// Refuses every delivery for good, quoting the start of its body in the error, as handlers
/// that report what they could not parse do.
struct QuotesTheBody;

#[async_trait]
impl Handler for QuotesTheBody {
    async fn handle(&self, work: &Work<'_>, _conn: &mut Conn) -> Result<Effect, HandlerError> {
        let body = &work.delivery.body;
        let start = String::from_utf8_lossy(&body[..body.len().min(12)]);
        Err(HandlerError::Permanent(format!("unknown sku [body of {start}")))
    }
}

fn catalogue_gate(store: &Store) -> Gate {
    let route = RouteConfig {
        topic: TOPIC.into(),
        tags: "*".into(),
        biz_type: "catalogue.update".into(),
        biz_id: "keys".into(),
        execute_time: None,
        handler: Some("test.quotes".into()),
    };
    let handlers = Handlers::new().with("test.quotes", QuotesTheBody);
    gate(store.clone(), identity(GROUP, "a"), vec![route], handlers)
}

fn update(key: &str, msg_id: &str, body: Vec<u8>) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: "update".into(),
        keys: vec![key.into()],
        body,
        ..Default::default()
    }
}

/// A dry run of the replay of `key`'s latest dead letter.
async fn dry_replay(store: &Store, gate: &Gate, key: &str) -> Line {
    let selection = Selection::Key { biz_id: key.into(), biz_type: None, execute_time: None };
    let mut lines = replay::replay(store, gate.routes(), GROUP, &selection, None).await.expect("replay");
    assert_eq!(lines.len(), 1, "{key}: {lines:?}");
    lines.remove(0)
}

static LOGGED: Sql = Sql::new("SELECT payload_truncated, payload, error FROM delivery_log WHERE msg_id = ?");

/// The row of `msg_id`: its flag, how many body bytes it kept, its error.
async fn logged(store: &Store, msg_id: &str) -> (i16, usize, String) {
    let r = store.query(&LOGGED).bind(msg_id).fetch_one(store.pool()).await.expect("the row");
    let payload: Option<Vec<u8>> = r.get(1);
    (r.get(0), payload.map_or(0, |p| p.len()), r.get(2))
}

/// A row as the log wrote it before `payload_truncated` existed.
static OLD_ROW: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, error, latency_us, payload) \
     VALUES (?, 'old', ?, ?, '', ?, 'update', 0, 0, 0, 'catalogue.update', ?, 0, 'dead_lettered', ?, 900, ?)",
);

mod cases {
    use super::*;

    pub async fn a_dead_letter_whose_error_quotes_its_body_is_replayable_and_a_cut_body_is_not(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let g = catalogue_gate(store);

        let quoted = g.process(&update("SKU-9", "M-1", br#"{"sku":"x"}"#.to_vec())).await;
        assert_eq!((quoted.outcome, quoted.verdict), (Outcome::DeadLettered, Verdict::DeadLetter));
        let (flag, kept, error) = logged(store, "M-1").await;
        assert_eq!((flag, kept), (0, 11));
        assert_eq!(error, r#"unknown sku [body of {"sku":"x"}"#);
        assert_eq!(dry_replay(store, &g, "SKU-9").await.action, Action::WouldSend);

        let mut huge = br#"{"sku":"x","blob":""#.to_vec();
        huge.resize(MAX_KEPT_PAYLOAD + 1, b'a');
        let cut = g.process(&update("SKU-10", "M-2", huge)).await;
        assert_eq!(cut.outcome, Outcome::DeadLettered);
        let (flag, kept, error) = logged(store, "M-2").await;
        assert_eq!((flag, kept), (1, MAX_KEPT_PAYLOAD));
        assert!(
            error.ends_with(&format!("[body of {} bytes cut to {MAX_KEPT_PAYLOAD}]", MAX_KEPT_PAYLOAD + 1))
        );
        let line = dry_replay(store, &g, "SKU-10").await;
        assert_eq!(line.action, Action::RefusedBodyCut);
        assert!(line.action.describe(TOPIC, true).contains("was cut"), "{line:?}");
    }

    pub async fn rows_logged_before_the_flag_are_marked_cut_from_the_logs_own_note_when_migrated(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let g = catalogue_gate(store);
        // The database as it was before migration 0007.
        for undo in [
            "ALTER TABLE delivery_log DROP COLUMN payload_truncated",
            "DELETE FROM _sqlx_migrations WHERE version = 7",
        ] {
            sqlx::query(undo).execute(store.pool()).await.expect(undo);
        }
        let cut_note = format!(" [body of {} bytes cut to {MAX_KEPT_PAYLOAD}]", MAX_KEPT_PAYLOAD + 10);
        for (key, msg_id, error, body) in [
            ("SKU-CUT", "M-CUT", format!("unknown sku{cut_note}"), vec![b'a'; MAX_KEPT_PAYLOAD]),
            ("SKU-QUOTED", "M-QUOTED", r#"unknown sku [body of {"sku":"x"}"#.to_owned(), b"{}".to_vec()),
            // The note's words, but not at the end of the error: a handler's, not the log's.
            ("SKU-WORDS", "M-WORDS", format!("{cut_note} said the handler"), b"{}".to_vec()),
        ] {
            store
                .query(&OLD_ROW)
                .bind(now_ms())
                .bind(GROUP)
                .bind(msg_id)
                .bind(TOPIC)
                .bind(key)
                .bind(error)
                .bind(body)
                .execute(store.pool())
                .await
                .expect("an old row");
        }
        store.migrate().await.expect("migration 0007 again");

        assert_eq!(logged(store, "M-CUT").await.0, 1);
        assert_eq!(logged(store, "M-QUOTED").await.0, 0);
        assert_eq!(logged(store, "M-WORDS").await.0, 0);
        assert_eq!(dry_replay(store, &g, "SKU-CUT").await.action, Action::RefusedBodyCut);
        assert_eq!(dry_replay(store, &g, "SKU-QUOTED").await.action, Action::WouldSend);
        assert_eq!(dry_replay(store, &g, "SKU-WORDS").await.action, Action::WouldSend);
    }
}

on_every_backend!(
    a_dead_letter_whose_error_quotes_its_body_is_replayable_and_a_cut_body_is_not,
    rows_logged_before_the_flag_are_marked_cut_from_the_logs_own_note_when_migrated,
);

// The group commit writes its log rows in one multi-row insert: the flag goes through it too.
on_every_backend_with_group_commit!(
    a_dead_letter_whose_error_quotes_its_body_is_replayable_and_a_cut_body_is_not
);
