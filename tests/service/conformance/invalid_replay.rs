//! A delivery refused as invalid keeps its body and is replayed once the route that refused
//! it is fixed, through the guards of dead letters: a body cut at the size limit, a topic no
//! route covers, a key claimed since (a producer's resend applied it) are refused, and so is a
//! message the routes, as they are now, still cannot read a key from. Each key is replayed
//! once, into exactly one effect, with cause `replay`; no broker is needed to see it, since a
//! stand-in hands what replay publishes to the gate.

use async_trait::async_trait;
use idemgate::clock::now_ms;
use idemgate::delivery::Delivery;
use idemgate::delivery_log::MAX_KEPT_PAYLOAD;
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::outcome::Outcome;
use idemgate::replay::{self, Action, Line, Selection};
use idemgate::route::{RouteConfig, Routes};
use idemgate::store::{Backend, Conn, Sql, query};

use super::support::{TestDb, ToTheGate, gate, identity};

const GROUP: &str = "ledger-service";
const TOPIC: &str = "ledger";

/// Writes one ledger row per entry: the effect, counted.
struct Books;

static BOOK: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'BOOKS', 1, 0)",
);
static BOOKED: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");
static CAUSES_OF: Sql = Sql::new(
    "SELECT COUNT(*) FROM delivery_log WHERE biz_id = ? AND outcome = 'processed' AND cause = 'replay'",
);

#[async_trait]
impl Handler for Books {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        query(work.backend, &BOOK).bind(work.key.biz_id.as_str()).execute(&mut *conn).await?;
        Ok(Effect::Applied)
    }
}

/// The ledger's route, reading the entry's id from `biz_id`; only tag `entry` is covered.
fn route(biz_id: &str) -> RouteConfig {
    RouteConfig {
        topic: TOPIC.into(),
        tags: "entry".into(),
        biz_type: "ledger.entry".into(),
        biz_id: biz_id.into(),
        execute_time: None,
        handler: Some("test.books".into()),
    }
}

/// An entry as the producers send it: the id in the body, no property.
fn entry(id: &str, msg_id: &str, tags: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: tags.into(),
        body: serde_json::json!({ "id": id }).to_string().into_bytes(),
        ..Default::default()
    }
}

