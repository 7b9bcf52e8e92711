//! idemgate on a three-node MariaDB Galera cluster: one `LocalGalera` for the whole binary, each
//! test on a database of its own (created on node 1, replicated to all), taking the cluster
//! in turn. Every scenario ends in exact books: every send logged, every key applied exactly
//! once, and a reconcile run that finds nothing lost or applied twice. Each prints its wall time
//! and its figures. A missing `mariadbd`, Galera provider, HAProxy or broker install fails the
//! test (`scripts/install-galera.sh`, `scripts/install-rocketmq.sh`).

#[allow(dead_code)]
#[path = "../end_to_end/support.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use idemgate::app::{Application, Feed, Running};
use idemgate::archive::{ArchiveOptions, ArchiveOutcome, Fault, RunKind, StartedBy, archive_once};
use idemgate::config::Settings;
use idemgate::outcome::Outcome;
use idemgate::reconcile::{ReconcileScheduler, ReconcileSettings};
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::galera::{LocalGalera, NODES, StateTransfer};
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;
use support::*;

use tokio::sync::{Mutex, MutexGuard, OnceCell};

/// The cluster every test of this binary shares, one test at a time: a test kills a node.
async fn cluster() -> MutexGuard<'static, LocalGalera> {
    static CLUSTER: OnceCell<Mutex<LocalGalera>> = OnceCell::const_new();
    CLUSTER
        .get_or_init(|| async {
            let started = Instant::now();
            let cluster = LocalGalera::start()
                .await
                .unwrap_or_else(|e| panic!("a three-node Galera cluster is required: {e:#}"));
            println!("galera: three nodes Synced {:.1} s after the start", started.elapsed().as_secs_f64());
            Mutex::new(cluster)
        })
        .await
        .lock()
        .await
}

