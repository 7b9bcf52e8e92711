//! A business key is stored, found and replayed exactly as it was written, in any script: the
//! claim, the delivery log, the reconciler's findings and replay's selection all hold the same
//! bytes. Thai keys carry vowel signs and tone marks, Devanagari and Bengali keys the virama of
//! their conjuncts, Tamil keys the pulli, a Persian key a zero-width non-joiner inside a word
//! (and the same word without it is another key, on MariaDB too), a Han key a character outside
//! the Basic Multilingual Plane (four bytes in UTF-8, `utf8mb4` on MariaDB), Hebrew and Arabic
//! keys run right to left. A key the rules refuse (an emoji, a space) is logged `invalid` with
//! its reason and found by its own text; one they refused before they took in its script is
//! replayed by its key or its msgId. The msgId and UNIQ_KEY are held exactly as delivered too.

use idemgate::clock::now_ms;
use idemgate::delivery::Delivery;
use idemgate::inspect::trace::{Answer, FinalState, SearchBy, Story, TraceContext, TraceQuery, trace};
use idemgate::outcome::{DuplicateCause, Outcome};
use idemgate::reconcile::{AnomalyKind, ReconcileOptions, reconcile_once, runs};
use idemgate::replay::{self, Action, Selection};
use idemgate::store::{Sql, Store};
use idemgate_shop::STOCK_LEDGER_CHECK;

use super::support::{TestDb, ToTheGate, gate, identity, stock_deduct};

const GROUP: &str = "stock-service";

/// Valid keys in every script named above, each with digits of its own script where it has
/// them; the Persian word twice, with and without its non-joiner.
const KEYS: [&str; 14] = [
    "สีดำ-ดี-๑๒",
    "สั่ง-1",
    "आदेश-कु-१२",
    "क्ष-1",
    "श्री-42",
    "স্কুল-৭",
    "தமிழ்-௧௨",
    "می\u{200c}خواهم-۱۲",
    "میخواهم-۱۲",
    "주문-한글-9",
    "订单-𠮷-7",
    "הזמנה-42",
    "שָׁלוֹם-1",
    "طلب-مُحَمَّد-١٢٣",
];

static CLAIMED_BIZ_ID: Sql = Sql::new("SELECT biz_id FROM idempotent_record_all WHERE msg_id = ?");
static LOGGED_BIZ_ID: Sql = Sql::new("SELECT biz_id FROM delivery_log WHERE msg_id = ?");

async fn text_of(store: &Store, sql: &'static Sql, msg_id: &str) -> String {
    use sqlx::Row;
    let row = store.query(sql).bind(msg_id).fetch_one(store.pool()).await.expect("one row");
    row.get(0)
}

/// The trace of `text` searched as a bizId, which must be exactly one key's story.
async fn story_of(store: &Store, text: &str) -> Story {
    let q = TraceQuery::new(text, SearchBy::BizId, None, None, None).expect("a searchable text");
    match trace(store, &TraceContext::default(), &q).await.expect("trace") {
        Answer::Story { story, .. } => *story,
        other => panic!("{text:?}: expected one key's story, got {other:?}"),
    }
}

fn window(since_ms: i64) -> ReconcileOptions {
    ReconcileOptions {
        consumer_group: GROUP.to_owned(),
        biz_type: None,
        since_ms,
        until_ms: now_ms() + 1,
        stuck_after_ms: 1_800_000,
        log_retention_ms: 14 * 86_400_000,
        max_per_kind: 100,
        instance_id: "test".to_owned(),
        started_by: "command".to_owned(),
    }
}

mod cases {
    use super::*;

    pub async fn keys_in_every_script_are_claimed_logged_traced_reconciled_and_replayed_as_written(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        idemgate_shop::seed_stock(store, "SKU-U", 1_000).await.unwrap();
        let g = gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::handler::Handlers::new());
        let started = now_ms() - 1_000;

        // Every key at once (with group commit, in shared groups), then a redelivery of each.
        let firsts = KEYS.iter().enumerate().map(|(i, key)| {
            let d = stock_deduct(key, &format!("M-{i}"), &format!("U-{i}"), "SKU-U", 1);
            let g = &g;
            async move { g.process(&d).await }
        });
        for (key, r) in KEYS.iter().zip(futures_util::future::join_all(firsts).await) {
            assert_eq!((r.outcome, r.logged), (Outcome::Processed, true), "{key}: {r:?}");
        }
        let copies = KEYS.iter().enumerate().map(|(i, key)| {
            // A retry copy: its own msgId, naming the stored copy it retries.
            let d = Delivery {
                stored_copy: format!("M-{i}"),
                ..stock_deduct(key, &format!("M-{i}-again"), &format!("U-{i}"), "SKU-U", 1)
            };
            let g = &g;
            async move { g.process(&d).await }
        });
        for (key, r) in KEYS.iter().zip(futures_util::future::join_all(copies).await) {
            assert_eq!((r.outcome, r.cause), (Outcome::Duplicate, Some(DuplicateCause::Redelivery)), "{key}");
        }

