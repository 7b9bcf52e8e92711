//! What happened, in words, for each duplicate of a key's timeline: the evidence its cause was
//! named from, held against the delivery that applied the key before it (the latest
//! `processed` row of the same key before it, on the same page).

use crate::clock::format_ms;
use crate::delivery::BrokerKind;
use crate::inspect::LogRow;
use crate::outcome::{DuplicateCause, RedeliveryCause};

/// Fills in the explanation of each duplicate among `rows` (a key's timeline, oldest first).
pub(crate) fn explain(rows: &mut [LogRow]) {
    for i in 0..rows.len() {
        if rows[i].outcome != "duplicate" {
            continue;
        }
        let applied = rows[..i].iter().rev().find(|r| r.outcome == "processed" && same_key(r, &rows[i]));
        rows[i].explanation = Some(sentence(&rows[i], applied));
    }
}

fn same_key(a: &LogRow, b: &LogRow) -> bool {
    a.biz_type == b.biz_type
        && a.biz_id == b.biz_id
        && a.execute_time == b.execute_time
        && a.consumer_group == b.consumer_group
}

/// The stored copy in the broker's words.
fn copy(r: &LogRow) -> String {
    match r.broker {
        BrokerKind::RocketMq => format!("msgId {}", r.stored_copy),
        BrokerKind::Kafka => format!("record {}", r.stored_copy),
        BrokerKind::RabbitMq => format!("message-id {}", r.uniq_key),
    }
}

fn sentence(dup: &LogRow, applied: Option<&LogRow>) -> String {
    let cause = dup.cause.as_deref().and_then(DuplicateCause::parse).unwrap_or(DuplicateCause::Unknown);
    let by = |a: &LogRow| {
        format!("the delivery applied at {} by instance {}", format_ms(a.logged_at_ms), a.instance_id)
    };
    let against =
        applied.map_or_else(|| "the delivery that applied the key (not on this page)".to_owned(), by);
    match cause {
        DuplicateCause::Redelivery => {
            let evidence = match dup.broker {
                BrokerKind::RabbitMq => "RabbitMQ flagged it redelivered".to_owned(),
                _ => format!("the same stored copy ({}) as {against}", copy(dup)),
            };
            let what = match dup.sub_cause.as_deref().and_then(RedeliveryCause::parse) {
                Some(sub) => format!("{} ({sub})", sub.meaning()),
                None => {
                    "what the broker did is read from the consumer record a few seconds after the delivery"
                        .to_owned()
                }
            };
            format!("Redelivery: {evidence}; {what}.")
        }
        DuplicateCause::ProducerRetry => {
            let other = applied.map_or_else(String::new, |a| match dup.broker {
                BrokerKind::RabbitMq => String::new(),
                _ => format!(" ({} against {})", copy(dup), copy(a)),
            });
            format!(
                "Producer retry: the same id {} as {against}, on another stored copy{other}, not flagged redelivered: the producer's client sent the same message again.",
                dup.uniq_key
            )
        }
        DuplicateCause::ProducerResend => format!(
            "Producer resend: a new id {}{} for the same business key: the application sent the event again as a new message.",
            dup.uniq_key,
            applied.map_or_else(String::new, |a| format!(" where {against} carried {}", a.uniq_key))
        ),
        other => format!("{}: {}.", other.as_str().replace('_', " "), other.meaning()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, outcome: &str, cause: Option<&str>, copy: &str, uniq: &str) -> LogRow {
        LogRow {
            id,
            logged_at_ms: id * 1_000,
            instance_id: format!("i{id}"),
            consumer_group: "g".into(),
            msg_id: copy.into(),
            uniq_key: uniq.into(),
            topic: "orders".into(),
            tags: String::new(),
            queue_id: 3,
            queue_offset: 1_042,
            reconsume_times: 0,
            biz_type: "order".into(),
            biz_id: "7".into(),
            execute_time: 0,
            outcome: outcome.into(),
            cause: cause.map(str::to_owned),
            layer: None,
            payload_match: None,
            payload_hash: None,
            error: None,
            latency_us: 0,
            trace_id: None,
            broker: BrokerKind::RocketMq,
            stored_copy: copy.into(),
            sub_cause: None,
            explanation: None,
            claimed_at_ms: None,
        }
    }

    #[test]
    fn each_duplicate_is_told_against_the_delivery_that_applied_its_key() {
        let mut rows = vec![
            row(1, "processed", None, "C1", "U1"),
            row(2, "duplicate", Some("redelivery"), "C1", "U1"),
            row(3, "duplicate", Some("producer_retry"), "C2", "U1"),
            row(4, "duplicate", Some("producer_resend"), "C3", "U2"),
        ];
        rows[1].sub_cause = Some("rebalance".into());
        explain(&mut rows);
        assert_eq!(rows[0].explanation, None);
        let said = |i: usize| rows[i].explanation.clone().unwrap_or_default();
        assert!(
            said(1).contains("the same stored copy (msgId C1)") && said(1).contains("by instance i1"),
            "{}",
            said(1)
        );
        assert!(said(1).contains("(rebalance)"), "{}", said(1));
        assert!(said(2).contains("msgId C2 against msgId C1"), "{}", said(2));
        assert!(said(3).contains("a new id U2") && said(3).contains("carried U1"), "{}", said(3));
    }
}
