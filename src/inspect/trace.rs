//! A business key's whole story: its dedup record (live or archived), every delivery of it
//! oldest first, a summary, and the business state its handler owns.
//!
//! A search names a bizId, a msgId or a UNIQ_KEY ([`SearchBy::Any`] tries them in that order).
//! When the text matches more than one key (the same bizId under two biz_types, two
//! execute_times or two consumer groups), the answer is the list of candidates to choose from.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{InspectError, Limits, LogRow, checked_text, log_columns};
use crate::archive::LogRetention;
use crate::clock::format_ms;
use crate::handler::{Fact, Handler};
use crate::route::MAX_ID_CHARS;
use crate::store::{AnyQuery, Sql, Store};

/// The most deliveries a trace lists; a key with more says so.
pub(crate) const MAX_DELIVERIES: usize = 500;
/// The most candidate keys a search lists.
pub(crate) const MAX_CANDIDATES: usize = 50;

/// What the search text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum SearchBy {
    /// A bizId, else a msgId, else a UNIQ_KEY.
    #[default]
    Any,
    /// A bizId.
    BizId,
    /// A msgId.
    MsgId,
    /// A UNIQ_KEY.
    UniqKey,
}

impl SearchBy {
    pub fn parse(text: &str) -> Result<Self, InspectError> {
        match text {
            "" | "any" => Ok(Self::Any),
            "biz_id" => Ok(Self::BizId),
            "msg_id" => Ok(Self::MsgId),
            "uniq_key" => Ok(Self::UniqKey),
            other => Err(InspectError::BadRequest(format!(
                "by={:?} is not one of any, biz_id, msg_id, uniq_key",
                other.chars().take(20).collect::<String>()
            ))),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::BizId => "bizId",
            Self::MsgId => "msgId",
            Self::UniqKey => "UNIQ_KEY",
        }
    }

    fn label_for_errors(self) -> &'static str {
        match self {
            Self::Any => "search text",
            other => other.label(),
        }
    }
}

/// A search, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceQuery {
    pub text: String,
    pub by: SearchBy,
    pub biz_type: Option<String>,
    pub execute_time: Option<i64>,
    pub consumer_group: Option<String>,
}

impl TraceQuery {
    /// Checks each part: lengths and characters, so that a hostile parameter is refused with
    /// its reason before any read.
    pub fn new(
        text: &str,
        by: SearchBy,
        biz_type: Option<&str>,
        execute_time: Option<i64>,
        consumer_group: Option<&str>,
    ) -> Result<Self, InspectError> {
        let text = checked_text(by.label_for_errors(), text, super::MAX_SEARCH_CHARS)?;
        if text.is_empty() {
            return Err(InspectError::BadRequest("type a bizId, msgId or UNIQ_KEY to search for".to_owned()));
        }
        Ok(Self {
            text,
            by,
            biz_type: super::biz_type_filter(biz_type)?,
            execute_time,
            consumer_group: match consumer_group.map(str::trim).filter(|g| !g.is_empty()) {
                None => None,
                Some(g) => Some(checked_text("group", g, MAX_ID_CHARS)?),
            },
        })
    }

    fn admits(&self, key: &KeyRef) -> bool {
        self.biz_type.as_ref().is_none_or(|t| *t == key.biz_type)
            && self.execute_time.is_none_or(|t| t == key.execute_time)
            && self.consumer_group.as_ref().is_none_or(|g| *g == key.consumer_group)
    }
}

/// A claim key: what the unique index holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct KeyRef {
    pub consumer_group: String,
    pub biz_type: String,
    pub biz_id: String,
    pub execute_time: i64,
}

impl KeyRef {
    /// Binds this key ([`crate::route::bind_key`]'s order).
    fn bind(&self, q: AnyQuery) -> AnyQuery {
        crate::route::bind_key(q, &self.consumer_group, &self.biz_type, &self.biz_id, self.execute_time)
    }

    fn from_row(r: &AnyRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            consumer_group: r.try_get(0)?,
            biz_type: r.try_get(1)?,
            biz_id: r.try_get(2)?,
            execute_time: r.try_get(3)?,
        })
    }
}

/// One key a search matched, for the choice list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub key: KeyRef,
    pub deliveries: i64,
    pub first_seen_ms: Option<i64>,
    pub last_seen_ms: Option<i64>,
    /// `live`, `archived` or `none`.
    pub claim: &'static str,
}

