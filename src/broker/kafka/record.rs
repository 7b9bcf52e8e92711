//! A Kafka record as the gate sees it, and the headers of the copies idemgate writes.
//!
//! **Whose headers are believed.** The `idemgate-*` headers (a copy's first coordinates, its
//! retry count, when it is due) are idemgate's own only on its retry topic, which only its
//! consumer writes; on a route's topic they are a producer's words, stripped and never
//! believed, so that a producer allowed to write topic A cannot have its record run by topic
//! B's route or forge its retry count. Even on the retry topic a copy's first topic must be one
//! the routes cover: a metric's `topic` label is always a route's topic, never a header's.
//!
//! **A record the client cannot read.** The broker stores a header's name unchecked, and
//! rdkafka's own reader panics on a name that is not UTF-8; the headers are read here with
//! their names as bytes, and such a record becomes a delivery marked `unreadable`: logged
//! `invalid`, kept with its body, and acknowledged, never a stopped consumer.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;

use rdkafka::bindings::{rd_kafka_header_get_all, rd_kafka_headers_t};
use rdkafka::message::{BorrowedHeaders, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::types::RDKafkaRespErr;

use crate::delivery::{BrokerKind, Delivery, UNIQ_KEY_PROPERTY};

/// The headers a retried or dead-lettered copy carries: the record's first coordinates, its
/// creation time, its retry count, when it is due, and why it was dead-lettered.
pub(super) const TOPIC_HEADER: &str = "idemgate-topic";
pub(super) const PARTITION_HEADER: &str = "idemgate-partition";
pub(super) const OFFSET_HEADER: &str = "idemgate-offset";
pub(super) const BORN_HEADER: &str = "idemgate-born";
pub(super) const RETRIES_HEADER: &str = "idemgate-retries";
pub(super) const DUE_HEADER: &str = "idemgate-due";
pub(super) const REASON_HEADER: &str = "idemgate-reason";
pub(super) const OWN_HEADERS: [&str; 7] =
    [TOPIC_HEADER, PARTITION_HEADER, OFFSET_HEADER, BORN_HEADER, RETRIES_HEADER, DUE_HEADER, REASON_HEADER];

/// Where a record was read: a route's topic, or idemgate's retry topic, whose copies name the
/// route topic they came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReadFrom<'a> {
    /// One of the routes' topics: idemgate's own headers are stripped.
    Route,
    /// The retry topic: idemgate's own headers are believed, and a copy's first topic must be
    /// one of `routed`.
    Retry { routed: &'a BTreeSet<String> },
}

/// Every header of a record, each name as raw bytes. rdkafka's `Headers::iter` and `get`
/// unwrap a name as UTF-8 and panic on one that is not, which the broker stores unchecked.
fn raw_headers(headers: &BorrowedHeaders) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    // A `&BorrowedHeaders` is the address of librdkafka's header list, as rdkafka's own
    // `as_native_ptr` casts it.
    let native = std::ptr::from_ref(headers).cast::<rd_kafka_headers_t>();
    let count = headers.count();
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name = std::ptr::null();
        let mut value = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `native` is the header list `headers` borrows, alive and unchanged for this
        // borrow, and `idx` is below its count; librdkafka points `name` at a NUL-terminated
        // copy of the name and `value` at `size` bytes (or null), both owned by the list.
        let err = unsafe { rd_kafka_header_get_all(native, idx, &mut name, &mut value, &mut size) };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        // SAFETY: as above: a NUL-terminated name, and `size` bytes at `value` when not null.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec());
        out.push((name, value));
    }
    out
}

/// The record's headers by name; `Err` naming the first header whose name is not UTF-8.
pub(super) fn header_map(m: &OwnedMessage) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    if let Some(headers) = m.headers() {
        for (name, value) in raw_headers(headers.as_borrowed()) {
            let name = String::from_utf8(name).map_err(|e| {
                let bytes = e.as_bytes();
                let shown: String =
                    bytes.iter().take(32).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
                format!(
                    "the name of a header is not UTF-8 ({} bytes: {shown}{})",
                    bytes.len(),
                    if bytes.len() > 32 { " …" } else { "" }
                )
            })?;
            out.insert(name, value.unwrap_or_default());
        }
    }
    Ok(out)
}

pub(super) fn text(headers: &BTreeMap<String, Vec<u8>>, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| String::from_utf8(v.clone()).ok())
}

pub(super) fn number(headers: &BTreeMap<String, Vec<u8>>, name: &str) -> Option<i64> {
    text(headers, name)?.parse().ok()
}

