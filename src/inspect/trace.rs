//! A business key's whole story: its dedup record (live or archived), its deliveries oldest
//! first a page at a time, a summary of all of them, and the business state its handler owns.
//!
//! A search names a bizId, a msgId, a UNIQ_KEY or a W3C trace id ([`SearchBy::Any`] tries them
//! in that order, the trace id only for text that is one: 32 hex digits). When the text matches
//! more than one key (the same bizId under two biz_types, two execute_times or two consumer
//! groups; the messages of one trace), the answer is the list of candidates to choose from.
//!
//! A key can have millions of deliveries (a message redelivered without end, a producer
//! resending in a loop), so no read here costs what the key's size does. The keys a bizId names
//! are stepped through, one probe of `delivery_log_key` each; the summary counts every
//! delivery, each outcome, duplicate cause and collision one range of
//! `delivery_log_key_outcome`, read up to [`COUNT_LIMIT`] (a count past it is a lower bound,
//! "more than"); the timeline is a page of [`PAGE_DELIVERIES`] read in the index's order from a
//! cursor, however deep the page. A msgId, UNIQ_KEY or trace id names its keys through its own
//! index, its first [`COUNT_LIMIT`] rows at most.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::lists::{Cursor, present};
use super::{InspectError, Limits, LogRow, checked_text, log_columns};
use crate::archive::LogRetention;
use crate::clock::format_ms;
use crate::delivery::TraceId;
use crate::handler::{Fact, Handler};
use crate::outcome::{DuplicateCause, Outcome};
use crate::route::MAX_ID_CHARS;
use crate::store::{AnyQuery, Arg, Bound, Sql, Store};

/// The deliveries one page of a trace's timeline lists. A page of a hot key's deliveries that
/// are no longer in the database's cache reads a table page per delivery (they lie among the
/// other keys' traffic): a hundred keep a deep page of 3M deliveries on MariaDB under 50 ms.
pub const PAGE_DELIVERIES: usize = 100;
/// The most candidate keys a search lists.
pub(crate) const MAX_CANDIDATES: usize = 50;
/// How far each of a summary's counts is read: a count up to it is exact, one past it is a
/// lower bound. Each count is one index range of at most this many entries, so the summary of
/// a key with millions of deliveries costs what one of five thousand does: a hot key fills
/// three ranges (its duplicates, redeliveries and resends), and at 10,000 those alone kept a
/// trace on MariaDB near 50 ms.
pub const COUNT_LIMIT: usize = 5_000;

/// `n`, or "more than [`COUNT_LIMIT`]" for a count read past it.
pub(crate) fn count_text(n: usize) -> String {
    if n > COUNT_LIMIT { format!("more than {COUNT_LIMIT}") } else { n.to_string() }
}

/// What the search text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
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
    /// A W3C trace id (32 hex digits), as the message's `traceparent` carried it.
    TraceId,
}

impl SearchBy {
    pub fn parse(text: &str) -> Result<Self, InspectError> {
        match text {
            "" | "any" => Ok(Self::Any),
            "biz_id" => Ok(Self::BizId),
            "msg_id" => Ok(Self::MsgId),
            "uniq_key" => Ok(Self::UniqKey),
            "trace_id" => Ok(Self::TraceId),
            other => Err(InspectError::BadRequest(format!(
                "by={:?} is not one of any, biz_id, msg_id, uniq_key, trace_id",
                other.chars().take(20).collect::<String>()
            ))),
        }
    }

    /// The value [`SearchBy::parse`] reads back: `by=` in a link.
    pub(crate) fn param(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::BizId => "biz_id",
            Self::MsgId => "msg_id",
            Self::UniqKey => "uniq_key",
            Self::TraceId => "trace_id",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::BizId => "bizId",
            Self::MsgId => "msgId",
            Self::UniqKey => "UNIQ_KEY",
            Self::TraceId => "trace id",
        }
    }

    fn label_for_errors(self) -> &'static str {
        match self {
            Self::Any => "search text",
            other => other.label(),
        }
    }
}

/// Which page of a key's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageAt {
    /// The oldest deliveries.
    #[default]
    Oldest,
    /// The deliveries after a cursor (the page's `next`).
    After(Cursor),
    /// The deliveries before a cursor (the page's `previous`).
    Before(Cursor),
}

/// A search, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceQuery {
    pub text: String,
    pub by: SearchBy,
    pub biz_type: Option<String>,
    pub execute_time: Option<i64>,
    pub consumer_group: Option<String>,
    /// The page of the timeline to read.
    pub page: PageAt,
}

impl TraceQuery {
    /// Checks each part: lengths and characters, so that a hostile parameter is refused with
    /// its reason before any read. A trace id is 32 hex digits, not all zero; it is searched
    /// for in lowercase, as the log stores it.
    pub fn new(
        text: &str,
        by: SearchBy,
        biz_type: Option<&str>,
        execute_time: Option<i64>,
        consumer_group: Option<&str>,
    ) -> Result<Self, InspectError> {
        let text = checked_text(by.label_for_errors(), text, super::MAX_SEARCH_CHARS)?;
        if text.is_empty() {
            return Err(InspectError::BadRequest(
                "type a bizId, msgId, UNIQ_KEY or trace id to search for".to_owned(),
            ));
        }
        let text = match by {
            SearchBy::TraceId => TraceId::from_search(&text).map(|t| t.to_string()).ok_or_else(|| {
                InspectError::BadRequest(
                    "a trace id is 32 hex digits, not all zero (the second field of a traceparent)"
                        .to_owned(),
                )
            })?,
            _ => text,
        };
        Ok(Self {
            text,
            by,
            biz_type: super::biz_type_filter(biz_type)?,
            execute_time,
            consumer_group: match consumer_group.map(str::trim).filter(|g| !g.is_empty()) {
                None => None,
                Some(g) => Some(checked_text("group", g, MAX_ID_CHARS)?),
            },
            page: PageAt::Oldest,
        })
    }

