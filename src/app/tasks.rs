//! The service's long-running parts, each a named task with its own stop signal, and the
//! supervisor that notices when one of them ends before it was asked to.
//!
//! A task that returns, fails or panics while the service runs is a fault: the service can
//! no longer do what it claims (a consumer that stopped pulling, a schedule that no longer
//! fires, an HTTP server that no longer answers). [`Tasks::first_exit`] reports it with the
//! task's name. Stopping goes in the reverse order of starting, each task finishing its work
//! in flight before the one started before it is asked to stop.
//!
//! The readiness flag `/readyz` reads is cleared the moment any task ends, however it ends, so
//! that readiness tells the truth before the supervisor has heard of it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A task's stop signal: resolves when the service stops.
pub(crate) struct Stop(oneshot::Receiver<()>);

impl Future for Stop {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        // A dropped sender means the supervisor is gone: stop too.
        self.0.poll_unpin(cx).map(|_| ())
    }
}

struct Task {
    name: &'static str,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<anyhow::Result<()>>,
    /// Set once the task has been joined.
    ended: Option<Ended>,
}

/// How a task ended.
#[derive(Debug)]
pub(crate) enum Ended {
    Returned,
    Failed(anyhow::Error),
    Panicked(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Returned => f.write_str("returned"),
            Self::Failed(e) => write!(f, "failed: {e:#}"),
            Self::Panicked(what) => write!(f, "panicked: {what}"),
        }
    }
}

impl Ended {
    fn of(joined: Result<anyhow::Result<()>, tokio::task::JoinError>) -> Self {
        match joined {
            Ok(Ok(())) => Self::Returned,
            Ok(Err(e)) => Self::Failed(e),
            Err(e) if e.is_panic() => Self::Panicked(crate::cron::panic_message(e.into_panic().as_ref())),
            Err(e) => Self::Failed(anyhow::anyhow!("cancelled: {e}")),
        }
    }
}

/// The named tasks of one service.
#[derive(Default)]
pub(crate) struct Tasks {
    tasks: Vec<Task>,
    readiness: Readiness,
}

/// The service's readiness flag, and whether a task has ended: set by [`Ending`].
#[derive(Clone, Default)]
struct Readiness {
    ready: Arc<AtomicBool>,
    one_ended: Arc<AtomicBool>,
}

/// Held by a running task: when the task ends (returns, fails, panics or is aborted), the
/// service is no longer ready.
struct Ending(Readiness);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.one_ended.store(true, Ordering::SeqCst);
        self.0.ready.store(false, Ordering::SeqCst);
    }
}

impl Tasks {
    /// Tasks that clear `ready` as soon as one of them ends.
    pub(crate) fn clearing(ready: Arc<AtomicBool>) -> Self {
        Self { tasks: Vec::new(), readiness: Readiness { ready, one_ended: Arc::default() } }
    }

    /// Sets the readiness flag, unless a task has ended already.
    pub(crate) fn mark_ready(&self) {
        self.readiness.ready.store(true, Ordering::SeqCst);
        // A task that ended before the store above has set `one_ended` before clearing `ready`.
        if self.readiness.one_ended.load(Ordering::SeqCst) {
            self.readiness.ready.store(false, Ordering::SeqCst);
        }
    }

    /// Spawns `run(stop)` as the task `name`. The task must return once `stop` resolves.
    pub(crate) fn spawn<F, Fut>(&mut self, name: &'static str, run: F)
    where
        F: FnOnce(Stop) -> Fut,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        let task = run(Stop(stopped));
        let ending = Ending(self.readiness.clone());
        let handle = tokio::spawn(async move {
            let _ending = ending;
            task.await
        });
        self.tasks.push(Task { name, stop: Some(stop), handle, ended: None });
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tasks.iter().map(|t| t.name)
    }