/// The dedup record of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRecord {
    /// `live` (in a claim table, see [`crate::layout`]) or `archived`.
    pub state: &'static str,
    pub msg_id: String,
    pub uniq_key: String,
    pub payload_hash: String,
    pub instance_id: String,
    pub claimed_at_ms: i64,
    pub archived_at_ms: Option<i64>,
}

impl ClaimRecord {
    /// A claim from a row of `msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms`, and
    /// `archived_at_ms` after them when the row comes from the archive.
    fn from_row(r: &AnyRow, state: &'static str) -> Result<Self, sqlx::Error> {
        Ok(Self {
            state,
            msg_id: r.try_get(0)?,
            uniq_key: r.try_get(1)?,
            payload_hash: r.try_get(2)?,
            instance_id: r.try_get(3)?,
            claimed_at_ms: r.try_get(4)?,
            archived_at_ms: if r.len() > 5 { r.try_get(5)? } else { None },
        })
    }
}

/// Where the key stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalState {
    /// Claimed, with at most one `processed` delivery.
    Applied,
    /// More than one `processed` delivery for one claim key: the alarm.
    AppliedTwice,
    /// Not claimed; the last delivery was given up. Replayable.
    DeadLettered,
    /// Not claimed; the last delivery failed and the broker will bring it back.
    Retrying,
    /// Refused as invalid; not claimed.
    Invalid,
    /// Seen only as a duplicate, or the log holds nothing that decides it.
    Unknown,
}

impl FinalState {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Applied => "applied once",
            Self::AppliedTwice => "APPLIED MORE THAN ONCE: the claim key has several processed deliveries",
            Self::DeadLettered => "dead-lettered: never applied; the body is kept for replay",
            Self::Retrying => "retrying: not applied yet; the broker will redeliver",
            Self::Invalid => "invalid: refused before the claim; the body is kept",
            Self::Unknown => "unknown: no processed delivery and no claim in the log's window",
        }
    }

    /// Whether the page should show it as a problem.
    pub fn is_trouble(self) -> bool {
        !matches!(self, Self::Applied)
    }
}

/// The summary line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub first_seen_ms: Option<i64>,
    pub last_seen_ms: Option<i64>,
    pub processed_at_ms: Option<i64>,
    pub deliveries: usize,
    pub processed: usize,
    /// Duplicates by cause.
    pub duplicates: BTreeMap<String, usize>,
    pub collisions: usize,
    /// Deliveries that failed and were handed back to the broker.
    pub retries: usize,
    pub dead_letters: usize,
    pub invalid: usize,
    pub final_state: FinalState,
    pub final_state_text: &'static str,
}

/// The whole story of one key.
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub key: KeyRef,
    /// The live claim, else the latest archived one.
    pub claim: Option<ClaimRecord>,
    /// Archived claims besides the one shown (a key claimed again after archiving).
    pub earlier_claims: Vec<ClaimRecord>,
    /// Oldest first, at most [`MAX_DELIVERIES`].
    pub deliveries: Vec<LogRow>,
    /// True when the key has more deliveries than listed.
    pub truncated: bool,
    pub summary: Summary,
    /// The business state the key's handler shows, if it shows any.
    pub business: Vec<Fact>,
    /// Set when part of this key's history lies beyond the delivery log's retention.
    pub retention_note: Option<String>,
    /// A Grafana link to the time around this key's events, when a Grafana URL is configured.
    pub grafana_url: Option<String>,
}

/// What a search found.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "found", rename_all = "snake_case")]
pub enum Answer {
    /// No key matched.
    Nothing { searched: String },
    /// Several keys matched (or the filters matched none of those found): choose one.
    Choice { matched_by: SearchBy, candidates: Vec<Candidate>, more: bool, note: Option<String> },
    /// Exactly one key.
    Story { matched_by: SearchBy, story: Box<Story> },
}

/// What a trace needs besides the store.
#[derive(Clone, Default)]
pub struct TraceContext {
    pub limits: Limits,
    /// The delivery log's retention, for the note on old history.
    pub retention: Option<LogRetention>,
    /// The Grafana dashboard's URL, such as `http://grafana:3000/d/idemgate`.
    pub grafana_url: Option<String>,
    /// Handlers by biz_type, for the business state.
    pub describers: BTreeMap<String, Arc<dyn Handler>>,
}

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceContext")
            .field("limits", &self.limits)
            .field("retention", &self.retention)
            .field("grafana_url", &self.grafana_url)
            .field("describers", &self.describers.keys().collect::<Vec<_>>())
            .finish()
    }
}

