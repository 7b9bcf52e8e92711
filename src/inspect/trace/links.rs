//! The links out of a trace to other tools: the Grafana dashboard around a key's time, a trace
//! in Tempo, Jaeger or the like, and a message's trace in the RocketMQ dashboard.

/// A link to the dashboard at `base` for the time range, filtered to `biz_type`.
pub(crate) fn grafana_link(base: &str, from_ms: i64, to_ms: i64, biz_type: &str) -> String {
    let query = serde_urlencoded::to_string([
        ("from", from_ms.to_string()),
        ("to", to_ms.to_string()),
        ("var-biz_type", biz_type.to_owned()),
    ])
    .unwrap_or_default();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{query}")
}

/// The link to a trace: `template` with every `{trace_id}` replaced by the id, percent-encoded
/// (a stored trace id is hex, which encoding leaves as it is; anything else is encoded).
pub fn trace_link(template: &str, trace_id: &str) -> String {
    fill_link(template, TRACE_ID_PLACEHOLDER, trace_id)
}

/// The link to a message's trace in the RocketMQ dashboard: `template` (from
/// `http.rocketmq_dashboard_url`) with every `{msg_id}` replaced by the id, percent-encoded.
pub fn message_trace_link(template: &str, msg_id: &str) -> String {
    fill_link(template, MSG_ID_PLACEHOLDER, msg_id)
}

/// `template` with every `placeholder` replaced by `id`, percent-encoded.
pub fn fill_link(template: &str, placeholder: &str, id: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
    template.replace(placeholder, &encoded)
}

/// What a trace URL template puts the trace id in place of.
pub const TRACE_ID_PLACEHOLDER: &str = "{trace_id}";
/// What a dashboard URL template puts the message's id in place of.
pub const MSG_ID_PLACEHOLDER: &str = "{msg_id}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grafana_links_carry_the_range_and_an_encoded_biz_type() {
        assert_eq!(
            grafana_link("http://g/d/idemgate", 1, 2, "a&b"),
            "http://g/d/idemgate?from=1&to=2&var-biz_type=a%26b"
        );
        assert!(grafana_link("http://g/d/x?orgId=1", 1, 2, "t").starts_with("http://g/d/x?orgId=1&from=1"));
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn trace_links_fill_every_placeholder_with_the_encoded_id() {
        assert_eq!(
            trace_link("https://tempo.example/explore?traceId={trace_id}", TRACE),
            format!("https://tempo.example/explore?traceId={TRACE}")
        );
        assert_eq!(trace_link("http://j/trace/{trace_id}#{trace_id}", "ab"), "http://j/trace/ab#ab");
        assert_eq!(trace_link("http://j/{trace_id}", "a\"&<b> c/"), "http://j/a%22%26%3Cb%3E+c%2F");
    }
}
