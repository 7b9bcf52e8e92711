//! The committer: turns single deliveries into groups for [`super::group`]. Callers queue their
//! delivery and wait for its answer; the queue is bounded, so when the database is slow the
//! callers, and through them the broker client's consume threads, wait instead of piling up.
//! `in_flight` tasks each take a group off the queue (the first delivery, then whatever else
//! arrives within the linger, up to the batch size), commit it, and answer every caller.
//!
//! **No key in two groups at once.** A group's claims stay uncommitted until the group commits,
//! and a second group that claims one of those keys must wait inside the database for that
//! commit, holding its own connection, its own row locks and every other delivery of its group
//! meanwhile. With duplicates close together in the stream (a redelivery of a batch, a
//! producer's resend), that wait is most of a group's time. So the committer remembers which
//! keys the groups in flight hold ([`GroupRunner::claim_key`]); a delivery whose key one of them
//! holds is set aside and goes into the first group formed after that group ends, where its
//! claim finds the key committed at once. This only orders deliveries within one process, and
//! decides nothing: another instance's claim still waits on the unique index, which stays the
//! only arbiter.
//!
//! **Deadlines.** Each delivery carries its deadline (see [`super::core`]). A caller waits for
//! room in the queue only until then; a delivery whose deadline passed while it waited for a
//! group is answered retry without running; a group runs by the earliest deadline among its
//! deliveries.
//!
//! **A task that panics** (a handler's defect) takes its group down with it: the group's
//! transaction rolls back, its callers are answered retry, and the panic is reported through the
//! gate's fault signal, on which the service stops with the part named (`group commit`), as it
//! does when a listener call panics. The other tasks go on meanwhile.
//!
//! What a group runs is a [`GroupRunner`]: the gate's group transaction, or, in the benchmarks,
//! the same batching with the handler alone.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::FutureExt;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::core::{ANSWER_GRACE, Core, until};
use super::disposition::{Disposition, Phases};
use super::observer::Observer;
use super::settings::{GroupSettings, MAX_BATCH};
use crate::delivery::Delivery;
use crate::outcome::{Outcome, Verdict};

/// Runs one group of deliveries by `due` and answers each, in their order.
#[async_trait]
pub trait GroupRunner: Send + Sync + 'static {
    async fn run_group(&self, deliveries: &[Delivery], due: Instant) -> Vec<Disposition>;

    /// A fingerprint of the key `d` will claim, or `None` when it claims none (a key that cannot
    /// be read, a runner without claims). Two deliveries with one fingerprint are never in two
    /// groups in flight at once. A collision of two keys only delays a delivery.
    fn claim_key(&self, _d: &Delivery) -> Option<u64> {
        None
    }
}

#[async_trait]
impl GroupRunner for Core {
    async fn run_group(&self, deliveries: &[Delivery], due: Instant) -> Vec<Disposition> {
        self.process_group(deliveries, due).await
    }

    fn claim_key(&self, d: &Delivery) -> Option<u64> {
        let key = self.routes.resolve(d).ok()?;
        let mut h = DefaultHasher::new();
        (&key.biz_type, &key.biz_id, key.execute_time).hash(&mut h);
        Some(h.finish())
    }
}

/// The gate's groups with no key known to the committer.
struct KeysUnknown(Arc<Core>);

#[async_trait]
impl GroupRunner for KeysUnknown {
    async fn run_group(&self, deliveries: &[Delivery], due: Instant) -> Vec<Disposition> {
        self.0.process_group(deliveries, due).await
    }
}

/// One queued delivery, the fingerprint of its key, its deadline, and where its answer goes.
struct Job {
    delivery: Delivery,
    key: Option<u64>,
    queued: Instant,
    due: Instant,
    reply: oneshot::Sender<Disposition>,
}

/// The gate's fault signal: the message of the first committer task that panicked.
pub(crate) type Faults = watch::Sender<Option<String>>;

