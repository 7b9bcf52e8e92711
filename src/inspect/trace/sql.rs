//! The statements a trace runs on the log and the claim tables: the lookups of the keys a search
//! names and of a key's claims, and, for each scope a story tells (a key, or the one message or
//! trace of a key without a bizId), the pages of its timeline and the statements of its counts.

use std::sync::LazyLock;

use super::query::{KeyRef, PageAt};
use super::tally::{COUNT_LIMIT, Tallies};
use crate::inspect::lists::Cursor;
use crate::inspect::log_columns;
use crate::store::{Arg, Bound, Sql};

/// The deliveries one page of a trace's timeline lists. A page of a hot key's deliveries that
/// are no longer in the database's cache reads a table page per delivery (they lie among the
/// other keys' traffic): a hundred keep a deep page of 3M deliveries on MariaDB under 50 ms.
pub const PAGE_DELIVERIES: usize = 100;

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
pub(super) static LOG_KEYS_BY_MSG_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE msg_id = ? LIMIT ?) m GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
pub(super) static LOG_KEYS_BY_UNIQ_KEY: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE uniq_key = ? LIMIT ?) m GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
// A trace names the keys of its messages' deliveries: a few, unless a producer sends many
// messages in one trace, so its keys are those of its first COUNT_LIMIT rows, read through
// delivery_log_trace_id. `trace_id IS NOT NULL` is that index's condition on PostgreSQL and
// SQLite, written out so that every planner matches it.
pub(super) static LOG_KEYS_BY_TRACE_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM (SELECT consumer_group, biz_type, biz_id, execute_time, logged_at_ms FROM delivery_log \
     WHERE trace_id = ? AND trace_id IS NOT NULL LIMIT ?) m \
     GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
pub(super) static LIVE_KEYS_BY_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, claimed_at_ms FROM idempotent_record_all \
     WHERE biz_id = ? LIMIT 51",
);
pub(super) static ARCHIVED_KEYS_BY_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, MAX(claimed_at_ms) FROM idempotent_record_archive \
     WHERE biz_id = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
pub(super) static LIVE_CLAIM: Sql = Sql::new(
    "SELECT msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms FROM idempotent_record_all \
     WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?",
);
pub(super) static ARCHIVED_CLAIMS: Sql = Sql::new(
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
pub(super) struct ScopeStatements {
    oldest_first: Sql,
    newest_first: Sql,
    pub(super) tallies: LazyLock<Tallies>,
    pub(super) figures: LazyLock<Tallies>,
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
pub(super) static OF_KEY: ScopeStatements = scope_statements!(of_key!(), "delivery_log_key");
static OF_MSG_ID: ScopeStatements = scope_statements!(of_msg_id!());
static OF_UNIQ_KEY: ScopeStatements = scope_statements!(of_uniq_key!());
static OF_TRACE_ID: ScopeStatements = scope_statements!(in trace_rows!(), of_trace_id!());

/// Whose deliveries a story tells: the key's, or, for a key without a bizId (a message refused
/// before its key could be read; every such message of a biz_type shares that key), the one
/// message (or the messages of the one trace) searched for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scope<'a> {
    Key(&'a KeyRef),
    MsgId(&'a KeyRef, &'a str),
    UniqKey(&'a KeyRef, &'a str),
    TraceId(&'a KeyRef, &'a str),
}

impl<'a> Scope<'a> {
    pub(super) fn statements(self) -> &'static ScopeStatements {
        match self {
            Self::Key(_) => &OF_KEY,
            Self::MsgId(..) => &OF_MSG_ID,
            Self::UniqKey(..) => &OF_UNIQ_KEY,
            Self::TraceId(..) => &OF_TRACE_ID,
        }
    }

    /// The values of the scope's condition, in its order.
    pub(super) fn args(self) -> Vec<Arg> {
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

    pub(super) fn key(self) -> &'a KeyRef {
        match self {
            Self::Key(key) | Self::MsgId(key, _) | Self::UniqKey(key, _) | Self::TraceId(key, _) => key,
        }
    }

    /// The statement of the timeline's page `page`: the page's rows and one more, to know
    /// whether it has a neighbour that way.
    pub(super) fn page(self, page: PageAt) -> Bound {
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

pub(super) fn first_key(biz_id: &str) -> Bound {
    Bound::new("first key", &FIRST_KEY_OF_BIZ_ID, vec![Arg::Text(biz_id.to_owned())])
}

/// The statement of the key after `key` among its bizId's.
pub(super) fn next_key(key: &KeyRef) -> Bound {
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
        OF_KEY.tallies.sample_statement("summary of a few", scope.args()),
        OF_KEY.tallies.statement("summary", &scope.args()),
        OF_KEY.figures.statement("figures", &scope.args()),
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
        OF_TRACE_ID.tallies.sample_statement("summary of a few", scope.args()),
        OF_TRACE_ID.tallies.statement("summary", &scope.args()),
        scope.page(PageAt::Oldest),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_of_a_trace_are_read_up_to_the_count_limit() {
        assert!(trace_rows!().contains(&format!(" LIMIT {}) t", COUNT_LIMIT + 1)));
        let page = OF_TRACE_ID.oldest_first.portable();
        assert!(page.starts_with(concat!("SELECT ", log_columns!(), " FROM (SELECT ")), "{page}");
        assert_eq!(page.matches('?').count(), 3 + 5, "the trace, the key's two, the cursor's five");
    }
}
