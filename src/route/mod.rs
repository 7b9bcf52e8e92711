//! Routing and key extraction: which business key a delivery claims, configured per topic and
//! tag.
//!
//! A route says which `biz_type` a topic/tag carries, where the `biz_id` comes from (the message
//! KEYS, a property, or a JSON field of the body) and where the optional `execute_time` of a
//! delayed message comes from, in the grammar every reader of a delivery shares
//! ([`crate::delivery::value`]). Everything that can be wrong with a delivery's key is found
//! here and described in a reason an engineer can act on; the gate logs it as `invalid`.
//!
//! The limits and the character rules of keys are [`key`]'s. This module must not touch the
//! database.

mod key;

use serde::{Deserialize, Serialize};

pub use key::BizKey;
pub use key::{MAX_BIZ_ID_CHARS, MAX_BIZ_TYPE_CHARS, MAX_ID_CHARS, check_key_text, excerpt};
pub(crate) use key::{MAX_TOPIC_CHARS, bind_key, delivered_text, stored_id, stored_key};

use crate::delivery::Delivery;
use crate::delivery::value::{Body, Source};
use crate::setting::{Invalid, invalid};

/// A route as written in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub topic: String,
    /// `*` or a RocketMQ tag expression such as `create || update`.
    #[serde(default = "any_tag")]
    pub tags: String,
    pub biz_type: String,
    /// `keys`, `property:NAME` or `json:/json/pointer`.
    #[serde(default = "from_keys")]
    pub biz_id: String,
    /// Absent for ordinary messages; `property:NAME` or `json:/pointer` for delayed ones. The
    /// value is epoch milliseconds or an RFC 3339 time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execute_time: Option<String>,
    /// The handler that applies the effect; defaults to `biz_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
}

fn any_tag() -> String {
    "*".to_owned()
}

fn from_keys() -> String {
    "keys".to_owned()
}

#[derive(Debug, Clone)]
enum TagFilter {
    Any,
    OneOf(Vec<String>),
}

impl TagFilter {
    fn parse(expr: &str) -> Option<Self> {
        let expr = expr.trim();
        if expr == "*" {
            return Some(Self::Any);
        }
        let tags: Vec<String> = expr.split("||").map(|t| t.trim().to_owned()).collect();
        if tags.iter().any(|t| t.is_empty() || t == "*") {
            return None;
        }
        Some(Self::OneOf(tags))
    }

    fn matches(&self, tag: &str) -> bool {
        match self {
            Self::Any => true,
            Self::OneOf(tags) => tags.iter().any(|t| t == tag),
        }
    }
}

#[derive(Debug, Clone)]
struct Route {
    topic: String,
    tags: TagFilter,
    biz_type: String,
    biz_id: Source,
    execute_time: Option<Source>,
    handler: String,
}

/// Why a delivery cannot be processed, with what could be read of its key for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    /// The route's biz_type, or empty where no route matched.
    pub biz_type: String,
    /// Whatever bizId was found, as found; empty where none was. The delivery log stores it
    /// as [`stored_key`] does: as it is when it passes the key rules (an execute_time was what
    /// failed), else as a printable, bounded excerpt, so the rejected message can still be
    /// looked up.
    pub biz_id: String,
}