/// The record's coordinates as a msgId: `topic-partition@offset`.
pub fn coordinates(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}-{partition}@{offset}")
}

/// A record as the gate sees it: a copy from the retry topic has its first coordinates back.
pub(crate) fn to_delivery(m: &OwnedMessage, tag_header: &str, from: ReadFrom<'_>) -> Delivery {
    let here = (m.topic().to_owned(), m.partition(), m.offset());
    let (headers, mut unreadable) = match header_map(m) {
        Ok(h) => (h, None),
        Err(why) => (BTreeMap::new(), Some(why)),
    };
    let (topic, partition, offset) = match from {
        ReadFrom::Route => here,
        ReadFrom::Retry { routed } => match text(&headers, TOPIC_HEADER) {
            Some(first) if routed.contains(&first) => (
                first,
                number(&headers, PARTITION_HEADER)
                    .and_then(|p| i32::try_from(p).ok())
                    .unwrap_or(m.partition()),
                number(&headers, OFFSET_HEADER).unwrap_or(m.offset()),
            ),
            named => {
                if unreadable.is_none() {
                    unreadable = Some(match named {
                        Some(_) => format!(
                            "a copy on the retry topic names a first topic no route covers (header {TOPIC_HEADER})"
                        ),
                        None => format!(
                            "a record on the retry topic has no {TOPIC_HEADER} header: idemgate did not write it"
                        ),
                    });
                }
                here
            }
        },
    };
    let own = |name: &str| match from {
        ReadFrom::Route => None,
        ReadFrom::Retry { .. } => number(&headers, name),
    };
    let uniq_key = text(&headers, UNIQ_KEY_PROPERTY)
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| coordinates(&topic, partition, offset));
    let tags = text(&headers, tag_header).unwrap_or_default();
    let born_at_ms = own(BORN_HEADER).or_else(|| m.timestamp().to_millis()).unwrap_or(0);
    let properties = headers
        .iter()
        .filter(|(k, _)| {
            !OWN_HEADERS.contains(&k.as_str()) && k.as_str() != UNIQ_KEY_PROPERTY && k.as_str() != tag_header
        })
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.clone()).ok()?)))
        .collect();
    Delivery {
        broker: BrokerKind::Kafka,
        msg_id: coordinates(m.topic(), m.partition(), m.offset()),
        // The first coordinates: a retry copy's are its first copy's.
        stored_copy: coordinates(&topic, partition, offset),
        uniq_key,
        topic,
        tags,
        keys: m
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .map(|k| vec![k.to_owned()])
            .unwrap_or_default(),
        properties,
        body: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        queue_id: partition,
        queue_offset: offset,
        reconsume_times: own(RETRIES_HEADER).and_then(|n| i32::try_from(n).ok()).unwrap_or(0).max(0),
        redelivered: false,
        born_at_ms,
        unreadable,
    }
}

