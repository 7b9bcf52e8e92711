//! Kafka (the private tansu) beyond the proofs every broker shares (`brokers.rs`): the broker
//! itself answering a fetch inside a record batch as Kafka does, a record whose header name is
//! not UTF-8, a producer writing idemgate's own headers on a route's topic, and a restart one
//! second after a SIGKILL with retries pending.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemgate::broker::BrokerKind;
use idemgate::clock::now_ms;
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Sql};
use idemgate_shop as shop;
use idemgate_shop::produce::ProduceReport;
use idemgate_testkit::kafka::{self as tk, BatchSpan};
use sqlx::Row;

use super::support::*;

const KIND: BrokerKind = BrokerKind::Kafka;

/// Runs a blocking testkit call off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a blocking task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_inside_a_batch_starts_at_its_offset() {
    const RECORDS: usize = 1_000;
    const PER_BATCH: usize = 64;
    let bootstrap = kafka().bootstrap().to_owned();
    let topic = unique("batches");
    tk::create_topic(&bootstrap, &topic, 1).await.expect("a one-partition topic");
    let offsets =
        tk::produce_batched(&bootstrap, &topic, 0, RECORDS, PER_BATCH).await.expect("the records sent");
    let expected: Vec<i64> = (0..RECORDS as i64).collect();
    assert_eq!(offsets, expected, "a fresh one-partition topic holds the records at 0..{RECORDS}, in order");
    let end = RECORDS as i64;

    // The batches the broker holds, read with the protocol by hand: contiguous, and several
    // records each.
    let batches = {
        let (b, t) = (bootstrap.clone(), topic.clone());
        blocking(move || tk::all_batches(&b, &t, 0)).await.expect("the log's batches")
    };
    let sizes: Vec<i64> = batches.iter().map(BatchSpan::records).collect();
    println!("{} records in {} batches: {sizes:?}", RECORDS, batches.len());
    assert_eq!(batches.first().map(|b| b.base), Some(0), "{batches:?}");
    assert_eq!(batches.last().map(|b| b.last), Some(end - 1), "{batches:?}");
    for pair in batches.windows(2) {
        assert_eq!(pair[1].base, pair[0].last + 1, "contiguous batches: {batches:?}");
    }
    assert!(
        batches.len() * 4 <= RECORDS && sizes.iter().any(|n| *n > 1),
        "the producer's linger made batches of several records: {sizes:?}"
    );

    // Offsets inside the log, one of them the middle of its largest batch.
    let largest = *batches.iter().max_by_key(|b| b.records()).expect("a batch");
    let middle = largest.base + largest.records() / 2;
    let mut chosen = vec![1, 112, 500, end - 1, middle];
    chosen.sort_unstable();
    chosen.dedup();
    let mut inside = 0;
    for &o in &chosen {
        let holding = batches.iter().find(|b| b.holds(o)).copied().expect("a batch holds it");
        inside += usize::from(holding.base < o);

        // The broker answers a fetch at `o` with the batch that holds it.
        let (answer, high) = {
            let (b, t) = (bootstrap.clone(), topic.clone());
            blocking(move || tk::fetch_batches(&b, &t, 0, o)).await.expect("a fetch")
        };
        assert_eq!(high, end, "the high watermark");
        assert_eq!(
            answer.first().copied(),
            Some(holding),
            "a fetch at {o} starts with the batch holding it ({holding:?}); the broker answered {:?}",
            &answer[..answer.len().min(3)]
        );

        // A client assigned at `o` receives `o` first, then every later record in order.
        let started = Instant::now();
        let read = {
            let (b, t) = (bootstrap.clone(), topic.clone());
            blocking(move || tk::read_from(&b, &t, 0, o, end, Duration::from_secs(30)))
                .await
                .expect("a reader")
        };
        println!(
            "offset {o}: in batch {}..={} ({} records); read {} records from {:?} to {:?} in {:?}",
            holding.base,
            holding.last,
            holding.records(),
            read.len(),
            read.first(),
            read.last(),
            started.elapsed()
        );
        assert_eq!(read.first().copied(), Some(o), "the first record read from {o}");
        let rest: Vec<i64> = (o..end).collect();
        assert!(
            read == rest,
            "from {o}: consecutive offsets to {end}; read {} records, {:?} …",
            read.len(),
            &read[..read.len().min(10)]
        );
    }
    assert!(inside >= 3, "offsets inside batches (not a batch's first) were read: {inside} of {chosen:?}");

    // At the end of the log the broker answers with no batch.
    let (answer, _) = {
        let (b, t) = (bootstrap.clone(), topic.clone());
        blocking(move || tk::fetch_batches(&b, &t, 0, end)).await.expect("a fetch at the end")
    };
    assert!(answer.is_empty(), "a fetch at the high watermark answers no batch: {answer:?}");
}

