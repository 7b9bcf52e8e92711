//! The link from each delivery of the trace page to its message's trace in the RocketMQ
//! dashboard (`http.rocketmq_dashboard_url`): by the id the trace records carry (the UNIQ_KEY,
//! else the msgId), percent-encoded in the link and HTML-escaped in the page; no link without
//! the setting.

use idemgate::store::Backend;

use super::*;

/// The targets of the page's message-trace links, as the HTML has them (escaped).
fn message_trace_links(html: &str) -> Vec<String> {
    let marker = "class=\"message-trace\" href=\"";
    html.match_indices(marker)
        .map(|(at, _)| {
            let link = &html[at + marker.len()..];
            link[..link.find('"').expect("a closing quote")].to_owned()
        })
        .collect()
}

mod cases {
    use super::*;

    /// A base address links each delivery to the dashboard's Message Trace page with its
    /// UNIQ_KEY; a template with `{msg_id}` is filled in, the id encoded, and the page escapes
    /// the link.
    pub async fn each_delivery_links_to_its_message_trace_in_the_dashboard(backend: Backend) {
        let mut settings = shop::settings();
        settings.http.rocketmq_dashboard_url = "https://mq.example/".to_owned();
        let app = App::with_settings(backend, settings).await;
        let first = stock_deduct("DB-1", "M-DB1", "U-DB1", "SKU-W", 1);
        let again = stock_deduct("DB-1", "M-DB2", "U-DB1", "SKU-W", 1);
        let odd = stock_deduct("DB-1", "M-DB3", "U<&\"> DB3", "SKU-W", 1);
        assert_eq!(app.deliver(&first).await, Outcome::Processed);
        assert_eq!(app.deliver(&again).await, Outcome::Duplicate);
        assert_eq!(app.deliver(&odd).await, Outcome::Duplicate);

        let (status, html, _) = app.get("/trace?biz_id=DB-1").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        let links = message_trace_links(&html);
        assert_eq!(
            links,
            [
                "https://mq.example/#/messageTrace?messageId=U-DB1",
                "https://mq.example/#/messageTrace?messageId=U-DB1",
                "https://mq.example/#/messageTrace?messageId=U%3C%26%22%3E+DB3",
            ]
            .map(|l| l.replace('&', "&#38;")),
            "{html}"
        );
        assert!(!html.contains("msgId=U<"), "the id is encoded: {html}");

        let mut settings = shop::settings();
        settings.http.rocketmq_dashboard_url =
            "https://mq.example/trace/{msg_id}?topic=RMQ_SYS_TRACE_TOPIC".to_owned();
        let app = App::with_settings(backend, settings).await;
        let keyless = Delivery { uniq_key: String::new(), ..stock_deduct("DB-2", "M-DB4", "x", "SKU-W", 1) };
        assert_eq!(app.deliver(&keyless).await, Outcome::Processed);
        let (status, html, _) = app.get("/trace?biz_id=DB-2").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert_eq!(
            message_trace_links(&html),
            ["https://mq.example/trace/M-DB4?topic=RMQ_SYS_TRACE_TOPIC"],
            "without a UNIQ_KEY the msgId: {html}"
        );
    }

    /// Without the setting, no delivery links to the dashboard.
    pub async fn without_the_dashboard_no_message_trace_link_is_shown(backend: Backend) {
        let app = App::new(backend).await;
        let d = stock_deduct("DB-3", "M-DB5", "U-DB5", "SKU-W", 1);
        assert_eq!(app.deliver(&d).await, Outcome::Processed);
        let (status, html, _) = app.get("/trace?biz_id=DB-3").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(message_trace_links(&html).is_empty(), "{html}");
        assert!(!html.contains("message trace"), "{html}");
    }
}

on_every_backend!(
    each_delivery_links_to_its_message_trace_in_the_dashboard,
    without_the_dashboard_no_message_trace_link_is_shown,
);