/// The queue and the tasks that turn it into groups. Dropping it (with its gate) closes the
/// queue; the tasks finish the groups they hold, and the deliveries set aside for them, and stop.
pub struct Committer {
    queue: mpsc::Sender<Job>,
    runner: Arc<dyn GroupRunner>,
    observer: Option<Arc<dyn Observer>>,
}

impl Committer {
    /// The gate's committer, reporting a task's panic to `faults`. `defer_held_keys` off lets a
    /// key be in two groups in flight, as before the committer knew keys: for the benchmarks'
    /// comparison only.
    pub(crate) fn start(
        core: Arc<Core>,
        settings: &GroupSettings,
        defer_held_keys: bool,
        faults: Faults,
    ) -> Self {
        let observer = core.observer.clone();
        match defer_held_keys {
            true => Self::start_with(core, observer, settings, faults),
            false => Self::start_with(Arc::new(KeysUnknown(core)), observer, settings, faults),
        }
    }

    /// A committer whose groups `runner` runs, reporting waits to `observer` and a task's panic
    /// to `faults`.
    pub fn start_with(
        runner: Arc<dyn GroupRunner>,
        observer: Option<Arc<dyn Observer>>,
        settings: &GroupSettings,
        faults: Faults,
    ) -> Self {
        let (queue, jobs) = mpsc::channel(settings.queue.max(1));
        let shared = Arc::new(Shared {
            jobs: tokio::sync::Mutex::new(jobs),
            holds: Mutex::new(Holds::default()),
            released: Notify::new(),
        });
        for _ in 0..settings.in_flight.max(1) {
            let task = commit_groups(runner.clone(), observer.clone(), shared.clone(), settings.clone());
            tokio::spawn(reporting_panics(task, faults.clone()));
        }
        Self { queue, runner, observer }
    }

    /// Queues `delivery` and waits for its group's answer, by `due`. A full queue makes the
    /// caller wait for room first (counted: the database is not keeping up); the time in the
    /// queue is measured from when the delivery got in. A group that has not answered by
    /// [`ANSWER_GRACE`] after `due` (its COMMIT hangs) is not waited for any longer.
    pub async fn submit(&self, delivery: Delivery, due: Instant) -> Disposition {
        let room = match self.queue.try_reserve() {
            Ok(room) => room,
            Err(mpsc::error::TrySendError::Full(())) => {
                if let Some(observer) = &self.observer {
                    observer.group_queue_full();
                }
                match until(due, self.queue.reserve()).await {
                    Some(Ok(room)) => room,
                    Some(Err(_)) => return abandoned(),
                    None => return unanswered(LATE_FOR_THE_QUEUE),
                }
            }
            Err(mpsc::error::TrySendError::Closed(())) => return abandoned(),
        };
        // Read in the caller's task, so that the committer's tasks only compare numbers.
        let key = self.runner.claim_key(&delivery);
        let (reply, answer) = oneshot::channel();
        room.send(Job { delivery, key, queued: Instant::now(), due, reply });
        match until(due + ANSWER_GRACE, answer).await {
            Some(answer) => answer.unwrap_or_else(|_| abandoned()),
            None => unanswered("its group did not answer by its deadline; the answer is retry"),
        }
    }
}

/// Runs a committer task; if it panics, logs it and raises `faults`. The group it held is gone
/// with it: its transaction rolled back, and its callers' answers (dropped) are retry.
async fn reporting_panics(task: impl Future<Output = ()>, faults: Faults) {
    if let Err(panic) = std::panic::AssertUnwindSafe(task).catch_unwind().await {
        let what = crate::cron::panic_message(panic.as_ref());
        tracing::error!(
            panic = %what,
            "a group-commit task panicked; its group's deliveries will be redelivered, and the service stops"
        );
        faults.send_replace(Some(what));
    }
}

const LATE_FOR_THE_QUEUE: &str =
    "its deadline (consumer.delivery_timeout_ms) passed while it waited for a group; not run";

