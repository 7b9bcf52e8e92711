//! `[kafka]`: where the brokers are, the retry and dead-letter topics, how long a retry waits,
//! how many records one batch holds, and whether idemgate creates the topics it uses.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::setting::{Invalid, invalid};

/// `[kafka]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// `IDEMGATE_KAFKA__BOOTSTRAP_SERVERS`: `host:port[,host:port]`.
    pub bootstrap_servers: String,
    /// `IDEMGATE_KAFKA__RETRY_TOPIC`: where a delivery the gate asked to retry is written,
    /// to be read again after `retry_delay_ms`; empty: `<group>.retry`. A consumer of its own,
    /// in the group `<group>.retry`, reads it.
    pub retry_topic: String,
    /// `IDEMGATE_KAFKA__DEAD_LETTER_TOPIC`: where a dead letter is written, body, key and
    /// headers kept; empty: `<group>.dlt`.
    pub dead_letter_topic: String,
    /// `IDEMGATE_KAFKA__RETRY_DELAY_MS`: how long a retried record waits in the retry topic.
    pub retry_delay_ms: u32,
    /// `IDEMGATE_KAFKA__MAX_POLL_RECORDS`: records taken into one batch at most. A batch's
    /// verdicts all come before its offsets are committed; with group commit, its fresh
    /// deliveries share transactions.
    pub max_poll_records: u32,
    /// `IDEMGATE_KAFKA__TAG_HEADER`: the record header read as the delivery's tag (what
    /// routes match with `tags`); records without it have none.
    pub tag_header: String,
    /// `IDEMGATE_KAFKA__CREATE_TOPICS`: create the routes' topics and the retry and dead-letter
    /// topics at start when they are missing (and `produce`'s topic on first send), with
    /// `topic_partitions` partitions. Off: they must exist.
    pub create_topics: bool,
    /// `IDEMGATE_KAFKA__TOPIC_PARTITIONS`: partitions of a topic idemgate creates.
    pub topic_partitions: u32,
    /// `IDEMGATE_KAFKA__SESSION_TIMEOUT_MS`: how long the group coordinator waits for a
    /// silent member before it hands the member's partitions to the others.
    pub session_timeout_ms: u32,
    /// `IDEMGATE_KAFKA__REQUEST_TIMEOUT_MS`: the longest a send, a commit, a lag reading's
    /// request or a topic's creation may take.
    pub request_timeout_ms: u32,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            bootstrap_servers: "127.0.0.1:9092".to_owned(),
            retry_topic: String::new(),
            dead_letter_topic: String::new(),
            retry_delay_ms: 5_000,
            max_poll_records: 64,
            tag_header: "TAGS".to_owned(),
            create_topics: true,
            topic_partitions: 3,
            session_timeout_ms: 30_000,
            request_timeout_ms: 10_000,
        }
    }
}

/// Kafka's limit on a topic name.
const MAX_TOPIC_CHARS: usize = 249;

/// Checks a topic name by Kafka's rule: ASCII letters, digits, `.`, `_` and `-`, at most 249,
/// not `.` or `..`.
pub fn check_topic(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err("is empty, \".\" or \"..\"".to_owned());
    }
    if name.len() > MAX_TOPIC_CHARS {
        return Err(format!("is longer than {MAX_TOPIC_CHARS} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err("may hold only ASCII letters, digits, '.', '_' and '-'".to_owned());
    }
    Ok(())
}

impl KafkaSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.bootstrap_servers.trim().is_empty()
            || self.bootstrap_servers.split(',').any(|s| !s.trim().contains(':'))
        {
            return Err(invalid("kafka.bootstrap_servers", "must be host:port[,host:port]"));
        }
        for (key, topic) in
            [("kafka.retry_topic", &self.retry_topic), ("kafka.dead_letter_topic", &self.dead_letter_topic)]
        {
            if !topic.is_empty() {
                check_topic(topic).map_err(|why| invalid(key, format!("{topic:?} {why}")))?;
            }
        }
        if !(100..=3_600_000).contains(&self.retry_delay_ms) {
            return Err(invalid("kafka.retry_delay_ms", "must be between 100 and 3600000"));
        }
        if !(1..=1_000).contains(&self.max_poll_records) {
            return Err(invalid("kafka.max_poll_records", "must be between 1 and 1000"));
        }
        if self.tag_header.is_empty() || self.tag_header.chars().any(char::is_control) {
            return Err(invalid("kafka.tag_header", "must be a header name"));
        }
        if !(1..=1_000).contains(&self.topic_partitions) {
            return Err(invalid("kafka.topic_partitions", "must be between 1 and 1000"));
        }
        if !(1_000..=300_000).contains(&self.session_timeout_ms) {
            return Err(invalid("kafka.session_timeout_ms", "must be between 1000 and 300000"));
        }
        if !(100..=120_000).contains(&self.request_timeout_ms) {
            return Err(invalid("kafka.request_timeout_ms", "must be between 100 and 120000"));
        }
        Ok(())
    }

    /// The retry topic of `group`.
    pub fn retry_topic_of(&self, group: &str) -> String {
        if self.retry_topic.is_empty() { format!("{group}.retry") } else { self.retry_topic.clone() }
    }

    /// The dead-letter topic of `group`.
    pub fn dead_letter_topic_of(&self, group: &str) -> String {
        if self.dead_letter_topic.is_empty() {
            format!("{group}.dlt")
        } else {
            self.dead_letter_topic.clone()
        }
    }

    pub fn describe(&self) -> String {
        format!("Kafka at {}", self.bootstrap_servers)
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.request_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_name_the_group_s_topics() {
        let s = KafkaSettings::default();
        s.validate().unwrap();
        assert_eq!(s.retry_topic_of("g"), "g.retry");
        assert_eq!(s.dead_letter_topic_of("g"), "g.dlt");
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        let base = KafkaSettings::default();
        let cases = [
            (KafkaSettings { bootstrap_servers: "".into(), ..base.clone() }, "kafka.bootstrap_servers"),
            (KafkaSettings { bootstrap_servers: "a:1,b".into(), ..base.clone() }, "kafka.bootstrap_servers"),
            (KafkaSettings { retry_topic: "a b".into(), ..base.clone() }, "kafka.retry_topic"),
            (KafkaSettings { dead_letter_topic: "..".into(), ..base.clone() }, "kafka.dead_letter_topic"),
            (KafkaSettings { retry_delay_ms: 1, ..base.clone() }, "kafka.retry_delay_ms"),
            (KafkaSettings { max_poll_records: 0, ..base.clone() }, "kafka.max_poll_records"),
            (KafkaSettings { tag_header: "".into(), ..base.clone() }, "kafka.tag_header"),
            (KafkaSettings { topic_partitions: 0, ..base.clone() }, "kafka.topic_partitions"),
            (KafkaSettings { session_timeout_ms: 10, ..base.clone() }, "kafka.session_timeout_ms"),
            (KafkaSettings { request_timeout_ms: 0, ..base.clone() }, "kafka.request_timeout_ms"),
        ];
        for (s, key) in cases {
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }
}