static LOG_KEYS_BY_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM delivery_log WHERE biz_id = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
static LOG_KEYS_BY_MSG_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM delivery_log WHERE msg_id = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
static LOG_KEYS_BY_UNIQ_KEY: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM delivery_log WHERE uniq_key = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
static LIVE_KEYS_BY_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, claimed_at_ms FROM idempotent_record_all \
     WHERE biz_id = ? LIMIT 51",
);
static ARCHIVED_KEYS_BY_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, MAX(claimed_at_ms) FROM idempotent_record_archive \
     WHERE biz_id = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
static LIVE_CLAIM: Sql = Sql::new(
    "SELECT msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms FROM idempotent_record_all \
     WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?",
);
static ARCHIVED_CLAIMS: Sql = Sql::new(
    "SELECT msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms, archived_at_ms \
     FROM idempotent_record_archive \
     WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ? \
     ORDER BY archived_at_ms DESC LIMIT 10",
);
static DELIVERIES_OF_KEY: Sql = Sql::new(concat!(
    "SELECT ",
    log_columns!(),
    " FROM delivery_log WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ? \
     ORDER BY logged_at_ms, id LIMIT 501"
));
static DELIVERIES_OF_MESSAGE: Sql = Sql::new(concat!(
    "SELECT ",
    log_columns!(),
    " FROM delivery_log WHERE msg_id = ? AND biz_id = '' AND biz_type = ? AND consumer_group = ? \
     ORDER BY logged_at_ms, id LIMIT 501"
));
static DELIVERIES_OF_UNIQ_KEY: Sql = Sql::new(concat!(
    "SELECT ",
    log_columns!(),
    " FROM delivery_log WHERE uniq_key = ? AND biz_id = '' AND biz_type = ? AND consumer_group = ? \
     ORDER BY logged_at_ms, id LIMIT 501"
));

/// Answers a search within `ctx.limits`.
pub async fn trace(store: &Store, ctx: &TraceContext, q: &TraceQuery) -> Result<Answer, InspectError> {
    ctx.limits.run(answer(store, ctx, q)).await
}

async fn answer(store: &Store, ctx: &TraceContext, q: &TraceQuery) -> Result<Answer, sqlx::Error> {
    let order: &[SearchBy] = match q.by {
        SearchBy::Any => &[SearchBy::BizId, SearchBy::MsgId, SearchBy::UniqKey],
        SearchBy::BizId => &[SearchBy::BizId],
        SearchBy::MsgId => &[SearchBy::MsgId],
        SearchBy::UniqKey => &[SearchBy::UniqKey],
    };
    for &by in order {
        let found = candidates(store, by, &q.text).await?;
        if found.is_empty() {
            continue;
        }
        let more = found.len() > MAX_CANDIDATES;
        let (admitted, others): (Vec<_>, Vec<_>) = found.into_iter().partition(|c| q.admits(&c.key));
        return Ok(match admitted.len() {
            1 if !more => {
                let key = admitted.into_iter().next().map(|c| c.key).expect("one candidate");
                let story =
                    story(store, ctx, key, (by != SearchBy::BizId).then_some((by, q.text.as_str()))).await?;
                Answer::Story { matched_by: by, story: Box::new(story) }
            }
            0 => Answer::Choice {
                matched_by: by,
                candidates: others.into_iter().take(MAX_CANDIDATES).collect(),
                more,
                note: Some(format!(
                    "{} {:?} exists, but not with the biz_type, execute_time or group asked for",
                    by.label(),
                    q.text
                )),
            },
            _ => Answer::Choice {
                matched_by: by,
                candidates: admitted.into_iter().take(MAX_CANDIDATES).collect(),
                more,
                note: None,
            },
        });
    }
    Ok(Answer::Nothing { searched: order.iter().map(|b| b.label()).collect::<Vec<_>>().join(", ") })
}