/// Each line's msgId and action, by msgId.
fn by_msg_id(lines: &[Line]) -> Vec<(String, Action)> {
    let mut out: Vec<_> = lines.iter().map(|l| (l.dead_letter_msg_id.clone(), l.action.clone())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

mod cases {
    use super::*;

    pub async fn an_invalid_delivery_is_replayed_after_its_route_is_fixed_through_every_guard(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let books = || Handlers::new().with("test.books", Books);
        // The release that reads the id from a property the producers never set.
        let broken = gate(store.clone(), identity(GROUP, "a"), vec![route("property:ENTRY")], books());
        let mut huge = br#"{"id":"E-3","blob":""#.to_vec();
        huge.resize(MAX_KEPT_PAYLOAD + 1, b'a');
        for d in [
            entry("E-1", "M-1", "entry"),
            entry("E-2", "M-2", "entry"),
            Delivery { body: huge, ..entry("E-3", "M-CUT", "entry") },
            entry("E-4", "M-NO-ROUTE", "refund"),
        ] {
            let r = broken.process(&d).await;
            assert_eq!((r.outcome, r.logged), (Outcome::Invalid, true), "{}: {r:?}", d.msg_id);
        }
        let since = Selection::InvalidSince(now_ms() - 60_000);
        let no_property = "biz_id: the message has no property ENTRY".to_owned();

        // Sent again to the same release, each would be refused again: nothing is sent.
        let lines = replay::replay(store, broken.routes(), GROUP, &since, None).await.unwrap();
        assert_eq!(
            by_msg_id(&lines),
            [
                ("M-1".to_owned(), Action::RefusedStillInvalid { reason: no_property.clone() }),
                ("M-2".to_owned(), Action::RefusedStillInvalid { reason: no_property }),
                ("M-CUT".to_owned(), Action::RefusedBodyCut),
                ("M-NO-ROUTE".to_owned(), Action::RefusedNoRoute),
            ]
        );
        assert!(lines.iter().all(|l| l.outcome == "invalid" && l.action.is_refusal()), "{lines:?}");

        // The fixed release reads the id from the body. A producer resend of E-2 reaches it
        // before the replay does.
        let fixed = gate(store.clone(), identity(GROUP, "b"), vec![route("json:/id")], books());
        let fixed_routes = Routes::new(&[route("json:/id")]).unwrap();
        assert_eq!(fixed.process(&entry("E-2", "M-2-resent", "entry")).await.outcome, Outcome::Processed);
        let dry = replay::replay(store, &fixed_routes, GROUP, &since, None).await.unwrap();
        let keys: Vec<_> = dry.iter().map(|l| (l.dead_letter_msg_id.as_str(), l.biz_id.as_str())).collect();
        assert!(keys.contains(&("M-1", "E-1")) && keys.contains(&("M-2", "E-2")), "read again: {keys:?}");
        let to_the_gate = ToTheGate { gate: &fixed };
        let lines = replay::replay(store, &fixed_routes, GROUP, &since, Some(&to_the_gate)).await.unwrap();
        let actions = by_msg_id(&lines);
        assert!(matches!(&actions[0], (m, Action::Sent { uniq_key }) if m == "M-1" && uniq_key == "R-M-1"));
        assert!(
            matches!(&actions[1], (m, Action::RefusedClaimed { msg_id, .. }) if m == "M-2" && msg_id == "M-2-resent"),
            "{actions:?}"
        );
        assert_eq!(actions[2].1, Action::RefusedBodyCut);
        assert_eq!(actions[3].1, Action::RefusedNoRoute);
        for id in ["E-1", "E-2"] {
            assert_eq!(db.scalar(&BOOKED, &[id]).await, 1, "{id} booked once");
        }
        assert_eq!(db.scalar(&CAUSES_OF, &["E-1"]).await, 1, "E-1 applied by the replay");

        // By msgId, once more: applied now, so refused.
        let again = Selection::Message { msg_id: "M-1".to_owned() };
        let lines = replay::replay(store, &fixed_routes, GROUP, &again, Some(&to_the_gate)).await.unwrap();
        assert!(matches!(&lines[..], [l] if matches!(l.action, Action::RefusedClaimed { .. })), "{lines:?}");
        assert_eq!(db.scalar(&BOOKED, &["E-1"]).await, 1);
    }

    /// The refusing release read the id from a property the producers never set; the fixed
    /// one reads it from the KEYS and the scheduled time from a user property, neither of which
    /// a key rebuilt from the log would carry. The replay sends the message with the KEYS and
    /// user properties it was delivered with, and without the broker's own properties.
    pub async fn an_invalid_delivery_is_replayed_with_the_keys_and_properties_it_was_delivered_with(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let books = || Handlers::new().with("test.books", Books);
        let broken = gate(store.clone(), identity(GROUP, "a"), vec![route("property:ENTRY")], books());
        let delivered = Delivery {
            keys: vec!["E-K".to_owned()],
            properties: [("AT", "1700000000000"), ("TENANT", "acme")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            body: b"{}".to_vec(),
            ..entry("", "M-K", "entry")
        };
        assert_eq!(broken.process(&delivered).await.outcome, Outcome::Invalid);

        let fixed_route = RouteConfig { execute_time: Some("property:AT".into()), ..route("keys") };
        let fixed = gate(store.clone(), identity(GROUP, "b"), vec![fixed_route.clone()], books());
        let fixed_routes = Routes::new(&[fixed_route]).unwrap();
        let seen = Recording { to: ToTheGate { gate: &fixed }, sent: Default::default() };
        let by_message = Selection::Message { msg_id: "M-K".to_owned() };
        let lines = replay::replay(store, &fixed_routes, GROUP, &by_message, Some(&seen)).await.unwrap();
        assert!(matches!(&lines[..], [l] if matches!(l.action, Action::Sent { .. })), "{lines:?}");
        assert_eq!((lines[0].biz_id.as_str(), lines[0].execute_time), ("E-K", 1_700_000_000_000));
        assert_eq!(db.scalar(&BOOKED, &["E-K"]).await, 1, "E-K booked once");
        let sent = seen.sent.lock().unwrap().clone();
        let [message] = &sent[..] else { panic!("one message sent: {sent:?}") };
        assert_eq!(message.keys, ["E-K"]);
        let names: Vec<_> = message.properties.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["AT", "IDEMGATE_REPLAY_OF", "TENANT"],
            "its properties as delivered, and the replay mark"
        );
    }
}

/// A stand-in broker that also keeps what it was handed.
struct Recording<'a> {
    to: ToTheGate<'a>,
    sent: std::sync::Mutex<Vec<Delivery>>,
}

#[async_trait]
impl replay::Publish for Recording<'_> {
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String> {
        self.sent.lock().unwrap().push(message.clone());
        self.to.publish(message).await
    }
}

on_every_backend!(
    an_invalid_delivery_is_replayed_after_its_route_is_fixed_through_every_guard,
    an_invalid_delivery_is_replayed_with_the_keys_and_properties_it_was_delivered_with
);
on_every_backend_with_group_commit!(
    an_invalid_delivery_is_replayed_after_its_route_is_fixed_through_every_guard,
    an_invalid_delivery_is_replayed_with_the_keys_and_properties_it_was_delivered_with
);