/// The answer for a delivery whose group never finished (its runtime is shutting down, or its
/// task panicked): not recorded, so not acknowledged.
fn abandoned() -> Disposition {
    unanswered("the group committer stopped before this delivery's group committed")
}

/// Retry, not recorded, for the reason `why`.
fn unanswered(why: &str) -> Disposition {
    Disposition {
        outcome: Outcome::Failed,
        verdict: Verdict::Retry,
        key: None,
        cause: None,
        layer: None,
        payload_match: None,
        error: Some(why.to_owned()),
        latency: Duration::ZERO,
        logged: false,
        phases: Phases::default(),
        prefilter: None,
    }
}

/// What the committer's tasks share: the queue (one task at a time forms a group from it), the
/// keys the groups in flight hold, and the signal that a group ended.
struct Shared {
    jobs: tokio::sync::Mutex<mpsc::Receiver<Job>>,
    holds: Mutex<Holds>,
    /// A group ended and the deliveries set aside for it are ready.
    released: Notify,
}

/// The keys of the groups in flight, and the deliveries that wait for one of them.
#[derive(Default)]
struct Holds {
    next_group: u64,
    /// Key fingerprint → the group in flight that claims it.
    held: HashMap<u64, u64>,
    /// Group in flight → the deliveries set aside until it ends.
    waiting: HashMap<u64, Vec<Job>>,
    /// Deliveries whose group ended: the next group takes them before the queue.
    ready: VecDeque<Job>,
}

impl Holds {
    /// Puts `job` into `group` (which is being formed as group `id`), or sets it aside when a
    /// group in flight holds its key. True when it went into the group.
    fn admit(&mut self, id: u64, job: Job, group: &mut Vec<Job>) -> bool {
        if let Some(key) = job.key {
            match self.held.get(&key) {
                Some(&holder) if holder != id => {
                    self.waiting.entry(holder).or_default().push(job);
                    return false;
                }
                _ => {
                    self.held.insert(key, id);
                }
            }
        }
        group.push(job);
        true
    }
}

impl Shared {
    /// The holds. Nothing panics while holding them, and if something did, they are still
    /// consistent (each change is one map operation), so a poisoned lock is taken as it is.
    fn holds(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the ready deliveries into `group`, up to `max`. Returns how many were set aside
    /// again (a newer group in flight holds their key).
    fn take_ready(&self, id: u64, group: &mut Vec<Job>, max: usize) -> u64 {
        let mut holds = self.holds();
        let mut deferred = 0;
        while group.len() < max {
            let Some(job) = holds.ready.pop_front() else { break };
            deferred += u64::from(!holds.admit(id, job, group));
        }
        deferred
    }

    fn admit(&self, id: u64, job: Job, group: &mut Vec<Job>) -> bool {
        self.holds().admit(id, job, group)
    }

    /// Nothing is set aside or ready: a closed queue then means the committer is done.
    fn idle(&self) -> bool {
        let holds = self.holds();
        holds.ready.is_empty() && holds.waiting.is_empty()
    }
}

/// A group in flight: when it ends (or its task unwinds), its keys are released and the
/// deliveries set aside for it become ready.
struct InFlight<'a> {
    shared: &'a Shared,
    id: u64,
    keys: Vec<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut holds = self.shared.holds();
        for key in &self.keys {
            if holds.held.get(key) == Some(&self.id) {
                holds.held.remove(key);
            }
        }
        if let Some(jobs) = holds.waiting.remove(&self.id) {
            holds.ready.extend(jobs);
            drop(holds);
            self.shared.released.notify_one();
        }
    }
}