/// The routing table: the first route whose topic and tag match a delivery decides its key.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    /// Builds the table, rejecting the first route that is wrong with an error naming it as
    /// `routes[i].field`.
    pub fn new(configs: &[RouteConfig]) -> Result<Self, Invalid> {
        let mut routes = Vec::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            let at = |field: &str| format!("routes[{i}].{field}");
            if c.topic.is_empty() || c.topic.chars().count() > MAX_TOPIC_CHARS {
                return Err(invalid(at("topic"), format!("must be 1 to {MAX_TOPIC_CHARS} characters")));
            }
            let tags = TagFilter::parse(&c.tags).ok_or_else(|| {
                invalid(at("tags"), format!("{:?} is not \"*\" or a tag list such as \"a || b\"", c.tags))
            })?;
            check_key_text(&c.biz_type, MAX_BIZ_TYPE_CHARS).map_err(|m| invalid(at("biz_type"), m))?;
            let biz_id = Source::parse(&c.biz_id).map_err(|m| invalid(at("biz_id"), m))?;
            let execute_time = c
                .execute_time
                .as_deref()
                .map(|s| match Source::parse(s).map_err(|m| invalid(at("execute_time"), m))? {
                    Source::Keys => Err(invalid(at("execute_time"), "cannot come from the message KEYS")),
                    other => Ok(other),
                })
                .transpose()?;
            routes.push(Route {
                topic: c.topic.clone(),
                tags,
                biz_type: c.biz_type.clone(),
                biz_id,
                execute_time,
                handler: c.handler.clone().unwrap_or_else(|| c.biz_type.clone()),
            });
        }
        Ok(Self { routes })
    }

    /// The handler names the routes need, for checking them against the registry at start.
    pub(crate) fn handler_names(&self) -> impl Iterator<Item = (usize, &str)> {
        self.routes.iter().enumerate().map(|(i, r)| (i, r.handler.as_str()))
    }

    /// Every biz_type the routes carry, for metrics that start at 0.
    pub fn biz_types(&self) -> std::collections::BTreeSet<String> {
        self.routes.iter().map(|r| r.biz_type.clone()).collect()
    }

    /// What a message sent again on `topic`/`tags` must carry for its route to read `biz_id`
    /// and `execute_time` again: its KEYS and properties (a key read from the body is already
    /// in the body). What is not known (`None`) is left out, for the route to find missing
    /// rather than read wrong. `None` when no route covers the topic and tag.
    pub(crate) fn republish(
        &self,
        topic: &str,
        tags: &str,
        biz_id: Option<&str>,
        execute_time: Option<i64>,
    ) -> Option<(Vec<String>, std::collections::BTreeMap<String, String>)> {
        let route = self.routes.iter().find(|r| r.topic == topic && r.tags.matches(tags))?;
        let keys = biz_id.map(str::to_owned).into_iter().collect();
        let mut properties = std::collections::BTreeMap::new();
        if let (Source::Property(name), Some(biz_id)) = (&route.biz_id, biz_id) {
            properties.insert(name.clone(), biz_id.to_owned());
        }
        if let (Some(Source::Property(name)), Some(at)) = (&route.execute_time, execute_time) {
            properties.insert(name.clone(), at.to_string());
        }
        Some((keys, properties))
    }

    /// Each biz_type with the handler of its first route: whose business state the trace
    /// page shows for a key of that type.
    pub(crate) fn handler_by_biz_type(&self) -> std::collections::BTreeMap<&str, &str> {
        let mut out = std::collections::BTreeMap::new();
        for r in &self.routes {
            out.entry(r.biz_type.as_str()).or_insert(r.handler.as_str());
        }
        out
    }

    /// Every (topic, tag expression) pair the routes cover, for building subscriptions.
    pub fn topics(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in &self.routes {
            let tags = match &r.tags {
                TagFilter::Any => vec!["*".to_owned()],
                TagFilter::OneOf(t) => t.clone(),
            };
            match out.iter_mut().find(|(t, _)| *t == r.topic) {
                Some((_, existing)) => existing.extend(tags),
                None => out.push((r.topic.clone(), tags)),
            }
        }
        out.into_iter()
            .map(|(topic, mut tags)| {
                if tags.iter().any(|t| t == "*") {
                    (topic, "*".to_owned())
                } else {
                    tags.dedup();
                    // No spaces around `||`: the RocketMQ Rust client hashes each tag of the
                    // expression untrimmed, and the broker filters by those hashes, so " a"
                    // would never match a message tagged "a".
                    (topic, tags.join("||"))
                }
            })
            .collect()
    }

    /// Finds the delivery's route and reads its business key.
    pub fn resolve(&self, d: &Delivery) -> Result<BizKey, Rejection> {
        let reject = |reason: String, biz_type: &str| Rejection {
            reason,
            biz_type: biz_type.to_owned(),
            biz_id: String::new(),
        };
        if let Some(why) = &d.unreadable {
            return Err(reject(format!("the message could not be read: {}", excerpt(why, 200)), ""));
        }
        for (what, value, max) in [
            ("msgId", &d.msg_id, MAX_ID_CHARS),
            ("UNIQ_KEY", &d.uniq_key, MAX_ID_CHARS),
            ("topic", &d.topic, MAX_TOPIC_CHARS),
            ("tags", &d.tags, MAX_TOPIC_CHARS),
        ] {
            let n = value.chars().count();
            if n > max {
                return Err(reject(format!("{what} is {n} characters long; the limit is {max}"), ""));
            }
            // PostgreSQL's text cannot hold a NUL: refused alike on every backend, so that the
            // claim and the log always store the ids as delivered (`stored_id`).
            if value.contains('\0') {
                return Err(reject(format!("{what} holds a NUL character, which cannot be stored"), ""));
            }
        }
        let Some(route) = self.routes.iter().find(|r| r.topic == d.topic && r.tags.matches(&d.tags)) else {
            return Err(reject(
                format!("no route for topic {} with tag {}", excerpt(&d.topic, 64), excerpt(&d.tags, 64)),
                "",
            ));
        };

        let mut body = Body::new(&d.body);
        let raw_id = read_text(&route.biz_id, d, &mut body)
            .map_err(|why| reject(format!("biz_id: {why}"), &route.biz_type))?;
        if let Err(why) = check_key_text(&raw_id, MAX_BIZ_ID_CHARS) {
            return Err(Rejection {
                reason: format!("biz_id from {}: {why}", route.biz_id.describe()),
                biz_type: route.biz_type.clone(),
                biz_id: raw_id,
            });
        }
        let execute_time = match &route.execute_time {
            None => 0,
            Some(source) => read_text(source, d, &mut body)
                .and_then(|text| parse_execute_time(&text))
                .map_err(|why| Rejection {
                    reason: format!("execute_time: {why}"),
                    biz_type: route.biz_type.clone(),
                    biz_id: raw_id.clone(),
                })?,
        };
        Ok(BizKey {
            biz_type: route.biz_type.clone(),
            biz_id: raw_id,
            execute_time,
            handler: route.handler.clone(),
        })
    }
}

