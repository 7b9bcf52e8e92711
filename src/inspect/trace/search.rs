//! Answering a search: the kinds of key its text is tried as, in turn, the keys each names (from
//! the log and, for a bizId, the claim tables), and then the one key's story or the choice
//! among several.

use std::collections::BTreeMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::answer::{Answer, Candidate};
use super::query::{KeyRef, SearchBy, TraceQuery};
use super::sql::{
    ARCHIVED_KEYS_BY_BIZ_ID, LIVE_KEYS_BY_BIZ_ID, LOG_KEYS_BY_MSG_ID, LOG_KEYS_BY_TRACE_ID,
    LOG_KEYS_BY_UNIQ_KEY, OF_KEY, Scope, first_key, next_key,
};
use super::story::{TraceContext, story};
use super::tally::{COUNT_LIMIT, TallyKind};
use crate::delivery::TraceId;
use crate::inspect::InspectError;
use crate::store::Store;

/// The most candidate keys a search lists.
pub(crate) const MAX_CANDIDATES: usize = 50;

/// Answers a search within `ctx.limits`.
pub async fn trace(store: &Store, ctx: &TraceContext, q: &TraceQuery) -> Result<Answer, InspectError> {
    ctx.limits.run(answer(store, ctx, q)).await
}

/// The kinds a search tries, in order, each with the text it looks for: with [`SearchBy::Any`]
/// a bizId, a msgId, a UNIQ_KEY, and, when the text is one, a trace id (in lowercase). Each is
/// one index lookup (a bizId's keys one probe each), so trying them all stays bounded.
fn attempts(q: &TraceQuery) -> Vec<(SearchBy, String)> {
    let as_is = |by| (by, q.text.clone());
    match q.by {
        SearchBy::Any => {
            let mut order = vec![as_is(SearchBy::BizId), as_is(SearchBy::MsgId), as_is(SearchBy::UniqKey)];
            if let Some(trace_id) = TraceId::from_search(&q.text) {
                order.push((SearchBy::TraceId, trace_id.to_string()));
            }
            order
        }
        by => vec![as_is(by)],
    }
}

async fn answer(store: &Store, ctx: &TraceContext, q: &TraceQuery) -> Result<Answer, sqlx::Error> {
    let order = attempts(q);
    for (by, text) in &order {
        let (by, text) = (*by, text.as_str());
        let found = candidates(store, by, text).await?;
        if found.is_empty() {
            continue;
        }
        let more = found.len() > MAX_CANDIDATES;
        let (admitted, others): (Vec<_>, Vec<_>) = found.into_iter().partition(|c| q.admits(&c.key));
        let (listed, note) = match admitted.len() {
            1 if !more => {
                let key = admitted.into_iter().next().map(|c| c.key).expect("one candidate");
                let scope = match by {
                    SearchBy::MsgId if key.biz_id.is_empty() => Scope::MsgId(&key, text),
                    SearchBy::UniqKey if key.biz_id.is_empty() => Scope::UniqKey(&key, text),
                    SearchBy::TraceId if key.biz_id.is_empty() => Scope::TraceId(&key, text),
                    _ => Scope::Key(&key),
                };
                let story = story(store, ctx, scope, q.page).await?;
                return Ok(Answer::Story { matched_by: by, story: Box::new(story) });
            }
            0 => (
                others,
                Some(format!(
                    "{} {:?} exists, but not with the biz_type, execute_time or group asked for",
                    by.label(),
                    q.text
                )),
            ),
            _ => (admitted, None),
        };
        let mut candidates: Vec<Candidate> = listed.into_iter().take(MAX_CANDIDATES).collect();
        if by == SearchBy::BizId {
            for c in &mut candidates {
                figure(store, c).await?;
            }
        }
        return Ok(Answer::Choice { matched_by: by, candidates, more, note, count_limit: COUNT_LIMIT });
    }
    Ok(Answer::Nothing { searched: order.iter().map(|(b, _)| b.label()).collect::<Vec<_>>().join(", ") })
}

