//! What a search finds, as the web UI, the JSON API and `idemgate trace` show it: nothing, a
//! choice of keys, or one key's story (its dedup record, the summary of its deliveries and
//! where it stands, a page of its timeline, its business state, and the traces it belongs to).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::query::{KeyRef, SearchBy};
use crate::handler::Fact;
use crate::inspect::LogRow;
use crate::outcome::Outcome;

/// One key a search matched, for the choice list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub key: KeyRef,
    /// The key's deliveries (for a msgId or UNIQ_KEY, those of that message), read up to
    /// [`COUNT_LIMIT`](super::COUNT_LIMIT): past it, a lower bound.
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
    /// The instance that applied it: claims keep none (the log names it), so it is the
    /// instance of the claim's processed delivery on the timeline's page, or empty.
    pub instance_id: String,
    pub claimed_at_ms: i64,
    pub archived_at_ms: Option<i64>,
}

impl ClaimRecord {
    /// A claim from a row of `msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms`, and
    /// `archived_at_ms` after them when the row comes from the archive.
    pub(super) fn from_row(r: &AnyRow, state: &'static str) -> Result<Self, sqlx::Error> {
        Ok(Self {
            state,
            msg_id: r.try_get(0)?,
            uniq_key: r.try_get(1)?,
            payload_hash: crate::outcome::claim_hash_hex(&r.try_get::<String, _>(2)?),
            instance_id: r.try_get(3)?,
            claimed_at_ms: r.try_get(4)?,
            archived_at_ms: if r.len() > 5 { r.try_get(5)? } else { None },
        })
    }

    /// Names the instance from `rows` (a timeline page) when the claim does not: the one that
    /// logged the processed delivery of the claim's msgId.
    pub(super) fn instance_from(mut self, rows: &[LogRow]) -> Self {
        if self.instance_id.is_empty()
            && let Some(row) =
                rows.iter().find(|r| r.outcome == Outcome::Processed.as_str() && r.msg_id == self.msg_id)
        {
            self.instance_id = row.instance_id.clone();
        }
        self
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
    pub(crate) fn is_trouble(self) -> bool {
        !matches!(self, Self::Applied)
    }
}

/// The summary line: counts over every delivery of the key, not only the page shown. Each
/// count is read up to `count_limit`; one past it is a lower bound ("more than").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub first_seen_ms: Option<i64>,
    pub last_seen_ms: Option<i64>,
    /// The first processed delivery, else the claim.
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
    /// [`COUNT_LIMIT`](super::COUNT_LIMIT): a count above it is a lower bound.
    pub count_limit: usize,
}

/// The whole story of one key.
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub key: KeyRef,
    /// The live claim, else the latest archived one.
    pub claim: Option<ClaimRecord>,
    /// Archived claims besides the one shown (a key claimed again after archiving).
    pub earlier_claims: Vec<ClaimRecord>,
    /// One page of the timeline, oldest first, at most [`PAGE_DELIVERIES`](super::PAGE_DELIVERIES).
    pub deliveries: Vec<LogRow>,
    /// The cursor of the page of later deliveries (`after=`), when there are any.
    pub next: Option<String>,
    /// The cursor of the page of earlier deliveries (`before=`), when there are any.
    pub previous: Option<String>,
    pub summary: Summary,
    /// The business state the key's handler shows, if it shows any.
    pub business: Vec<Fact>,
    /// Set when part of this key's history lies beyond the delivery log's retention.
    pub retention_note: Option<String>,
    /// A Grafana link to the time around this key's events, when a Grafana URL is configured.
    pub grafana_url: Option<String>,
    /// The traces the deliveries of this page belong to, in the order they first appear: each
    /// W3C trace id a message's `traceparent` carried, with a link to the trace when a trace
    /// URL template is configured.
    pub traces: Vec<TraceRef>,
}

/// A trace some deliveries belong to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceRef {
    pub trace_id: String,
    /// The trace in Tempo, Jaeger or the like, from `http.trace_url_template`.
    pub url: Option<String>,
}

/// What a search found.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "found", rename_all = "snake_case")]
pub enum Answer {
    /// No key matched.
    Nothing { searched: String },
    /// Several keys matched (or the filters matched none of those found): choose one. Each
    /// candidate's deliveries are read up to `count_limit`.
    Choice {
        matched_by: SearchBy,
        candidates: Vec<Candidate>,
        more: bool,
        note: Option<String>,
        count_limit: usize,
    },
    /// Exactly one key.
    Story { matched_by: SearchBy, story: Box<Story> },
}