/// The headers of a retried or dead-lettered copy of `m` (delivered as `d`): the record's own
/// headers whose names read as UTF-8, less idemgate's, then idemgate's.
pub(super) fn copy_headers(m: &OwnedMessage, d: &Delivery, extra: &[(&str, String)]) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    if let Some(h) = m.headers() {
        for (k, v) in raw_headers(h.as_borrowed()) {
            let Ok(k) = String::from_utf8(k) else { continue };
            if !OWN_HEADERS.contains(&k.as_str()) && k != UNIQ_KEY_PROPERTY {
                headers = headers.insert(Header { key: &k, value: v.as_deref() });
            }
        }
    }
    let own = [
        (TOPIC_HEADER, d.topic.clone()),
        (PARTITION_HEADER, d.queue_id.to_string()),
        (OFFSET_HEADER, d.queue_offset.to_string()),
        (BORN_HEADER, d.born_at_ms.to_string()),
        (UNIQ_KEY_PROPERTY, d.uniq_key.clone()),
    ];
    for (k, v) in own.iter().map(|(k, v)| (*k, v)).chain(extra.iter().map(|(k, v)| (*k, v))) {
        headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    headers
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;

    use super::*;

    fn record(topic: &str, partition: i32, offset: i64, headers: &[(&str, &str)]) -> OwnedMessage {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"ORDER-1".to_vec()),
            topic.to_owned(),
            Timestamp::CreateTime(1_700_000_000_000),
            partition,
            offset,
            Some(h),
        )
    }

    fn routed() -> BTreeSet<String> {
        BTreeSet::from(["shop".to_owned()])
    }

    /// The headers of a copy of `shop`-2@41 on the retry topic, its first topic `first`.
    fn copy_of(first: &str) -> Vec<(&str, &str)> {
        vec![
            (TOPIC_HEADER, first),
            (PARTITION_HEADER, "2"),
            (OFFSET_HEADER, "41"),
            (BORN_HEADER, "1699999999000"),
            (RETRIES_HEADER, "2"),
            (DUE_HEADER, "1"),
            (UNIQ_KEY_PROPERTY, "shop-2@41"),
            ("TAGS", "payment.confirm"),
        ]
    }

    #[test]
    fn a_record_is_a_delivery_at_its_coordinates() {
        let d = to_delivery(
            &record("shop", 2, 41, &[("TAGS", "order.create"), ("traceparent", "00-x")]),
            "TAGS",
            ReadFrom::Route,
        );
        assert_eq!(d.broker, BrokerKind::Kafka);
        assert_eq!((d.topic.as_str(), d.queue_id, d.queue_offset), ("shop", 2, 41));
        assert_eq!(d.msg_id, "shop-2@41");
        assert_eq!(d.uniq_key, "shop-2@41", "no UNIQ_KEY header: the coordinates");
        assert_eq!(d.tags, "order.create");
        assert_eq!(d.keys, vec!["ORDER-1"]);
        assert_eq!(d.born_at_ms, 1_700_000_000_000);
        assert_eq!(d.property("traceparent"), Some("00-x"));
        assert!(d.property("TAGS").is_none());
        assert_eq!(d.reconsume_times, 0);
        assert_eq!(d.unreadable, None);
    }

    #[test]
    fn a_retried_copy_has_its_first_coordinates_uniq_key_and_count() {
        let routed = routed();
        let d = to_delivery(
            &record("g.retry", 0, 7, &copy_of("shop")),
            "TAGS",
            ReadFrom::Retry { routed: &routed },
        );
        assert_eq!((d.topic.as_str(), d.queue_id, d.queue_offset), ("shop", 2, 41));
        assert_eq!(d.msg_id, "g.retry-0@7");
        assert_eq!(d.uniq_key, "shop-2@41");
        assert_eq!(d.reconsume_times, 2);
        assert_eq!(d.born_at_ms, 1_699_999_999_000);
        assert_eq!(d.unreadable, None);
        assert!(d.properties.keys().all(|k| !k.starts_with("idemgate-")), "{:?}", d.properties);
    }

    #[test]
    fn idemgate_s_headers_on_a_route_s_topic_are_not_believed() {
        let d = to_delivery(&record("shop", 1, 9, &copy_of("payments")), "TAGS", ReadFrom::Route);
        assert_eq!((d.topic.as_str(), d.queue_id, d.queue_offset), ("shop", 1, 9), "its own coordinates");
        assert_eq!(d.reconsume_times, 0, "a forged retry count is ignored");
        assert_eq!(d.born_at_ms, 1_700_000_000_000, "its own timestamp");
        assert_eq!(d.unreadable, None);
        assert!(d.properties.keys().all(|k| !k.starts_with("idemgate-")), "stripped: {:?}", d.properties);
    }

    #[test]
    fn a_copy_naming_a_topic_no_route_covers_is_unreadable() {
        let routed = routed();
        let d = to_delivery(
            &record("g.retry", 0, 7, &copy_of("payments")),
            "TAGS",
            ReadFrom::Retry { routed: &routed },
        );
        assert_eq!(d.topic, "g.retry", "never the header's topic");
        assert!(d.unreadable.as_deref().is_some_and(|u| u.contains("no route covers")), "{:?}", d.unreadable);
        let d = to_delivery(
            &record("g.retry", 0, 8, &[("TAGS", "x")]),
            "TAGS",
            ReadFrom::Retry { routed: &routed },
        );
        assert!(
            d.unreadable.as_deref().is_some_and(|u| u.contains("did not write it")),
            "{:?}",
            d.unreadable
        );
    }

    #[test]
    fn a_negative_retry_count_reads_as_none() {
        let routed = routed();
        let mut headers = copy_of("shop");
        headers[4] = (RETRIES_HEADER, "-5");
        let d = to_delivery(&record("g.retry", 0, 7, &headers), "TAGS", ReadFrom::Retry { routed: &routed });
        assert_eq!(d.reconsume_times, 0);
    }

    #[test]
    fn a_producer_s_uniq_key_header_wins() {
        let d = to_delivery(&record("shop", 0, 1, &[(UNIQ_KEY_PROPERTY, "U-9")]), "TAGS", ReadFrom::Route);
        assert_eq!(d.uniq_key, "U-9");
    }
}