    /// The same search at the timeline's page `after` or `before` a cursor (the `next` and
    /// `previous` of another page); neither means the oldest page.
    pub fn paged(mut self, after: Option<&str>, before: Option<&str>) -> Result<Self, InspectError> {
        self.page = match (present(after), present(before)) {
            (None, None) => PageAt::Oldest,
            (Some(a), None) => PageAt::After(Cursor::parse_param("after", a, "the page links")?),
            (None, Some(b)) => PageAt::Before(Cursor::parse_param("before", b, "the page links")?),
            (Some(_), Some(_)) => {
                return Err(InspectError::BadRequest("give after or before, not both".to_owned()));
            }
        };
        Ok(self)
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
    /// The key's deliveries (for a msgId or UNIQ_KEY, those of that message), read up to
    /// [`COUNT_LIMIT`]: past it, a lower bound.
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
    fn from_row(r: &AnyRow, state: &'static str) -> Result<Self, sqlx::Error> {
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
    fn instance_from(mut self, rows: &[LogRow]) -> Self {
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
    /// [`COUNT_LIMIT`]: a count above it is a lower bound.
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
    /// One page of the timeline, oldest first, at most [`PAGE_DELIVERIES`].
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

/// What a trace needs besides the store.
#[derive(Clone, Default)]
pub struct TraceContext {
    pub limits: Limits,
    /// The delivery log's retention, for the note on old history.
    pub retention: Option<LogRetention>,
    /// The Grafana dashboard's URL, such as `http://grafana:3000/d/idemgate`.
    pub grafana_url: Option<String>,
    /// The URL of a trace in Tempo, Jaeger or the like, `{trace_id}` standing for the trace id
    /// (`http.trace_url_template`, checked at load).
    pub trace_url_template: Option<String>,
    /// The URL of a message's trace in the RocketMQ dashboard, `{msg_id}` standing for the
    /// message's id (from `http.rocketmq_dashboard_url`, checked at load).
    pub dashboard_url_template: Option<String>,
    /// Handlers by biz_type, for the business state.
    pub describers: BTreeMap<String, Arc<dyn Handler>>,
}

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceContext")
            .field("limits", &self.limits)
            .field("retention", &self.retention)
            .field("grafana_url", &self.grafana_url)
            .field("trace_url_template", &self.trace_url_template)
            .field("dashboard_url_template", &self.dashboard_url_template)
            .field("describers", &self.describers.keys().collect::<Vec<_>>())
            .finish()
    }
}

// ---- the keys a search names ----------------------------------------------------------------

/// The first key of a bizId, in `delivery_log_key`'s order.
static FIRST_KEY_OF_BIZ_ID: Sql = Sql::new(
    "SELECT biz_type, consumer_group, execute_time FROM delivery_log WHERE biz_id = ? \
     ORDER BY biz_type, consumer_group, execute_time LIMIT 1",
);
/// The key of a bizId after a given one, in `delivery_log_key`'s order: the next execute_time of
/// the same biz_type and group, else the next group of the biz_type, else the next biz_type.
/// Each branch is one probe of the index, however many deliveries the key stepped over has.
static NEXT_KEY_OF_BIZ_ID: Sql = Sql::new(
    "SELECT biz_type, consumer_group, execute_time, 1 AS step FROM (SELECT biz_type, consumer_group, \
     execute_time FROM delivery_log WHERE biz_id = ? AND biz_type = ? AND consumer_group = ? \
     AND execute_time > ? ORDER BY execute_time LIMIT 1) a \
     UNION ALL SELECT biz_type, consumer_group, execute_time, 2 AS step FROM (SELECT biz_type, \
     consumer_group, execute_time FROM delivery_log WHERE biz_id = ? AND biz_type = ? \
     AND consumer_group > ? ORDER BY consumer_group, execute_time LIMIT 1) b \
     UNION ALL SELECT biz_type, consumer_group, execute_time, 3 AS step FROM (SELECT biz_type, \
     consumer_group, execute_time FROM delivery_log WHERE biz_id = ? AND biz_type > ? \
     ORDER BY biz_type, consumer_group, execute_time LIMIT 1) c \
     ORDER BY step LIMIT 1",
);
// A msgId or UNIQ_KEY names the keys of its deliveries; a message has a few, and only a message
// redelivered without end has many, so its keys are those of its first COUNT_LIMIT rows.
static LOG_KEYS_BY_MSG_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE msg_id = ? LIMIT ?) m GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
static LOG_KEYS_BY_UNIQ_KEY: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE uniq_key = ? LIMIT ?) m GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
// A trace names the keys of its messages' deliveries: a few, unless a producer sends many
// messages in one trace, so its keys are those of its first COUNT_LIMIT rows, read through
// delivery_log_trace_id. `trace_id IS NOT NULL` is that index's condition on PostgreSQL and
// SQLite, written out so that every planner matches it.
static LOG_KEYS_BY_TRACE_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE trace_id = ? AND trace_id IS NOT NULL LIMIT ?) m \
     GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
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

// ---- whose deliveries a story tells ---------------------------------------------------------

/// The rows of one key: every column of the claim key, bound in [`crate::route::bind_key`]'s
/// order. `delivery_log_key` and `delivery_log_key_outcome` lead with these columns.
macro_rules! of_key {
    () => {
        "consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?"
    };
}
/// The rows of one message without a bizId, by msgId or UNIQ_KEY, then its biz_type and group.
macro_rules! of_msg_id {
    () => {
        "msg_id = ? AND biz_id = '' AND biz_type = ? AND consumer_group = ?"
    };
}
macro_rules! of_uniq_key {
    () => {
        "uniq_key = ? AND biz_id = '' AND biz_type = ? AND consumer_group = ?"
    };
}
/// The rows of one trace, for the messages of a key without a bizId: read first through
/// `delivery_log_trace_id`, at most [`COUNT_LIMIT`] + 1 of them (a count's bound), as a derived
/// table, which no planner merges into the query around it (it has a `LIMIT`), so that none
/// reads every row of the key by another index and filters them by trace; then narrowed by
/// [`of_trace_id!`] to the key's.
macro_rules! trace_rows {
    () => {
        concat!(
            "(SELECT ",
            log_columns!(),
            " FROM delivery_log WHERE trace_id = ? AND trace_id IS NOT NULL LIMIT 5001) t"
        )
    };
}
macro_rules! of_trace_id {
    () => {
        "biz_id = '' AND biz_type = ? AND consumer_group = ?"
    };
}
/// The scope's deliveries from a cursor, `$from` the cursor's condition and the order, read
/// from `$source` (the log, or a part of it); with `$index`, MySQL/MariaDB is told to read that
/// index of the log.
macro_rules! page_of {
    ($source:expr, $scope:expr, $from:literal) => {
        Sql::new(concat!("SELECT ", log_columns!(), " FROM ", $source, " WHERE ", $scope, $from))
    };
    ($source:expr, $scope:expr, $from:literal, $index:literal) => {
        Sql::with_mysql(
            concat!("SELECT ", log_columns!(), " FROM ", $source, " WHERE ", $scope, $from),
            concat!(
                "SELECT ",
                log_columns!(),
                " FROM ",
                $source,
                " FORCE INDEX (",
                $index,
                ") WHERE ",
                $scope,
                $from
            ),
        )
    };
}