/// Every key `text` names as `by`, from the log and (for a bizId) the claim tables.
async fn candidates(store: &Store, by: SearchBy, text: &str) -> Result<Vec<Candidate>, sqlx::Error> {
    let log_sql = match by {
        SearchBy::BizId | SearchBy::Any => &LOG_KEYS_BY_BIZ_ID,
        SearchBy::MsgId => &LOG_KEYS_BY_MSG_ID,
        SearchBy::UniqKey => &LOG_KEYS_BY_UNIQ_KEY,
    };
    let mut by_key: BTreeMap<KeyRef, Candidate> = BTreeMap::new();
    for r in store.query(log_sql).bind(text).fetch_all(store.pool()).await? {
        let key = KeyRef::from_row(&r)?;
        by_key.insert(
            key.clone(),
            Candidate {
                key,
                deliveries: r.try_get(4)?,
                first_seen_ms: r.try_get(5)?,
                last_seen_ms: r.try_get(6)?,
                claim: "none",
            },
        );
    }
    if matches!(by, SearchBy::BizId | SearchBy::Any) {
        for (sql, state) in [(&ARCHIVED_KEYS_BY_BIZ_ID, "archived"), (&LIVE_KEYS_BY_BIZ_ID, "live")] {
            for r in store.query(sql).bind(text).fetch_all(store.pool()).await? {
                let key = KeyRef::from_row(&r)?;
                let claimed_at: i64 = r.try_get(4)?;
                let c = by_key.entry(key.clone()).or_insert(Candidate {
                    key,
                    deliveries: 0,
                    first_seen_ms: Some(claimed_at),
                    last_seen_ms: Some(claimed_at),
                    claim: state,
                });
                c.claim = state;
            }
        }
    }
    Ok(by_key.into_values().collect())
}

/// The story of `key`. `message` is the msgId or UNIQ_KEY searched for, which scopes the
/// timeline when the key has no bizId (a message refused before its key could be read).
async fn story(
    store: &Store,
    ctx: &TraceContext,
    key: KeyRef,
    message: Option<(SearchBy, &str)>,
) -> Result<Story, sqlx::Error> {
    let rows = match message {
        Some((by, m)) if key.biz_id.is_empty() => {
            let sql = if by == SearchBy::UniqKey { &DELIVERIES_OF_UNIQ_KEY } else { &DELIVERIES_OF_MESSAGE };
            store
                .query(sql)
                .bind(m)
                .bind(key.biz_type.as_str())
                .bind(key.consumer_group.as_str())
                .fetch_all(store.pool())
                .await?
        }
        _ => key.bind(store.query(&DELIVERIES_OF_KEY)).fetch_all(store.pool()).await?,
    };
    let mut deliveries = rows.iter().map(LogRow::from_row).collect::<Result<Vec<_>, _>>()?;
    let truncated = deliveries.len() > MAX_DELIVERIES;
    deliveries.truncate(MAX_DELIVERIES);

    let (claim, earlier_claims) = claims(store, &key).await?;
    let summary = summarize(&deliveries, claim.as_ref());
    let business = match ctx.describers.get(&key.biz_type) {
        Some(handler) if !key.biz_id.is_empty() => handler.describe(store, &key.biz_id).await?,
        _ => Vec::new(),
    };
    let now = crate::clock::now_ms();
    let retention_note = ctx.retention.and_then(|r| {
        let oldest =
            [claim.as_ref().map(|c| c.claimed_at_ms), summary.first_seen_ms].into_iter().flatten().min()?;
        r.is_beyond(oldest, now).then(|| r.notice(now))
    });
    let grafana_url = ctx.grafana_url.as_deref().and_then(|base| {
        let from = summary.first_seen_ms?;
        let to = summary.last_seen_ms.unwrap_or(from);
        Some(grafana_link(base, from - 5 * 60_000, to + 5 * 60_000, &key.biz_type))
    });
    Ok(Story {
        key,
        claim,
        earlier_claims,
        deliveries,
        truncated,
        summary,
        business,
        retention_note,
        grafana_url,
    })
}

/// The live claim (else the latest archived one) and the other archived ones.
pub(crate) async fn claims(
    store: &Store,
    key: &KeyRef,
) -> Result<(Option<ClaimRecord>, Vec<ClaimRecord>), sqlx::Error> {
    let live = key.bind(store.query(&LIVE_CLAIM)).fetch_optional(store.pool()).await?;
    let live = live.as_ref().map(|r| ClaimRecord::from_row(r, "live")).transpose()?;
    let mut archived = key
        .bind(store.query(&ARCHIVED_CLAIMS))
        .fetch_all(store.pool())
        .await?
        .iter()
        .map(|r| ClaimRecord::from_row(r, "archived"))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(match live {
        Some(live) => (Some(live), archived),
        None if archived.is_empty() => (None, archived),
        None => {
            let latest = archived.remove(0);
            (Some(latest), archived)
        }
    })
}