/// Every key `text` names as `by`, from the log and (for a bizId) the claim tables, at most
/// [`MAX_CANDIDATES`] + 1 from each. A bizId's candidates from the log have no figures yet
/// ([`figure`] reads them for the keys a choice lists).
async fn candidates(store: &Store, by: SearchBy, text: &str) -> Result<Vec<Candidate>, sqlx::Error> {
    let mut by_key: BTreeMap<KeyRef, Candidate> = BTreeMap::new();
    let unseen = |key: KeyRef| Candidate {
        key,
        deliveries: 0,
        first_seen_ms: None,
        last_seen_ms: None,
        claim: "none",
    };
    match by {
        SearchBy::BizId | SearchBy::Any => {
            for key in keys_of_biz_id(store, text, MAX_CANDIDATES + 1).await? {
                by_key.insert(key.clone(), unseen(key));
            }
        }
        SearchBy::MsgId | SearchBy::UniqKey | SearchBy::TraceId => {
            let sql = match by {
                SearchBy::MsgId => &LOG_KEYS_BY_MSG_ID,
                SearchBy::UniqKey => &LOG_KEYS_BY_UNIQ_KEY,
                _ => &LOG_KEYS_BY_TRACE_ID,
            };
            let read = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
            for r in store.query(sql).bind(text).bind(read).fetch_all(store.pool()).await? {
                let key = KeyRef::from_row(&r)?;
                by_key.insert(
                    key.clone(),
                    Candidate {
                        deliveries: r.try_get(4)?,
                        first_seen_ms: r.try_get(5)?,
                        last_seen_ms: r.try_get(6)?,
                        ..unseen(key)
                    },
                );
            }
        }
    }
    if matches!(by, SearchBy::BizId | SearchBy::Any) {
        for (sql, state) in [(&ARCHIVED_KEYS_BY_BIZ_ID, "archived"), (&LIVE_KEYS_BY_BIZ_ID, "live")] {
            for r in store.query(sql).bind(text).fetch_all(store.pool()).await? {
                let key = KeyRef::from_row(&r)?;
                let claimed_at: i64 = r.try_get(4)?;
                let c = by_key.entry(key.clone()).or_insert_with(|| unseen(key));
                c.claim = state;
                c.first_seen_ms = c.first_seen_ms.or(Some(claimed_at));
                c.last_seen_ms = c.last_seen_ms.or(Some(claimed_at));
            }
        }
    }
    Ok(by_key.into_values().collect())
}

/// The keys of `biz_id` in the log, at most `limit`, stepped through in `delivery_log_key`'s
/// order one probe each: a key with millions of deliveries costs no more than one with a few.
async fn keys_of_biz_id(store: &Store, biz_id: &str, limit: usize) -> Result<Vec<KeyRef>, sqlx::Error> {
    let key_at = |r: &AnyRow| -> Result<KeyRef, sqlx::Error> {
        Ok(KeyRef {
            biz_type: r.try_get(0)?,
            consumer_group: r.try_get(1)?,
            biz_id: biz_id.to_owned(),
            execute_time: r.try_get(2)?,
        })
    };
    let mut keys = Vec::new();
    let mut next = first_key(biz_id).query(store).fetch_optional(store.pool()).await?;
    while let Some(row) = next.take() {
        let key = key_at(&row)?;
        if keys.len() + 1 < limit {
            next = next_key(&key).query(store).fetch_optional(store.pool()).await?;
        }
        keys.push(key);
    }
    Ok(keys)
}

/// Reads a bizId candidate's figures from the log: its deliveries (up to [`COUNT_LIMIT`]),
/// the oldest and the newest. A key only the claim tables know keeps its claim's time.
async fn figure(store: &Store, c: &mut Candidate) -> Result<(), sqlx::Error> {
    let tallies = OF_KEY.figures.read(store, &Scope::Key(&c.key).args()).await?;
    let of = |kind| tallies.iter().find(|t| t.kind == kind);
    if let Some(all) = of(TallyKind::All).filter(|t| t.count > 0) {
        c.deliveries = i64::try_from(all.count).unwrap_or(i64::MAX);
        c.first_seen_ms = of(TallyKind::First).and_then(|t| t.first_ms);
        c.last_seen_ms = of(TallyKind::Last).and_then(|t| t.last_ms);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn any_tries_a_trace_id_last_and_only_for_text_that_is_one() {
        let tried = |text: &str| {
            let q = TraceQuery::new(text, SearchBy::Any, None, None, None).unwrap();
            attempts(&q).into_iter().map(|(by, text)| format!("{}={text}", by.param())).collect::<Vec<_>>()
        };
        assert_eq!(tried("O-1"), ["biz_id=O-1", "msg_id=O-1", "uniq_key=O-1"]);
        let upper = TRACE.to_uppercase();
        assert_eq!(
            tried(&upper),
            [
                format!("biz_id={upper}"),
                format!("msg_id={upper}"),
                format!("uniq_key={upper}"),
                format!("trace_id={TRACE}")
            ]
        );
        assert_eq!(tried(&"0".repeat(32)).len(), 3, "an all-zero id is no trace id");
        let q = TraceQuery::new(TRACE, SearchBy::TraceId, None, None, None).unwrap();
        assert_eq!(attempts(&q), [(SearchBy::TraceId, TRACE.to_owned())]);
    }
}
