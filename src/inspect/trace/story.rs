//! One key's story read from the store: the counts of its deliveries and their summary, a page
//! of its timeline, its claims live and archived, the business state its handler shows, and the
//! retention note, Grafana link and traces around them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::answer::{ClaimRecord, Story, TraceRef};
use super::links::{grafana_link, trace_link};
use super::query::{KeyRef, PageAt};
use super::sql::{ARCHIVED_CLAIMS, LIVE_CLAIM, PAGE_DELIVERIES, Scope};
use super::tally::summarize;
use crate::archive::LogRetention;
use crate::handler::Handler;
use crate::inspect::lists::Cursor;
use crate::inspect::{Limits, LogRow};
use crate::store::Store;

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

/// The story of the deliveries `scope` names, with the page `page` of its timeline.
pub(super) async fn story(
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
    let tallies = scope.statements().tallies.read(store, &scope.args()).await?;
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
    let mut timeline = page_of(&mut rows, page, cursor_of);
    super::explain::explain(&mut timeline.rows);
    Ok(timeline)
}

/// The page of `rows` (read in the index's order from `page`'s cursor), with its neighbours.
fn page_of(rows: &mut Vec<LogRow>, page: PageAt, cursor_of: impl Fn(&LogRow) -> Cursor) -> Timeline {
    let mut rows = std::mem::take(rows);
    match page {
        PageAt::Oldest | PageAt::After(_) => {
            let later = rows.len() > PAGE_DELIVERIES;
            rows.truncate(PAGE_DELIVERIES);
            let previous = match page {
                PageAt::After(c) => Some(rows.first().map(&cursor_of).unwrap_or(c)),
                _ => None,
            };
            let next = later.then(|| rows.last().map(&cursor_of)).flatten();
            Timeline { rows, next, previous }
        }
        PageAt::Before(_) => {
            let earlier = rows.len() > PAGE_DELIVERIES;
            rows.truncate(PAGE_DELIVERIES);
            rows.reverse();
            let previous = earlier.then(|| rows.first().map(&cursor_of)).flatten();
            let next = rows.last().map(&cursor_of);
            Timeline { rows, next, previous }
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

#[cfg(test)]
mod tests {
    use super::*;

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
            stored_copy: String::new(),
            sub_cause: None,
            explanation: None,
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
}