        for (i, key) in KEYS.iter().enumerate() {
            let m = format!("M-{i}");
            assert_eq!(text_of(store, &CLAIMED_BIZ_ID, &m).await, *key, "the claim holds the key as written");
            assert_eq!(text_of(store, &LOGGED_BIZ_ID, &m).await, *key, "the processed row holds it too");
            let again = format!("M-{i}-again");
            assert_eq!(text_of(store, &LOGGED_BIZ_ID, &again).await, *key, "and the duplicate's row");

            let story = story_of(store, key).await;
            assert_eq!(story.key.biz_id, *key);
            assert_eq!(
                story.claim.as_ref().map(|c| (c.state, c.msg_id.as_str())),
                Some(("live", m.as_str()))
            );
            let outcomes: Vec<_> = story.deliveries.iter().map(|d| d.outcome.as_str()).collect();
            assert_eq!(outcomes, ["processed", "duplicate"], "{key}");
            assert_eq!(story.summary.final_state, FinalState::Applied, "{key}");
        }
        let clean = reconcile_once(store, &window(started), &[STOCK_LEDGER_CHECK], now_ms()).await.unwrap();
        assert!(clean.is_clean(), "{:#?}", clean.anomalies);

        // Each script's key dead-lettered (more stock asked than there is): lost until replayed,
        // and replay selects it by its exact text.
        let dead: Vec<String> = KEYS.iter().map(|k| format!("{k}:9")).collect();
        for (i, key) in dead.iter().enumerate() {
            let r = g.process(&stock_deduct(key, &format!("D-{i}"), &format!("V-{i}"), "SKU-U", 5_000)).await;
            assert_eq!(r.outcome, Outcome::DeadLettered, "{key}: {r:?}");
            assert_eq!(text_of(store, &LOGGED_BIZ_ID, &format!("D-{i}")).await, *key);
        }
        let report = reconcile_once(store, &window(started), &[STOCK_LEDGER_CHECK], now_ms()).await.unwrap();
        let mut lost: Vec<(AnomalyKind, String)> =
            report.anomalies.iter().map(|a| (a.kind, a.biz_id.clone())).collect();
        lost.sort();
        let mut expected: Vec<(AnomalyKind, String)> =
            dead.iter().map(|k| (AnomalyKind::Lost, k.clone())).collect();
        expected.sort();
        assert_eq!(lost, expected, "only the dead letters, by their own keys: {:#?}", report.anomalies);
        let mut stored: Vec<String> = runs::anomalies(store, report.run_id, None, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.biz_id)
            .collect();
        stored.sort();
        assert_eq!(stored, expected.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>());

