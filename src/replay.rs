//! Guarded dead-letter replay: re-publish dead-lettered messages to their original topic with
//! the same business key, through a real producer, so the fixed consumer can apply them.
//!
//! The guard: a key that is already claimed (live or archived) is refused, so a replay can
//! never be what applies an effect twice. The gate stays the arbiter: a replay that races an
//! original redelivery arrives as a `replay` duplicate. Every re-published message carries
//! `IDEMGATE_REPLAY_OF` (the dead letter's msgId), so its deliveries are logged with cause
//! `replay`. The body is the one the delivery log kept.
//!
//! This module reads the log and the claims and sends; it must not write either.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::broker::Producer;
use crate::delivery::{Delivery, REPLAY_PROPERTY};
use crate::delivery_log::MAX_KEPT_PAYLOAD;
use crate::inspect::trace::{ClaimRecord, KeyRef, claims};
use crate::route::Routes;
use crate::store::{Sql, Store};

/// Which dead letters to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The latest dead letter of one key (or of each biz_type / execute_time it exists under,
    /// unless narrowed).
    Key { biz_id: String, biz_type: Option<String>, execute_time: Option<i64> },
    /// The latest dead letter of every key dead-lettered since this moment (epoch ms).
    Since(i64),
}

/// The most keys one replay handles.
pub(crate) const MAX_KEYS: i64 = 1_000;

/// What happened to one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Action {
    /// Re-published; the new message's UNIQ_KEY.
    Sent { uniq_key: String },
    /// `--dry-run`: this would be sent.
    WouldSend,
    /// The key is claimed: its effect is applied, so it is not sent again.
    RefusedClaimed { state: &'static str, claimed_at_ms: i64, msg_id: String },
    /// The dead letter's body was not kept (a row logged before bodies were kept).
    RefusedNoBody,
    /// The dead letter's body was cut at the size limit when it was logged
    /// ([`MAX_KEPT_PAYLOAD`] bytes kept): what is kept is not the message.
    RefusedBodyCut,
    /// No route covers the original topic and tag any more.
    RefusedNoRoute,
    /// The producer could not send; nothing was sent for this key.
    Failed { error: String },
}

impl Action {
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Sent { .. } | Self::WouldSend)
    }

    /// What happened, in a sentence; `topic` is the dead letter's.
    pub fn describe(&self, topic: &str, dry_run: bool) -> String {
        match self {
            Action::Sent { uniq_key } => format!("sent again as UNIQ_KEY {uniq_key}"),
            Action::WouldSend if dry_run => "would be sent (dry run)".to_owned(),
            Action::WouldSend => "not sent".to_owned(),
            Action::RefusedClaimed { state, claimed_at_ms, msg_id } => format!(
                "refused: already applied ({state} claim of {}, by msgId {msg_id})",
                crate::clock::format_ms(*claimed_at_ms)
            ),
            Action::RefusedNoBody => "refused: the dead letter's body was not kept".to_owned(),
            Action::RefusedBodyCut => format!(
                "refused: the dead letter's body was longer than {MAX_KEPT_PAYLOAD} bytes and was cut when it was logged"
            ),
            Action::RefusedNoRoute => format!("refused: no route covers topic {topic} any more"),
            Action::Failed { error } => format!("failed: {error}"),
        }
    }
}

/// One key's replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    pub consumer_group: String,
    pub biz_type: String,
    pub biz_id: String,
    pub execute_time: i64,
    /// The dead letter replayed (its msgId and when it was logged).
    pub dead_letter_msg_id: String,
    pub dead_lettered_at_ms: i64,
    pub topic: String,
    pub action: Action,
}

static BY_KEY: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, msg_id, logged_at_ms, topic, tags, payload, payload_truncated \
     FROM delivery_log WHERE outcome = 'dead_lettered' AND consumer_group = ? AND biz_id = ? \
     AND (? = '' OR biz_type = ?) ORDER BY logged_at_ms DESC, id DESC LIMIT 1000",
);
static SINCE: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, msg_id, logged_at_ms, topic, tags, payload, payload_truncated \
     FROM delivery_log WHERE outcome = 'dead_lettered' AND outcome <> 'processed' AND consumer_group = ? \
     AND logged_at_ms >= ? \
     ORDER BY logged_at_ms DESC, id DESC LIMIT 10000",
);
/// A dead letter chosen for replay.
struct Candidate {
    line: Line,
    tags: String,
    payload: Option<Vec<u8>>,
    /// The log's `payload_truncated`: the body was cut at the size limit.
    cut: bool,
}

fn candidate(r: &AnyRow) -> Result<Candidate, sqlx::Error> {
    Ok(Candidate {
        line: Line {
            consumer_group: r.try_get(0)?,
            biz_type: r.try_get(1)?,
            biz_id: r.try_get(2)?,
            execute_time: r.try_get(3)?,
            dead_letter_msg_id: r.try_get(4)?,
            dead_lettered_at_ms: r.try_get(5)?,
            topic: r.try_get(6)?,
            action: Action::WouldSend,
        },
        tags: r.try_get(7)?,
        payload: r.try_get(8)?,
        cut: r.try_get::<i16, _>(9)? != 0,
    })
}

