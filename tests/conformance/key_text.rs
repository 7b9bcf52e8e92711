//! A business key is stored, found and replayed exactly as it was written, in any script: the
//! claim, the delivery log, the reconciler's findings and replay's selection all hold the same
//! bytes. Thai and Devanagari keys carry combining vowel signs, a Han key a character outside
//! the Basic Multilingual Plane (four bytes in UTF-8, `utf8mb4` on MariaDB), Hebrew and Arabic
//! keys run right to left. A key the rules refuse (an emoji, a Thai tone mark) is logged
//! `invalid` with its reason and found by its own text.

use idemgate::testing::clock::now_ms;
use idemgate::testing::inspect::trace::{
    Answer, FinalState, SearchBy, Story, TraceContext, TraceQuery, trace,
};
use idemgate::testing::outcome::{DuplicateCause, Outcome};
use idemgate::testing::reconcile::{AnomalyKind, ReconcileOptions, reconcile_once, runs};
use idemgate::testing::replay::{self, Action, Selection};
use idemgate::testing::shop::STOCK_LEDGER_CHECK;
use idemgate::testing::store::{Sql, Store};

use super::support::{TestDb, gate, identity, stock_deduct};

const GROUP: &str = "stock-service";

/// Valid keys in five scripts, each with digits of its own script where it has them.
const KEYS: [&str; 5] = ["สีดำ-ดี-๑๒", "आदेश-कु-१२", "订单-𠮷-7", "הזמנה-42", "طلب-مُحَمَّد-١٢٣"];

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
        backend: idemgate::testing::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        idemgate::testing::shop::seed_stock(store, "SKU-U", 1_000).await.unwrap();
        let g =
            gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::testing::handler::Handlers::new());
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
            let d = stock_deduct(key, &format!("M-{i}-again"), &format!("U-{i}"), "SKU-U", 1);
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
        backend: idemgate::testing::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let g =
            gate(store.clone(), identity(GROUP, "a"), vec![], idemgate::testing::handler::Handlers::new());
        for (key, msg_id, reason) in [
            ("ORDER-😀", "M-EMOJI", "forbidden character 😀 (U+1F600) at position 7"),
            ("สั่ง-1", "M-TONE", "forbidden character \\u{e48} (U+0E48) at position 3"),
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
        }
    }
}

macro_rules! key_text_cases {
    ($runner:ident) => {
        $runner!(
            keys_in_every_script_are_claimed_logged_traced_reconciled_and_replayed_as_written,
            a_key_the_rules_refuse_is_logged_invalid_with_its_reason_and_found_by_its_text,
        );
    };
}

key_text_cases!(on_every_backend);
key_text_cases!(on_every_backend_with_group_commit);
key_text_cases!(on_mariadb_claiming_as_on_mysql);