        for key in &dead {
            let selection = Selection::Key { biz_id: key.clone(), biz_type: None, execute_time: None };
            let lines = replay::replay(store, g.routes(), GROUP, &selection, None).await.unwrap();
            let got: Vec<_> = lines.iter().map(|l| (l.biz_id.as_str(), &l.action)).collect();
            assert_eq!(got, [(key.as_str(), &Action::WouldSend)], "{key}");
        }
    }

    pub async fn a_key_the_rules_refuse_is_logged_invalid_with_its_reason_and_found_by_its_text(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let g = gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::handler::Handlers::new());
        for (key, msg_id, reason) in [
            ("ORDER-😀", "M-EMOJI", "forbidden character 😀 (U+1F600) at position 7"),
            ("สั่ง 1", "M-SPACE", "forbidden character   (U+0020) at position 5"),
        ] {
            let r = g.process(&stock_deduct(key, msg_id, "U-1", "SKU-U", 1)).await;
            assert_eq!((r.outcome, r.logged), (Outcome::Invalid, true), "{key}: {r:?}");
            assert!(r.error.as_deref().unwrap_or_default().contains(reason), "{key}: {r:?}");
            // Nothing in the key needs escaping to be stored safely, so the row holds it as sent.
            assert_eq!(text_of(store, &LOGGED_BIZ_ID, msg_id).await, key);

            let story = story_of(store, key).await;
            assert_eq!(story.summary.final_state, FinalState::Invalid, "{key}");
            assert!(story.claim.is_none());
            let [row] = &story.deliveries[..] else { panic!("{key}: {:?}", story.deliveries) };
            assert_eq!((row.outcome.as_str(), row.msg_id.as_str()), ("invalid", msg_id));
            assert!(row.error.as_deref().unwrap_or_default().contains(reason), "{row:?}");

            // Kept, and refused again while the rule refuses it: replay sends nothing.
            let selection = Selection::Message { msg_id: msg_id.to_owned() };
            let lines = replay::replay(store, g.routes(), GROUP, &selection, None).await.unwrap();
            let [line] = &lines[..] else { panic!("{key}: {lines:?}") };
            assert_eq!(line.outcome, "invalid");
            assert!(
                matches!(&line.action, Action::RefusedStillInvalid { reason: why } if why.contains(reason)),
                "{key}: {line:?}"
            );
        }
    }

    /// Deliveries the rule refused before it took in their scripts, as the log kept them then
    /// (the Persian key escaped, `\u{200c}` for its non-joiner), are found by their keys as
    /// written now and by their msgIds, and replayed into exactly one effect each.
    pub async fn keys_refused_before_the_rule_took_in_their_script_are_replayed_into_one_effect(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        idemgate_shop::seed_stock(store, "SKU-R", 100).await.unwrap();
        let g = gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::handler::Handlers::new());
        let refused = [
            ("क्ष-1", "क्ष-1", "M-DEVA", "forbidden character \u{94d} (U+094D) at position 2"),
            ("สั่ง-1", "สั่ง-1", "M-THAI", "forbidden character \u{e48} (U+0E48) at position 3"),
            ("தமிழ்-1", "தமிழ்-1", "M-TAMIL", "forbidden character \u{bcd} (U+0BCD) at position 5"),
            ("می\u{200c}خواهم-1", "می\\u{200c}خواهم-1", "M-FA", "forbidden character \u{200c} (U+200C)"),
        ];
        for (_, logged, msg_id, reason) in refused {
            let body = serde_json::json!({"sku": "SKU-R", "quantity": 1}).to_string();
            store
                .query(&OLD_INVALID_ROW)
                .bind(now_ms())
                .bind(GROUP)
                .bind(msg_id)
                .bind(format!("U-{msg_id}"))
                .bind(idemgate_shop::TOPIC)
                .bind(idemgate_shop::TAG_STOCK_DEDUCT)
                .bind(logged)
                .bind(format!("biz_id from the message KEYS: has a {reason}"))
                .bind(body.into_bytes())
                .execute(store.pool())
                .await
                .expect("a row as the log wrote it");
        }
        let to_the_gate = ToTheGate { gate: &g };

        // By key, as written now: the Thai and Devanagari ones.
        for (key, _, msg_id, _) in &refused[..2] {
            let selection = Selection::Key { biz_id: (*key).to_owned(), biz_type: None, execute_time: None };
            let dry = replay::replay(store, g.routes(), GROUP, &selection, None).await.unwrap();
            let got: Vec<_> =
                dry.iter().map(|l| (l.biz_id.as_str(), l.dead_letter_msg_id.as_str(), &l.action)).collect();
            assert_eq!(got, [(*key, *msg_id, &Action::WouldSend)], "{key}");
            let sent =
                replay::replay(store, g.routes(), GROUP, &selection, Some(&to_the_gate)).await.unwrap();
            assert!(matches!(sent[0].action, Action::Sent { .. }), "{key}: {sent:?}");
        }
        // By msgId: the Tamil one; the Persian one by its key, which the log holds escaped.
        let by_msg_id = Selection::Message { msg_id: "M-TAMIL".to_owned() };
        let sent = replay::replay(store, g.routes(), GROUP, &by_msg_id, Some(&to_the_gate)).await.unwrap();
        assert_eq!(sent.iter().map(|l| l.biz_id.as_str()).collect::<Vec<_>>(), ["தமிழ்-1"]);
        let persian = Selection::Key { biz_id: refused[3].0.to_owned(), biz_type: None, execute_time: None };
        let sent = replay::replay(store, g.routes(), GROUP, &persian, Some(&to_the_gate)).await.unwrap();
        assert_eq!(sent.iter().map(|l| l.biz_id.as_str()).collect::<Vec<_>>(), [refused[3].0]);
        assert!(matches!(sent[0].action, Action::Sent { .. }), "{sent:?}");

        for (key, _, msg_id, _) in refused {
            let replayed_as = format!("R-{msg_id}");
            assert_eq!(text_of(store, &CLAIMED_BIZ_ID, &replayed_as).await, key, "claimed as written");
            let story = story_of(store, key).await;
            assert_eq!(story.summary.final_state, FinalState::Applied, "{key}");
            let replayed: Vec<_> =
                story.deliveries.iter().map(|d| (d.outcome.as_str(), d.cause.as_deref())).collect();
            assert!(replayed.contains(&("processed", Some("replay"))), "{key}: {replayed:?}");
        }
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-R"]).await, 96, "four deductions, each once");

        // Everything refused in the last hour, again: each key is claimed now.
        let again = Selection::InvalidSince(now_ms() - 3_600_000);
        let lines = replay::replay(store, g.routes(), GROUP, &again, Some(&to_the_gate)).await.unwrap();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines.iter().all(|l| matches!(l.action, Action::RefusedClaimed { .. })), "{lines:?}");
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-R"]).await, 96);
    }

    /// A msgId and UNIQ_KEY with quotes, a backslash and non-Latin letters are held by the log
    /// as by the claim: the trace finds the key by either, and the reconciler sees the claim's
    /// delivery (no orphan).
    pub async fn odd_msg_ids_and_uniq_keys_are_logged_as_claimed_traced_and_reconciled(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        idemgate_shop::seed_stock(store, "SKU-O", 100).await.unwrap();
        let g = gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::handler::Handlers::new());
        let started = now_ms() - 1_000;
        let (msg_id, uniq_key) = ("7F00'01\\注文\"x", "U-'ユニーク'\\ключ");
        let r = g.process(&stock_deduct("ODD-1", msg_id, uniq_key, "SKU-O", 1)).await;
        assert_eq!(r.outcome, Outcome::Processed, "{r:?}");
        // A retry copy of it, naming its odd msgId as the stored copy it retries.
        let retry = Delivery {
            stored_copy: msg_id.to_owned(),
            ..stock_deduct("ODD-1", "M-ODD-again", uniq_key, "SKU-O", 1)
        };
        let again = g.process(&retry).await;
        assert_eq!((again.outcome, again.cause), (Outcome::Duplicate, Some(DuplicateCause::Redelivery)));

        let report = reconcile_once(store, &window(started), &[STOCK_LEDGER_CHECK], now_ms()).await.unwrap();
        assert!(report.is_clean(), "no orphan for an odd msgId: {:#?}", report.anomalies);
        for (text, by) in [(msg_id, SearchBy::MsgId), (uniq_key, SearchBy::UniqKey)] {
            let q = TraceQuery::new(text, by, None, None, None).expect("searchable");
            match trace(store, &TraceContext::default(), &q).await.expect("trace") {
                Answer::Story { story, .. } => assert_eq!(story.key.biz_id, "ODD-1", "{by:?}"),
                other => panic!("{text:?} as {by:?}: {other:?}"),
            }
        }
        assert_eq!(text_of(store, &LOGGED_MSG_ID, "ODD-1").await, msg_id, "the log holds the msgId as sent");
        assert_eq!(text_of(store, &CLAIMED_MSG_ID, "ODD-1").await, msg_id, "as the claim does");
    }
}