/// The latest dead letter of each selected key, newest first, at most [`MAX_KEYS`].
async fn select(store: &Store, group: &str, selection: &Selection) -> Result<Vec<Candidate>, sqlx::Error> {
    let rows = match selection {
        Selection::Key { biz_id, biz_type, .. } => {
            let t = biz_type.as_deref().unwrap_or("");
            store
                .query(&BY_KEY)
                .bind(group)
                .bind(biz_id.as_str())
                .bind(t)
                .bind(t)
                .fetch_all(store.pool())
                .await?
        }
        Selection::Since(ms) => store.query(&SINCE).bind(group).bind(*ms).fetch_all(store.pool()).await?,
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for r in &rows {
        let c = candidate(r)?;
        if let Selection::Key { execute_time: Some(t), .. } = selection
            && c.line.execute_time != *t
        {
            continue;
        }
        let key = (c.line.biz_type.clone(), c.line.biz_id.clone(), c.line.execute_time);
        if c.line.biz_id.is_empty() || !seen.insert(key) {
            continue;
        }
        out.push(c);
        if out.len() as i64 >= MAX_KEYS {
            break;
        }
    }
    Ok(out)
}

/// The claim holding a key, live or else archived, as the trace page reads it.
async fn claim_of(store: &Store, l: &Line) -> Result<Option<ClaimRecord>, sqlx::Error> {
    let key = KeyRef {
        consumer_group: l.consumer_group.clone(),
        biz_type: l.biz_type.clone(),
        biz_id: l.biz_id.clone(),
        execute_time: l.execute_time,
    };
    Ok(claims(store, &key).await?.0)
}

/// Replays the selected dead letters of `group`: each key's latest dead letter is checked
/// against the claims and, unless refused, sent with `producer` (none: a dry run).
pub async fn replay(
    store: &Store,
    routes: &Routes,
    group: &str,
    selection: &Selection,
    producer: Option<&Producer>,
) -> Result<Vec<Line>, sqlx::Error> {
    let mut lines = Vec::new();
    for c in select(store, group, selection).await? {
        let mut line = c.line;
        line.action = if let Some(claim) = claim_of(store, &line).await? {
            Action::RefusedClaimed {
                state: claim.state,
                claimed_at_ms: claim.claimed_at_ms,
                msg_id: claim.msg_id,
            }
        } else if c.cut {
            Action::RefusedBodyCut
        } else if c.payload.is_none() {
            Action::RefusedNoBody
        } else if let Some((keys, mut properties)) =
            routes.republish(&line.topic, &c.tags, &line.biz_id, line.execute_time)
        {
            properties.insert(REPLAY_PROPERTY.to_owned(), line.dead_letter_msg_id.clone());
            let message = Delivery {
                topic: line.topic.clone(),
                tags: c.tags.clone(),
                keys,
                properties,
                body: c.payload.unwrap_or_default(),
                ..Delivery::default()
            };
            match producer {
                None => Action::WouldSend,
                Some(p) => match p.send(&message).await {
                    Ok(sent) => Action::Sent { uniq_key: sent.uniq_key },
                    Err(e) => Action::Failed { error: format!("{e:#}") },
                },
            }
        } else {
            Action::RefusedNoRoute
        };
        match &line.action {
            Action::Sent { uniq_key } => tracing::info!(
                biz_type = %line.biz_type, biz_id = %line.biz_id, %uniq_key, of = %line.dead_letter_msg_id,
                "dead letter replayed"
            ),
            Action::RefusedClaimed { .. } => tracing::info!(
                biz_type = %line.biz_type, biz_id = %line.biz_id, "replay refused: the key is already claimed"
            ),
            _ => {}
        }
        lines.push(line);
    }
    Ok(lines)
}

/// The lines as text, for the command line.
pub(crate) fn render_text(lines: &[Line], dry_run: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if lines.is_empty() {
        out.push_str("no dead letter matches\n");
    }
    for l in lines {
        let what = l.action.describe(&l.topic, dry_run);
        let _ = writeln!(
            out,
            "{} {:?}{} (dead letter {} of {}): {what}",
            l.biz_type,
            l.biz_id,
            if l.execute_time == 0 { String::new() } else { format!(" @{}", l.execute_time) },
            l.dead_letter_msg_id,
            crate::clock::format_ms(l.dead_lettered_at_ms)
        );
    }
    out
}

/// Replay from the web UI: the routes to rebuild keys with, and a producer started on first use.
pub struct Replayer {
    name_server: String,
    producer_group: String,
    routes: Routes,
    producer: tokio::sync::OnceCell<Producer>,
}

impl std::fmt::Debug for Replayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer").field("name_server", &self.name_server).finish()
    }
}

impl Replayer {
    pub fn new(name_server: &str, producer_group: &str, routes: Routes) -> Self {
        Self {
            name_server: name_server.to_owned(),
            producer_group: producer_group.to_owned(),
            routes,
            producer: tokio::sync::OnceCell::new(),
        }
    }

    /// Replays one key's latest dead letter.
    pub async fn replay_key(
        &self,
        store: &Store,
        group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
    ) -> anyhow::Result<Vec<Line>> {
        let producer = self
            .producer
            .get_or_try_init(|| Producer::start(&self.name_server, &self.producer_group))
            .await?;
        let selection = Selection::Key {
            biz_id: biz_id.to_owned(),
            biz_type: Some(biz_type.to_owned()),
            execute_time: Some(execute_time),
        };
        Ok(replay(store, &self.routes, group, &selection, Some(producer)).await?)
    }
}
