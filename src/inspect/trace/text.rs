//! The answer as plain text, for `idemgate trace`.

use super::answer::{Answer, Story};
use super::query::SearchBy;
use super::tally::count_text;
use crate::clock::format_ms;

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
        let cause = match &d.sub_cause {
            Some(sub) => format!("{cause}/{sub}"),
            None => cause,
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
        if let Some(why) = &d.explanation {
            let _ = writeln!(out, "      {why}");
        }
    }
    if let Some(next) = &s.next {
        let _ = writeln!(out, "  … later deliveries: --after {next}");
    }
}
