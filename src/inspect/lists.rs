//! The lists an engineer works through: recent dead letters, invalid messages and key collisions,
//! newest first, filtered by biz_type and time, paged with a cursor so that a page costs the
//! same however deep it is.

use serde::Serialize;

use super::{InspectError, Limits, LogRow, biz_type_filter, log_columns, parse_moment};
use crate::layout::Layout;
use crate::store::{Arg, Bound, Sql, Store};

/// The rows on a page unless asked otherwise, and the most a page may hold.
pub(crate) const DEFAULT_PAGE: usize = 50;
pub(crate) const MAX_PAGE: usize = 200;

/// Which list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListKind {
    /// Deliveries given up on: the body is kept for replay.
    DeadLetters,
    /// Deliveries refused before their key could be claimed.
    Invalid,
    /// Duplicates whose body differs from the claim's: the same key for different content.
    Collisions,
}

impl ListKind {
    pub const ALL: [ListKind; 3] = [ListKind::DeadLetters, ListKind::Invalid, ListKind::Collisions];

    /// The page's path segment: `/dead-letters`, `/invalid`, `/collisions`.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead-letters",
            Self::Invalid => "invalid",
            Self::Collisions => "collisions",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::DeadLetters => "Dead letters",
            Self::Invalid => "Invalid messages",
            Self::Collisions => "Key collisions",
        }
    }

    pub(crate) fn explanation(self) -> &'static str {
        match self {
            Self::DeadLetters => {
                "Deliveries given up on after their last allowed attempt, or refused for good by their \
                 handler. The key is not claimed; the body is kept for replay."
            }
            Self::Invalid => {
                "Messages refused before the claim: no key, a key that breaks the rules, or a body of the \
                 wrong shape. Each is acknowledged, so the broker does not retry it; the body is kept."
            }
            Self::Collisions => {
                "Duplicates whose body differs from the body that claimed the key: the producer reused a \
                 business key for different content. The first body won; the others were skipped."
            }
        }
    }

    fn statement(self) -> &'static Sql {
        match self {
            Self::DeadLetters | Self::Invalid => &BY_OUTCOME,
            Self::Collisions => &COLLISIONS,
        }
    }

    fn outcome(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead_lettered",
            Self::Invalid => "invalid",
            Self::Collisions => "duplicate",
        }
    }
}

/// A parameter that is there and not blank.
pub(super) fn present(v: Option<&str>) -> Option<&str> {
    v.map(str::trim).filter(|v| !v.is_empty())
}

/// Where a page starts: strictly older than this row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub logged_at_ms: i64,
    pub id: i64,
}

impl Cursor {
    pub fn parse(text: &str) -> Result<Self, InspectError> {
        Self::parse_param("before", text, "the Older link")
    }

    /// A cursor given as the parameter `name`, whose error points to `link`.
    pub(crate) fn parse_param(name: &str, text: &str, link: &str) -> Result<Self, InspectError> {
        let bad = || {
            InspectError::BadRequest(format!(
                "{name}={:?} is not a page cursor (it looks like 1764409923000-42; use {link})",
                text.chars().take(40).collect::<String>()
            ))
        };
        let (at, id) = text.trim().split_once('-').ok_or_else(bad)?;
        Ok(Self { logged_at_ms: at.parse().map_err(|_| bad())?, id: id.parse().map_err(|_| bad())? })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.logged_at_ms, self.id)
    }
}

/// A list request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub kind: ListKind,
    pub biz_type: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub before: Option<Cursor>,
    pub page_size: usize,
}

impl ListQuery {
    /// Reads the page's parameters as the UI and the API receive them (absent or empty means
    /// no filter).
    pub fn new(
        kind: ListKind,
        biz_type: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
        before: Option<&str>,
        limit: Option<&str>,
    ) -> Result<Self, InspectError> {
        let since_ms = present(since).map(|v| parse_moment("since", v)).transpose()?;
        let until_ms = present(until).map(|v| parse_moment("until", v)).transpose()?;
        if let (Some(s), Some(u)) = (since_ms, until_ms)
            && s > u
        {
            return Err(InspectError::BadRequest("since is after until".to_owned()));
        }
        let page_size = match present(limit) {
            None => DEFAULT_PAGE,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => {
                    return Err(InspectError::BadRequest(format!(
                        "limit must be a whole number from 1 to {MAX_PAGE}"
                    )));
                }
            },
        };
        Ok(Self {
            kind,
            biz_type: biz_type_filter(biz_type)?,
            since_ms,
            until_ms,
            before: present(before).map(Cursor::parse).transpose()?,
            page_size,
        })
    }

    /// The first page of `kind`, unfiltered.
    pub fn latest(kind: ListKind, page_size: usize) -> Self {
        Self { kind, biz_type: None, since_ms: None, until_ms: None, before: None, page_size }
    }
}

/// One page, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct ListPage {
    pub kind: ListKind,
    pub rows: Vec<LogRow>,
    /// The cursor of the next (older) page, when there is one.
    pub next: Option<String>,
}