/// The statements of one [`Scope`].
struct ScopeStatements {
    oldest_first: Sql,
    newest_first: Sql,
    tallies: LazyLock<Tallies>,
    figures: LazyLock<Tallies>,
}

macro_rules! scope_statements {
    ($scope:expr $(, $index:literal)?) => {
        scope_statements!(in "delivery_log", $scope $(, $index)?)
    };
    (in $source:expr, $scope:expr $(, $index:literal)?) => {
        // The cursor's row comparison is written out, since MySQL does not use an index for
        // `(a, b) > (?, ?)`, with the bound on its first column repeated so that every planner
        // starts the index range there.
        ScopeStatements {
            oldest_first: page_of!(
                $source,
                $scope,
                " AND logged_at_ms >= ? AND (logged_at_ms > ? OR (logged_at_ms = ? AND id > ?)) \
                 ORDER BY logged_at_ms, id LIMIT ?"
                $(, $index)?
            ),
            newest_first: page_of!(
                $source,
                $scope,
                " AND logged_at_ms <= ? AND (logged_at_ms < ? OR (logged_at_ms = ? AND id < ?)) \
                 ORDER BY logged_at_ms DESC, id DESC LIMIT ?"
                $(, $index)?
            ),
            tallies: LazyLock::new(|| Tallies::summary($source, $scope)),
            figures: LazyLock::new(|| Tallies::figures($source, $scope)),
        }
    };
}

// MariaDB reads a deep page of a hot key by the key's columns alone (a `ref` read on
// `delivery_log_key`), filtering every earlier delivery, rather than as a range from the cursor;
// told to read that index, it starts the range at the cursor.
static OF_KEY: ScopeStatements = scope_statements!(of_key!(), "delivery_log_key");
static OF_MSG_ID: ScopeStatements = scope_statements!(of_msg_id!());
static OF_UNIQ_KEY: ScopeStatements = scope_statements!(of_uniq_key!());
static OF_TRACE_ID: ScopeStatements = scope_statements!(in trace_rows!(), of_trace_id!());

/// Whose deliveries a story tells: the key's, or, for a key without a bizId (a message refused
/// before its key could be read; every such message of a biz_type shares that key), the one
/// message (or the messages of the one trace) searched for.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    Key(&'a KeyRef),
    MsgId(&'a KeyRef, &'a str),
    UniqKey(&'a KeyRef, &'a str),
    TraceId(&'a KeyRef, &'a str),
}

impl<'a> Scope<'a> {
    fn statements(self) -> &'static ScopeStatements {
        match self {
            Self::Key(_) => &OF_KEY,
            Self::MsgId(..) => &OF_MSG_ID,
            Self::UniqKey(..) => &OF_UNIQ_KEY,
            Self::TraceId(..) => &OF_TRACE_ID,
        }
    }

    /// The values of the scope's condition, in its order.
    fn args(self) -> Vec<Arg> {
        match self {
            Self::Key(k) => vec![
                Arg::Text(k.consumer_group.clone()),
                Arg::Text(k.biz_type.clone()),
                Arg::Text(k.biz_id.clone()),
                Arg::Int(k.execute_time),
            ],
            Self::MsgId(k, text) | Self::UniqKey(k, text) | Self::TraceId(k, text) => vec![
                Arg::Text((*text).to_owned()),
                Arg::Text(k.biz_type.clone()),
                Arg::Text(k.consumer_group.clone()),
            ],
        }
    }

    fn key(self) -> &'a KeyRef {
        match self {
            Self::Key(key) | Self::MsgId(key, _) | Self::UniqKey(key, _) | Self::TraceId(key, _) => key,
        }
    }

    /// The statement of the timeline's page `page`: the page's rows and one more, to know
    /// whether it has a neighbour that way.
    fn page(self, page: PageAt) -> Bound {
        let statements = self.statements();
        let (name, sql, from) = match page {
            PageAt::Oldest => {
                ("timeline", &statements.oldest_first, Cursor { logged_at_ms: i64::MIN, id: i64::MIN })
            }
            PageAt::After(c) => ("timeline after", &statements.oldest_first, c),
            PageAt::Before(c) => ("timeline before", &statements.newest_first, c),
        };
        let mut args = self.args();
        args.extend([
            Arg::Int(from.logged_at_ms),
            Arg::Int(from.logged_at_ms),
            Arg::Int(from.logged_at_ms),
            Arg::Int(from.id),
            Arg::Int(i64::try_from(PAGE_DELIVERIES + 1).unwrap_or(i64::MAX)),
        ]);
        Bound::new(name, sql, args)
    }
}

// ---- the summary's counts -------------------------------------------------------------------

/// What one branch of a [`Tallies`] statement counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TallyKind {
    /// The deliveries of one outcome.
    Outcome,
    /// The duplicates of one cause (the label).
    Cause,
    /// The duplicates of one cause whose body differs from the claim's.
    Collision,
    /// Every delivery.
    All,
    /// The oldest delivery and the newest: one row each, for their times.
    First,
    Last,
}

impl TallyKind {
    const ALL: [Self; 6] = [Self::Outcome, Self::Cause, Self::Collision, Self::All, Self::First, Self::Last];

    fn name(self) -> &'static str {
        match self {
            Self::Outcome => "outcome",
            Self::Cause => "cause",
            Self::Collision => "collision",
            Self::All => "all",
            Self::First => "first",
            Self::Last => "last",
        }
    }
}

/// One branch: the rows of the scope that `condition` picks, read in the index's order up to
/// `limit`.
struct Branch {
    kind: TallyKind,
    label: &'static str,
    /// The rows it picks, for counting a few rows read at once ([`Tallies::read`]).
    pick: Pick,
    condition: String,
    order: &'static str,
    limit: i64,
}

/// Which rows a [`Branch`] picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Every,
    Outcome(Outcome),
    Cause(DuplicateCause),
    /// The duplicates of a cause whose body differs from the claim's.
    Collision(DuplicateCause),
}

