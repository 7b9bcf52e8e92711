//! Guarded replay: re-publish dead-lettered and invalid deliveries to their original topic,
//! through a real producer, so that the fixed consumer (or the fixed rule or route) can apply
//! them.
//!
//! The guard: a key that is already claimed (live or archived) is refused, so a replay can
//! never be what applies an effect twice. The gate stays the arbiter: a replay that races an
//! original redelivery arrives as a `replay` duplicate. Every re-published message carries
//! `IDEMGATE_REPLAY_OF` (the replayed row's msgId), so its deliveries are logged with cause
//! `replay`. The body is the one the delivery log kept.
//!
//! A dead letter is sent again with its key as logged. An invalid delivery was refused before
//! its key was claimed, so its key is read again, from the message rebuilt of what the log
//! kept (its body, topic and tag, and its bizId as delivered where the log holds it), by the
//! routes as they are now: one they still refuse is not sent, and one they accept is guarded
//! by the key they read.
//!
//! This module reads the log and the claims and sends; it must not write either.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::broker::Brokers;
use crate::delivery::{Delivery, REPLAY_PROPERTY};
use crate::delivery_log::{KeptHeaders, MAX_KEPT_PAYLOAD};
use crate::inspect::trace::{ClaimRecord, KeyRef, claims};
use crate::route::{MAX_BIZ_ID_CHARS, Routes, delivered_text, excerpt};
use crate::store::{Sql, Store};

/// Which deliveries to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The latest dead letter or invalid delivery of one key (or of each biz_type /
    /// execute_time it exists under, unless narrowed), found by the key as the log holds it.
    Key { biz_id: String, biz_type: Option<String>, execute_time: Option<i64> },
    /// The latest dead letter of every key dead-lettered since this moment (epoch ms).
    Since(i64),
    /// Every delivery refused as invalid since this moment (epoch ms): the latest of each key
    /// the routes now read from it, and each one whose key they still cannot read.
    InvalidSince(i64),
    /// The latest dead-lettered or invalid delivery of one message, by its msgId: for a
    /// message refused before any key could be read from it, or whose key the log holds only
    /// as an excerpt.
    Message { msg_id: String },
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
    /// The body was not kept (a row logged before bodies were kept).
    RefusedNoBody,
    /// The body was cut at the size limit when it was logged ([`MAX_KEPT_PAYLOAD`] bytes
    /// kept): what is kept is not the message.
    RefusedBodyCut,
    /// No route covers the original topic and tag any more.
    RefusedNoRoute,
    /// An invalid delivery that the routes, as they are now, still refuse: sent again, it
    /// would only be refused again.
    RefusedStillInvalid { reason: String },
    /// The producer could not send; nothing was sent for this key.
    Failed { error: String },
}

impl Action {
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Sent { .. } | Self::WouldSend)
    }

    /// What happened, in a sentence; `topic` is the replayed delivery's.
    pub fn describe(&self, topic: &str, dry_run: bool) -> String {
        match self {
            Action::Sent { uniq_key } => format!("sent again as UNIQ_KEY {uniq_key}"),
            Action::WouldSend if dry_run => "would be sent (dry run)".to_owned(),
            Action::WouldSend => "not sent".to_owned(),
            Action::RefusedClaimed { state, claimed_at_ms, msg_id } => format!(
                "refused: already applied ({state} claim of {}, by msgId {msg_id})",
                crate::clock::format_ms(*claimed_at_ms)
            ),
            Action::RefusedNoBody => "refused: the body was not kept".to_owned(),
            Action::RefusedBodyCut => format!(
                "refused: the body was longer than {MAX_KEPT_PAYLOAD} bytes and was cut when it was logged"
            ),
            Action::RefusedNoRoute => format!("refused: no route covers topic {topic} any more"),
            Action::RefusedStillInvalid { reason } => {
                format!("refused: the routes still refuse it ({reason})")
            }
            Action::Failed { error } => format!("failed: {error}"),
        }
    }
}

/// One key's replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    pub consumer_group: String,
    /// The key replayed: a dead letter's as logged, an invalid delivery's as the routes now
    /// read it (as logged while they still refuse it).
    pub biz_type: String,
    pub biz_id: String,
    pub execute_time: i64,
    /// What the replayed row was: `dead_lettered` or `invalid`.
    pub outcome: String,
    /// The row replayed, dead letter or invalid delivery: its msgId and when it was logged.
    pub dead_letter_msg_id: String,
    pub dead_lettered_at_ms: i64,
    pub topic: String,
    pub action: Action,
}

impl Line {
    /// What the replayed row was, in words: `dead letter` or `invalid delivery`.
    pub(crate) fn replayed_row(&self) -> &'static str {
        if self.outcome == "invalid" { "invalid delivery" } else { "dead letter" }
    }
}

/// The columns [`candidate`] reads, in order, as a literal for `concat!`.
macro_rules! replay_columns {
    () => {
        "SELECT consumer_group, biz_type, biz_id, execute_time, msg_id, logged_at_ms, topic, tags, payload, \
         payload_truncated, outcome, kept_headers FROM delivery_log "
    };
}

