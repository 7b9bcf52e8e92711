//! The instances of the consumer groups, read from the consumer record ([`crate::instances`]):
//! each run, its state, the queues it holds now, its recent history, and the duplicates it logged
//! by cause and sub-cause. Every read is bounded in rows; the page's request in time.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::Row;

use crate::instances::{EventKind, STALE_AFTER_MS};
use crate::store::{Sql, Store};

/// The most runs shown, newest first.
pub const MAX_RUNS: i64 = 50;
/// The most events read: the history shown, and what the queues held now are worked out from.
pub const MAX_EVENTS: i64 = 1_000;
/// How far back the duplicates by cause are counted.
pub const DUPLICATES_SINCE_MS: i64 = 60 * 60 * 1_000;

/// How a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Its heartbeat is fresh.
    Running,
    /// It stopped as asked.
    Stopped,
    /// It stopped without a clean stop (marked by a later run).
    Crashed,
    /// Its heartbeat ended and no stop is on record: dead, or cut off from the database.
    Silent,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Crashed => "crashed",
            Self::Silent => "silent",
        }
    }
}

/// One run of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    pub instance_id: String,
    pub consumer_group: String,
    pub broker: String,
    pub started_at_ms: i64,
    pub heartbeat_at_ms: i64,
    pub stopped_at_ms: Option<i64>,
    pub state: RunState,
    /// The queues or partitions it holds now, as its events within the last [`MAX_EVENTS`] say
    /// (RabbitMQ's consumers share their group's one queue and name none).
    pub queues: Vec<String>,
    /// The duplicates it logged in the last hour, by `cause` or `cause/sub_cause`.
    pub duplicates: BTreeMap<String, i64>,
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunEvent {
    pub at_ms: i64,
    pub instance_id: String,
    pub consumer_group: String,
    pub kind: String,
    pub queue: String,
    pub detail: String,
}

/// The instances page's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instances {
    pub read_at_ms: i64,
    pub runs: Vec<Run>,
    /// The latest events, newest first.
    pub events: Vec<RunEvent>,
}

static RUNS: Sql = Sql::new(
    "SELECT instance_id, started_at_ms, consumer_group, broker, heartbeat_at_ms, stopped_at_ms, stop \
     FROM consumer_instance ORDER BY started_at_ms DESC LIMIT ?",
);
static EVENTS: Sql = Sql::new(
    "SELECT at_ms, instance_id, consumer_group, kind, queue, detail FROM consumer_event \
     ORDER BY at_ms DESC, id DESC LIMIT ?",
);
static DUPLICATES: Sql = Sql::new(
    "SELECT instance_id, cause, sub_cause, COUNT(*) FROM delivery_log \
     WHERE outcome = 'duplicate' AND logged_at_ms >= ? GROUP BY instance_id, cause, sub_cause",
);

/// Reads the runs, their events and their duplicates at `now_ms`.
pub async fn read(store: &Store, now_ms: i64) -> Result<Instances, sqlx::Error> {
    let rows = store.query(&RUNS).bind(MAX_RUNS).fetch_all(store.pool()).await?;
    let mut runs = Vec::with_capacity(rows.len());
    for r in &rows {
        let heartbeat_at_ms: i64 = r.try_get(4)?;
        let stop: Option<String> = r.try_get(6)?;
        let state = match stop.as_deref() {
            Some("clean") => RunState::Stopped,
            Some(_) => RunState::Crashed,
            None if heartbeat_at_ms < now_ms - STALE_AFTER_MS => RunState::Silent,
            None => RunState::Running,
        };
        runs.push(Run {
            instance_id: r.try_get(0)?,
            started_at_ms: r.try_get(1)?,
            consumer_group: r.try_get(2)?,
            broker: r.try_get(3)?,
            heartbeat_at_ms,
            stopped_at_ms: r.try_get(5)?,
            state,
            queues: Vec::new(),
            duplicates: BTreeMap::new(),
        });
    }
    let rows = store.query(&EVENTS).bind(MAX_EVENTS).fetch_all(store.pool()).await?;
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        events.push(RunEvent {
            at_ms: r.try_get(0)?,
            instance_id: r.try_get(1)?,
            consumer_group: r.try_get(2)?,
            kind: r.try_get(3)?,
            queue: r.try_get(4)?,
            detail: r.try_get(5)?,
        });
    }
    for run in runs.iter_mut().filter(|r| r.state == RunState::Running) {
        run.queues = held(run, &events);
    }
    let rows = store.query(&DUPLICATES).bind(now_ms - DUPLICATES_SINCE_MS).fetch_all(store.pool()).await?;
    for r in &rows {
        let instance: String = r.try_get(0)?;
        let cause: Option<String> = r.try_get(1)?;
        let sub_cause: Option<String> = r.try_get(2)?;
        let n: i64 = r.try_get(3)?;
        let label = match (cause, sub_cause) {
            (Some(c), Some(s)) => format!("{c}/{s}"),
            (Some(c), None) => c,
            (None, _) => "unknown".to_owned(),
        };
        // The newest run of the instance logged them (an instance id names one process at a
        // time).
        if let Some(run) = runs.iter_mut().find(|run| run.instance_id == instance) {
            *run.duplicates.entry(label).or_default() += n;
        }
    }
    Ok(Instances { read_at_ms: now_ms, runs, events })
}

/// The queues `run` holds now: those its events since its start assigned and did not revoke
/// since, oldest event first.
fn held(run: &Run, newest_first: &[RunEvent]) -> Vec<String> {
    let mut queues = BTreeSet::new();
    let mine = newest_first
        .iter()
        .rev()
        .filter(|e| e.instance_id == run.instance_id && e.at_ms >= run.started_at_ms && !e.queue.is_empty());
    for e in mine {
        match EventKind::parse(&e.kind) {
            Some(EventKind::Assigned) => {
                queues.insert(e.queue.clone());
            }
            Some(EventKind::Revoked) => {
                queues.remove(&e.queue);
            }
            _ => {}
        }
    }
    queues.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queues_held_are_those_assigned_and_not_taken_since_the_run_started() {
        let run = Run {
            instance_id: "a".into(),
            consumer_group: "g".into(),
            broker: "kafka".into(),
            started_at_ms: 100,
            heartbeat_at_ms: 1_000,
            stopped_at_ms: None,
            state: RunState::Running,
            queues: vec![],
            duplicates: BTreeMap::new(),
        };
        let e = |at_ms, instance: &str, kind: &str, queue: &str| RunEvent {
            at_ms,
            instance_id: instance.into(),
            consumer_group: "g".into(),
            kind: kind.into(),
            queue: queue.into(),
            detail: String::new(),
        };
        let newest_first = [
            e(500, "a", "revoked", "t · partition 1"),
            e(400, "b", "assigned", "t · partition 1"),
            e(300, "a", "assigned", "t · partition 1"),
            e(200, "a", "assigned", "t · partition 0"),
            e(50, "a", "assigned", "t · partition 9"),
        ];
        assert_eq!(
            held(&run, &newest_first),
            ["t · partition 0"],
            "before its start, or another's: not its own"
        );
    }
}