/// An `invalid` row as the log wrote it for a stock deduction whose key it refused.
static OLD_INVALID_ROW: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, error, latency_us, payload) \
     VALUES (?, 'old', ?, ?, ?, ?, ?, 0, 0, 0, 'stock.deduct', ?, 0, 'invalid', ?, 900, ?)",
);
static STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static LOGGED_MSG_ID: Sql =
    Sql::new("SELECT msg_id FROM delivery_log WHERE biz_id = ? AND outcome = 'processed'");
static CLAIMED_MSG_ID: Sql = Sql::new("SELECT msg_id FROM idempotent_record_all WHERE biz_id = ?");

macro_rules! key_text_cases {
    ($runner:ident) => {
        $runner!(
            keys_in_every_script_are_claimed_logged_traced_reconciled_and_replayed_as_written,
            a_key_the_rules_refuse_is_logged_invalid_with_its_reason_and_found_by_its_text,
            keys_refused_before_the_rule_took_in_their_script_are_replayed_into_one_effect,
            odd_msg_ids_and_uniq_keys_are_logged_as_claimed_traced_and_reconciled,
        );
    };
}

key_text_cases!(on_every_backend);
key_text_cases!(on_every_backend_with_group_commit);
key_text_cases!(on_mariadb_claiming_as_on_mysql);