static BY_MSG_ID: Sql = Sql::new(
    "SELECT outcome, COALESCE(error, ''), biz_type, topic, reconsume_times FROM delivery_log WHERE msg_id = ?",
);

/// The log rows of a record read at `msg_id`: outcome, error, biz_type, topic and reconsume
/// count, waiting up to `limit` for at least one.
async fn rows_of(
    store: &idemgate::store::Store,
    msg_id: &str,
    limit: Duration,
) -> Vec<(String, String, String, String, i32)> {
    let started = Instant::now();
    loop {
        let rows = store.query(&BY_MSG_ID).bind(msg_id).fetch_all(store.pool()).await.expect("log rows");
        if !rows.is_empty() || started.elapsed() > limit {
            return rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The books of `report`'s run when `all` the runs share one database: each run's own orders,
/// payments and deductions, and the stock (which they share) less what every run deducted.
/// `skus` are the stock rows the database holds: one no run deducted keeps its first stock.
fn expected_among(
    report: &ProduceReport,
    all: &[&ProduceReport],
    skus: impl Iterator<Item = String>,
) -> Books {
    let mut expected = expected_books(report);
    let mut deducted: BTreeMap<String, i64> = skus.map(|sku| (sku, 0)).collect();
    for r in all {
        for (sku, q) in &r.tally.deducted {
            *deducted.entry(sku.clone()).or_default() += q;
        }
    }
    expected.stock = deducted.into_iter().map(|(sku, q)| (sku, shop::INITIAL_STOCK - q)).collect();
    expected
}

/// Waits (up to 180 s) until every run's books are exact, [`expected_among`] the others, and
/// every send is in the delivery log; on failure, the troubled deliveries and `diagnosis()`.
async fn assert_runs_converge(
    store: &idemgate::store::Store,
    group: &str,
    runs: &[(&ProduceReport, &[SendLine])],
    diagnosis: impl AsyncFnOnce() -> String,
) {
    let all: Vec<&ProduceReport> = runs.iter().map(|(r, _)| *r).collect();
    let started = Instant::now();
    let mismatch = loop {
        let mut mismatch = None;
        for (report, _) in runs {
            let books = books(store, &report.run, group).await;
            let expected = expected_among(report, &all, books.stock.keys().cloned());
            if books != expected {
                mismatch = Some((report.run.clone(), books, expected));
                break;
            }
        }
        if mismatch.is_none() || started.elapsed() > Duration::from_secs(180) {
            break mismatch;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    if let Some((run, books, expected)) = mismatch {
        let why = diagnosis().await;
        assert_eq!(
            books,
            expected,
            "run {run}: troubled deliveries:\n{}\n{why}",
            trouble(store, group).await
        );
    }
    for (_, sends) in runs {
        assert_every_send_is_logged(store, group, sends).await;
    }
}

/// Polls `/readyz` every 200 ms until stopped; returns every answer that was not 200.
fn watch_readiness(addr: String) -> (Arc<AtomicBool>, std::thread::JoinHandle<Vec<String>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut bad = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match http_get(&addr, "/readyz") {
                    Some((200, _)) => {}
                    Some((status, body)) => bad.push(format!("{status}: {body}")),
                    None => bad.push("no answer".to_owned()),
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            bad
        })
    };
    (stop, watching)
}

/// The flags of a stream with no poison and nothing malformed.
const CLEAN: [&str; 6] = ["--poison", "0", "--malformed", "0", "--early-payments", "0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_with_a_non_utf8_header_name_is_invalid_and_the_group_goes_on() {
    let db = database(Backend::Postgres).await;
    let (topic, group) = (unique("badheader"), unique("group"));
    let (run_before, run_after) = (unique("B").replace('_', ""), unique("A").replace('_', ""));
    let mut s = settings_for(KIND, &db.url, &topic, &group, "solo", 2);
    // One partition: the records after the bad one are behind it in the same log.
    s.kafka.topic_partitions = 1;
    let service = Service::start(&s);
    let (stop, readiness) = watch_readiness(service_addr(&service));

    let (before, before_sends) =
        produce_to(KIND, &topic, &run_before, 1, 0, &[&["--duplicates", "0"][..], &CLEAN].concat());
    let order_no = format!("{run_before}-BADHEADER-1");
    let body = order_body(&order_no);
    let uniq = idemgate::delivery::new_message_id();
    let (partition, offset) = tk::send_raw(
        kafka().bootstrap(),
        &topic,
        &order_no,
        &body,
        &[
            (b"TAGS", shop::TAG_ORDER_CREATE.as_bytes()),
            (b"UNIQ_KEY", uniq.as_bytes()),
            (&[0xff], b"not a name"),
        ],
    )
    .await
    .expect("the record with a header named 0xff");
    let (after, after_sends) = produce_to(KIND, &topic, &run_after, 300, 0, &["--duplicates", "0.3"]);

    let msg_id = format!("{topic}-{partition}@{offset}");
    let rows = rows_of(&db.store, &msg_id, Duration::from_secs(90)).await;
    println!("the bad record {msg_id}: {rows:?}");
    assert_eq!(
        rows.len(),
        1,
        "one log row for {msg_id}: {rows:?}\nserve log:\n{}",
        tail(&service.log_text())
    );
    let (outcome, error, _, row_topic, retries) = &rows[0];
    assert_eq!(outcome, "invalid", "{rows:?}");
    assert!(
        error.contains("header") && error.contains("not UTF-8") && error.contains("ff"),
        "the reason names the header name: {error:?}"
    );
    assert_eq!((row_topic.as_str(), *retries), (topic.as_str(), 0));

    assert_runs_converge(
        &db.store,
        &group,
        &[(&before, before_sends.as_slice()), (&after, after_sends.as_slice())],
        async || tail(&service.log_text()),
    )
    .await;
    let orders = idemgate::store::Sql::new("SELECT COUNT(*) FROM shop_order WHERE order_no = ?");
    let n: i64 =
        db.store.query(&orders).bind(order_no.as_str()).fetch_one(db.store.pool()).await.unwrap().get(0);
    assert_eq!(n, 0, "the unreadable record had no effect");
    println!(
        "books exact: {} + {} sends before and after it; {} orders after it",
        before.sent, after.sent, after.tally.orders
    );

    stop.store(true, Ordering::Relaxed);
    let not_ready = readiness.join().expect("the readiness watch");
    assert!(not_ready.is_empty(), "/readyz answered other than 200: {not_ready:?}");
    let exit = service.terminate();
    assert!(!exit.log.contains("panicked"), "{}", tail(&exit.log));
    assert_eq!(exit.code(), Some(0), "{}", tail(&exit.log));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_one_topic_naming_another_runs_its_own_topic_s_route() {
    let db = database(Backend::Postgres).await;
    let (topic_a, topic_b, group) = (unique("route_a"), unique("route_b"), unique("group"));
    let run = unique("H").replace('_', "");
    let biz_type_b = "order.create.b";
    let mut s = settings_for(KIND, &db.url, &topic_a, &group, "solo", 2);
    s.routes.push(RouteConfig {
        topic: topic_b.clone(),
        tags: shop::TAG_ORDER_CREATE.to_owned(),
        biz_type: biz_type_b.to_owned(),
        biz_id: "keys".to_owned(),
        execute_time: None,
        handler: Some(shop::ORDER_CREATE.to_owned()),
    });
    let service = Service::start(&s);

    let order_no = format!("{run}-O-1");
    let body = order_body(&order_no);
    let uniq = idemgate::delivery::new_message_id();
    let (partition, offset) = tk::send_raw(
        kafka().bootstrap(),
        &topic_a,
        &order_no,
        &body,
        &[
            (b"TAGS", shop::TAG_ORDER_CREATE.as_bytes()),
            (b"UNIQ_KEY", uniq.as_bytes()),
            (b"idemgate-topic", topic_b.as_bytes()),
            (b"idemgate-retries", b"99"),
            (b"idemgate-partition", b"7"),
            (b"idemgate-offset", b"12345"),
            (b"idemgate-born", b"1"),
        ],
    )
    .await
    .expect("the record naming topic B");
    let msg_id = format!("{topic_a}-{partition}@{offset}");
    let rows = rows_of(&db.store, &msg_id, Duration::from_secs(90)).await;
    println!("{msg_id}: {rows:?}");
    assert_eq!(rows.len(), 1, "{rows:?}\nserve log:\n{}", tail(&service.log_text()));
    let (outcome, error, biz_type, row_topic, retries) = &rows[0];
    assert_eq!(
        (outcome.as_str(), biz_type.as_str(), row_topic.as_str(), *retries),
        ("processed", shop::ORDER_CREATE, topic_a.as_str(), 0),
        "run by topic A's route at its own coordinates, a first attempt: {error}"
    );
    static COORDINATES: Sql =
        Sql::new("SELECT queue_id, queue_offset, uniq_key FROM delivery_log WHERE msg_id = ?");
    let r = db.store.query(&COORDINATES).bind(msg_id.as_str()).fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(
        (r.get::<i32, _>(0), r.get::<i64, _>(1), r.get::<String, _>(2)),
        (partition, offset, uniq.clone()),
        "its own partition and offset, its own UNIQ_KEY"
    );
    let orders = Sql::new("SELECT COUNT(*) FROM shop_order WHERE order_no = ?");
    let n: i64 =
        db.store.query(&orders).bind(order_no.as_str()).fetch_one(db.store.pool()).await.unwrap().get(0);
    assert_eq!(n, 1, "the order was made once");

    // No metric counts it under topic B, and none as a redelivery.
    let (status, text) = http_get(&service_addr(&service), "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    let group_label = [("consumer_group", group.as_str())];
    for name in ["idemgate_deliveries_total", "idemgate_redeliveries_total"] {
        let b = series(&text, name, &[("topic", topic_b.as_str())]);
        assert!(b.iter().all(|v| *v == 0.0), "{name} with topic=\"B\": {b:?}");
    }
    let processed_a = sample(
        &text,
        "idemgate_deliveries_total",
        &[
            group_label[0],
            ("topic", topic_a.as_str()),
            ("biz_type", shop::ORDER_CREATE),
            ("outcome", "processed"),
        ],
    );
    assert_eq!(processed_a, Some(1.0), "counted once under topic A and its biz_type");
    let b_type = sample(&text, "idemgate_deliveries_total", &[("biz_type", biz_type_b)]).unwrap_or(0.0);
    assert_eq!(b_type, 0.0, "nothing under B's biz_type");
    let redeliveries = sample(&text, "idemgate_redeliveries_total", &group_label).unwrap_or(0.0);
    assert_eq!(redeliveries, 0.0, "the forged retry count is not a redelivery");
    println!(
        "topic B series: {}",
        text.lines().filter(|l| l.contains(&format!("topic=\"{topic_b}\"")) && !l.starts_with('#')).count()
    );

    let exit = service.terminate();
    assert_eq!(exit.code(), Some(0), "{}", tail(&exit.log));
    db.drop_now().await;
}

static FIRST_PROCESSED: Sql = Sql::new(
    "SELECT MIN(logged_at_ms) FROM delivery_log WHERE consumer_group = ? AND instance_id = ? AND outcome = 'processed'",
);

static ATTEMPTS_OF: Sql = Sql::new(
    "SELECT reconsume_times, outcome, instance_id FROM delivery_log WHERE biz_id = ? AND consumer_group = ? ORDER BY id",
);

/// What a stalled restart is diagnosed by: where both groups stand on every partition, and the
/// logs of both instances and of the broker.
fn diagnosis(group: &str, topics: &[String], first_log: &str, second_log: &str) -> String {
    let bootstrap = kafka().bootstrap();
    let retry_topic = vec![format!("{group}.retry")];
    let positions = |g: &str, t: &[String]| match tk::group_positions(bootstrap, g, t) {
        Ok(p) => p
            .iter()
            .map(|p| {
                format!(
                    "  {}-{} committed {:?} low {} high {}",
                    p.topic, p.partition, p.committed, p.low, p.high
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("  unread: {e:#}"),
    };
    let described = [group.to_owned(), format!("{group}.retry")]
        .iter()
        .map(|g| {
            tk::describe_group(bootstrap, g).unwrap_or_else(|e| format!("group {g}: undescribed: {e:#}"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let broker_log = kafka().log_text();
    // The whole logs, kept for whoever reads the failure.
    let kept = std::env::temp_dir().join(format!("idemgate-kafka-restart-{}", std::process::id()));
    let saved = std::fs::create_dir_all(&kept)
        .and_then(|()| std::fs::write(kept.join("killed-serve.log"), first_log))
        .and_then(|()| std::fs::write(kept.join("restarted-serve.log"), second_log))
        .and_then(|()| std::fs::write(kept.join("tansu.log"), &broker_log));
    let kept = match saved {
        Ok(()) => format!("the whole logs are in {}", kept.display()),
        Err(e) => format!("the logs could not be kept: {e}"),
    };
    // The broker's lines about the group, the last 80.
    let about: Vec<&str> = broker_log.lines().filter(|l| l.contains(group)).collect();
    let broker_tail = about[about.len().saturating_sub(80)..].join("\n");
    format!(
        "{kept}\n{described}\ngroup {group}:\n{}\ngroup {group}.retry:\n{}\n--- the killed instance's log (end):\n{}\n--- the restarted instance's log (end):\n{}\n--- tansu's lines naming the group (the last 80 of {}):\n{broker_tail}",
        positions(group, topics),
        positions(&format!("{group}.retry"), &retry_topic),
        tail(first_log),
        tail(second_log),
        about.len()
    )
}

/// The last lines of a log, for failure messages.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The group's session timeout in these restarts.
const SESSION_TIMEOUT_MS: u32 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_one_second_after_a_sigkill_with_retries_pending_resumes_and_keeps_the_books() {
    restart_after_a_sigkill(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_session_timeout_with_retries_pending_resumes_and_keeps_the_books() {
    let session = Duration::from_millis(u64::from(SESSION_TIMEOUT_MS));
    restart_after_a_sigkill(session + Duration::from_secs(3)).await;
}

/// Three routed topics, two poison records waiting in the retry topic, about 2,600 records from
/// batching producers; `serve` SIGKILLed 2 s into the stream and a new one started
/// `restart_after` later: the new one resumes within twice the session timeout and 20 s, and
/// the books are exact.
async fn restart_after_a_sigkill(restart_after: Duration) {
    let db = database(Backend::Postgres).await;
    let group = unique("group");
    let topics: Vec<String> = (1..=3).map(|i| unique(&format!("restart{i}"))).collect();
    let runs: Vec<String> = (1..=3).map(|i| unique(&format!("K{i}")).replace('_', "")).collect();
    let poison_run = unique("KP").replace('_', "");
    let configure = |instance: &str| {
        let mut s = settings_for(KIND, &db.url, &topics[0], &group, instance, 2);
        s.routes = topics.iter().flat_map(|t| shop::routes(t)).collect();
        s.kafka.session_timeout_ms = SESSION_TIMEOUT_MS;
        // Long enough that the two poison records are still waiting in the retry topic at the
        // kill.
        s.kafka.retry_delay_ms = 8_000;
        s
    };
    let first = Service::start(&configure("before-crash"));

    // Two poison records, failed once and waiting in the retry topic.
    let (poison, poison_sends) = produce_to(
        KIND,
        &topics[0],
        &poison_run,
        2,
        0,
        &["--poison", "1", "--malformed", "0", "--duplicates", "0"],
    );
    assert_eq!(poison.tally.poison, 2);
    let poison_keys: Vec<String> = (1..=2).map(|n| format!("{poison_run}-POISON-{n}")).collect();
    for key in &poison_keys {
        wait_for_log(&db.store, key, "a first failed attempt", |rows| {
            rows.iter().any(|r| r.starts_with("failed"))
        })
        .await;
    }
    let poison_failed_at = Instant::now();

    // About 2,600 records over three topics at 150 a second each, through the batching
    // producer.
    let producers: Vec<_> = topics
        .iter()
        .zip(&runs)
        .map(|(topic, run)| {
            let (topic, run) = (topic.clone(), run.clone());
            std::thread::spawn(move || produce_to(KIND, &topic, &run, 870, 150, &["--duplicates", "0.3"]))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first_log = first.log_text();
    let processed_before_kill = processed_by_instance(&db.store, &group).await;
    first.kill_hard();
    let killed_at = Instant::now();
    println!(
        "SIGKILL {:?} after the poison's first failure, {:?} into the stream; processed before: {processed_before_kill:?}",
        poison_failed_at.elapsed(),
        Duration::from_secs(2)
    );
    tokio::time::sleep(restart_after).await;
    let restart_at_ms = now_ms();
    let restarted = Instant::now();
    let second = Service::start(&configure("after-crash"));
    println!(
        "the new instance serving {:?} after its start, {:?} after the kill",
        restarted.elapsed(),
        killed_at.elapsed()
    );
    let sent: Vec<_> = producers.into_iter().map(|p| p.join().expect("a producer thread")).collect();
    let total: u64 = sent.iter().map(|(r, _)| r.sent).sum();
    println!(
        "sent {total} records over {} topics: {:?}",
        topics.len(),
        sent.iter().map(|(r, _)| (r.sent, r.elapsed_seconds)).collect::<Vec<_>>()
    );

    // The new instance's first processed delivery, within the session timeout and a margin.
    let limit = Duration::from_millis(u64::from(SESSION_TIMEOUT_MS) * 2) + Duration::from_secs(20);
    let first_processed = loop {
        let r = db
            .store
            .query(&FIRST_PROCESSED)
            .bind(group.as_str())
            .bind("after-crash")
            .fetch_one(db.store.pool())
            .await
            .expect("the first processed row");
        if let Some(at) = r.get::<Option<i64>, _>(0) {
            break Some(at);
        }
        if restarted.elapsed() > limit + Duration::from_secs(30) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let resumed =
        first_processed.map(|at| Duration::from_millis(u64::try_from(at - restart_at_ms).unwrap_or(0)));
    println!("the new instance's first processed delivery {resumed:?} after its start (limit {limit:?})");
    let resumed_in_time = resumed.is_some_and(|r| r <= limit);
    if !resumed_in_time {
        let why = blocking({
            let (group, topics, first_log, second_log) =
                (group.clone(), topics.clone(), first_log.clone(), second.log_text());
            move || diagnosis(&group, &topics, &first_log, &second_log)
        })
        .await;
        panic!(
            "the restarted instance processed nothing within {limit:?} (first processed: {resumed:?})\n{why}"
        );
    }

    // The books are exact for every run, the poison's included.
    let mut runs: Vec<(&ProduceReport, &[SendLine])> = sent.iter().map(|(r, s)| (r, s.as_slice())).collect();
    runs.push((&poison, poison_sends.as_slice()));
    assert_runs_converge(&db.store, &group, &runs, async || {
        let (group, topics, first_log, second_log) =
            (group.clone(), topics.clone(), first_log.clone(), second.log_text());
        blocking(move || diagnosis(&group, &topics, &first_log, &second_log)).await
    })
    .await;
    let converged = restarted.elapsed();
    let by_instance = processed_by_instance(&db.store, &group).await;
    let causes = duplicates_by_cause(&db.store, &group).await;
    let mut poison_attempts = BTreeMap::new();
    for key in &poison_keys {
        let rows = db
            .store
            .query(&ATTEMPTS_OF)
            .bind(key.as_str())
            .bind(group.as_str())
            .fetch_all(db.store.pool())
            .await
            .unwrap();
        let rows: Vec<String> = rows
            .iter()
            .map(|r| format!("r{} {} {}", r.get::<i32, _>(0), r.get::<String, _>(1), r.get::<String, _>(2)))
            .collect();
        poison_attempts.insert(key.clone(), rows);
    }
    println!(
        "books exact {converged:?} after the restart; processed by instance {by_instance:?}; duplicates by cause {causes:?}"
    );
    println!("the pending poison's attempts: {poison_attempts:#?}");
    assert!(
        by_instance.contains_key("before-crash") && by_instance.contains_key("after-crash"),
        "{by_instance:?}"
    );
    for (key, rows) in &poison_attempts {
        assert!(rows.iter().any(|r| r.contains("dead_lettered")), "{key} ends dead-lettered: {rows:?}");
        assert!(
            rows.iter().any(|r| r.ends_with("after-crash")),
            "{key} was retried by the new instance: {rows:?}"
        );
    }
    let exit = second.terminate();
    assert_eq!(exit.code(), Some(0), "{}", tail(&exit.log));
    db.drop_now().await;
}