/// A scratch database on the cluster, created (and migrated) through node 1.
async fn database(cluster: &LocalGalera) -> ScratchDb {
    ScratchDb::create_at(
        Backend::MySql,
        &cluster.admin_url(0),
        &StoreOptions { max_connections: 4, ..Default::default() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A pool on node `index` of `db`.
async fn store_on(cluster: &LocalGalera, index: usize, db: &ScratchDb) -> Store {
    Store::connect(&cluster.url(index, db.name()), &StoreOptions { max_connections: 8, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("node {}: {e}", index + 1))
}

/// The service on `url` fed by the caller: the same assembly as `serve`, with group commit when
/// `group_commit`.
async fn service(url: &str, group: &str, instance: &str, group_commit: bool) -> Running {
    let mut settings = caller_settings(url, group, instance);
    settings.group_commit.enabled = group_commit;
    let app = Application::build_with(&settings, shop::handlers(), Feed::Caller)
        .await
        .unwrap_or_else(|e| panic!("{instance}: {e:#}"));
    app.start().await.expect("the service starts")
}

/// The certification retries a service's `/metrics` counts.
fn certification_retries(running: &Running) -> f64 {
    let addr = running.url().trim_start_matches("http://");
    let (status, text) = http_get(addr, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    sample(&text, "idemgate_transient_retries_total", &[("cause", "certification")])
        .expect("the certification retries are exported from the start")
}

static ORDERS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM shop_order WHERE order_no LIKE ?");
static OUTCOMES_LIKE: Sql = Sql::new(
    "SELECT outcome, COUNT(*) FROM delivery_log WHERE biz_id LIKE ? AND consumer_group = ? GROUP BY outcome",
);

/// Rounds of the race, each on a key of its own.
const ROUNDS: usize = 20;
/// Deliveries of one key in each round.
const RACERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_deliveries_of_one_key_on_three_nodes_make_one_processed_and_fifteen_duplicates() {
    race_across_nodes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_group_commit_sixteen_deliveries_of_one_key_on_three_nodes_make_one_processed() {
    race_across_nodes(true).await;
}

/// [`ROUNDS`] rounds of [`RACERS`] deliveries of one key, spread over a service on each node.
async fn race_across_nodes(group_commit: bool) {
    let cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let group = unique("race");
    let mut services = Vec::new();
    for node in 0..NODES {
        let url = cluster.url(node, db.name());
        services.push(service(&url, &group, &format!("node-{}", node + 1), group_commit).await);
    }
    let prefix = unique("RACE").replace('_', "");
    for round in 0..ROUNDS {
        let order = order(shop::TOPIC, &format!("{prefix}-{round}"), 100);
        // All sixteen leave together, so that each node accepts a claim before it hears of another's.
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (gate, start) = (services[i % NODES].gate().clone(), start.clone());
                let mut d = order.clone();
                d.msg_id = format!("{prefix}-{round}-{i}");
                tokio::spawn(async move {
                    start.wait().await;
                    gate.process(&d).await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for racer in racers {
            outcomes.push(racer.await.expect("a racer").outcome);
        }
        let processed = outcomes.iter().filter(|o| **o == Outcome::Processed).count();
        let duplicates = outcomes.iter().filter(|o| **o == Outcome::Duplicate).count();
        assert_eq!((processed, duplicates), (1, RACERS - 1), "round {round}: {outcomes:?}");
    }
    let retries: f64 = services.iter().map(certification_retries).sum();
    let by_outcome: Vec<(String, i64)> = db
        .store
        .query(&OUTCOMES_LIKE)
        .bind(format!("{prefix}-%"))
        .bind(group.as_str())
        .fetch_all(db.store.pool())
        .await
        .expect("the log")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let orders: i64 = db
        .store
        .query(&ORDERS_LIKE)
        .bind(format!("{prefix}-%"))
        .fetch_one(db.store.pool())
        .await
        .expect("orders")
        .get(0);
    assert_eq!(orders, ROUNDS as i64, "each key applied once");
    assert_eq!(
        by_outcome,
        [("duplicate".to_owned(), (ROUNDS * (RACERS - 1)) as i64), ("processed".to_owned(), ROUNDS as i64)],
        "one log row per delivery"
    );
    // Each round's losers on the two other nodes saw their claim fail certification at COMMIT
    // (or aborted by the winner's write set), retried it, and found the key taken.
    assert!(retries > 0.0, "no certification retry in {ROUNDS} rounds of {RACERS} deliveries on three nodes");
    let (code, text) = reconcile(&cluster.url(0, db.name()), &group);
    assert!(text.contains("lost 0") && text.contains("double_applied 0"), "reconcile ({code:?}):\n{text}");
    println!(
        "galera race (group commit {group_commit}): {ROUNDS} rounds of {RACERS} deliveries of one key over {NODES} \
         nodes; {retries} certification retries; wall {:.1} s",
        began.elapsed().as_secs_f64()
    );
    for running in services {
        running.stop().await.expect("the service stops cleanly");
    }
    db.drop_now().await;
}

static SEED_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) VALUES ('lease', 'stock.deduct', ?, 0, ?, ?, 'h', 'seed', ?)",
);
static ARCHIVED: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_archive");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_two_nodes_never_run_the_same_archive_or_reconcile_tick() {
    let cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let (one, two) = (store_on(&cluster, 0, &db).await, store_on(&cluster, 1, &db).await);
    // On a whole second, so that `at` and `at + 3` below fall in one tick.
    let now = idemgate::clock::now_ms() / 1_000 * 1_000;
    let old = now - 200 * idemgate::archive::retention::DAY_MS;
    for i in 0..30 {
        one.query(&SEED_CLAIM)
            .bind(format!("OLD-{i}"))
            .bind(format!("m-{i}"))
            .bind(format!("u-{i}"))
            .bind(old + i)
            .execute(one.pool())
            .await
            .expect("a claim");
    }
    let options = |instance: &str| ArchiveOptions {
        dedup_retention_ms: 90 * idemgate::archive::retention::DAY_MS,
        log_retention_ms: None,
        batch_size: 10,
        pause: Duration::ZERO,
        time_budget: Duration::from_secs(60),
        lease_ttl: Duration::from_secs(60),
        instance_id: instance.to_owned(),
        started_by: StartedBy::Schedule,
        // The lease between nodes is what this proves; the partitioned log has its own suite.
        partition_log: false,
        claim_key_by_biz_id: true,
        fault: Fault::None,
    };
    let (a, b) = (options("on-node-1"), options("on-node-2"));
    // Ten ticks, each served by both instances at once, each from its own node.
    for tick in 0..10 {
        let at = now + tick * 1_000;
        let (ra, rb) = tokio::join!(archive_once(&one, &a, at), archive_once(&two, &b, at + 3));
        let (ra, rb) = (ra.expect("node 1's run"), rb.expect("node 2's run"));
        let done = [&ra, &rb].iter().filter(|r| r.outcome == ArchiveOutcome::Done).count();
        assert_eq!(done, 1, "tick {tick}: {ra:?} {rb:?}");
    }
    let runs = idemgate::archive::runs::recent(&db.store, 100).await.expect("archive runs");
    let dedup: Vec<_> = runs.iter().filter(|r| r.kind == RunKind::Dedup).collect();
    let successes = dedup.iter().filter(|r| r.status.as_str() == "success").count();
    let skipped = dedup.iter().filter(|r| r.status.as_str() == "skipped").count();
    assert_eq!((successes, skipped), (10, 10), "{dedup:?}");
    let archived: i64 = db.store.query(&ARCHIVED).fetch_one(db.store.pool()).await.expect("archive").get(0);
    assert_eq!(archived, 30, "every old claim archived once");

    // The reconcile lease: two schedulers on one schedule, every second, one on each node.
    let settings = ReconcileSettings { schedule: "* * * * * *".to_owned(), ..ReconcileSettings::default() };
    let group = unique("lease");
    let mut schedulers = Vec::new();
    for (store, instance) in [(&one, "on-node-1"), (&two, "on-node-2")] {
        let s = ReconcileScheduler::start_for_serve(
            store.clone(),
            &settings,
            &group,
            instance,
            14,
            vec![shop::STOCK_LEDGER_CHECK],
        )
        .await
        .expect("a scheduler")
        .expect("enabled");
        schedulers.push(s);
    }
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    for s in schedulers {
        s.shutdown().await;
    }
    let runs = idemgate::reconcile::runs::recent(&db.store, 100).await.expect("reconcile runs");
    let runs: Vec<_> = runs.iter().filter(|r| r.consumer_group == group).collect();
    assert!(runs.len() >= 3, "a run about every second: {runs:?}");
    assert!(runs.iter().all(|r| r.status == "success"), "{runs:?}");
    let ticks: BTreeSet<i64> = runs.iter().map(|r| r.started_at_ms / 1_000).collect();
    assert_eq!(ticks.len(), runs.len(), "one run per tick, not one per instance: {runs:?}");
    let by: BTreeSet<&str> = runs.iter().map(|r| r.instance_id.as_str()).collect();
    println!(
        "galera leases: 10 archive ticks on two nodes, one run each; {} reconcile ticks, one run each, by {by:?}; \
         wall {:.1} s",
        runs.len(),
        began.elapsed().as_secs_f64()
    );
    one.close().await;
    two.close().await;
    db.drop_now().await;
}

static CREATE_UNKEYED: Sql = Sql::new("CREATE TABLE audit_note (note VARCHAR(20) NOT NULL)");
static KEY_IT: Sql =
    Sql::new("ALTER TABLE audit_note ADD COLUMN id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY");

/// `serve`'s settings on `url`, fed by the caller.
fn caller_settings(url: &str, group: &str, instance: &str) -> Settings {
    let mut s = Settings::default();
    s.database.url = url.to_owned();
    s.consumer.group = group.to_owned();
    s.consumer.instance = instance.to_owned();
    s.http.bind = "127.0.0.1:0".to_owned();
    s.routes = shop::routes(shop::TOPIC);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_on_galera_refuses_a_table_without_a_primary_key_and_names_it() {
    let cluster = cluster().await;
    let db = database(&cluster).await;
    db.store.query(&CREATE_UNKEYED).execute(db.store.pool()).await.expect("a table without a key");
    let settings = caller_settings(&cluster.url(1, db.name()), "pk", "node-2");
    let refused = match Application::build_with(&settings, shop::handlers(), Feed::Caller).await {
        Ok(_) => panic!("the service started on a database with a table without a primary key"),
        Err(e) => format!("{e:#}"),
    };
    assert!(refused.contains("table audit_note has no primary key"), "{refused}");
    db.store.query(&KEY_IT).execute(db.store.pool()).await.expect("a key added");
    let app = Application::build_with(&settings, shop::handlers(), Feed::Caller)
        .await
        .expect("the service starts once the table has a key");
    drop(app);
    db.drop_now().await;
}

/// Claims per node in the sharded layout.
const CLAIMS_PER_NODE: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_in_four_shards_on_three_nodes_take_ids_no_other_node_takes_inside_their_shard_range() {
    let cluster = cluster().await;
    let db = database(&cluster).await;
    let group = unique("ids");
    let mut services = Vec::new();
    let mut offsets = BTreeSet::new();
    for node in 0..NODES {
        let mut s = caller_settings(&cluster.url(node, db.name()), &group, &format!("node-{}", node + 1));
        s.dedup.shards = 4;
        let app =
            Application::build_with(&s, shop::handlers(), Feed::Caller).await.expect("the service builds");
        let store = store_on(&cluster, node, &db).await;
        let ids = idemgate::store::galera::id_settings(store.pool()).await.expect("the id settings");
        // wsrep_auto_increment_control on: the increment is the cluster's size, the offset the node's own.
        assert!(ids.control && ids.increment == NODES as i64 && ids.cluster_size == NODES as i64, "{ids:?}");
        offsets.insert(ids.offset);
        store.close().await;
        services.push((app.start().await.expect("the service starts"), ids.offset));
    }
    assert_eq!(offsets.len(), NODES, "each node hands out its own residue: {offsets:?}");
    for (node, (running, _)) in services.iter().enumerate() {
        for i in 0..CLAIMS_PER_NODE {
            let order = order(shop::TOPIC, &format!("{group}-{node}-{i}"), 100);
            assert_eq!(running.gate().process(&order).await.outcome, Outcome::Processed);
        }
    }
    let mut seen = BTreeSet::new();
    for shard in 0..4i64 {
        // Which node claimed each key: the instance of its processed delivery in the log (a claim
        // keeps none).
        let sql = format!(
            "SELECT r.id, l.instance_id FROM idempotent_record_{shard:02} r JOIN delivery_log l \
             ON l.consumer_group = r.consumer_group AND l.biz_type = r.biz_type AND l.biz_id = r.biz_id \
             AND l.execute_time = r.execute_time AND l.outcome = 'processed' WHERE r.consumer_group = ?"
        );
        let rows = idemgate::store::query_built(Backend::MySql, sql)
            .bind(group.as_str())
            .fetch_all(db.store.pool())
            .await
            .expect("a shard");
        for row in rows {
            let (id, instance): (i64, String) = (row.get(0), row.get(1));
            let node: usize = instance.trim_start_matches("node-").parse().expect("a node's instance");
            let offset = services[node - 1].1;
            // Shard k draws from ((k + 1)·10^15, (k + 2)·10^15]; a node only ids ≡ its offset (mod 3).
            assert_eq!(id / 1_000_000_000_000_000, shard + 1, "id {id} outside shard {shard}'s range");
            assert_eq!(id % NODES as i64, offset % NODES as i64, "id {id} of node {node} (offset {offset})");
            assert!(seen.insert(id), "id {id} handed out twice");
        }
    }
    assert_eq!(seen.len(), NODES * CLAIMS_PER_NODE, "every claim in a shard");
    for (running, _) in services {
        running.stop().await.expect("the service stops cleanly");
    }
    db.drop_now().await;
}

/// The traffic of the broker scenarios: 30% duplicates of every cause, no poison and no malformed
/// message, so that every send carries a key that must be applied exactly once.
const TRAFFIC: [&str; 6] = ["--duplicates", "0.3", "--poison", "0", "--malformed", "0"];

/// The books converge to what `produce` sent, every send is logged, and a reconcile run finds
/// nothing lost or applied twice; the duplicates by cause.
async fn assert_exact_books(
    store: &Store,
    url: &str,
    run: &str,
    group: &str,
    sent: &(idemgate_shop::produce::ProduceReport, Vec<SendLine>),
) -> std::collections::BTreeMap<String, i64> {
    assert_converges(store, run, group, &sent.0, &sent.1).await;
    let (code, text) = reconcile(url, group);
    assert!(text.contains("lost 0") && text.contains("double_applied 0"), "reconcile ({code:?}):\n{text}");
    duplicates_by_cause(store, group).await
}

/// The certification retries of a running `serve`.
fn serve_certification_retries(service: &Service) -> f64 {
    let (_, text) = http_get(&service_addr(service), "/metrics").expect("/metrics answers");
    sample(&text, "idemgate_transient_retries_total", &[("cause", "certification")]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_serve_instances_each_on_its_own_node_apply_ten_thousand_messages_exactly_once() {
    let cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let (topic, group, run) = (unique("gserve"), unique("group"), unique("gserve").replace('_', ""));
    let services: Vec<Service> = (0..NODES)
        .map(|node| {
            Service::start(&settings(
                &cluster.url(node, db.name()),
                &topic,
                &group,
                &format!("node-{}", node + 1),
                16,
            ))
        })
        .collect();
    let sent = tokio::task::block_in_place(|| produce(&topic, &run, 10_000, 0, &TRAFFIC));
    let causes = assert_exact_books(&db.store, &cluster.url(0, db.name()), &run, &group, &sent).await;
    let by_instance = processed_by_instance(&db.store, &group).await;
    assert_eq!(by_instance.len(), NODES, "every instance processed part of the stream: {by_instance:?}");
    let retries: Vec<f64> = services.iter().map(serve_certification_retries).collect();
    println!(
        "galera serve: {} sends ({:.0}/s) by kind {:?}; duplicates by cause {causes:?}; processed by instance \
         {by_instance:?}; certification retries per node {retries:?}; wall {:.1} s",
        sent.0.sent,
        sent.0.sends_per_second,
        sent.0.tally.sends,
        began.elapsed().as_secs_f64()
    );
    for service in services {
        assert_eq!(tokio::task::block_in_place(|| service.terminate()).code(), Some(0));
    }
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_stream_and_back_twenty_seconds_later_leaves_exact_books_through_haproxy() {
    let mut cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let proxy = cluster.proxy().await.unwrap_or_else(|e| panic!("HAProxy is required: {e:#}"));
    let url = proxy.url(db.name());
    let (topic, group, run) = (unique("gkill"), unique("group"), unique("gkill").replace('_', ""));
    let services: Vec<Service> = (1..=2)
        .map(|i| Service::start(&settings(&url, &topic, &group, &format!("instance-{i}"), 16)))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce(&topic, &run, 6_000, 200, &TRAFFIC))
    };
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Node 1, the one that bootstrapped the cluster: it must come back as an ordinary member.
    cluster.kill(0);
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let restarted = Instant::now();
    let transfer = cluster.restart(0).await.unwrap_or_else(|e| panic!("node 1 rejoins: {e:#}"));
    let rejoined = restarted.elapsed();
    // It missed 20 s of writes, and the donors' gcache holds them: it takes them alone.
    assert_eq!(
        transfer,
        StateTransfer::Incremental,
        "node 1 caught up by IST; its log says:\n{}",
        cluster.transfer_log(0)
    );
    let down = killed.elapsed();
    let sent = tokio::task::block_in_place(|| producer.join()).expect("the producer");
    // The books are read on node 2, which stayed up; node 1 has caught up by now anyway.
    let books_store = store_on(&cluster, 1, &db).await;
    let causes = assert_exact_books(&books_store, &url, &run, &group, &sent).await;
    let by_instance = processed_by_instance(&books_store, &group).await;
    assert_eq!(by_instance.len(), 2, "both instances went on through the loss: {by_instance:?}");
    println!(
        "galera node loss: node 1 SIGKILLed {:.1} s into the stream, started again 20 s later, Synced by \
         {transfer:?} state transfer {:.1} s after its start ({:.1} s down in all); {} sends by kind {:?}; duplicates by cause {causes:?}; processed \
         by instance {by_instance:?}; wall {:.1} s",
        8.0,
        rejoined.as_secs_f64(),
        down.as_secs_f64(),
        sent.0.sent,
        sent.0.tally.sends,
        began.elapsed().as_secs_f64()
    );
    for service in services {
        assert_eq!(
            tokio::task::block_in_place(|| service.terminate()).code(),
            Some(0),
            "serve ran through the loss"
        );
    }
    books_store.close().await;
    drop(proxy);
    db.drop_now().await;
}

/// What a fault scenario left, read by [`after_the_fault`].
struct AfterTheFault {
    /// When the books were read equal to the manifest.
    books_exact_at: Instant,
    unlogged: f64,
    causes: std::collections::BTreeMap<String, i64>,
    checked: idemgate_testkit::history::Checked,
}

/// Once `sent` (the producer's report and manifest of `run`) is in: the books of `group` equal
/// it within `limit`, every send is logged or its missing first attempt counted unlogged by
/// `services`, a reconcile run through `reconcile_url` finds nothing lost or applied twice; with
/// the duplicates by cause and the history checker's verdict over the log since `since_ms`.
async fn after_the_fault(
    store: &Store,
    cluster: &LocalGalera,
    reconcile_url: &str,
    (run, group, since_ms): (&str, &str, i64),
    sent: &(idemgate_shop::produce::ProduceReport, Vec<SendLine>),
    services: &[&Service],
    limit: Duration,
) -> AfterTheFault {
    let expected = expected_books(&sent.0);
    let books = wait_for_books(store, run, group, &expected, limit).await;
    let books_exact_at = Instant::now();
    assert_eq!(
        books,
        expected,
        "troubled deliveries:\n{}\n{}",
        trouble(store, group).await,
        cluster.faults()
    );
    let unlogged = unlogged_attempts(services);
    assert_every_send_is_logged_or_counted(store, group, &sent.1, unlogged).await;
    let (code, text) = reconcile(reconcile_url, group);
    assert!(text.contains("lost 0") && text.contains("double_applied 0"), "reconcile ({code:?}):\n{text}");
    AfterTheFault {
        books_exact_at,
        unlogged,
        causes: duplicates_by_cause(store, group).await,
        checked: check_history(store, group, run, &sent.1, since_ms).await,
    }
}

/// What a node tells of itself while cut off: its state, the size of its component, and whether
/// that component is the primary one.
async fn wait_for_view(
    cluster: &LocalGalera,
    index: usize,
    primary: bool,
    size: u32,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < limit {
        match cluster.view(index).await {
            Ok((_, s, p)) if p == primary && s == size => return started.elapsed(),
            other => last = Some(other.map_err(|e| format!("{e:#}"))),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "node {} did not see a {} component of {size} within {limit:?}; last {last:?}\n{}",
        index + 1,
        if primary { "primary" } else { "non-primary" },
        cluster.faults()
    )
}

/// Node 3 cut off from nodes 1 and 2 for 30 s while `serve` writes through it and another
/// instance of the group writes through node 1. Node 3 finds itself a minority of one and
/// refuses writes; its deliveries fail and go back to the broker; the majority goes on. After
/// the heal node 3 catches up, and the history checker finds every acknowledged send applied
/// exactly once, nothing committed on the majority lost, and the log true to the effects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_other_two_refuses_writes_and_nothing_committed_is_lost_or_applied_twice() {
    let mut cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let (topic, group, run) = (unique("gpart"), unique("group"), unique("gpart").replace('_', ""));
    let since_ms = idemgate::clock::now_ms() - 60_000;
    let minority = Service::start(&settings(&cluster.url(2, db.name()), &topic, &group, "node-3", 16));
    let majority = Service::start(&settings(&cluster.url(0, db.name()), &topic, &group, "node-1", 16));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce(&topic, &run, 5_000, 150, &TRAFFIC))
    };
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.partition(2).unwrap_or_else(|e| panic!("nftables cuts node 3 off: {e:#}"));
    let cut = Instant::now();
    let minority_after = wait_for_view(&cluster, 2, false, 1, Duration::from_secs(30)).await;
    let majority_after = wait_for_view(&cluster, 0, true, 2, Duration::from_secs(30)).await;
    // The minority refuses a write of its own, whatever the client (a plain connection here:
    // the service's own pool could not even open one, its first read failing too).
    let refused = {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        match sqlx::AnyConnection::connect(&cluster.url(2, db.name())).await {
            Ok(mut conn) => {
                let write = sqlx::query("UPDATE shop_stock SET quantity = quantity WHERE sku = 'SKU-1'")
                    .execute(&mut conn)
                    .await;
                let _ = conn.close().await;
                write.expect_err("a node in a minority refuses writes").to_string()
            }
            Err(e) => e.to_string(),
        }
    };
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(cut.elapsed())).await;
    cluster.heal().unwrap_or_else(|e| panic!("the heal: {e:#}"));
    let healed = Instant::now();
    cluster.wait_rejoined(2).await.unwrap_or_else(|e| panic!("node 3 rejoins: {e:#}\n{}", cluster.faults()));
    let rejoined = healed.elapsed();
    let sent = tokio::task::block_in_place(|| producer.join()).expect("the producer");
    let books_store = store_on(&cluster, 0, &db).await;
    // The instance on node 3 could not log its attempts while the node refused writes: each
    // was counted unlogged and answered for a retry, which is logged.
    let after = after_the_fault(
        &books_store,
        &cluster,
        &cluster.url(0, db.name()),
        (&run, &group, since_ms),
        &sent,
        &[&minority, &majority],
        Duration::from_secs(240),
    )
    .await;
    let (recovered, unlogged, causes, checked) =
        (after.books_exact_at - healed, after.unlogged, after.causes, after.checked);
    let (_, metrics) = http_get(&service_addr(&minority), "/metrics").expect("/metrics answers");
    let failed_on_minority =
        series(&metrics, "idemgate_deliveries_total", &[("outcome", "failed")]).iter().sum::<f64>()
            + series(&metrics, "idemgate_transient_retries_total", &[]).iter().sum::<f64>();
    let by_instance = processed_by_instance(&books_store, &group).await;
    println!(
        "galera partition: node 3 cut off {:.1} s into the stream for 30 s; it saw itself a non-primary component of \
         one {:.1} s after the cut, nodes 1 and 2 a primary of two {:.1} s after it; a write on node 3 was refused \
         ({refused}); node 3 Synced in a cluster of three {:.1} s after the heal, books exact {:.1} s after it; {} \
         sends by kind {:?}; duplicates by cause {causes:?}; processed by instance {by_instance:?}; failures and \
         retries felt by the instance on node 3: {failed_on_minority}; attempts unlogged {unlogged}; wall {:.1} s\n{checked}{}",
        8.0,
        minority_after.as_secs_f64(),
        majority_after.as_secs_f64(),
        rejoined.as_secs_f64(),
        recovered.as_secs_f64(),
        sent.0.sent,
        sent.0.tally.sends,
        began.elapsed().as_secs_f64(),
        cluster.faults()
    );
    assert!(
        refused.contains("WSREP") || refused.contains("1047"),
        "the minority's refusal names the cluster state: {refused}"
    );
    assert!(failed_on_minority > 0.0, "the instance on node 3 felt the partition");
    assert!(checked.is_valid(), "{checked}{}", cluster.faults());
    for service in [minority, majority] {
        let exit = tokio::task::block_in_place(|| service.terminate());
        assert_eq!(exit.code(), Some(0), "serve ran through the partition");
        // The test cluster writes the redo log at each commit and flushes it once a second,
        // as MariaDB's Galera guides advise: the service says what that risks.
        assert!(
            exit.log.contains("innodb_flush_log_at_trx_commit"),
            "serve warns about the flush setting at start"
        );
    }
    books_store.close().await;
    db.drop_now().await;
}

/// Every node SIGKILLed 300 ms apart mid-stream (Jepsen's "nodes crash in quick succession"),
/// under the test cluster's `innodb_flush_log_at_trx_commit = 2`, then the cluster started again
/// from its most advanced node: nothing the consumers acknowledged is lost, and nothing is
/// applied twice. A SIGKILL leaves the operating system's page cache to the files, so this is a
/// crash of the processes, not of the machines: what it cannot show is the second a power loss
/// takes with it (docs/galera.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_killed_within_a_second_and_the_cluster_started_again_loses_nothing_acknowledged() {
    let mut cluster = cluster().await;
    let began = Instant::now();
    let db = database(&cluster).await;
    let proxy = cluster.proxy().await.unwrap_or_else(|e| panic!("HAProxy is required: {e:#}"));
    let url = proxy.url(db.name());
    let (topic, group, run) = (unique("gcrash"), unique("group"), unique("gcrash").replace('_', ""));
    let since_ms = idemgate::clock::now_ms() - 60_000;
    let services: Vec<Service> = (1..=2)
        .map(|i| Service::start(&settings(&url, &topic, &group, &format!("instance-{i}"), 16)))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce(&topic, &run, 5_000, 200, &TRAFFIC))
    };
    tokio::time::sleep(Duration::from_secs(8)).await;
    tokio::task::block_in_place(|| cluster.kill_all(Duration::from_millis(300)));
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let positions = cluster
        .restart_all()
        .await
        .unwrap_or_else(|e| panic!("the cluster starts again: {e:#}\n{}", cluster.faults()));
    let down = killed.elapsed();
    let sent = tokio::task::block_in_place(|| producer.join()).expect("the producer");
    let books_store = store_on(&cluster, 0, &db).await;
    let after = after_the_fault(
        &books_store,
        &cluster,
        &url,
        (&run, &group, since_ms),
        &sent,
        &services.iter().collect::<Vec<_>>(),
        Duration::from_secs(300),
    )
    .await;
    let (recovered, unlogged, causes, checked) =
        (after.books_exact_at - killed, after.unlogged, after.causes, after.checked);
    println!(
        "galera crash: all three nodes SIGKILLed 300 ms apart 8.0 s into the stream, started again from \
         positions {positions:?}, all Synced {:.1} s after the first kill; books exact {:.1} s after it; {} sends by \
         kind {:?}; duplicates by cause {causes:?}; attempts unlogged {unlogged}; wall {:.1} s\n{checked}{}",
        down.as_secs_f64(),
        recovered.as_secs_f64(),
        sent.0.sent,
        sent.0.tally.sends,
        began.elapsed().as_secs_f64(),
        cluster.faults()
    );
    assert!(checked.is_valid(), "{checked}{}", cluster.faults());
    for service in services {
        let exit = tokio::task::block_in_place(|| service.terminate());
        assert_eq!(exit.code(), Some(0), "serve ran through the whole cluster's loss");
    }
    books_store.close().await;
    drop(proxy);
    db.drop_now().await;
}