impl Pick {
    fn picks(self, row: &Sampled) -> bool {
        let duplicate_of = |c: DuplicateCause| {
            row.outcome == Outcome::Duplicate.as_str() && row.cause.as_deref() == Some(c.as_str())
        };
        match self {
            Self::Every => true,
            Self::Outcome(o) => row.outcome == o.as_str(),
            Self::Cause(c) => duplicate_of(c),
            Self::Collision(c) => duplicate_of(c) && row.payload_match == Some(0),
        }
    }
}

/// A delivery of the scope as [`Tallies::read`] counts it.
struct Sampled {
    outcome: String,
    cause: Option<String>,
    payload_match: Option<i16>,
    logged_at_ms: i64,
}

/// The most deliveries of a scope counted from the rows themselves; a scope with more is counted
/// branch by branch.
const SAMPLED: usize = 200;

/// One statement of counts over a scope's deliveries: a `UNION ALL` of [`Branch`]es, each a
/// range of one index read up to its limit, so that the statement costs at most its branches
/// times [`COUNT_LIMIT`] index entries, whatever the key's size. Each row names its branch.
///
/// Most scopes hold a few deliveries: [`Tallies::read`] first reads up to [`SAMPLED`] of them in
/// one range (`sample`) and counts them here. On the log partitioned by day, every branch is a
/// read of every day's index, and planning the branches of every day costs more than reading a
/// few rows; only a scope with more deliveries than that (a hot key) runs the branches.
struct Tallies {
    branches: Vec<Branch>,
    sql: Sql,
    sample: Sql,
}

/// One row of a [`Tallies`] statement.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tally {
    kind: TallyKind,
    label: String,
    count: usize,
    first_ms: Option<i64>,
    last_ms: Option<i64>,
}

impl Tallies {
    /// The summary's counts: each outcome, the duplicates of each cause and their collisions,
    /// and the oldest and newest delivery.
    fn summary(source: &'static str, scope: &'static str) -> Self {
        let counted = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
        let branch = |kind, label, pick, condition: String| Branch {
            kind,
            label,
            pick,
            condition,
            order: "",
            limit: counted,
        };
        let mut branches: Vec<Branch> = Outcome::ALL
            .iter()
            .map(|o| {
                branch(TallyKind::Outcome, o.as_str(), Pick::Outcome(*o), format!(" AND outcome = '{o}'"))
            })
            .collect();
        // No branch asks for a cause IS NULL: the gate names a cause for every duplicate, and
        // a planner without statistics may read such a branch by delivery_log_key, filtering
        // every delivery of the key. Duplicates without a named cause are what the causes leave
        // of the exact count ([`summarize`]).
        let duplicate = Outcome::Duplicate.as_str();
        for cause in DuplicateCause::ALL {
            let is = format!(" AND outcome = '{duplicate}' AND cause = '{cause}'");
            branches.push(branch(TallyKind::Cause, cause.as_str(), Pick::Cause(*cause), is.clone()));
            branches.push(branch(
                TallyKind::Collision,
                cause.as_str(),
                Pick::Collision(*cause),
                format!("{is} AND payload_match = 0"),
            ));
        }
        branches.extend(Self::ends());
        Self::new(source, scope, branches)
    }

    /// A candidate key's figures: its deliveries, the oldest and the newest.
    fn figures(source: &'static str, scope: &'static str) -> Self {
        let counted = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
        let all = Branch {
            kind: TallyKind::All,
            label: "",
            pick: Pick::Every,
            condition: String::new(),
            order: "",
            limit: counted,
        };
        Self::new(source, scope, std::iter::once(all).chain(Self::ends()).collect())
    }

    fn ends() -> [Branch; 2] {
        let end = |kind, order| Branch {
            kind,
            label: "",
            pick: Pick::Every,
            condition: String::new(),
            order,
            limit: 1,
        };
        [
            end(TallyKind::First, " ORDER BY logged_at_ms, id"),
            end(TallyKind::Last, " ORDER BY logged_at_ms DESC, id DESC"),
        ]
    }

