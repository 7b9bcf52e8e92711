//! The app suite's own: its test handlers, its deliveries and the log it captures. The
//! assembled service itself is the test kit's (`idemgate_testkit::app`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idemgate::delivery::Delivery;
use idemgate::handler::{Answers, Effect, Handler, HandlerError, Work, handle_each};
use idemgate::store::Conn;
use idemgate_shop as shop;

pub use idemgate_testkit::app::*;
pub use idemgate_testkit::http::{head, request};

/// A `stock.deduct` of one unit of [`SKU`] for `biz_id`, as first sent.
pub fn deduct(biz_id: &str) -> Delivery {
    let body = shop::DeductStock { sku: SKU.to_owned(), quantity: 1 };
    Delivery {
        msg_id: format!("M-{biz_id}-{}", rand::random::<u32>()),
        uniq_key: format!("U-{biz_id}"),
        ..shop::deduction_message(shop::TOPIC, biz_id, &body)
    }
}

/// A delivery for the test handler `name` with key `biz_id`.
pub fn for_handler(name: &str, biz_id: &str) -> Delivery {
    Delivery {
        msg_id: format!("M-{biz_id}-{}", rand::random::<u32>()),
        uniq_key: format!("U-{biz_id}"),
        topic: TEST_TOPIC.to_owned(),
        tags: name.to_owned(),
        keys: vec![biz_id.to_owned()],
        body: b"{}".to_vec(),
        ..Default::default()
    }
}

/// A handler that sleeps, then applies nothing but its claim.
pub struct Sleepy(pub Duration);

#[async_trait]
impl Handler for Sleepy {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(Effect::Applied)
    }
}

/// A handler that counts the calls of its batch form, then takes the batch one delivery at a
/// time as a handler without a batch form does.
pub struct BatchCounting(pub Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Handler for BatchCounting {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        Ok(Effect::Applied)
    }

    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        handle_each(self, works, conn).await
    }
}

/// A handler that waits until the test opens it.
pub struct Gated(pub Arc<tokio::sync::Semaphore>);

#[async_trait]
impl Handler for Gated {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        let _permit = self.0.acquire().await.map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(Effect::Applied)
    }
}

/// A handler whose first `fail` calls fail with a transient database error (a lost
/// connection's kind), then applies.
pub struct TransientlyFailing {
    pub fail: u32,
    pub calls: Arc<Mutex<u32>>,
}

#[async_trait]
impl Handler for TransientlyFailing {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        if *calls <= self.fail {
            return Err(HandlerError::Database(sqlx::Error::PoolTimedOut));
        }
        Ok(Effect::Applied)
    }
}

/// A handler that always asks to be retried.
pub struct AlwaysRetry;

#[async_trait]
impl Handler for AlwaysRetry {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        Err(HandlerError::Retryable("the downstream is not ready".to_owned()))
    }
}

/// What `tracing` wrote while `f` ran, for the settings whose effect is a log line. The
/// subscriber is this thread's only; the test runtime runs every task on this thread.
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || CaptureWriter(writer.clone()))
            .finish();
        (Self(buffer), tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