// A refused key is logged as its excerpt (`stored_key`); a key the rules accept now may have
// been refused and escaped before, so the key is looked up in both forms.
static BY_KEY: Sql = Sql::new(concat!(
    replay_columns!(),
    "WHERE outcome IN ('dead_lettered', 'invalid') AND consumer_group = ? AND biz_id IN (?, ?) \
     AND (? = '' OR biz_type = ?) ORDER BY logged_at_ms DESC, id DESC LIMIT 1000",
));
static SINCE: Sql = Sql::new(concat!(
    replay_columns!(),
    "WHERE outcome = 'dead_lettered' AND outcome <> 'processed' AND consumer_group = ? \
     AND logged_at_ms >= ? ORDER BY logged_at_ms DESC, id DESC LIMIT 10000",
));
static INVALID_SINCE: Sql = Sql::new(concat!(
    replay_columns!(),
    "WHERE outcome = 'invalid' AND outcome <> 'processed' AND consumer_group = ? \
     AND logged_at_ms >= ? ORDER BY logged_at_ms DESC, id DESC LIMIT 10000",
));
static BY_MESSAGE: Sql = Sql::new(concat!(
    replay_columns!(),
    "WHERE outcome IN ('dead_lettered', 'invalid') AND consumer_group = ? AND msg_id = ? \
     ORDER BY logged_at_ms DESC, id DESC LIMIT 1000",
));

/// A logged delivery chosen for replay.
struct Candidate {
    line: Line,
    tags: String,
    payload: Option<Vec<u8>>,
    /// The log's `payload_truncated`: the body was cut at the size limit.
    cut: bool,
    /// The KEYS and properties the message was delivered with, where the log kept them.
    headers: Option<KeptHeaders>,
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
            outcome: r.try_get(10)?,
            action: Action::WouldSend,
        },
        tags: r.try_get(7)?,
        payload: r.try_get(8)?,
        cut: r.try_get::<i16, _>(9)? != 0,
        headers: KeptHeaders::read(r.try_get::<Option<String>, _>(11)?.as_deref()),
    })
}

/// The selected rows, newest first.
async fn select(store: &Store, group: &str, selection: &Selection) -> Result<Vec<Candidate>, sqlx::Error> {
    let rows = match selection {
        Selection::Key { biz_id, biz_type, .. } => {
            let t = biz_type.as_deref().unwrap_or("");
            store
                .query(&BY_KEY)
                .bind(group)
                .bind(biz_id.as_str())
                .bind(excerpt(biz_id, MAX_BIZ_ID_CHARS))
                .bind(t)
                .bind(t)
                .fetch_all(store.pool())
                .await?
        }
        Selection::Since(ms) => store.query(&SINCE).bind(group).bind(*ms).fetch_all(store.pool()).await?,
        Selection::InvalidSince(ms) => {
            store.query(&INVALID_SINCE).bind(group).bind(*ms).fetch_all(store.pool()).await?
        }
        Selection::Message { msg_id } => {
            store.query(&BY_MESSAGE).bind(group).bind(msg_id.as_str()).fetch_all(store.pool()).await?
        }
    };
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let c = candidate(r)?;
        if let Selection::Key { execute_time: Some(t), .. } = selection
            && c.line.execute_time != *t
        {
            continue;
        }
        out.push(c);
    }
    Ok(out)
}

/// What one replay is sent for, so that each is sent once: a key, or a message whose key the
/// routes cannot read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Key(String, String, i64),
    Message(String),
}