    /// Resolves when the first task still running ends, with its name and how it ended.
    /// Never resolves when there is none.
    pub(crate) async fn first_exit(&mut self) -> (&'static str, &Ended) {
        let running: Vec<_> = self
            .tasks
            .iter_mut()
            .enumerate()
            .filter(|(_, t)| t.ended.is_none())
            .map(|(i, t)| Box::pin(async move { (i, (&mut t.handle).await) }))
            .collect();
        if running.is_empty() {
            return std::future::pending().await;
        }
        let ((i, joined), _, _) = futures_util::future::select_all(running).await;
        let task = &mut self.tasks[i];
        (task.name, task.ended.insert(Ended::of(joined)))
    }

    /// Stops every task, the last spawned first, waiting for each to finish. Returns
    /// the tasks that did not stop cleanly (failed or panicked, or ended earlier on their
    /// own), with how they ended.
    pub(crate) async fn stop_all(self) -> Vec<(&'static str, Ended)> {
        let mut faults = Vec::new();
        for mut task in self.tasks.into_iter().rev() {
            let ended = match task.ended.take() {
                Some(ended) => ended,
                None => {
                    if let Some(stop) = task.stop.take() {
                        let _ = stop.send(());
                    }
                    match Ended::of(task.handle.await) {
                        Ended::Returned => continue,
                        other => other,
                    }
                }
            };
            faults.push((task.name, ended));
        }
        faults
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_the_first_exit_named_and_reported_when_stopping() {
        let mut tasks = Tasks::default();
        tasks.spawn("steady", |stop| async move {
            stop.await;
            Ok(())
        });
        tasks.spawn("fragile", |_stop| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("boom");
        });
        let (name, ended) = tasks.first_exit().await;
        assert_eq!(name, "fragile");
        assert_eq!(ended.to_string(), "panicked: boom");
        let faults = tasks.stop_all().await;
        assert_eq!(faults.len(), 1, "{faults:?}");
        assert_eq!(faults[0].0, "fragile");
    }

    #[tokio::test]
    async fn a_task_that_returns_early_is_an_exit_too() {
        let mut tasks = Tasks::default();
        tasks.spawn("quitter", |_stop| async move { Ok(()) });
        tasks.spawn("failing", |stop| async move {
            stop.await;
            anyhow::bail!("could not stop")
        });
        let (name, ended) = tasks.first_exit().await;
        assert_eq!((name, ended.to_string()), ("quitter", "returned".to_owned()));
        let faults = tasks.stop_all().await;
        let named: Vec<_> = faults.iter().map(|(n, e)| format!("{n} {e}")).collect();
        assert_eq!(named, ["failing failed: could not stop", "quitter returned"]);
    }

    #[tokio::test]
    async fn tasks_stop_last_started_first_each_after_the_one_before_has_finished() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Tasks::default();
        for (name, linger) in [("http", 0), ("consumer", 50)] {
            let order = order.clone();
            tasks.spawn(name, move |stop| async move {
                stop.await;
                tokio::time::sleep(Duration::from_millis(linger)).await;
                order.lock().unwrap().push(name);
                Ok(())
            });
        }
        assert!(tasks.stop_all().await.is_empty());
        assert_eq!(*order.lock().unwrap(), ["consumer", "http"]);
    }

    #[tokio::test]
    async fn a_task_that_panics_makes_the_service_unready_before_its_exit_is_awaited() {
        let ready = Arc::new(AtomicBool::new(false));
        let mut tasks = Tasks::clearing(ready.clone());
        tasks.spawn("steady", |stop| async move {
            stop.await;
            Ok(())
        });
        tasks.mark_ready();
        assert!(ready.load(Ordering::SeqCst));
        tasks.spawn("fragile", |_stop| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("boom");
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!ready.load(Ordering::SeqCst), "still ready after a part panicked");
        tasks.mark_ready();
        assert!(!ready.load(Ordering::SeqCst), "made ready again after a part ended");
        let faults = tasks.stop_all().await;
        assert_eq!(faults.len(), 1, "{faults:?}");
    }

    #[tokio::test]
    async fn with_no_task_running_first_exit_never_resolves() {
        let mut tasks = Tasks::default();
        let waited = tokio::time::timeout(Duration::from_millis(50), tasks.first_exit()).await;
        assert!(waited.is_err());
    }
}