fn summarize(deliveries: &[LogRow], claim: Option<&ClaimRecord>) -> Summary {
    let count = |outcome: &str| deliveries.iter().filter(|d| d.outcome == outcome).count();
    let mut duplicates = BTreeMap::new();
    for d in deliveries.iter().filter(|d| d.outcome == "duplicate") {
        *duplicates.entry(d.cause.clone().unwrap_or_else(|| "unknown".to_owned())).or_insert(0) += 1;
    }
    let processed = count("processed");
    let processed_at_ms = deliveries
        .iter()
        .find(|d| d.outcome == "processed")
        .map(|d| d.logged_at_ms)
        .or(claim.map(|c| c.claimed_at_ms));
    let final_state = if processed > 1 {
        FinalState::AppliedTwice
    } else if claim.is_some() || processed == 1 {
        FinalState::Applied
    } else {
        match deliveries.iter().rev().find(|d| d.outcome != "duplicate").map(|d| d.outcome.as_str()) {
            Some("dead_lettered") => FinalState::DeadLettered,
            Some("failed") => FinalState::Retrying,
            Some("invalid") => FinalState::Invalid,
            _ => FinalState::Unknown,
        }
    };
    Summary {
        first_seen_ms: deliveries.first().map(|d| d.logged_at_ms).or(claim.map(|c| c.claimed_at_ms)),
        last_seen_ms: deliveries.last().map(|d| d.logged_at_ms).or(claim.map(|c| c.claimed_at_ms)),
        processed_at_ms,
        deliveries: deliveries.len(),
        processed,
        duplicates,
        collisions: deliveries.iter().filter(|d| d.is_collision()).count(),
        retries: count("failed"),
        dead_letters: count("dead_lettered"),
        invalid: count("invalid"),
        final_state,
        final_state_text: final_state.describe(),
    }
}

/// A link to the dashboard at `base` for the time range, filtered to `biz_type`.
pub(crate) fn grafana_link(base: &str, from_ms: i64, to_ms: i64, biz_type: &str) -> String {
    let query = serde_urlencoded::to_string([
        ("from", from_ms.to_string()),
        ("to", to_ms.to_string()),
        ("var-biz_type", biz_type.to_owned()),
    ])
    .unwrap_or_default();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{query}")
}

/// The story as plain text, for `idemgate trace`.
pub fn render_text(answer: &Answer) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    match answer {
        Answer::Nothing { searched } => {
            let _ = writeln!(out, "nothing found (searched as {searched})");
        }
        Answer::Choice { matched_by, candidates, more, note } => {
            if let Some(note) = note {
                let _ = writeln!(out, "{note}");
            }
            let _ = writeln!(
                out,
                "several keys match this {}; pick one with --biz-type/--execute-time/--group:",
                matched_by.label()
            );
            for c in candidates {
                let _ = writeln!(
                    out,
                    "  group={} biz_type={} biz_id={:?} execute_time={}  deliveries={} claim={} last={}",
                    c.key.consumer_group,
                    c.key.biz_type,
                    c.key.biz_id,
                    c.key.execute_time,
                    c.deliveries,
                    c.claim,
                    c.last_seen_ms.map(format_ms).unwrap_or_default()
                );
            }
            if *more {
                let _ = writeln!(out, "  … and more");
            }
        }
        Answer::Story { matched_by, story } => render_story(&mut out, *matched_by, story),
    }
    out
}