/// The message to send for `c` and the key it will claim: `Err` with the refusal when there
/// is none to send. A dead letter's key is the one logged; an invalid delivery's is what the
/// routes now read from the message rebuilt from the log.
fn message_for(routes: &Routes, c: &mut Candidate) -> Result<Delivery, Action> {
    if c.cut {
        return Err(Action::RefusedBodyCut);
    }
    let Some(body) = c.payload.take() else { return Err(Action::RefusedNoBody) };
    let line = &mut c.line;
    let invalid = line.outcome == "invalid";
    let rebuilt = if invalid {
        // The bizId as delivered, where the log holds it (whole, or as an excerpt to read back);
        // the execute_time of a refused delivery was not logged, so the route must find it in
        // the body or not at all.
        let biz_id = delivered_text(&line.biz_id).filter(|id| !id.is_empty());
        routes.republish(&line.topic, &c.tags, biz_id.as_deref(), None)
    } else {
        routes.republish(&line.topic, &c.tags, Some(&line.biz_id), Some(line.execute_time))
    };
    let (keys, mut properties) = match (invalid, rebuilt, c.headers.take()) {
        (_, None, _) => return Err(Action::RefusedNoRoute),
        // An invalid delivery goes out as it came, with its own KEYS and properties: what the
        // refusing route could not read, the fixed one may. Each broker's publisher leaves out
        // what its broker sets itself.
        (true, Some(_), Some(kept)) => (kept.keys, kept.properties),
        (_, Some(rebuilt), _) => rebuilt,
    };
    properties.insert(REPLAY_PROPERTY.to_owned(), line.dead_letter_msg_id.clone());
    let message = Delivery {
        topic: line.topic.clone(),
        tags: c.tags.clone(),
        keys,
        properties,
        body,
        ..Delivery::default()
    };
    if invalid {
        let key = routes
            .resolve(&message)
            .map_err(|rejection| Action::RefusedStillInvalid { reason: rejection.reason })?;
        line.biz_type = key.biz_type;
        line.biz_id = key.biz_id;
        line.execute_time = key.execute_time;
    }
    Ok(message)
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

pub use crate::broker::Publish;

/// Replays the selected deliveries of `group`: each key's latest dead letter or invalid
/// delivery (and each invalid message whose key cannot be read, once) is checked against the
/// claims and, unless refused, sent with `to` (none: a dry run): the broker's publisher, or a
/// stand-in for it. At most [`MAX_KEYS`].
pub async fn replay(
    store: &Store,
    routes: &Routes,
    group: &str,
    selection: &Selection,
    to: Option<&dyn Publish>,
) -> Result<Vec<Line>, sqlx::Error> {
    replay_through(store, routes, group, selection, to).await
}

async fn replay_through(
    store: &Store,
    routes: &Routes,
    group: &str,
    selection: &Selection,
    to: Option<&dyn Publish>,
) -> Result<Vec<Line>, sqlx::Error> {
    let mut lines = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for mut c in select(store, group, selection).await? {
        if c.line.outcome != "invalid" && c.line.biz_id.is_empty() {
            continue;
        }
        let message = message_for(routes, &mut c);
        let mut line = c.line;
        // An invalid delivery's key is known once the routes read it; until then it is its own.
        let target = match (&message, line.outcome.as_str()) {
            (Err(_), "invalid") => Target::Message(line.dead_letter_msg_id.clone()),
            _ => Target::Key(line.biz_type.clone(), line.biz_id.clone(), line.execute_time),
        };
        if !seen.insert(target) {
            continue;
        }
        // A dead letter's key is known whatever else is wrong with it, and an applied key is
        // the first thing to say; an invalid delivery's key is known once the routes read it.
        let claim = match (&message, line.outcome.as_str()) {
            (Err(_), "invalid") => None,
            _ => claim_of(store, &line).await?,
        };
        line.action = match (claim, message) {
            (Some(claim), _) => Action::RefusedClaimed {
                state: claim.state,
                claimed_at_ms: claim.claimed_at_ms,
                msg_id: claim.msg_id,
            },
            (None, Err(refusal)) => refusal,
            (None, Ok(message)) => match to {
                None => Action::WouldSend,
                Some(to) => match to.publish(&message).await {
                    Ok(uniq_key) => Action::Sent { uniq_key },
                    Err(e) => Action::Failed { error: format!("{e:#}") },
                },
            },
        };
        match &line.action {
            Action::Sent { uniq_key } => tracing::info!(
                biz_type = %line.biz_type, biz_id = %line.biz_id, %uniq_key, of = %line.dead_letter_msg_id,
                outcome = %line.outcome, "delivery replayed"
            ),
            Action::RefusedClaimed { .. } => tracing::info!(
                biz_type = %line.biz_type, biz_id = %line.biz_id, "replay refused: the key is already claimed"
            ),
            _ => {}
        }
        lines.push(line);
        if lines.len() as i64 >= MAX_KEYS {
            break;
        }
    }
    Ok(lines)
}

/// The lines as text, for the command line.
pub fn render_text(lines: &[Line], dry_run: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if lines.is_empty() {
        out.push_str("no dead letter or invalid delivery matches\n");
    }
    for l in lines {
        let what = l.action.describe(&l.topic, dry_run);
        let _ = writeln!(
            out,
            "{} {:?}{} ({} {} of {}): {what}",
            l.biz_type,
            l.biz_id,
            if l.execute_time == 0 { String::new() } else { format!(" @{}", l.execute_time) },
            l.replayed_row(),
            l.dead_letter_msg_id,
            crate::clock::format_ms(l.dead_lettered_at_ms)
        );
    }
    out
}

/// Replay from the web UI: the routes to rebuild keys with, and a publisher to the service's
/// broker started on first use.
pub struct Replayer {
    brokers: Brokers,
    routes: Routes,
    publisher: tokio::sync::OnceCell<Box<dyn Publish>>,
}

impl std::fmt::Debug for Replayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer").field("broker", &self.brokers.describe()).finish()
    }
}

impl Replayer {
    pub fn new(brokers: Brokers, routes: Routes) -> Self {
        Self { brokers, routes, publisher: tokio::sync::OnceCell::new() }
    }

    /// Replays `selection` of `group` (from the trace page: one key, or one message).
    pub async fn replay(
        &self,
        store: &Store,
        group: &str,
        selection: &Selection,
    ) -> anyhow::Result<Vec<Line>> {
        let publisher = self.publisher.get_or_try_init(|| self.brokers.publisher()).await?;
        Ok(replay(store, &self.routes, group, selection, Some(publisher.as_ref())).await?)
    }
}