/// One committer task: takes a group off the queue (the first delivery, then whatever else
/// arrives within the linger, up to the batch size), commits it, answers each caller.
async fn commit_groups(
    runner: Arc<dyn GroupRunner>,
    observer: Option<Arc<dyn Observer>>,
    shared: Arc<Shared>,
    settings: GroupSettings,
) {
    let max_batch = settings.max_batch.clamp(1, MAX_BATCH);
    loop {
        let Some((id, group, deferred)) = next_group(&shared, max_batch, settings.linger()).await else {
            return;
        };
        if let Some(observer) = &observer {
            for job in &group {
                observer.group_wait(job.queued.elapsed());
            }
            if deferred > 0 {
                observer.group_deferred(deferred);
            }
        }
        let in_flight = InFlight { shared: &shared, id, keys: group.iter().filter_map(|j| j.key).collect() };
        // A delivery out of time is answered now; the group runs by the earliest deadline left.
        let now = Instant::now();
        let (late, group): (Vec<Job>, Vec<Job>) = group.into_iter().partition(|j| j.due <= now);
        for job in late {
            let answer = unanswered(LATE_FOR_THE_QUEUE);
            if let Some(observer) = &observer {
                observer.delivery(&job.delivery, &answer);
            }
            let _ = job.reply.send(answer);
        }
        let Some(due) = group.iter().map(|j| j.due).min() else { continue };
        let (deliveries, replies): (Vec<Delivery>, Vec<oneshot::Sender<Disposition>>) =
            group.into_iter().map(|j| (j.delivery, j.reply)).unzip();
        let answers = runner.run_group(&deliveries, due).await;
        // Released before the answers go out, so the duplicates set aside can join the next
        // group while the callers acknowledge.
        drop(in_flight);
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away has nothing to acknowledge.
            let _ = reply.send(answer);
        }
    }
}