/// The row key's claim time, if it is claimed now: one lookup on the claim's unique index.
macro_rules! claimed_now {
    () => {
        "(SELECT r.claimed_at_ms FROM idempotent_record_all r WHERE r.consumer_group = delivery_log.consumer_group \
         AND r.biz_type = delivery_log.biz_type AND r.biz_id = delivery_log.biz_id \
         AND r.execute_time = delivery_log.execute_time)"
    };
}

// `? = ''` switches the biz_type filter off; the cursor condition is a row comparison written
// out, since MySQL does not use an index for `(a, b) < (?, ?)`. `outcome <> 'processed'` and
// `payload_match = 0` are the conditions of the partial indexes these lists read
// (`migrations/*/0009_lighter_log_indexes.sql`), written out so that a planner can match them
// whatever outcome is bound.
static BY_OUTCOME: Sql = Sql::new(concat!(
    "SELECT ",
    log_columns!(),
    ", ",
    claimed_now!(),
    " FROM delivery_log WHERE outcome = ? AND outcome <> 'processed' AND logged_at_ms >= ? AND logged_at_ms <= ? \
     AND (? = '' OR biz_type = ?) AND (logged_at_ms < ? OR (logged_at_ms = ? AND id < ?)) \
     ORDER BY logged_at_ms DESC, id DESC LIMIT ?"
));
static COLLISIONS: Sql = Sql::new(concat!(
    "SELECT ",
    log_columns!(),
    ", ",
    claimed_now!(),
    " FROM delivery_log WHERE payload_match = 0 AND outcome = ? AND logged_at_ms >= ? AND logged_at_ms <= ? \
     AND (? = '' OR biz_type = ?) AND (logged_at_ms < ? OR (logged_at_ms = ? AND id < ?)) \
     ORDER BY logged_at_ms DESC, id DESC LIMIT ?"
));

/// Reads one page within `limits`.
pub async fn list(store: &Store, limits: &Limits, q: &ListQuery) -> Result<ListPage, InspectError> {
    limits.run(read(store, q)).await
}

/// The rows of one page, without the time limit: for a caller that sets its own.
pub(crate) async fn list_rows(store: &Store, q: ListQuery) -> Result<Vec<LogRow>, sqlx::Error> {
    Ok(read(store, &q).await?.rows)
}

/// The statement of `q`'s page with its values, on `layout`'s claim tables.
pub fn statement(layout: Layout, q: &ListQuery) -> Bound {
    let before = q.before.unwrap_or(Cursor { logged_at_ms: i64::MAX, id: i64::MAX });
    let until = q.until_ms.unwrap_or(i64::MAX).min(before.logged_at_ms);
    let biz_type = q.biz_type.clone().unwrap_or_default();
    Bound::new(
        q.kind.slug(),
        crate::layout::correlated(q.kind.statement(), layout),
        vec![
            Arg::Text(q.kind.outcome().to_owned()),
            Arg::Int(q.since_ms.unwrap_or(0)),
            Arg::Int(until),
            Arg::Text(biz_type.clone()),
            Arg::Text(biz_type),
            Arg::Int(before.logged_at_ms),
            Arg::Int(before.logged_at_ms),
            Arg::Int(before.id),
            Arg::Int(i64::try_from(q.page_size + 1).unwrap_or(i64::MAX)),
        ],
    )
}

async fn read(store: &Store, q: &ListQuery) -> Result<ListPage, sqlx::Error> {
    let layout = crate::layout::current(store).await?;
    let rows = statement(layout, q).query(store).fetch_all(store.pool()).await?;
    let mut rows = rows.iter().map(LogRow::from_row).collect::<Result<Vec<_>, _>>()?;
    let next = (rows.len() > q.page_size).then(|| {
        rows.truncate(q.page_size);
        rows.last().map(|r| Cursor { logged_at_ms: r.logged_at_ms, id: r.id }.to_string())
    });
    Ok(ListPage { kind: q.kind, rows, next: next.flatten() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_explained() {
        let c = Cursor { logged_at_ms: 1_764_409_923_000, id: 42 };
        assert_eq!(Cursor::parse(&c.to_string()).unwrap(), c);
        assert!(
            Cursor::parse("'; DROP TABLE delivery_log; --").unwrap_err().to_string().contains("page cursor")
        );
    }

    #[test]
    fn list_parameters_are_checked() {
        let q = ListQuery::new(ListKind::DeadLetters, Some(".*"), Some(""), None, None, Some("10")).unwrap();
        assert_eq!((q.biz_type, q.page_size), (None, 10));
        assert!(ListQuery::new(ListKind::Invalid, None, None, None, None, Some("100000")).is_err());
        assert!(
            ListQuery::new(
                ListKind::Invalid,
                None,
                Some("2026-11-29T10:00"),
                Some("2026-11-28T10:00"),
                None,
                None
            )
            .is_err()
        );
    }
}
