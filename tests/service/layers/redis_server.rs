//! A private `redis-server` for fault tests: started on a free port, killed and started again
//! on the same port. `redis-server` must be installed (the machine's Redis package); a missing
//! one fails the test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    pub async fn start(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = Self { port, args: extra.iter().map(|s| s.to_string()).collect(), child: None };
        server.spawn().await;
        server
    }

    /// A free port with no server on it yet: Redis down from the start. [`RedisServer::restart`]
    /// starts it.
    #[allow(dead_code)]
    pub fn reserved(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self { port, args: extra.iter().map(|s| s.to_string()).collect(), child: None }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server must be installed for the fault tests: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let client = redis::Client::open(self.url()).unwrap();
            if let Ok(mut c) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING").query_async::<String>(&mut c).await.is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not come up", self.port);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: the server is gone at once, with every key (it keeps nothing on disk).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