/// Forms the next group: the deliveries ready again first, then the queue's, the first one
/// waited for as long as it takes and the rest within the linger, until the group and the
/// deliveries set aside meanwhile make `max_batch`. Returns the group's id, its
/// deliveries and how many were set aside while forming it; `None` once the queue is closed and
/// nothing waits any more.
async fn next_group(shared: &Shared, max_batch: usize, linger: Duration) -> Option<(u64, Vec<Job>, u64)> {
    let mut jobs = shared.jobs.lock().await;
    let id = {
        let mut holds = shared.holds();
        holds.next_group += 1;
        holds.next_group
    };
    let mut group = Vec::new();
    let mut deferred = 0;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut closed = false;
    // A delivery set aside counts towards the group's size: its caller waits for the group in
    // flight, and so do the deliveries it would send next, so lingering for it only idles.
    // An empty group is never full: it waits for its first delivery.
    let full =
        |group: &Vec<Job>, deferred: u64| !group.is_empty() && group.len() + deferred as usize >= max_batch;
    while !full(&group, deferred) {
        deferred += shared.take_ready(id, &mut group, max_batch);
        if full(&group, deferred) {
            break;
        }
        if deadline.is_none() && !group.is_empty() {
            deadline = Some(tokio::time::Instant::now() + linger);
        }
        if !closed {
            match jobs.try_recv() {
                Ok(job) => {
                    deferred += u64::from(!shared.admit(id, job, &mut group));
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
        }
        if closed {
            if !group.is_empty() {
                break;
            }
            if shared.idle() {
                return None;
            }
            // A group in flight still holds deliveries set aside: they come back when it ends.
            shared.released.notified().await;
            continue;
        }
        let wait_for_job = async {
            match deadline {
                Some(at) => tokio::time::timeout_at(at, jobs.recv()).await,
                None => Ok(jobs.recv().await),
            }
        };
        tokio::select! {
            received = wait_for_job => match received {
                Ok(Some(job)) => deferred += u64::from(!shared.admit(id, job, &mut group)),
                Ok(None) => closed = true,
                Err(_) => break,
            },
            () = shared.released.notified() => {}
        }
    }
    Some((id, group, deferred))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Records the keys of the groups in flight; the key is the delivery's msgId.
    #[derive(Default)]
    struct Recorder {
        in_flight: Mutex<Vec<HashSet<u64>>>,
        overlaps: AtomicUsize,
        groups: Mutex<Vec<Vec<String>>>,
        running: AtomicUsize,
        most_running: AtomicUsize,
    }

    #[async_trait]
    impl GroupRunner for Recorder {
        async fn run_group(&self, deliveries: &[Delivery], _due: Instant) -> Vec<Disposition> {
            let keys: HashSet<u64> = deliveries.iter().filter_map(|d| self.claim_key(d)).collect();
            {
                let mut in_flight = self.in_flight.lock().unwrap();
                if in_flight.iter().any(|other| !other.is_disjoint(&keys)) {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                in_flight.push(keys.clone());
            }
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_running.fetch_max(now, Ordering::SeqCst);
            self.groups.lock().unwrap().push(deliveries.iter().map(|d| d.msg_id.clone()).collect());
            tokio::time::sleep(Duration::from_millis(40)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            self.in_flight.lock().unwrap().retain(|k| *k != keys);
            deliveries
                .iter()
                .map(|d| Disposition {
                    outcome: Outcome::Processed,
                    verdict: Verdict::Ack,
                    error: Some(d.msg_id.clone()),
                    logged: true,
                    ..abandoned()
                })
                .collect()
        }

        fn claim_key(&self, d: &Delivery) -> Option<u64> {
            d.msg_id.strip_prefix("key-").and_then(|n| n.split('#').next()).and_then(|n| n.parse().ok())
        }
    }

    /// A deadline the tests never reach.
    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn settings(in_flight: usize, max_batch: usize) -> GroupSettings {
        GroupSettings { enabled: true, max_batch, linger_ms: 3, in_flight, queue: 256, batch: true }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_key_is_in_two_groups_in_flight_and_every_delivery_is_answered() {
        let recorder = Arc::new(Recorder::default());
        let committer =
            Arc::new(Committer::start_with(recorder.clone(), None, &settings(3, 8), watch::channel(None).0));
        // 120 deliveries over 10 keys, so that most of them find their key in flight.
        let answers = futures_util::future::join_all((0..120).map(|i| {
            let committer = committer.clone();
            async move {
                let msg_id = format!("key-{}#{i}", i % 10);
                let r =
                    committer.submit(Delivery { msg_id: msg_id.clone(), ..Default::default() }, soon()).await;
                (msg_id, r)
            }
        }))
        .await;
        for (msg_id, r) in &answers {
            assert_eq!(r.outcome, Outcome::Processed, "{msg_id}: {:?}", r.error);
            assert_eq!(r.error.as_deref(), Some(msg_id.as_str()), "an answer went to the wrong caller");
        }
        assert_eq!(recorder.overlaps.load(Ordering::SeqCst), 0, "a key was in two groups in flight");
        let groups = recorder.groups.lock().unwrap();
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 120);
        assert!(recorder.most_running.load(Ordering::SeqCst) >= 2, "the groups never overlapped at all");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_copies_of_one_key_are_answered_one_group_at_a_time() {
        let recorder = Arc::new(Recorder::default());
        let committer =
            Arc::new(Committer::start_with(recorder.clone(), None, &settings(2, 4), watch::channel(None).0));
        let answers = futures_util::future::join_all((0..40).map(|i| {
            let committer = committer.clone();
            async move {
                committer
                    .submit(Delivery { msg_id: format!("key-5#{i}"), ..Default::default() }, soon())
                    .await
            }
        }))
        .await;
        assert!(answers.iter().all(|r| r.outcome == Outcome::Processed));
        assert_eq!(recorder.overlaps.load(Ordering::SeqCst), 0);
        let groups = recorder.groups.lock().unwrap();
        assert!(groups.iter().all(|g| !g.is_empty() && g.len() <= 4), "{groups:?}");
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 40);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delivery_set_aside_joins_the_group_after_its_holder() {
        let recorder = Arc::new(Recorder::default());
        let committer =
            Arc::new(Committer::start_with(recorder.clone(), None, &settings(2, 4), watch::channel(None).0));
        let first = {
            let committer = committer.clone();
            tokio::spawn(async move {
                committer.submit(Delivery { msg_id: "key-1#a".into(), ..Default::default() }, soon()).await
            })
        };
        // The first group is in flight (it sleeps 40 ms) when the copy and a stranger arrive.
        tokio::time::sleep(Duration::from_millis(15)).await;
        let copy = committer.submit(Delivery { msg_id: "key-1#b".into(), ..Default::default() }, soon());
        let other = committer.submit(Delivery { msg_id: "key-2#c".into(), ..Default::default() }, soon());
        let (copy, other) = tokio::join!(copy, other);
        assert_eq!(first.await.unwrap().outcome, Outcome::Processed);
        assert_eq!((copy.outcome, other.outcome), (Outcome::Processed, Outcome::Processed));
        let groups = recorder.groups.lock().unwrap().clone();
        let at = |id: &str| groups.iter().position(|g| g.iter().any(|m| m == id)).unwrap();
        assert!(at("key-1#b") > at("key-1#a"), "{groups:?}");
        // The stranger was not held back with the copy: it went into the second group.
        assert_eq!(at("key-2#c"), 1, "{groups:?}");
        assert_eq!(recorder.overlaps.load(Ordering::SeqCst), 0);
    }

    /// Panics on a delivery whose msgId is `boom`; applies the others.
    struct Fragile;

    #[async_trait]
    impl GroupRunner for Fragile {
        async fn run_group(&self, deliveries: &[Delivery], _due: Instant) -> Vec<Disposition> {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if deliveries.iter().any(|d| d.msg_id == "boom") {
                panic!("a handler's defect");
            }
            deliveries
                .iter()
                .map(|_| Disposition {
                    outcome: Outcome::Processed,
                    verdict: Verdict::Ack,
                    logged: true,
                    ..abandoned()
                })
                .collect()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_panics_answers_its_group_retry_and_raises_the_fault_while_the_others_go_on() {
        let faults = watch::Sender::new(None);
        let mut raised = faults.subscribe();
        let committer = Committer::start_with(Arc::new(Fragile), None, &settings(2, 1), faults);
        let boom = committer.submit(Delivery { msg_id: "boom".into(), ..Default::default() }, soon()).await;
        assert_eq!((boom.outcome, boom.verdict, boom.logged), (Outcome::Failed, Verdict::Retry, false));
        let what = tokio::time::timeout(Duration::from_secs(2), raised.wait_for(Option::is_some))
            .await
            .expect("the fault is raised")
            .expect("the sender lives")
            .clone();
        assert_eq!(what.as_deref(), Some("a handler's defect"));
        let after = committer.submit(Delivery { msg_id: "fine".into(), ..Default::default() }, soon()).await;
        assert_eq!(after.outcome, Outcome::Processed, "the other task takes the next group");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delivery_whose_deadline_passes_in_the_queue_is_answered_retry_without_running() {
        let recorder = Arc::new(Recorder::default());
        let committer =
            Arc::new(Committer::start_with(recorder.clone(), None, &settings(1, 1), watch::channel(None).0));
        // The first group sleeps 40 ms; the second delivery's deadline is 10 ms away.
        let first = {
            let committer = committer.clone();
            tokio::spawn(async move {
                committer.submit(Delivery { msg_id: "key-1#a".into(), ..Default::default() }, soon()).await
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let due = Instant::now() + Duration::from_millis(10);
        let late = committer.submit(Delivery { msg_id: "key-2#b".into(), ..Default::default() }, due).await;
        assert_eq!(first.await.unwrap().outcome, Outcome::Processed);
        assert_eq!((late.outcome, late.verdict, late.logged), (Outcome::Failed, Verdict::Retry, false));
        assert!(late.error.as_deref().is_some_and(|e| e.contains("deadline")), "{:?}", late.error);
        let groups = recorder.groups.lock().unwrap().clone();
        assert_eq!(groups, [vec!["key-1#a".to_owned()]], "the late delivery never ran");
    }
}
