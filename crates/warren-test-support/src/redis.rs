//! A real Redis server (`redis-server`) for the shared coordination tests.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A real Redis server (Debian's `redis-server`; scripts/test installs it) on a free
/// loopback port, with no persistence. Killed on drop.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

impl RedisServer {
    /// Starts the server; fails with what to install when `redis-server` is missing.
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): apt-get install redis-server (scripts/test does)")
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
