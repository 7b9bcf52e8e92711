//! What a search names: its text and the kind of key the text is (a bizId, msgId, UNIQ_KEY or
//! W3C trace id), the biz_type, execute_time and group that narrow it to one claim key, and the
//! page of the timeline it asks for; each part checked before any read.

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::delivery::TraceId;
use crate::inspect::lists::{Cursor, present};
use crate::inspect::{InspectError, checked_text};
use crate::route::MAX_ID_CHARS;
use crate::store::AnyQuery;

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
        let text = checked_text(by.label_for_errors(), text, crate::inspect::MAX_SEARCH_CHARS)?;
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
            biz_type: crate::inspect::biz_type_filter(biz_type)?,
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

    pub(super) fn admits(&self, key: &KeyRef) -> bool {
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
    pub(super) fn bind(&self, q: AnyQuery) -> AnyQuery {
        crate::route::bind_key(q, &self.consumer_group, &self.biz_type, &self.biz_id, self.execute_time)
    }

    pub(super) fn from_row(r: &AnyRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            consumer_group: r.try_get(0)?,
            biz_type: r.try_get(1)?,
            biz_id: r.try_get(2)?,
            execute_time: r.try_get(3)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn searches_are_checked_before_any_read() {
        let long = "x".repeat(200);
        assert!(TraceQuery::new(&long, SearchBy::Any, None, None, None).is_err());
        assert!(TraceQuery::new("  ", SearchBy::Any, None, None, None).is_err());
        let q = TraceQuery::new("O-1", SearchBy::BizId, Some(".*"), Some(5), Some("")).unwrap();
        assert_eq!((q.biz_type, q.execute_time, q.consumer_group), (None, Some(5), None));
    }
}
