//! `/`: the ops overview.

use askama::Template;
use axum::extract::State;
use axum::response::Response;

use super::problem::ApiError;
use super::problem::Problem;
use super::state::AppState;
use super::view::json;
use super::view::{RowView, RunView, href, render};
use crate::broker::lag::{LagReading, TopicLag};
use crate::clock::format_ms;
use crate::inspect::overview::{self, Minute, Overview, Window};
use crate::inspect::{InspectError, LogRow};
use axum::Router;
use axum::routing::get;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/", get(overview_page)).route("/api/overview", get(overview))
}

/// One window's figures, formatted.
struct WindowView {
    label: &'static str,
    /// What the rates are over when the log covers less than the window, or nothing yet.
    coverage: String,
    deliveries: i64,
    throughput: String,
    conflicts: String,
    duplicate_ratio: String,
    duplicates: i64,
    retries: i64,
    dead_letters: i64,
    invalid: i64,
    collisions: i64,
}

impl WindowView {
    fn new(w: &Window) -> Self {
        let coverage = if w.covered_seconds == 0.0 {
            "no deliveries logged yet".to_owned()
        } else if w.is_partial() {
            format!("rates over the last {} (all the data there is)", span(w.covered_seconds))
        } else {
            String::new()
        };
        Self {
            label: w.label,
            coverage,
            deliveries: w.deliveries,
            throughput: format!("{:.1}/s", w.deliveries_per_second),
            conflicts: format!("{:.2}/s", w.conflicts_per_second),
            duplicate_ratio: format!("{:.1}%", w.duplicate_ratio * 100.0),
            duplicates: w.duplicates,
            retries: w.retries,
            dead_letters: w.dead_letters,
            invalid: w.invalid,
            collisions: w.collisions,
        }
    }
}

/// A time the log covers, as a card says it: `30 s`, `4 min 30 s`, `12 min`.
fn span(seconds: f64) -> String {
    let s = seconds.round() as i64;
    match (s / 60, s % 60) {
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) if m < 10 => format!("{m} min {s} s"),
        (m, _) => format!("{m} min"),
    }
}

/// One topic's consumer lag, as the latest reading found it.
struct LagView {
    topic: String,
    messages: i64,
    /// The oldest unconsumed message's age, or why it is not known.
    age: String,
    /// Queues that lag, of the queues read, in the broker's words.
    queues: String,
    result: &'static str,
    problem: String,
}

impl LagView {
    fn new(t: &TopicLag, reading: &LagReading) -> Self {
        let read_at_ms = reading.read_at_ms;
        Self {
            topic: t.topic.clone(),
            messages: t.messages(),
            age: match t.age_seconds(read_at_ms) {
                Some(s) if s < 1.0 && t.messages() == 0 => "nothing waiting".to_owned(),
                Some(s) => span(s),
                None => "unknown".to_owned(),
            },
            queues: reading.queues_in_words(t),
            result: t.result.as_str(),
            problem: t.problem.clone().unwrap_or_default(),
        }
    }
}

/// A bar of the per-minute chart: SVG coordinates, drawn on the server.
struct Bar {
    x: i64,
    /// Top and height of the whole bar (all deliveries), of its duplicate part and of its
    /// retry and dead-letter part.
    y: i64,
    h: i64,
    dup_y: i64,
    dup_h: i64,
    bad_y: i64,
    bad_h: i64,
    title: String,
}

const CHART_HEIGHT: i64 = 90;
const BAR_WIDTH: i64 = 10;

