//! A real Redis for the shared quota store's tests (docs/src/quotas.md, "Several replicas"):
//! Debian's `redis-server` on loopback, on a port of its own, no persistence, started and
//! stopped by the test through its PID. `scripts/test.sh` installs it; without it the test
//! fails and says so.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a start waits for Redis to answer `PING`.
const START_DEADLINE: Duration = Duration::from_secs(10);

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A Redis on a free loopback port, answering `PING` when this returns.
    pub async fn start() -> RedisServer {
        let mut redis = RedisServer {
            port: crate::support::free_port(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        redis.restart().await;
        redis
    }

    /// `redis://127.0.0.1:PORT/0`, for `[quotas] store`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill redis-server");
            child.wait().expect("reap redis-server");
        }
    }

    /// Starts the server again on the same port, empty (nothing is persisted).
    pub async fn restart(&mut self) {
        self.kill();
        let log = self.dir.path().join("redis.log");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start redis-server: {e} (Debian's package; scripts/test.sh installs it)"));
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        while self.ping().await.is_err() {
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && tokio::time::Instant::now() < deadline,
                "redis-server on port {} did not come up ({exited:?}); its log: {}",
                self.port,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered. A slow Redis,
    /// for as long as the test says, with no clock involved.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused server (SIGCONT): it answers what queued meanwhile.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("redis-server running");
        crate::support::signal(child, signal);
    }

    /// One `PING` on a new connection, bounded.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let client = redis::Client::open(self.url())?;
        let ping = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop)
        };
        tokio::time::timeout(Duration::from_secs(1), ping)
            .await
            .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "PING timed out").into()))
    }

    /// The keys Redis holds now (`KEYS *`: a test's key space is small).
    pub async fn keys(&self) -> Vec<String> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a paused server too.
        self.kill();
    }
}