    fn new(source: &'static str, scope: &'static str, branches: Vec<Branch>) -> Self {
        let text = branches
            .iter()
            .map(|b| {
                format!(
                    "SELECT '{}' AS kind, '{}' AS label, COUNT(*) AS n, MIN(logged_at_ms) AS first_ms, \
                     MAX(logged_at_ms) AS last_ms FROM (SELECT logged_at_ms FROM {source} \
                     WHERE {scope}{}{} LIMIT ?) n",
                    b.kind.name(),
                    b.label,
                    b.condition,
                    b.order
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let sample =
            format!("SELECT outcome, cause, payload_match, logged_at_ms FROM {source} WHERE {scope} LIMIT ?");
        Self {
            branches,
            sql: Sql::new(Box::leak(text.into_boxed_str())),
            sample: Sql::new(Box::leak(sample.into_boxed_str())),
        }
    }

    /// The statement that reads up to [`SAMPLED`] deliveries of `scope`, and one more.
    fn sample_statement(&'static self, name: &'static str, scope: Scope<'_>) -> Bound {
        let mut args = scope.args();
        args.push(Arg::Int(i64::try_from(SAMPLED + 1).unwrap_or(i64::MAX)));
        Bound::new(name, &self.sample, args)
    }

    /// The tallies of `rows`, one per branch, as the branches' statement would give them.
    fn count(&self, rows: &[Sampled]) -> Vec<Tally> {
        self.branches
            .iter()
            .map(|b| {
                let times = rows.iter().filter(|r| b.pick.picks(r)).map(|r| r.logged_at_ms);
                let (first, last) = (times.clone().min(), times.clone().max());
                let (count, first_ms, last_ms) = match b.kind {
                    TallyKind::First => (usize::from(first.is_some()), first, first),
                    TallyKind::Last => (usize::from(last.is_some()), last, last),
                    _ => (times.count(), first, last),
                };
                Tally { kind: b.kind, label: b.label.to_owned(), count, first_ms, last_ms }
            })
            .collect()
    }

    /// The statement with its values for `scope`.
    fn statement(&'static self, name: &'static str, scope: Scope<'_>) -> Bound {
        let args =
            self.branches.iter().flat_map(|b| scope.args().into_iter().chain([Arg::Int(b.limit)])).collect();
        Bound::new(name, &self.sql, args)
    }

    async fn read(&'static self, store: &Store, scope: Scope<'_>) -> Result<Vec<Tally>, sqlx::Error> {
        let sampled = self.sample_statement("sample", scope).query(store).fetch_all(store.pool()).await?;
        if sampled.len() <= SAMPLED {
            let rows = sampled
                .iter()
                .map(|r| {
                    Ok(Sampled {
                        outcome: r.try_get(0)?,
                        cause: r.try_get(1)?,
                        payload_match: r.try_get(2)?,
                        logged_at_ms: r.try_get(3)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            return Ok(self.count(&rows));
        }
        let rows = self.statement("tallies", scope).query(store).fetch_all(store.pool()).await?;
        rows.iter()
            .map(|r| {
                let kind: String = r.try_get(0)?;
                Ok(Tally {
                    kind: TallyKind::ALL.into_iter().find(|k| k.name() == kind).ok_or_else(|| {
                        sqlx::Error::Protocol(format!("a tally of an unknown kind {kind:?}"))
                    })?,
                    label: r.try_get(1)?,
                    count: usize::try_from(r.try_get::<i64, _>(2)?).unwrap_or(0),
                    first_ms: r.try_get(3)?,
                    last_ms: r.try_get(4)?,
                })
            })
            .collect()
    }
}

// ---- the answer -----------------------------------------------------------------------------

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

fn first_key(biz_id: &str) -> Bound {
    Bound::new("first key", &FIRST_KEY_OF_BIZ_ID, vec![Arg::Text(biz_id.to_owned())])
}

/// The statement of the key after `key` among its bizId's.
fn next_key(key: &KeyRef) -> Bound {
    let text = |v: &str| Arg::Text(v.to_owned());
    let (id, biz_type, group) = (key.biz_id.as_str(), key.biz_type.as_str(), key.consumer_group.as_str());
    Bound::new(
        "next key",
        &NEXT_KEY_OF_BIZ_ID,
        vec![
            text(id),
            text(biz_type),
            text(group),
            Arg::Int(key.execute_time),
            text(id),
            text(biz_type),
            text(group),
            text(id),
            text(biz_type),
        ],
    )
}

/// The statements a trace of `key` runs on the log, with their values: the stepping through its
/// bizId's keys, its summary and a choice list's figures, and the pages of its timeline (the
/// later and earlier ones from `around_ms`).
pub fn statements(key: &KeyRef, around_ms: i64) -> Vec<Bound> {
    let scope = Scope::Key(key);
    let middle = Cursor { logged_at_ms: around_ms, id: 0 };
    vec![
        first_key(&key.biz_id),
        next_key(key),
        OF_KEY.tallies.sample_statement("summary of a few", scope),
        OF_KEY.tallies.statement("summary", scope),
        OF_KEY.figures.statement("figures", scope),
        scope.page(PageAt::Oldest),
        scope.page(PageAt::After(middle)),
        scope.page(PageAt::Before(middle)),
    ]
}

/// The statements a search by `trace_id` runs on the log, with their values: the lookup of the
/// keys its messages' deliveries name, and, for `keyless` (a key without a bizId), the summary
/// and the oldest page of the deliveries of that trace.
pub fn statements_by_trace_id(trace_id: &str, keyless: &KeyRef) -> Vec<Bound> {
    let read = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
    let scope = Scope::TraceId(keyless, trace_id);
    vec![
        Bound::new(
            "keys by trace id",
            &LOG_KEYS_BY_TRACE_ID,
            vec![Arg::Text(trace_id.to_owned()), Arg::Int(read)],
        ),
        OF_TRACE_ID.tallies.sample_statement("summary of a few", scope),
        OF_TRACE_ID.tallies.statement("summary", scope),
        scope.page(PageAt::Oldest),
    ]
}

/// Reads a bizId candidate's figures from the log: its deliveries (up to [`COUNT_LIMIT`]),
/// the oldest and the newest. A key only the claim tables know keeps its claim's time.
async fn figure(store: &Store, c: &mut Candidate) -> Result<(), sqlx::Error> {
    let tallies = OF_KEY.figures.read(store, Scope::Key(&c.key)).await?;
    let of = |kind| tallies.iter().find(|t| t.kind == kind);
    if let Some(all) = of(TallyKind::All).filter(|t| t.count > 0) {
        c.deliveries = i64::try_from(all.count).unwrap_or(i64::MAX);
        c.first_seen_ms = of(TallyKind::First).and_then(|t| t.first_ms);
        c.last_seen_ms = of(TallyKind::Last).and_then(|t| t.last_ms);
    }
    Ok(())
}

/// The story of the deliveries `scope` names, with the page `page` of its timeline.
async fn story(
    store: &Store,
    ctx: &TraceContext,
    scope: Scope<'_>,
    page: PageAt,
) -> Result<Story, sqlx::Error> {
    let key = scope.key();
    // One read after another, on the pool's connections as they come. Run at once, each on a
    // connection of its own, the same reads of a hot key took four times as long on MariaDB
    // (p50 119 ms against 35 ms, `idemgate-bench trace`, 2 cores): they compete for the
    // server's threads and its buffer pool instead of overlapping waits.
    let business = async {
        match ctx.describers.get(&key.biz_type) {
            Some(handler) if !key.biz_id.is_empty() => handler.describe(store, &key.biz_id).await,
            _ => Ok(Vec::new()),
        }
    };
    let tallies = scope.statements().tallies.read(store, scope).await?;
    let timeline = timeline(store, scope, page).await?;
    let (claim, earlier_claims) = claims(store, key).await?;
    let claim = claim.map(|c| c.instance_from(&timeline.rows));
    let business = business.await?;
    let summary = summarize(&tallies, claim.as_ref());
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
    let traces = traces_of(&timeline.rows, ctx.trace_url_template.as_deref());
    Ok(Story {
        key: key.clone(),
        claim,
        earlier_claims,
        deliveries: timeline.rows,
        next: timeline.next.map(|c| c.to_string()),
        previous: timeline.previous.map(|c| c.to_string()),
        summary,
        business,
        retention_note,
        grafana_url,
        traces,
    })
}

/// The most traces a story names: a page's deliveries mostly share one or a few.
const MAX_TRACES: usize = 20;

/// The distinct traces of `rows`, in the order they first appear, at most [`MAX_TRACES`], each
/// linked through `template` when there is one.
fn traces_of(rows: &[LogRow], template: Option<&str>) -> Vec<TraceRef> {
    let mut traces: Vec<TraceRef> = Vec::new();
    for trace_id in rows.iter().filter_map(|r| r.trace_id.as_deref()) {
        if traces.len() == MAX_TRACES {
            break;
        }
        if !traces.iter().any(|t| t.trace_id == trace_id) {
            let url = template.map(|t| trace_link(t, trace_id));
            traces.push(TraceRef { trace_id: trace_id.to_owned(), url });
        }
    }
    traces
}

/// One page of a timeline and the cursors of its neighbours.
struct Timeline {
    rows: Vec<LogRow>,
    next: Option<Cursor>,
    previous: Option<Cursor>,
}

/// The page `page` of the deliveries `scope` names, oldest first: [`PAGE_DELIVERIES`] rows read
/// from the cursor in the index's order (one more, to know whether the page has a neighbour
/// that way).
async fn timeline(store: &Store, scope: Scope<'_>, page: PageAt) -> Result<Timeline, sqlx::Error> {
    let cursor_of = |r: &LogRow| Cursor { logged_at_ms: r.logged_at_ms, id: r.id };
    let rows = scope.page(page).query(store).fetch_all(store.pool()).await?;
    let mut rows = rows.iter().map(LogRow::from_row).collect::<Result<Vec<_>, _>>()?;
    match page {
        PageAt::Oldest | PageAt::After(_) => {
            let later = rows.len() > PAGE_DELIVERIES;
            rows.truncate(PAGE_DELIVERIES);
            let previous = match page {
                PageAt::After(c) => Some(rows.first().map(cursor_of).unwrap_or(c)),
                _ => None,
            };
            let next = later.then(|| rows.last().map(cursor_of)).flatten();
            Ok(Timeline { rows, next, previous })
        }
        PageAt::Before(_) => {
            let earlier = rows.len() > PAGE_DELIVERIES;
            rows.truncate(PAGE_DELIVERIES);
            rows.reverse();
            let previous = earlier.then(|| rows.first().map(cursor_of)).flatten();
            let next = rows.last().map(cursor_of);
            Ok(Timeline { rows, next, previous })
        }
    }
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

/// The summary from a scope's tallies ([`Tallies::summary`]) and its claim. Duplicates logged
/// without a named cause (none the gate writes) count as `unknown`, when the count of
/// duplicates is exact. Which way an unclaimed key without a processed delivery stands is its
/// latest delivery that is not a duplicate; a dead letter wins a tie in the same millisecond,
/// as the last attempt.
fn summarize(tallies: &[Tally], claim: Option<&ClaimRecord>) -> Summary {
    let outcome = |o: Outcome| tallies.iter().find(|t| t.kind == TallyKind::Outcome && t.label == o.as_str());
    let count = |o: Outcome| outcome(o).map_or(0, |t| t.count);
    let mut duplicates: BTreeMap<String, usize> = tallies
        .iter()
        .filter(|t| t.kind == TallyKind::Cause && t.count > 0)
        .map(|t| (t.label.clone(), t.count))
        .collect();
    let named: usize = duplicates.values().sum();
    let all = count(Outcome::Duplicate);
    if all <= COUNT_LIMIT && all > named {
        *duplicates.entry(DuplicateCause::Unknown.as_str().to_owned()).or_insert(0) += all - named;
    }
    let end = |kind| tallies.iter().find(|t| t.kind == kind);
    let processed = count(Outcome::Processed);
    let final_state = if processed > 1 {
        FinalState::AppliedTwice
    } else if claim.is_some() || processed == 1 {
        FinalState::Applied
    } else {
        [Outcome::Failed, Outcome::Invalid, Outcome::DeadLettered]
            .into_iter()
            .filter_map(|o| outcome(o).and_then(|t| t.last_ms).map(|at| (at, o)))
            .max_by_key(|&(at, o)| (at, o == Outcome::DeadLettered))
            .map_or(FinalState::Unknown, |(_, o)| match o {
                Outcome::DeadLettered => FinalState::DeadLettered,
                Outcome::Invalid => FinalState::Invalid,
                _ => FinalState::Retrying,
            })
    };
    let claimed_at = claim.map(|c| c.claimed_at_ms);
    Summary {
        first_seen_ms: end(TallyKind::First).and_then(|t| t.first_ms).or(claimed_at),
        last_seen_ms: end(TallyKind::Last).and_then(|t| t.last_ms).or(claimed_at),
        processed_at_ms: outcome(Outcome::Processed).and_then(|t| t.first_ms).or(claimed_at),
        deliveries: Outcome::ALL.iter().map(|&o| count(o)).sum(),
        processed,
        duplicates,
        collisions: tallies.iter().filter(|t| t.kind == TallyKind::Collision).map(|t| t.count).sum(),
        retries: count(Outcome::Failed),
        dead_letters: count(Outcome::DeadLettered),
        invalid: count(Outcome::Invalid),
        final_state,
        final_state_text: final_state.describe(),
        count_limit: COUNT_LIMIT,
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

/// The link to a trace: `template` with every `{trace_id}` replaced by the id, percent-encoded
/// (a stored trace id is hex, which encoding leaves as it is; anything else is encoded).
pub fn trace_link(template: &str, trace_id: &str) -> String {
    fill_link(template, TRACE_ID_PLACEHOLDER, trace_id)
}

/// The link to a message's trace in the RocketMQ dashboard: `template` (from
/// `http.rocketmq_dashboard_url`) with every `{msg_id}` replaced by the id, percent-encoded.
pub fn message_trace_link(template: &str, msg_id: &str) -> String {
    fill_link(template, MSG_ID_PLACEHOLDER, msg_id)
}

/// `template` with every `placeholder` replaced by `id`, percent-encoded.
pub fn fill_link(template: &str, placeholder: &str, id: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
    template.replace(placeholder, &encoded)
}

/// What a trace URL template puts the trace id in place of.
pub const TRACE_ID_PLACEHOLDER: &str = "{trace_id}";
/// What a dashboard URL template puts the message's id in place of.
pub const MSG_ID_PLACEHOLDER: &str = "{msg_id}";

/// The story as plain text, for `idemgate trace`.
pub fn render_text(answer: &Answer) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    match answer {
        Answer::Nothing { searched } => {
            let _ = writeln!(out, "nothing found (searched as {searched})");
        }
        Answer::Choice { matched_by, candidates, more, note, .. } => {
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
                    count_text(usize::try_from(c.deliveries).unwrap_or(0)),
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
    let dups: Vec<String> = m.duplicates.iter().map(|(c, n)| format!("{} {c}", count_text(*n))).collect();
    let _ = writeln!(
        out,
        "first seen {} · processed {} · {} deliveries · duplicates: {} · collisions {} · retries {} · dead letters {}",
        m.first_seen_ms.map(format_ms).unwrap_or_else(|| "-".into()),
        m.processed_at_ms.map(format_ms).unwrap_or_else(|| "never".into()),
        count_text(m.deliveries),
        if dups.is_empty() { "none".to_owned() } else { dups.join(", ") },
        count_text(m.collisions),
        count_text(m.retries),
        count_text(m.dead_letters)
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
                if c.instance_id.is_empty() { "-" } else { &c.instance_id },
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
    for t in &s.traces {
        let _ = writeln!(
            out,
            "trace {}{}",
            t.trace_id,
            t.url.as_deref().map(|u| format!("  {u}")).unwrap_or_default()
        );
    }
    let _ = writeln!(out, "timeline (oldest first):");
    if let Some(previous) = &s.previous {
        let _ = writeln!(out, "  … earlier deliveries: --before {previous}");
    }
    for d in &s.deliveries {
        let cause = match (&d.cause, d.payload_match) {
            (Some(c), Some(false)) => format!(" {c} PAYLOAD DIFFERS"),
            (Some(c), _) => format!(" {c}"),
            _ => String::new(),
        };
        let at = match d.broker {
            crate::delivery::BrokerKind::RocketMq => {
                format!("{}/q{}/@{}", d.topic, d.queue_id, d.queue_offset)
            }
            other => other.position(&d.topic, &d.tags, d.queue_id, d.queue_offset),
        };
        let _ = writeln!(
            out,
            "  {}  {:<13}{}  msgId {}  UNIQ_KEY {}  {at}  reconsume {}  {} µs{}{}",
            format_ms(d.logged_at_ms),
            d.outcome,
            cause,
            d.msg_id,
            if d.uniq_key.is_empty() { "-" } else { &d.uniq_key },
            d.reconsume_times,
            d.latency_us,
            d.trace_id.as_deref().map(|t| format!("  trace {t}")).unwrap_or_default(),
            d.error.as_deref().map(|e| format!("  error: {e}")).unwrap_or_default()
        );
    }
    if let Some(next) = &s.next {
        let _ = writeln!(out, "  … later deliveries: --after {next}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(kind: TallyKind, label: &str, count: usize, first: i64, last: i64) -> Tally {
        Tally { kind, label: label.to_owned(), count, first_ms: Some(first), last_ms: Some(last) }
    }

    /// The tallies of a timeline given as (outcome, cause, at) rows.
    fn tallies_of(rows: &[(Outcome, Option<DuplicateCause>, i64)]) -> Vec<Tally> {
        let mut out = Vec::new();
        let mut add = |kind, label: &str, at: &[i64]| {
            if let (Some(first), Some(last)) = (at.iter().min(), at.iter().max()) {
                out.push(tally(kind, label, at.len(), *first, *last));
            }
        };
        for o in Outcome::ALL {
            let at: Vec<i64> = rows.iter().filter(|r| r.0 == *o).map(|r| r.2).collect();
            add(TallyKind::Outcome, o.as_str(), &at);
        }
        for c in DuplicateCause::ALL {
            let at: Vec<i64> = rows.iter().filter(|r| r.1 == Some(*c)).map(|r| r.2).collect();
            add(TallyKind::Cause, c.as_str(), &at);
        }
        let all: Vec<i64> = rows.iter().map(|r| r.2).collect();
        add(TallyKind::First, "", &all);
        add(TallyKind::Last, "", &all);
        out
    }

    #[test]
    fn a_few_rows_counted_here_give_the_tallies_the_branches_would() {
        use DuplicateCause::{ProducerResend, Redelivery};
        let row = |outcome: Outcome, cause: Option<DuplicateCause>, matched: Option<i16>, at| Sampled {
            outcome: outcome.as_str().to_owned(),
            cause: cause.map(|c| c.as_str().to_owned()),
            payload_match: matched,
            logged_at_ms: at,
        };
        let rows = [
            row(Outcome::Failed, None, None, 5),
            row(Outcome::Processed, None, None, 7),
            row(Outcome::Duplicate, Some(Redelivery), Some(1), 9),
            row(Outcome::Duplicate, Some(ProducerResend), Some(0), 3),
        ];
        let summary = Tallies::summary("delivery_log", of_key!());
        let counted = summary.count(&rows);
        assert_eq!(counted.len(), summary.branches.len(), "one tally per branch, as the statement gives");
        let find = |kind, label: &str| counted.iter().find(|t| t.kind == kind && t.label == label).unwrap();
        let failed = find(TallyKind::Outcome, "failed");
        assert_eq!((failed.count, failed.first_ms, failed.last_ms), (1, Some(5), Some(5)));
        let duplicates = find(TallyKind::Outcome, "duplicate");
        assert_eq!((duplicates.count, duplicates.first_ms, duplicates.last_ms), (2, Some(3), Some(9)));
        assert_eq!(find(TallyKind::Cause, "redelivery").count, 1);
        assert_eq!(find(TallyKind::Collision, "redelivery").count, 0);
        let collision = find(TallyKind::Collision, "producer_resend");
        assert_eq!((collision.count, collision.first_ms), (1, Some(3)));
        assert_eq!(find(TallyKind::Outcome, "dead_lettered").first_ms, None, "none: no time");
        let (first, last) = (find(TallyKind::First, ""), find(TallyKind::Last, ""));
        assert_eq!((first.count, first.first_ms, last.count, last.last_ms), (1, Some(3), 1, Some(9)));
        let figures = Tallies::figures("delivery_log", of_key!()).count(&rows);
        assert_eq!(figures[0].count, 4);
        assert!(Tallies::figures("delivery_log", of_key!()).count(&[]).iter().all(|t| t.count == 0));
    }

    #[test]
    fn the_summary_names_the_final_state_from_the_counts() {
        use DuplicateCause::Redelivery;
        use Outcome::{DeadLettered, Duplicate, Failed, Processed};
        let retried = tallies_of(&[(Failed, None, 1), (Failed, None, 2), (Processed, None, 3)]);
        let s = summarize(&retried, None);
        assert_eq!((s.final_state, s.retries, s.processed_at_ms), (FinalState::Applied, 2, Some(3)));
        assert_eq!((s.first_seen_ms, s.last_seen_ms, s.deliveries), (Some(1), Some(3), 3));

        let dead = tallies_of(&[(Failed, None, 1), (DeadLettered, None, 2)]);
        assert_eq!(summarize(&dead, None).final_state, FinalState::DeadLettered);
        let retrying = tallies_of(&[(Failed, None, 1)]);
        assert_eq!(summarize(&retrying, None).final_state, FinalState::Retrying);
        let same_moment = tallies_of(&[(Failed, None, 2), (DeadLettered, None, 2)]);
        assert_eq!(summarize(&same_moment, None).final_state, FinalState::DeadLettered);

        let twice = tallies_of(&[(Processed, None, 1), (Processed, None, 2)]);
        assert_eq!(summarize(&twice, None).final_state, FinalState::AppliedTwice);

        let dups = tallies_of(&[(Processed, None, 1), (Duplicate, Some(Redelivery), 2)]);
        let s = summarize(&dups, None);
        assert_eq!(s.duplicates.get("redelivery"), Some(&1));
        assert_eq!(s.final_state, FinalState::Applied);
    }

    #[test]
    fn counts_past_the_limit_read_as_lower_bounds() {
        let hot = [
            tally(TallyKind::Outcome, "duplicate", COUNT_LIMIT + 1, 1, 9),
            tally(TallyKind::Outcome, "processed", 2, 1, 7),
            tally(TallyKind::Cause, "redelivery", COUNT_LIMIT + 1, 2, 3),
            tally(TallyKind::Cause, "unknown", 4, 2, 3),
        ];
        let s = summarize(&hot, None);
        assert_eq!(s.final_state, FinalState::AppliedTwice);
        assert_eq!(count_text(s.deliveries), format!("more than {COUNT_LIMIT}"));
        assert_eq!(count_text(s.processed), "2");
        assert_eq!(s.duplicates.get("unknown"), Some(&4), "nothing is made up of a count read in part");

        let unnamed = [
            tally(TallyKind::Outcome, "duplicate", 7, 1, 9),
            tally(TallyKind::Cause, "redelivery", 3, 2, 3),
            tally(TallyKind::Cause, "unknown", 1, 2, 3),
        ];
        let s = summarize(&unnamed, None);
        assert_eq!(s.duplicates.get("unknown"), Some(&4), "a duplicate logged without a cause is unknown");
    }

    #[test]
    fn every_branch_of_the_summary_reads_one_key_up_to_the_limit() {
        let tallies = Tallies::summary("delivery_log", of_key!());
        let text = tallies.sql.portable();
        let branches = Outcome::ALL.len() + 2 * DuplicateCause::ALL.len() + 2;
        assert_eq!(tallies.branches.len(), branches);
        assert_eq!(text.matches(" UNION ALL ").count(), branches - 1);
        assert_eq!(text.matches(of_key!()).count(), branches);
        assert_eq!(text.matches(" LIMIT ?) n").count(), branches);
    }

    #[test]
    fn the_rows_of_a_trace_are_read_up_to_the_count_limit() {
        assert!(trace_rows!().contains(&format!(" LIMIT {}) t", COUNT_LIMIT + 1)));
        let page = OF_TRACE_ID.oldest_first.portable();
        assert!(page.starts_with(concat!("SELECT ", log_columns!(), " FROM (SELECT ")), "{page}");
        assert_eq!(page.matches('?').count(), 3 + 5, "the trace, the key's two, the cursor's five");
    }

    #[test]
    fn grafana_links_carry_the_range_and_an_encoded_biz_type() {
        assert_eq!(
            grafana_link("http://g/d/idemgate", 1, 2, "a&b"),
            "http://g/d/idemgate?from=1&to=2&var-biz_type=a%26b"
        );
        assert!(grafana_link("http://g/d/x?orgId=1", 1, 2, "t").starts_with("http://g/d/x?orgId=1&from=1"));
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn a_trace_id_search_is_32_hex_digits_searched_in_lowercase() {
        let q = TraceQuery::new(&TRACE.to_uppercase(), SearchBy::TraceId, None, None, None).unwrap();
        assert_eq!(q.text, TRACE);
        for not_one in
            ["O-1", &TRACE[1..], &"0".repeat(32), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]
        {
            let err = TraceQuery::new(not_one, SearchBy::TraceId, None, None, None).unwrap_err().to_string();
            assert!(err.contains("a trace id is 32 hex digits"), "{not_one}: {err}");
        }
        assert_eq!(SearchBy::parse("trace_id").unwrap(), SearchBy::TraceId);
        assert_eq!(SearchBy::parse(SearchBy::TraceId.param()).unwrap(), SearchBy::TraceId);
        assert!(SearchBy::parse("traceid").unwrap_err().to_string().contains("trace_id"));
    }

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

    #[test]
    fn trace_links_fill_every_placeholder_with_the_encoded_id() {
        assert_eq!(
            trace_link("https://tempo.example/explore?traceId={trace_id}", TRACE),
            format!("https://tempo.example/explore?traceId={TRACE}")
        );
        assert_eq!(trace_link("http://j/trace/{trace_id}#{trace_id}", "ab"), "http://j/trace/ab#ab");
        assert_eq!(trace_link("http://j/{trace_id}", "a\"&<b> c/"), "http://j/a%22%26%3Cb%3E+c%2F");
    }

    #[test]
    fn a_story_names_each_trace_of_its_page_once_in_order() {
        let row = |id: i64, trace_id: Option<&str>| LogRow {
            id,
            logged_at_ms: id,
            instance_id: String::new(),
            consumer_group: String::new(),
            msg_id: String::new(),
            uniq_key: String::new(),
            topic: String::new(),
            tags: String::new(),
            queue_id: 0,
            queue_offset: 0,
            reconsume_times: 0,
            biz_type: String::new(),
            biz_id: String::new(),
            execute_time: 0,
            outcome: "processed".to_owned(),
            cause: None,
            layer: None,
            payload_match: None,
            payload_hash: None,
            error: None,
            latency_us: 0,
            trace_id: trace_id.map(str::to_owned),
            broker: crate::delivery::BrokerKind::RocketMq,
            claimed_at_ms: None,
        };
        let rows = [row(1, Some("b")), row(2, None), row(3, Some("a")), row(4, Some("b"))];
        let plain = traces_of(&rows, None);
        assert_eq!(plain.iter().map(|t| t.trace_id.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert!(plain.iter().all(|t| t.url.is_none()));
        let linked = traces_of(&rows, Some("https://t/{trace_id}"));
        assert_eq!(linked[1].url.as_deref(), Some("https://t/a"));
        let many: Vec<_> = (0..100).map(|i| row(i, Some(&format!("{i:032x}")))).collect();
        assert_eq!(traces_of(&many, None).len(), MAX_TRACES);
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