fn bars(minutes: &[Minute]) -> (Vec<Bar>, i64) {
    let peak = minutes.iter().map(|m| m.deliveries).max().unwrap_or(0).max(1);
    let scale = |n: i64| if n == 0 { 0 } else { (n * CHART_HEIGHT / peak).max(1) };
    let bars = minutes
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let h = scale(m.deliveries);
            let dup_h = scale(m.duplicates).min(h);
            let bad_h = scale(m.retries + m.dead_letters).min(h - dup_h);
            let time = chrono::DateTime::from_timestamp_millis(m.start_ms)
                .map(|t| t.format("%H:%M").to_string())
                .unwrap_or_default();
            Bar {
                x: i as i64 * BAR_WIDTH,
                y: CHART_HEIGHT - h,
                h,
                dup_y: CHART_HEIGHT - dup_h,
                dup_h,
                bad_y: CHART_HEIGHT - dup_h - bad_h,
                bad_h,
                title: format!(
                    "{time} UTC: {} deliveries, {} duplicates, {} retries, {} dead letters",
                    m.deliveries, m.duplicates, m.retries, m.dead_letters
                ),
            }
        })
        .collect();
    (bars, peak)
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage<'a> {
    title: String,
    search: &'a str,
    now: String,
    windows: Vec<WindowView>,
    bars: Vec<Bar>,
    peak: i64,
    chart_width: i64,
    chart_height: i64,
    top_conflicts: Vec<(String, i64)>,
    dead_letters: Vec<RowView>,
    collisions: Vec<RowView>,
    invalid: Vec<RowView>,
    archive_enabled: bool,
    archive_schedule: String,
    archive_next: String,
    archive_runs: Vec<RunView>,
    /// The latest reconcile run: when, and (kind, count, link) per kind; empty before any run.
    reconcile_when: String,
    reconcile_counts: Vec<(String, i64, String)>,
    /// When this instance last read the consumer lag; empty when it has not (no broker, or
    /// `broker.lag_interval_seconds` 0, or not yet).
    lag_when: String,
    lag: Vec<LagView>,
}

pub(super) async fn overview_page(State(state): State<AppState>) -> Result<Response, Problem> {
    let o = read_overview(&state).await?;
    let (bars, peak) = bars(&o.minutes);
    let links = state.web.trace.trace_url_template.as_deref();
    let rows = |rows: &[LogRow]| rows.iter().map(|r| RowView::new(r, links)).collect::<Vec<_>>();
    let lag = state.metrics.consumer_lag();
    let page = OverviewPage {
        title: "Overview".to_owned(),
        search: "",
        now: format_ms(o.now_ms),
        windows: vec![WindowView::new(&o.last_5_minutes), WindowView::new(&o.last_hour)],
        chart_width: bars.len() as i64 * BAR_WIDTH,
        chart_height: CHART_HEIGHT,
        bars,
        peak,
        top_conflicts: o.top_conflicts.iter().map(|c| (c.biz_type.clone(), c.duplicates)).collect(),
        dead_letters: rows(&o.latest_dead_letters),
        collisions: rows(&o.latest_collisions),
        invalid: rows(&o.latest_invalid),
        archive_enabled: o.archive.enabled,
        archive_schedule: o.archive.schedule.clone(),
        archive_next: o.archive.next_run_ms.map(format_ms).unwrap_or_else(|| "not scheduled".to_owned()),
        archive_runs: o.archive.runs.iter().take(4).map(RunView::new).collect(),
        reconcile_when: o
            .reconcile
            .as_ref()
            .map(|r| format_ms(r.run.finished_at_ms.unwrap_or(r.run.started_at_ms)))
            .unwrap_or_default(),
        reconcile_counts: o
            .reconcile
            .as_ref()
            .map(|r| {
                r.counts
                    .iter()
                    .map(|(k, n)| {
                        (
                            k.as_str().replace('_', " "),
                            *n,
                            href("/anomalies", &[("kind", k.as_str().to_owned())]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        lag_when: lag.as_ref().map(|r| format_ms(r.read_at_ms)).unwrap_or_default(),
        lag: lag.iter().flat_map(|r| r.topics.iter().map(|t| LagView::new(t, r))).collect(),
    };
    Ok(render(&page))
}

pub(super) async fn read_overview(state: &AppState) -> Result<Overview, InspectError> {
    overview::overview(&state.store, &state.web.trace.limits, &state.web.archive, crate::clock::now_ms())
        .await
}

// ---- the JSON API --------------------------------------------------------------------------

async fn overview(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&read_overview(&state).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_covered_span_reads_in_seconds_then_minutes() {
        assert_eq!(span(30.4), "30 s");
        assert_eq!(span(270.0), "4 min 30 s");
        assert_eq!(span(240.0), "4 min");
        assert_eq!(span(725.0), "12 min");
    }
}