fn render_story(out: &mut String, matched_by: SearchBy, s: &Story) {
    use std::fmt::Write;
    let k = &s.key;
    let _ = writeln!(
        out,
        "bizId {:?}  (biz_type {}, execute_time {}, group {}; found by {})",
        k.biz_id,
        k.biz_type,
        k.execute_time,
        k.consumer_group,
        matched_by.label()
    );
    let m = &s.summary;
    let _ = writeln!(out, "state: {}", m.final_state_text);
    let dups: Vec<String> = m.duplicates.iter().map(|(c, n)| format!("{n} {c}")).collect();
    let _ = writeln!(
        out,
        "first seen {} · processed {} · {} deliveries · duplicates: {} · collisions {} · retries {} · dead letters {}",
        m.first_seen_ms.map(format_ms).unwrap_or_else(|| "-".into()),
        m.processed_at_ms.map(format_ms).unwrap_or_else(|| "never".into()),
        m.deliveries,
        if dups.is_empty() { "none".to_owned() } else { dups.join(", ") },
        m.collisions,
        m.retries,
        m.dead_letters
    );
    match &s.claim {
        Some(c) => {
            let _ = writeln!(
                out,
                "dedup record ({}): claimed {} by msgId {} (UNIQ_KEY {}) on {}; payload sha256 {}{}",
                c.state,
                format_ms(c.claimed_at_ms),
                c.msg_id,
                if c.uniq_key.is_empty() { "-" } else { &c.uniq_key },
                c.instance_id,
                c.payload_hash,
                c.archived_at_ms.map(|a| format!("; archived {}", format_ms(a))).unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(out, "dedup record: none (the key is not claimed)");
        }
    }
    for f in &s.business {
        let _ = writeln!(out, "{}{}: {}", if f.alarm { "!! " } else { "" }, f.label, f.value);
    }
    if let Some(note) = &s.retention_note {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(out, "timeline (oldest first):");
    for d in &s.deliveries {
        let cause = match (&d.cause, d.payload_match) {
            (Some(c), Some(false)) => format!(" {c} PAYLOAD DIFFERS"),
            (Some(c), _) => format!(" {c}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}  {:<13}{}  msgId {}  UNIQ_KEY {}  {}/q{}/@{}  reconsume {}  {} µs{}",
            format_ms(d.logged_at_ms),
            d.outcome,
            cause,
            d.msg_id,
            if d.uniq_key.is_empty() { "-" } else { &d.uniq_key },
            d.topic,
            d.queue_id,
            d.queue_offset,
            d.reconsume_times,
            d.latency_us,
            d.error.as_deref().map(|e| format!("  error: {e}")).unwrap_or_default()
        );
    }
    if s.truncated {
        let _ = writeln!(out, "  … only the first {MAX_DELIVERIES} deliveries are listed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(outcome: &str, cause: Option<&str>, at: i64) -> LogRow {
        LogRow {
            id: at,
            logged_at_ms: at,
            instance_id: "i".into(),
            consumer_group: "g".into(),
            msg_id: format!("m{at}"),
            uniq_key: String::new(),
            topic: "t".into(),
            tags: String::new(),
            queue_id: 0,
            queue_offset: at,
            reconsume_times: 0,
            biz_type: "stock.deduct".into(),
            biz_id: "D-1".into(),
            execute_time: 0,
            outcome: outcome.into(),
            cause: cause.map(Into::into),
            layer: None,
            payload_match: cause.map(|_| true),
            payload_hash: None,
            error: None,
            latency_us: 10,
            claimed_at_ms: None,
        }
    }

    #[test]
    fn the_summary_names_the_final_state_from_the_timeline() {
        let retried = [row("failed", None, 1), row("failed", None, 2), row("processed", None, 3)];
        let s = summarize(&retried, None);
        assert_eq!((s.final_state, s.retries, s.processed_at_ms), (FinalState::Applied, 2, Some(3)));

        let dead = [row("failed", None, 1), row("dead_lettered", None, 2)];
        assert_eq!(summarize(&dead, None).final_state, FinalState::DeadLettered);
        assert_eq!(summarize(&dead[..1], None).final_state, FinalState::Retrying);

        let twice = [row("processed", None, 1), row("processed", None, 2)];
        assert_eq!(summarize(&twice, None).final_state, FinalState::AppliedTwice);

        let dups = [row("processed", None, 1), row("duplicate", Some("redelivery"), 2)];
        let s = summarize(&dups, None);
        assert_eq!(s.duplicates.get("redelivery"), Some(&1));
        assert_eq!(s.final_state, FinalState::Applied);
    }

    #[test]
    fn grafana_links_carry_the_range_and_an_encoded_biz_type() {
        assert_eq!(
            grafana_link("http://g/d/idemgate", 1, 2, "a&b"),
            "http://g/d/idemgate?from=1&to=2&var-biz_type=a%26b"
        );
        assert!(grafana_link("http://g/d/x?orgId=1", 1, 2, "t").starts_with("http://g/d/x?orgId=1&from=1"));
    }

    #[test]
    fn searches_are_checked_before_any_read() {
        let long = "x".repeat(200);
        assert!(TraceQuery::new(&long, SearchBy::Any, None, None, None).is_err());
        assert!(TraceQuery::new("  ", SearchBy::Any, None, None, None).is_err());
        let q = TraceQuery::new("O-1", SearchBy::BizId, Some(".*"), Some(5), Some("")).unwrap();
        assert_eq!((q.biz_type, q.execute_time, q.consumer_group), (None, Some(5), None));
    }
}