/// What `source` holds in `d`, as text, not empty: the part of a key it gives, not yet checked
/// against the key rules.
fn read_text(source: &Source, d: &Delivery, body: &mut Body<'_>) -> Result<String, String> {
    let text = source.read(d, body)?;
    if text.is_empty() {
        return Err(format!("{} is empty", source.describe()));
    }
    Ok(text)
}

/// Epoch milliseconds, or an RFC 3339 time: how a route, the trace page and the command line
/// read an execute_time.
pub fn parse_execute_time(text: &str) -> Result<i64, String> {
    let ms = match text.parse::<i64>() {
        Ok(ms) => ms,
        Err(_) => chrono::DateTime::parse_from_rfc3339(text).map(|t| t.timestamp_millis()).map_err(|_| {
            format!("{} is neither epoch milliseconds nor an RFC 3339 time", excerpt(text, 64))
        })?,
    };
    if ms < 0 {
        return Err(format!("{ms} is before 1970"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(biz_id: &str, execute_time: Option<&str>) -> Routes {
        Routes::new(&[RouteConfig {
            topic: "shop".into(),
            tags: "stock_deduct || stock_deduct_v2".into(),
            biz_type: "stock.deduct".into(),
            biz_id: biz_id.into(),
            execute_time: execute_time.map(Into::into),
            handler: None,
        }])
        .unwrap()
    }

    fn delivery(body: &[u8]) -> Delivery {
        Delivery {
            msg_id: "m1".into(),
            topic: "shop".into(),
            tags: "stock_deduct".into(),
            keys: vec!["D-1".into()],
            body: body.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_key_is_read_from_keys_properties_and_json() {
        let d = delivery(br#"{"deduction":{"id":"D-9"},"n":42}"#);
        assert_eq!(route("keys", None).resolve(&d).unwrap().biz_id, "D-1");
        assert_eq!(route("json:/deduction/id", None).resolve(&d).unwrap().biz_id, "D-9");
        assert_eq!(route("json:/n", None).resolve(&d).unwrap().biz_id, "42");
        let mut d = d;
        d.properties.insert("BIZ".into(), "P-7".into());
        let key = route("property:BIZ", None).resolve(&d).unwrap();
        assert_eq!((key.biz_id.as_str(), key.handler.as_str(), key.execute_time), ("P-7", "stock.deduct", 0));
    }

    #[test]
    fn execute_time_accepts_millis_and_rfc3339() {
        let mut d = delivery(br#"{"at":"2026-01-02T03:04:05Z"}"#);
        assert_eq!(route("keys", Some("json:/at")).resolve(&d).unwrap().execute_time, 1_767_323_045_000);
        d.properties.insert("AT".into(), "1700000000000".into());
        assert_eq!(route("keys", Some("property:AT")).resolve(&d).unwrap().execute_time, 1_700_000_000_000);
        d.properties.insert("AT".into(), "tomorrow".into());
        let r = route("keys", Some("property:AT")).resolve(&d).unwrap_err();
        assert!(r.reason.contains("neither epoch milliseconds nor an RFC 3339"), "{}", r.reason);
        assert_eq!(r.biz_id, "D-1");
    }

    #[test]
    fn each_bad_key_gets_a_reason_that_says_what_is_wrong() {
        let cases: Vec<(Routes, Delivery, &str)> = vec![
            (
                route("keys", None),
                Delivery { keys: vec![], ..delivery(b"{}") },
                "biz_id: the message has no KEYS",
            ),
            (
                route("keys", None),
                Delivery { keys: vec![String::new()], ..delivery(b"{}") },
                "biz_id: the message KEYS are empty",
            ),
            (route("property:X", None), delivery(b"{}"), "biz_id: the message has no property X"),
            (
                route("json:/id", None),
                delivery(b"\xff\xfe"),
                "biz_id: the body is not UTF-8 (invalid byte at offset 0)",
            ),
            (route("json:/id", None), delivery(b"not json"), "biz_id: the body is not JSON"),
            (route("json:/id", None), delivery(b"{}"), "biz_id: the body has no field /id"),
            (route("json:/id", None), delivery(br#"{"id":""}"#), "biz_id: JSON field /id is empty"),
            (
                route("json:/id", None),
                delivery(br#"{"id":1.5}"#),
                "biz_id: field /id is 1.5, expected a string or an integer",
            ),
            (
                route("json:/id", None),
                delivery(br#"{"id":{"a":1}}"#),
                "biz_id: field /id is {\"a\":1}, expected a string or an integer",
            ),
            (
                route("json:/id", None),
                delivery(br#"{"id":"x' OR '1'='1"}"#),
                "has a forbidden character \\' (U+0027) at position 2",
            ),
            (
                route("json:/id", None),
                delivery(br#"{"id":"<script>alert(1)</script>"}"#),
                "forbidden character < (U+003C) at position 1",
            ),
            (
                route("json:/id", None),
                delivery(b"{\"id\":\"a\\u0000b\"}"),
                "forbidden character \\0 (U+0000) at position 2",
            ),
            (
                route("json:/id", None),
                delivery(b"{\"id\":\"a\\nb\"}"),
                "forbidden character \\n (U+000A) at position 2",
            ),
            (
                route("json:/id", None),
                delivery(b"{\"id\":\"a b\"}"),
                "forbidden character   (U+0020) at position 2",
            ),
        ];
        for (routes, d, expected) in cases {
            let r = routes.resolve(&d).unwrap_err();
            assert!(r.reason.contains(expected), "expected {expected:?} in {:?}", r.reason);
            assert_eq!(r.biz_type, "stock.deduct");
        }
    }

    #[test]
    fn an_oversized_id_is_rejected_and_its_excerpt_is_bounded() {
        let long = "A".repeat(10_000);
        let d = Delivery { keys: vec![long], ..delivery(b"{}") };
        let r = route("keys", None).resolve(&d).unwrap_err();
        assert!(r.reason.contains("is 10000 characters long; the limit is 128"), "{}", r.reason);
        assert_eq!(r.biz_id.len(), 10_000);
        let kept = excerpt(&r.biz_id, MAX_BIZ_ID_CHARS);
        assert_eq!(kept.chars().count(), MAX_BIZ_ID_CHARS);
        assert!(kept.ends_with("…(10000 chars)"));
        let d = Delivery { msg_id: "m".repeat(200), ..delivery(b"{}") };
        assert!(route("keys", None).resolve(&d).unwrap_err().reason.starts_with("msgId is 200 characters"));
    }

    #[test]
    fn a_message_without_a_route_is_rejected_by_topic_and_tag() {
        let d = Delivery { tags: "refund".into(), ..delivery(b"{}") };
        let r = route("keys", None).resolve(&d).unwrap_err();
        assert_eq!(r.reason, "no route for topic shop with tag refund");
        assert_eq!(r.biz_type, "");
    }

    #[test]
    fn a_bad_route_is_refused_with_its_key_named() {
        let mut c = RouteConfig {
            topic: "t".into(),
            tags: "*".into(),
            biz_type: "order.create".into(),
            biz_id: "body".into(),
            execute_time: None,
            handler: None,
        };
        let e = Routes::new(std::slice::from_ref(&c)).unwrap_err();
        assert_eq!(e.key, "routes[0].biz_id");
        c.biz_id = "keys".into();
        c.biz_type = "order create".into();
        assert_eq!(Routes::new(std::slice::from_ref(&c)).unwrap_err().key, "routes[0].biz_type");
        c.biz_type = "order.create".into();
        c.tags = "a || ".into();
        assert_eq!(Routes::new(std::slice::from_ref(&c)).unwrap_err().key, "routes[0].tags");
        c.tags = "*".into();
        c.execute_time = Some("keys".into());
        assert_eq!(Routes::new(&[c]).unwrap_err().key, "routes[0].execute_time");
    }

    #[test]
    fn subscriptions_merge_the_tags_of_one_topic() {
        let r = Routes::new(&[
            RouteConfig {
                topic: "shop".into(),
                tags: "a".into(),
                biz_type: "x".into(),
                biz_id: "keys".into(),
                execute_time: None,
                handler: None,
            },
            RouteConfig {
                topic: "shop".into(),
                tags: "b || c".into(),
                biz_type: "y".into(),
                biz_id: "keys".into(),
                execute_time: None,
                handler: None,
            },
            RouteConfig {
                topic: "other".into(),
                tags: "*".into(),
                biz_type: "z".into(),
                biz_id: "keys".into(),
                execute_time: None,
                handler: None,
            },
        ])
        .unwrap();
        assert_eq!(r.topics(), vec![("shop".into(), "a||b||c".into()), ("other".into(), "*".into())]);
    }
}
